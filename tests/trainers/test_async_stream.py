"""RolloutStream on scripted groups: capacity from the staleness bound, the wait and drop
policies, DAPO drops as groups arrive, resume state, and every wait ending at its deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

import pytest
from waits import eventually

from agentloop.errors import AgentLoopError, ConfigError
from agentloop.trainers.stream import RolloutStream, StreamSettings, group_min_version
from agentloop.types import StopReason, Task, Trajectory, TrajectoryGroup

P = 2  # groups per batch


def make_group(
    task: Task, version: int, rewards: tuple[float, ...] = (0.0, 1.0)
) -> TrajectoryGroup:
    """A group whose trajectories have 1 prompt token and 2 sampled tokens of ``version``."""
    trajs = tuple(
        Trajectory(
            task.id, (1, 2, 3), (0, 1, 1), (0.0, -0.5, -0.5), 1, r, StopReason.DONE,
            sample_index=i, versions=(-1, version, version),
        )
        for i, r in enumerate(rewards)
    )  # fmt: skip
    return TrajectoryGroup(task, trajs)


class Script:
    """Plays group ``i`` after ``delays[i]`` seconds (default 0), or when the test releases it
    (``gates``), tagged with the stream's engine version when it started; records the start and
    finish orders."""

    def __init__(
        self,
        delays: dict[int, float] | None = None,
        rewards: Callable[[int], tuple[float, ...]] | None = None,
        gates: Iterable[int] = (),
    ) -> None:
        self.delays = delays or {}
        self.rewards = rewards or (lambda i: (0.0, 1.0))
        self.gates = {i: asyncio.Event() for i in gates}
        self.started: list[int] = []
        self.finished: list[int] = []
        self.stream: RolloutStream | None = None
        self.tasks = (Task(f"t{i}") for i in range(10_000))

    def next_task(self) -> Task:
        return next(self.tasks)

    async def play(self, task: Task, index: int) -> TrajectoryGroup:
        assert self.stream is not None
        version = self.stream.version
        self.started.append(index)
        if index in self.gates:
            await self.gates[index].wait()
        else:
            await asyncio.sleep(self.delays.get(index, 0.0))
        self.finished.append(index)
        return make_group(task, version, self.rewards(index))


def stream(script: Script, **settings: object) -> RolloutStream:
    s = StreamSettings(**{"groups_per_batch": P, "max_staleness": 1, "timeout_s": 10.0, **settings})  # type: ignore[arg-type]
    script.stream = RolloutStream(s, next_task=script.next_task, play=script.play)
    return script.stream


async def test_capacity_follows_the_staleness_bound() -> None:
    script = Script()
    s = stream(script, max_staleness=0)
    s.start()
    await eventually(lambda: len(script.started) == 2)
    assert script.started == [0, 1]
    assert s.capacity() == 0  # (k + v + 1) · P = 2 groups at version 0, no more
    batch = await s.take(trainer_version=0)
    assert [g.task.id for g in batch.groups] == ["t0", "t1"]
    # taken but the weights are not pushed yet: still no room, nothing else started
    assert s.capacity() == 0 and script.started == [0, 1]
    s.set_version(1)
    await eventually(lambda: len(script.started) == 4)
    assert script.started == [0, 1, 2, 3] and s.capacity() == 0
    await s.close()


async def test_one_version_of_slack_starts_the_next_batch_early() -> None:
    script = Script()
    s = stream(script, max_staleness=1)
    s.start()
    await eventually(lambda: len(script.started) == 4)
    assert script.started == [0, 1, 2, 3] and s.capacity() == 0  # two batches' worth at v0
    await s.take(0)
    assert s.capacity() == 0 and len(script.started) == 4  # the next one needs version 1
    s.set_version(1)
    await eventually(lambda: len(script.started) == 6)
    assert s.capacity() == 0
    await s.close()


async def test_wait_policy_hands_groups_over_in_start_order() -> None:
    script = Script(delays={0: 0.3})  # group 0 is the slow tail
    s = stream(script, max_staleness=1)
    batch = await s.take(0)
    assert [g.task.id for g in batch.groups] == ["t0", "t1"]
    assert batch.metrics["async/wait_s"] >= 0.25
    await s.close()


async def test_drop_policy_hands_groups_over_as_they_finish_and_drops_stale_ones() -> None:
    script = Script(gates={0})  # group 0 (version 0) finishes late: when released below
    s = stream(script, max_staleness=1, policy="drop")
    batches = []
    for version in range(5):
        s.set_version(version)
        if version == 3:  # the trainer is now 3 versions past group 0's
            script.gates[0].set()
            await eventually(lambda: 0 in script.finished)
        batches.append(await s.take(version))
    ids = [g.task.id for b in batches for g in b.groups]
    assert ids[:2] == ["t1", "t2"]  # t0 did not hold the first batch up
    assert "t0" not in ids  # by the time it finished it was too old: dropped, and counted
    assert sum(b.metrics["async/dropped_stale_groups"] for b in batches) == 1
    for version, batch in enumerate(batches):
        assert all(version - group_min_version(g, -1) <= 1 for g in batch.groups)
    await s.close()


async def test_dynamic_sampling_drops_constant_groups_as_they_arrive() -> None:
    script = Script(rewards=lambda i: (1.0, 1.0) if i % 2 == 0 else (0.0, 1.0))
    s = stream(script, max_staleness=1, dynamic_sampling=True)
    batch = await s.take(0)
    assert all(len(set(g.rewards_G)) > 1 for g in batch.groups)
    assert [g.task.id for g in batch.groups] == ["t1", "t3"]
    assert batch.metrics["rollout/dropped_groups"] == 2  # t0 and t2, replaced by t4, t5 ...
    await s.close()


async def test_dynamic_sampling_gives_up_after_its_cap() -> None:
    script = Script(rewards=lambda i: (0.0, 0.0))
    s = stream(script, dynamic_sampling=True, max_dropped_per_batch=6)
    with pytest.raises(ConfigError, match="max_sampling_rounds"):
        await s.take(0)
    await s.close()


async def test_a_failing_rollout_side_stops_the_trainer_with_its_error() -> None:
    script = Script()

    async def broken(task: Task, index: int) -> TrajectoryGroup:
        raise RuntimeError("engine pool gone")

    s = stream(script)
    s._play = broken
    with pytest.raises(AgentLoopError, match="engine pool gone"):
        await s.take(0)
    await s.close()


async def test_waiting_for_a_batch_has_a_deadline() -> None:
    script = Script(delays={0: 30.0})
    s = stream(script, timeout_s=0.3)
    with pytest.raises(AgentLoopError, match=r"batch_timeout_s=0\.3"):
        await s.take(0)
    await s.close()  # cancels the stuck group
    assert all(e.job is None or e.job.done() for e in s._entries.values())


async def test_state_dict_keeps_finished_groups_and_replays_running_tasks() -> None:
    script = Script(delays={3: 30.0})
    s = stream(script, max_staleness=1)
    await s.take(0)  # t0, t1 taken; t2 finished; t3 running
    await eventually(lambda: 2 in script.finished)
    state = s.state_dict()
    await s.close()
    assert [g["task"]["id"] for g in state["groups"]] == ["t2"]
    assert [t["id"] for t in state["tasks"]] == ["t3"]

    resumed_script = Script()
    resumed_script.tasks = (Task(f"n{i}") for i in range(100))
    r = stream(resumed_script, max_staleness=1)
    r.load_state_dict(state)
    r.set_version(1)
    batch = await r.take(1)
    assert [g.task.id for g in batch.groups] == ["t2", "t3"]  # kept group first, then replayed
    assert (
        batch.metrics["async/restored_groups"] == 1 and batch.metrics["async/requeued_tasks"] == 1
    )
    assert group_min_version(batch.groups[0], -1) == 0  # its recorded versions survived
    await r.close()


async def test_a_half_taken_batch_frees_no_capacity() -> None:
    script = Script(delays={1: 0.3})  # the trainer holds group 0 while it waits for group 1
    s = stream(script, max_staleness=0)
    await s.take(0)
    assert script.started == [0, 1]  # nothing started at version 0 beyond the bound
    await s.close()
