"""Training data: a resumable seeded prompt sampler, and each step's batch saved for replay."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentloop.errors import ConfigError
from agentloop.io import iter_jsonl, trajectory_from_dict, trajectory_to_dict
from agentloop.types import Task, TrajectoryGroup

__all__ = ["PromptSampler", "read_step_groups", "step_file", "write_step_groups"]


class PromptSampler:
    """Prompts in epochs: each epoch is a fresh permutation of ``tasks`` drawn from
    ``(seed, epoch)`` alone, so the order after a resume is the order without one.

    The state is two integers (:meth:`state_dict`); a batch that crosses the end of an epoch
    continues into the next one.
    """

    def __init__(self, tasks: Sequence[Task], *, seed: int = 0, shuffle: bool = True) -> None:
        if not tasks:
            raise ConfigError(
                "the training split has no tasks; check data.env and data.train_split"
            )
        self.tasks = list(tasks)
        self.seed, self.shuffle = seed, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.tasks)))
        if self.shuffle:
            random.Random(f"{self.seed}/{epoch}").shuffle(order)
        return order

    def next_batch(self, size: int) -> list[Task]:
        """The next ``size`` tasks."""
        out = []
        for _ in range(size):
            if self.position == len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            out.append(self.tasks[self._order[self.position]])
            self.position += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "num_tasks": len(self.tasks)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["num_tasks"] != len(self.tasks):
            raise ConfigError(
                f"the checkpoint's sampler walked {state['num_tasks']} tasks, this run has "
                f"{len(self.tasks)}; resume with the same data.* settings, or with "
                "checkpoint.resume=never"
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._permutation(self.epoch)


def step_file(root: str | os.PathLike[str], step: int) -> Path:
    """``root/step_NNNNNN.jsonl``: where step ``step``'s batch is saved."""
    return Path(root) / f"step_{step:06d}.jsonl"


def write_step_groups(
    root: str | os.PathLike[str], step: int, groups: Sequence[TrajectoryGroup], env_id: str
) -> Path:
    """Save the groups one step trained on, in the eval JSONL format plus ``step``, ``group``
    and ``task`` (the task's data), so :func:`read_step_groups` rebuilds them exactly. The file
    is written whole, then renamed: a kill never leaves half a step."""
    path = step_file(root, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        for gi, g in enumerate(groups):
            for t in g.trajectories:
                record = {
                    **trajectory_to_dict(t),
                    "env": env_id,
                    "step": step,
                    "group": gi,
                    "task": dict(g.task.data),
                }
                f.write(json.dumps(record) + "\n")
    tmp.replace(path)
    return path


def read_step_groups(root: str | os.PathLike[str], step: int) -> list[TrajectoryGroup]:
    """The groups :func:`write_step_groups` saved for ``step``, in their original order."""
    path = step_file(root, step)
    if not path.is_file():
        raise ConfigError(
            f"rollout.replay: {path} does not exist; replay needs one file per step, so set "
            "trainer.total_steps to at most the number of recorded steps"
        )
    by_group: dict[int, list[Any]] = {}
    tasks: dict[int, Task] = {}
    for record in iter_jsonl(path):
        gi = int(record["group"])
        by_group.setdefault(gi, []).append(trajectory_from_dict(record))
        tasks[gi] = Task(id=record["task_id"], data=record.get("task") or {})
    return [TrajectoryGroup(tasks[gi], tuple(by_group[gi])) for gi in sorted(by_group)]
