"""bench/peers (the race against TRL and verl): each system's log read into per-step phases
(recorded samples: agentloop's metrics of a real H100 step, TRL's step lines from CPU smoke runs
of trl_grpo.py, single and multi, and console lines formatted by verl 0.9.1's own logger), the
results JSON and table, the driver's options, TRL's timer grouping, the padded race tokenizer,
and the multi variant's episodes: agentloop's (its race env and ``rollout.max_turn_tokens``)
and TRL's ``rollout_func`` bookkeeping (verl's agent loop is checked against verl itself by
``bench/peers/verl_check.py``, where verl imports)."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from contextlib import nullcontext
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "peers"


def peers(name: str) -> ModuleType:
    """``bench/peers/NAME.py`` (its folder on sys.path, as the scripts have it)."""
    here = str(ROOT / "bench" / "peers")
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module(name)


def test_agentloop_metrics_give_its_own_phase_timers() -> None:
    r = peers("results")
    (step,) = r.parse_agentloop((DATA / "agentloop_metrics.jsonl").read_text(), sequences=512)
    assert step.step == 2
    assert (step.gen, step.old_logprobs) == pytest.approx((27.1518, 4.0847), abs=1e-4)
    assert (step.update, step.sync) == pytest.approx((14.5602, 0.0518), abs=1e-4)
    assert step.other == pytest.approx(47.2054 - 27.1518 - 4.0847 - 14.5602 - 0.0518, abs=1e-3)
    assert step.tokens_per_s == pytest.approx(524244 / 47.2054, rel=1e-4)


def test_verl_console_lines_with_numpy_reprs_and_ray_prefixes() -> None:
    r = peers("results")
    steps = r.parse_verl((DATA / "verl_console.log").read_text(), sequences=512)
    assert [s.step for s in steps] == [2, 3]  # the line without timing_s/step is skipped
    s2 = steps[0]
    assert (s2.wall, s2.gen, s2.old_logprobs, s2.update, s2.sync) == (29.0, 14.25, 3.5, 9.75, 0.5)
    assert s2.sampled_tokens == 512 * 512 and s2.peak_mem_gb == 40.5
    assert steps[1].gen == 16.0 and steps[1].other == pytest.approx(31.0 - 16 - 3.5 - 9.75 - 0.5)


def test_verl_step_line_of_a_real_h200_run_with_ray_colours() -> None:
    # verl 0.9.1's step-1 line from an H200 race run, Ray's ANSI-coloured prefix kept
    r = peers("results")
    (step,) = r.parse_verl((DATA / "verl_h200_console.log").read_text(), sequences=512)
    assert step.step == 1 and step.wall == pytest.approx(153.434, abs=1e-3)
    assert (step.gen, step.update) == pytest.approx((22.092, 78.733), abs=1e-3)
    assert step.sampled_tokens == 512 * 512


def test_trl_step_lines_of_a_real_smoke_run() -> None:
    r = peers("results")
    steps = r.parse_trl((DATA / "trl_cpu_smoke.log").read_text(), sequences=32)
    assert [s.step for s in steps] == [1, 2]
    for s in steps:
        assert 0 < s.gen < s.wall and 0 < s.update < s.wall and s.other >= 0
        assert s.sampled_tokens == 16 * 32  # 16-token completions, min_new_tokens forced


def test_trl_timers_group_nested_and_loss_time_logprobs() -> None:
    t = peers("trl_grpo")
    events = [
        ("GRPOTrainer._prepare_inputs", 0.0, 6.0),
        ("GRPOTrainer.sync_weights", 0.0, 1.0),
        ("VLLMGeneration.sync_weights", 0.1, 0.9),  # nested, same name: counted once
        ("GRPOTrainer.vLLM.generate", 1.0, 4.0),
        ("GRPOTrainer._get_per_token_logps_and_entropies", 4.0, 5.5),  # old logprobs
        ("GRPOTrainer.compute_loss", 6.0, 8.0),
        ("GRPOTrainer._get_per_token_logps_and_entropies", 6.0, 7.5),  # inside the loss
    ]
    got = t.step_phases(events, wall=10.0)
    assert got == {"wall": 10.0, "gen": 3.0, "sync": 1.0, "old_logprobs": 1.5, "update": 4.0}


def _run(r: ModuleType, system: str, walls: list[float], gen: float) -> object:
    steps = tuple(
        r.Step(step=i + 1, wall=w, gen=gen, old_logprobs=1.0, update=w - gen - 2.0, sync=0.5,
               sampled_tokens=262144.0) for i, w in enumerate(walls)
    )  # fmt: skip
    return r.SystemRun(system=system, steps=steps, versions={"torch": "2.11.0"}, rc=0)


def test_table_ratios_are_agentloop_over_the_best_peer() -> None:
    r = peers("results")
    runs = [_run(r, "agentloop", [99.0, 20.0, 22.0, 21.0], gen=10.0),
            _run(r, "trl", [99.0, 40.0, 40.0, 40.0], gen=30.0),
            _run(r, "verl", [99.0, 30.0, 30.0, 30.0], gen=12.0)]  # fmt: skip
    med = {run.system: r.median_phases(run) for run in runs}
    assert med["agentloop"]["wall"] == 21.0  # the warm-up step (99 s) is left out
    ratios = r.ratio_row(med)
    assert ratios["wall"] == pytest.approx(21.0 / 30.0)  # verl is the best peer on wall time
    assert ratios["gen"] == pytest.approx(10.0 / 12.0)
    assert ratios["tokens_per_s"] == pytest.approx((262144 / 21) / (262144 / 30))
    md = r.table(runs, "NVIDIA H200")
    assert "| agentloop | 1 (warm-up) | 99.00 |" in md
    assert "| agentloop ÷ best peer | 0.70 | 0.83 |" in md


def test_a_failed_run_is_a_row_and_runs_round_trip_through_json(tmp_path: Path) -> None:
    r = peers("results")
    run = _run(r, "trl", [5.0, 4.0], gen=1.0)
    back = r.run_from_json(json.loads(json.dumps(r.run_to_json(run))))
    assert back == run
    failed = r.SystemRun(system="verl", steps=(), rc=1, error="exit status 1")
    assert "| verl | – | failed (rc 1): exit status 1 |" in r.table([failed], "GPU")


def test_race_options_and_merge(tmp_path: Path) -> None:
    race, r = peers("race"), peers("results")
    args = race.parse_args(["--out", str(tmp_path / "out"), "--systems", "agentloop, trl",
                            "--work", str(tmp_path / "work"), "--steps", "3"])  # fmt: skip
    assert args.systems == ["agentloop", "trl"] and args.variant == "single"
    with pytest.raises(SystemExit):
        race.parse_args(["--out", "x", "--systems", "agentloop,deepspeed"])
    with pytest.raises(SystemExit):
        race.parse_args(["--out", "x", "--variant", "three"])
    for system, gen in (("agentloop", 10.0), ("trl", 30.0)):
        d = tmp_path / "work" / "single" / system
        d.mkdir(parents=True)
        (d / "result.json").write_text(json.dumps(r.run_to_json(_run(r, system, [9, 8, 8], gen))))
        (d / "run.log").write_text("line\n" * 500)
    path = race.merge(args)
    results = json.loads(path.read_text())
    assert sorted(results["systems"]) == ["agentloop", "trl"]
    assert results["workload"]["sequences"] == 512 and results["workload"]["response_len"] == 512
    assert (tmp_path / "out" / "table-single.md").read_text().count("| trl |") == 4
    assert len((tmp_path / "out" / "trl-single.log").read_text().splitlines()) == 300


def test_the_race_tokenizer_is_padded_to_the_model_vocab() -> None:
    w = peers("workload")
    tj = {"model": {"vocab": {"a": 0, "b": 1, "Ġaaaa": 3}},
          "added_tokens": [{"id": 2, "content": "<|im_end|>"}]}  # fmt: skip
    vocab = w.pad_vocab(tj, 10)["model"]["vocab"]
    assert sorted(vocab.values()) == [0, 1, *range(3, 10)]  # id 2 stays the added token's
    assert len(set(vocab)) == len(vocab) and vocab["Ġaaaa"] == 3
    with pytest.raises(ValueError, match="--shape"):
        w.Workload(shape="7b")


def test_the_multi_variant_workload() -> None:
    w = peers("workload").Workload(variant="multi")
    assert (w.turns, w.turn_tokens, w.sampled_tokens) == (3, 170, 510)
    assert w.max_response == 510 + 2 * (64 + 32)  # room for the observations and their template
    assert peers("race").parse_args(["--out", "x", "--variant", "multi"]).variant == "multi"


def test_agentloop_race_config_of_the_multi_variant() -> None:
    from agentloop.trainers.config import TrainConfig, load_config

    a, w = peers("agentloop_grpo"), peers("workload")
    multi = w.Workload(variant="multi")
    cfg = load_config(TrainConfig, a.CONFIG, a.overrides(multi, Path("/m"), Path("/o")))
    r = cfg.rollout
    assert (r.max_turns, r.max_turn_tokens, r.max_response_len) == (3, 170, 702)
    assert cfg.data.env_kwargs == {"turns": 3, "prompts": 64}
    single = load_config(TrainConfig, a.CONFIG, a.overrides(w.Workload(), Path("/m"), Path("/o")))
    assert single.rollout.max_turn_tokens is None and single.rollout.max_response_len == 512


def test_agentloop_multi_episode_is_three_capped_turns(tokenizer: Any) -> None:
    """The race env answers whatever the model writes; each turn stops at the cap and goes on."""
    from agentloop.chat import TokenBuilder
    from agentloop.engines.fake import FakeEngine
    from agentloop.rollout import RolloutConfig, rollout

    race_env = peers("race_env")
    env = race_env.RaceEnv(turns=3, prompts=2)
    (task,) = env.tasks(limit=1)
    engine = FakeEngine(lambda p, s: "x" * 400, tokenizer=tokenizer, eos_token_id=2)
    config = RolloutConfig(max_turns=3, max_prompt_len=512, max_response_len=400,
                           max_turn_tokens=20)  # fmt: skip
    traj = asyncio.run(rollout(env, engine, TokenBuilder(tokenizer), task, config))
    assert traj.stop_reason.value == "done" and not traj.failed
    assert [t.completion_tokens for t in traj.turns] == [20, 20, 20]
    assert sum(traj.loss_mask) == 60
    users = [m.content for m in traj.messages if m.role == "user"]
    assert users[1:] == [peers("workload").tool_result_text()] * 2


def test_verl_sampled_tokens_leave_out_the_observations() -> None:
    r = peers("results")
    log = ("(AgentLoopWorkerTQ pid=77) RACE_VERL_UNSAMPLED 160\n"
           "(TaskRunnerV1 pid=4242) step:2 - response_length/mean:np.float64(670.0) - "
           "timing_s/gen:np.float64(20.0) - timing_s/step:np.float64(30.0)\n")  # fmt: skip
    (step,) = r.parse_verl(log, sequences=512)
    assert step.sampled_tokens == 510 * 512 and step.gen == 20.0


def test_trl_multi_smoke_counts_sampled_tokens_only() -> None:
    r = peers("results")
    steps = r.parse_trl((DATA / "trl_cpu_smoke_multi.log").read_text(), sequences=32)
    assert [s.step for s in steps] == [1, 2]  # found after the progress bar on the same line
    assert all(s.sampled_tokens == 3 * 16 * 32 for s in steps)  # env_mask 0 on observations
    assert all(0 < s.gen < s.wall for s in steps)


def test_trl_rollout_func_span_is_the_generation_phase() -> None:
    t = peers("trl_grpo")
    turns = [("GRPOTrainer.vLLM.generate", 1.0 + 2 * k, 2.5 + 2 * k) for k in range(3)]
    events = [("GRPOTrainer._prepare_inputs", 0.0, 9.0), *turns,
              ("GRPOTrainer.rollout_func", 1.0, 8.0)]  # fmt: skip
    assert t.step_phases(events, wall=12.0)["gen"] == 7.0


def test_trl_rollout_func_three_turns_with_masked_observations(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    profiling = ModuleType("trl.extras.profiling")
    profiling.profiling_context = lambda trainer, name: nullcontext()  # type: ignore[attr-defined]
    for name in ("trl", "trl.extras"):
        monkeypatch.setitem(sys.modules, name, ModuleType(name))
    monkeypatch.setitem(sys.modules, "trl.extras.profiling", profiling)
    turns, w = peers("trl_turns"), peers("workload").Workload(variant="multi", response_len=30)
    calls: list[list[list[int]]] = []

    def generate(prompts: list[list[int]], images: Any, num_generations: int, profiler: Any):
        calls.append(prompts)
        ids = [[7 + len(calls)] * 10 for _ in prompts]
        return prompts, ids, [[[-0.5]] * 10 for _ in prompts], None

    trainer = SimpleNamespace(use_vllm=True, num_generations=8, processing_class=tokenizer,
                              vllm_generation=SimpleNamespace(generate=generate))  # fmt: skip
    prompts = [[{"role": "user", "content": f"q{i}"}] for i in range(2)]
    out = turns.make_rollout_func(w)(prompts, trainer)
    obs = turns.observation_ids(tokenizer, peers("workload").tool_result_text())
    assert tokenizer.decode(obs).startswith("<|im_end|>")  # the cut turn's closing comes first
    for i in range(2):
        assert out["completion_ids"][i] == [8] * 10 + obs + [9] * 10 + obs + [10] * 10
        assert out["env_mask"][i] == ([1] * 10 + [0] * len(obs)) * 2 + [1] * 10
        assert out["logprobs"][i] == ([-0.5] * 10 + [0.0] * len(obs)) * 2 + [-0.5] * 10
        assert calls[2][i] == out["prompt_ids"][i] + out["completion_ids"][i][:-10]
