"""The scripted Calc demonstrations the tool-calling tiny model is taught on."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from agentloop.chat import TokenBuilder
from agentloop.envs import make
from agentloop.errors import ConfigError
from agentloop.models.calc_caller import CALC_ENV, TeachConfig, calc_demonstrations, teach


@pytest.mark.integration  # the Calc env's python tool runs in the real sandbox
def test_demonstrations_call_the_tool_then_box_its_output(tokenizer: Any) -> None:
    builder = TokenBuilder(tokenizer, tools=make(CALC_ENV).tool_schemas)
    demos = calc_demonstrations(builder, 6)
    assert [d.task_id for d in demos] == [f"calc-train-{i:06d}" for i in range(6)]
    for demo in demos:
        call, tool, answer = demo.messages[2:]
        assert call.tool_calls[0].name == "python" and "print(" in call.content
        assert tool.role == "tool" and tool.content.strip().isdigit()  # the tool really ran
        assert answer.content == f"The answer is \\boxed{{{tool.content.strip()}}}."
        assert demo.reward == 1.0  # the scripted expression is the task's own arithmetic
        trained = [t for t, m in zip(demo.token_ids, demo.loss_mask, strict=True) if m]
        assert builder.decode(trained).count("<tool_call>") == 1


def test_teach_config_names_bad_values() -> None:
    with pytest.raises(ConfigError, match="steps must be >= 1, got 0"):
        TeachConfig(steps=0)
    with pytest.raises(ConfigError, match="lr > 0"):
        TeachConfig(lr=0.0)


@pytest.mark.integration
@pytest.mark.slow
def test_teach_writes_a_model_that_loads_with_its_tokenizer(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = teach(tiny_model_dir, tmp_path / "m", TeachConfig(num_demos=8, steps=3, batch_size=4))
    info = json.loads((out / "calc_caller.json").read_text())
    assert len(info["losses"]) == 3 and all(math.isfinite(x) for x in info["losses"])
    model = AutoModelForCausalLM.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert not torch.equal(model.lm_head.weight, base.lm_head.weight)  # it trained
    assert AutoTokenizer.from_pretrained(out).chat_template == (
        AutoTokenizer.from_pretrained(tiny_model_dir).chat_template
    )
