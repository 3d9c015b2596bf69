"""RolloutStream: groups played beside the trainer into a bounded buffer, with staleness control.

The rollout side starts one group (``n`` episodes of one task) at a time, as long as two budgets
allow it: ``max_groups_in_flight`` running groups, and the staleness capacity — with ``k =
max_staleness``, ``P`` groups per batch and the engines at policy version ``v``, at most ``(k + v
+ 1) · P`` groups are ever started and not dropped, trained ones included. A group started when
the engines held version ``v`` is therefore at most ``k`` versions older than the trainer that
takes it in start order (policy ``wait``). Policy ``drop`` hands groups over as they finish
(a slow group does not hold up the ones behind it) and drops, counting them, those whose oldest
token is more than ``k`` versions behind the trainer. DAPO dynamic sampling drops a group whose
samples all score the same as soon as it finishes; the rollout side starts another in its place.

Every wait has a deadline; an error on the rollout side is raised to the trainer, and closing the
stream cancels what runs. :meth:`RolloutStream.state_dict` gives the finished groups not yet
trained (kept whole) and the tasks of running groups (played again from the start after a resume).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agentloop.errors import AgentLoopError, ConfigError
from agentloop.io import trajectory_from_dict, trajectory_to_dict
from agentloop.trainers.dapo import filter_groups
from agentloop.types import Task, TrajectoryGroup

__all__ = ["RolloutStream", "StreamBatch", "StreamSettings", "group_min_version"]

log = logging.getLogger(__name__)
_CLOSE_TIMEOUT_S = 60.0

PlayGroup = Callable[[Task, int], Awaitable[TrajectoryGroup]]


@dataclass(frozen=True)
class StreamSettings:
    """``groups_per_batch`` P, ``max_staleness`` k (policy versions), ``policy`` ``wait`` or
    ``drop``, ``max_groups_in_flight``, ``timeout_s`` (the trainer's deadline per batch),
    DAPO ``dynamic_sampling`` on ``filter_metric`` with at most ``max_dropped_per_batch``
    dropped groups per batch (0: no cap)."""

    groups_per_batch: int
    max_staleness: int
    policy: str = "wait"
    max_groups_in_flight: int = 8
    timeout_s: float = 3600.0
    dynamic_sampling: bool = False
    filter_metric: str = "reward"
    max_dropped_per_batch: int = 0

    def __post_init__(self) -> None:
        if self.policy not in ("wait", "drop"):
            raise ConfigError(f"stream policy {self.policy!r} must be 'wait' or 'drop'")
        if self.groups_per_batch < 1 or self.max_groups_in_flight < 1 or self.max_staleness < 0:
            raise ConfigError(
                f"stream needs groups_per_batch >= 1, max_groups_in_flight >= 1 and "
                f"max_staleness >= 0, got {self.groups_per_batch}, "
                f"{self.max_groups_in_flight}, {self.max_staleness}"
            )


@dataclass(frozen=True)
class StreamBatch:
    """The groups of one batch (in the order taken) and what the stream did to gather them."""

    groups: tuple[TrajectoryGroup, ...]
    metrics: dict[str, float]


@dataclass
class _Entry:
    index: int  # start order
    task: Task
    start_version: int
    group: TrajectoryGroup | None = None
    job: asyncio.Task[None] | None = None
    restored: bool = False


def group_min_version(group: TrajectoryGroup, default: int) -> int:
    """The oldest policy version among the group's trained tokens (``default`` if unknown)."""
    versions = [v for t in group.trajectories for v in t.trained_versions]
    return min(versions) if versions else default


@dataclass
class _Counters:
    dropped_zero_var: int = 0
    dropped_stale: int = 0
    requeued: int = 0


class RolloutStream:
    """See the module docstring. ``next_task()`` draws a prompt; ``play(task, index)`` plays its
    group (``index``: the start order, for seeding). ``version`` is the engines' policy version
    and ``consumed`` the groups trained so far (a resumed run: ``step · P``)."""

    def __init__(
        self,
        settings: StreamSettings,
        *,
        next_task: Callable[[], Task],
        play: PlayGroup,
        version: int = 0,
        consumed: int = 0,
    ) -> None:
        self.settings = settings
        self._next_task, self._play = next_task, play
        self._version, self._consumed, self._started = version, consumed, 0
        self._entries: dict[int, _Entry] = {}  # started, not yet taken or dropped
        self._ready: collections.deque[int] = collections.deque()  # finished, in finish order
        self._requeue: collections.deque[Task] = collections.deque()
        self._counters = _Counters()
        self._changed = asyncio.Event()
        self._producer: asyncio.Task[None] | None = None
        self._error: BaseException | None = None

    # ------------------------------------------------------------------ rollout side
    @property
    def version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        """The engines now hold policy ``version``: the capacity grows by P per version."""
        self._version = version
        self._changed.set()

    def capacity(self) -> int:
        """How many more groups may start under the staleness bound."""
        s = self.settings
        bound = (s.max_staleness + self._version + 1) * s.groups_per_batch
        return bound - self._consumed - len(self._entries)

    def running(self) -> int:
        return sum(1 for e in self._entries.values() if e.group is None)

    def start(self) -> None:
        """Start the rollout side (a task on the running event loop)."""
        if self._producer is None:
            self._producer = asyncio.create_task(self._produce(), name="rollout-stream")

    async def _produce(self) -> None:
        try:
            while True:
                while self.capacity() <= 0 or self.running() >= self.settings.max_groups_in_flight:
                    self._changed.clear()
                    await self._changed.wait()
                task = self._requeue.popleft() if self._requeue else self._next_task()
                entry = _Entry(self._started, task, self._version)
                self._started += 1
                self._entries[entry.index] = entry
                entry.job = asyncio.create_task(self._run(entry), name=f"group-{entry.index}")
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # surfaced to the trainer's next take()
            self._error = exc
            self._changed.set()

    async def _run(self, entry: _Entry) -> None:
        try:
            group = await self._play(entry.task, entry.index)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._error = exc
            self._changed.set()
            return
        if self.settings.dynamic_sampling:
            kept, _ = filter_groups([group], metric=self.settings.filter_metric)
            if not kept:
                self._counters.dropped_zero_var += 1
                del self._entries[entry.index]
                self._changed.set()
                return
        entry.group = group
        self._ready.append(entry.index)
        self._changed.set()

    # ------------------------------------------------------------------ trainer side
    async def take(self, trainer_version: int) -> StreamBatch:
        """The next ``groups_per_batch`` groups for a trainer at ``trainer_version`` (waits for
        them, up to ``timeout_s``)."""
        if self._producer is None:
            self.start()
        t0 = time.perf_counter()
        picked: list[_Entry] = []
        try:
            async with asyncio.timeout(self.settings.timeout_s):
                while len(picked) < self.settings.groups_per_batch:
                    self._check()
                    entry = self._pick()
                    if entry is None:
                        self._changed.clear()
                        await self._changed.wait()
                        continue
                    self._remove(entry)
                    if trainer_version - self._min_version(entry) > self.settings.max_staleness:
                        self._counters.dropped_stale += 1
                        self._changed.set()
                        continue
                    picked.append(entry)
                    self._consumed += 1  # now, not at the end: a half-taken batch frees no room
        except TimeoutError:
            raise AgentLoopError(
                f"the trainer waited trainer.batch_timeout_s={self.settings.timeout_s} s for a "
                f"batch and got {len(picked)} of {self.settings.groups_per_batch} groups "
                f"({self.running()} running, {len(self._ready)} finished); the rollout side is "
                "stuck or too slow: check the engines, or raise trainer.batch_timeout_s"
            ) from None
        self._changed.set()
        return StreamBatch(
            tuple(e.group for e in picked if e.group is not None),
            self._batch_metrics(picked, trainer_version, time.perf_counter() - t0),
        )

    def _check(self) -> None:
        if self._error is not None:
            raise AgentLoopError(
                f"the rollout side failed: {type(self._error).__name__}: {self._error}"
            ) from self._error
        cap = self.settings.max_dropped_per_batch
        if cap and self._counters.dropped_zero_var > cap:
            raise ConfigError(
                f"dynamic sampling dropped {self._counters.dropped_zero_var} groups with constant "
                f"{self.settings.filter_metric} while gathering one batch of "
                f"{self.settings.groups_per_batch} (cap {cap} = max_sampling_rounds × "
                "prompts_per_step); the data are too easy or too hard for the model: raise "
                "algorithm.max_sampling_rounds, filter the dataset, or, for a model that earns "
                "no reward (model.path=tiny), set algorithm.dynamic_sampling=false"
            )

    def _pick(self) -> _Entry | None:
        if self.settings.policy == "drop":
            return self._entries[self._ready[0]] if self._ready else None
        if not self._entries:
            return None
        head = self._entries[min(self._entries)]
        return head if head.group is not None else None

    def _remove(self, entry: _Entry) -> None:
        del self._entries[entry.index]
        self._ready.remove(entry.index)

    def _min_version(self, entry: _Entry) -> int:
        assert entry.group is not None
        return group_min_version(entry.group, entry.start_version)

    def _batch_metrics(self, picked: list[_Entry], version: int, wait_s: float) -> dict[str, float]:
        c = self._counters
        out = {
            "async/wait_s": wait_s,
            "async/engine_version": float(self._version),
            "async/finished_groups": float(len(self._ready)),
            "async/running_groups": float(self.running()),
            "async/capacity": float(self.capacity()),
            "async/dropped_stale_groups": float(c.dropped_stale),
            "async/start_lag_mean": sum(version - e.start_version for e in picked) / len(picked),
            "rollout/dropped_groups": float(c.dropped_zero_var),
        }
        restored = sum(e.restored for e in picked)
        if restored or c.requeued:  # after a resume: kept groups trained, running tasks replayed
            out["async/restored_groups"] = float(restored)
            out["async/requeued_tasks"] = float(c.requeued)
        self._counters = _Counters()
        return out

    # ------------------------------------------------------------------ resume and shutdown
    def state_dict(self) -> dict[str, Any]:
        """Finished groups not yet trained (with their start versions) and the tasks of the
        running groups, in start order: what a resumed run continues with."""
        entries = [self._entries[i] for i in sorted(self._entries)]
        return {
            "started": self._started,
            "groups": [_group_record(e) for e in entries if e.group is not None],
            "tasks": [_task_record(e.task) for e in entries if e.group is None]
            + [_task_record(t) for t in self._requeue],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`: its groups are taken first, its tasks played first.
        Call before :meth:`start`."""
        self._started = int(state.get("started", 0))
        records = list(state.get("groups", ()))
        for i, record in enumerate(records):  # before anything started after the resume
            trajectories = tuple(trajectory_from_dict(t) for t in record["trajectories"])
            task = Task(record["task"]["id"], record["task"]["data"])
            group = TrajectoryGroup(task, trajectories)
            entry = _Entry(i - len(records), task, int(record["start_version"]), group)
            entry.restored = True
            self._entries[entry.index] = entry
            self._ready.append(entry.index)
        self._requeue.extend(Task(t["id"], t["data"]) for t in state.get("tasks", ()))
        self._counters.requeued = len(self._requeue)

    async def close(self) -> None:
        """Cancel the rollout side and every running group (waiting up to a minute)."""
        jobs = [e.job for e in self._entries.values() if e.job is not None and not e.job.done()]
        if self._producer is not None:
            jobs.append(self._producer)
        for job in jobs:
            job.cancel()
        if jobs:
            _, pending = await asyncio.wait(jobs, timeout=_CLOSE_TIMEOUT_S)
            if pending:
                log.warning(
                    "%d rollout tasks did not stop within %.0f s", len(pending), _CLOSE_TIMEOUT_S
                )
        self._producer = None


def _task_record(task: Task) -> dict[str, Any]:
    return {"id": task.id, "data": dict(task.data)}


def _group_record(entry: _Entry) -> dict[str, Any]:
    assert entry.group is not None
    return {
        "task": _task_record(entry.task),
        "start_version": entry.start_version,
        "trajectories": [trajectory_to_dict(t) for t in entry.group.trajectories],
    }
