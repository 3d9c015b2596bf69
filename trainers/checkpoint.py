"""Resumable checkpoints of a PolicyWorker: sharded model + optimizer (DCP), step, scheduler,
and the RL run's own state (:class:`RunState`)."""

from __future__ import annotations

import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from agentloop.errors import ConfigError
from agentloop.trainers.worker import PolicyWorker

if TYPE_CHECKING:
    from agentloop.trainers.rollouts import SourceState

__all__ = ["RngState", "RunState", "latest_checkpoint", "load_checkpoint", "save_checkpoint"]

_STEP_DIR = re.compile(r"^step_(\d+)$")
_TRAINER_STATE = "trainer_state.pt"


@dataclass(frozen=True)
class RngState:
    """The driver's random generators (Python's and torch's CPU one)."""

    python: tuple[Any, ...]
    torch: torch.Tensor

    @classmethod
    def capture(cls) -> RngState:
        return cls(random.getstate(), torch.get_rng_state())

    def restore(self) -> None:
        random.setstate(self.python)
        torch.set_rng_state(self.torch)


@dataclass(frozen=True)
class RunState:
    """What an RL run saves beside the weights, so that a resumed run goes on where it stopped."""

    step: int
    """Steps trained: the policy version of the saved weights."""
    source: SourceState
    """Where the data order stands (the prompt sampler; async mode: the unconsumed groups)."""
    rng: RngState
    """The driver's random generators."""


def save_checkpoint(
    worker: PolicyWorker,
    root: str | os.PathLike[str],
    *,
    run_state: RunState | None = None,
    keep_last: int | None = None,
    step: int | None = None,
) -> Path:
    """Write ``root/step_NNNNNNNN`` and return it; collective.

    Model and optimizer state go through torch distributed checkpoint (DCP): every rank writes
    its own shards in parallel, and :func:`load_checkpoint` re-shards them for any number of
    ranks. Rank 0 adds the step, the LR scheduler and ``run_state`` (an RL run's data position
    and RNG states). The directory appears under its final name only when complete (written as
    ``.tmp``, then renamed), so a run killed mid-save resumes from the previous one. ``root`` must
    be one filesystem shared by all ranks. ``keep_last`` deletes older step directories.
    ``step`` names the directory (default: the worker's optimiser step; a recipe passes its own
    step counter when one step makes several optimiser updates).
    """
    if keep_last is not None and keep_last < 1:
        raise ConfigError(f"keep_last must be >= 1 (or None to keep all), got {keep_last}")
    final = Path(root) / f"step_{worker.step if step is None else step:08d}"
    tmp = final.with_name(final.name + ".tmp")
    if worker.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    model_sd, optim_sd = get_state_dict(worker.model, worker.optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp)
    if worker.rank == 0:
        trainer_state = {
            "step": worker.step,
            "scheduler": worker.scheduler.state_dict(),
            "run_state": run_state,
        }
        torch.save(trainer_state, tmp / _TRAINER_STATE)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        if keep_last is not None:
            for old in _step_dirs(Path(root))[:-keep_last]:
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def load_checkpoint(worker: PolicyWorker, path: str | os.PathLike[str]) -> RunState | None:
    """Restore model, optimizer, scheduler and step from a :func:`save_checkpoint` directory,
    whatever the number of ranks that wrote it; collective. Returns the saved ``run_state``."""
    path = Path(path)
    if not (path / _TRAINER_STATE).is_file():
        raise ConfigError(
            f"{str(path)!r} is not a complete checkpoint (no {_TRAINER_STATE}); pass a step_* "
            "directory written by save_checkpoint, or use latest_checkpoint(root)"
        )
    model_sd, optim_sd = get_state_dict(worker.model, worker.optimizer)
    # dcp.load fills these dicts in place, re-sharded for this world
    dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
    set_state_dict(
        worker.model, worker.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd
    )
    trainer_state = torch.load(path / _TRAINER_STATE, weights_only=False)
    worker.step = int(trainer_state["step"])
    worker.scheduler.load_state_dict(trainer_state["scheduler"])
    run_state: RunState | None = trainer_state.get("run_state")
    return run_state


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """The complete ``step_*`` directory with the highest step under ``root`` (for
    ``resume=auto``), or None."""
    dirs = _step_dirs(Path(root))
    return dirs[-1] if dirs else None


def _step_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _STEP_DIR.match(p.name)) and (p / _TRAINER_STATE).is_file()
    ]
    return [p for _, p in sorted(found)]
