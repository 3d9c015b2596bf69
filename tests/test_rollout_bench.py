"""bench/rollout_throughput.py's fair ceiling replays the loop's turns: each turn's sampled run is
found in the loss mask, so the replay asks for the same lengths after the same observations."""

from __future__ import annotations

from bench_scripts import load_bench

from agentloop.types import StopReason, Trajectory


def test_the_replay_finds_each_turns_sampled_tokens_between_the_observations() -> None:
    bench = load_bench("rollout_throughput")
    # prompt (3), turn 1 samples 2, observation (4), turn 2 samples 3, a final observation (1)
    mask = (0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0)
    traj = Trajectory(
        task_id="t", token_ids=tuple(range(len(mask))), loss_mask=mask,
        logprobs=(0.0,) * len(mask), prompt_len=3, reward=1.0, stop_reason=StopReason.DONE,
    )  # fmt: skip
    assert bench.sampled_runs(traj) == [(3, 2), (9, 3)]
