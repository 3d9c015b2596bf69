"""Resumable checkpoints of a PolicyWorker: sharded model + optimizer (DCP), step, scheduler,
and the RL run's own state (:class:`RunState`), each file checksummed and verified on load."""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from agentloop.checksums import file_sha256
from agentloop.errors import ConfigError
from agentloop.trainers.worker import PolicyWorker

if TYPE_CHECKING:
    from agentloop.trainers.rollouts import SourceState

__all__ = [
    "CHECKSUMS_FILE",
    "RESUME_FILE",
    "CheckpointError",
    "RngState",
    "RunState",
    "latest_checkpoint",
    "load_checkpoint",
    "resume_checkpoint",
    "save_checkpoint",
    "verify_checkpoint",
]

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d+)$")
_TRAINER_STATE = "trainer_state.pt"
CHECKSUMS_FILE = "checksums.json"
"""Written last into every checkpoint: each file's size and SHA-256."""
RESUME_FILE = "resume.json"
"""Written beside the step directories by :func:`resume_checkpoint`: what ``resume=auto`` chose
and which newer checkpoints it skipped as damaged, and why."""


class CheckpointError(ConfigError):
    """A checkpoint is damaged (a checksum mismatch, a missing or unreadable file); the message
    names the file."""


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
    lora = _lora_record(worker)
    model_sd, optim_sd = get_state_dict(worker.model, worker.optimizer, options=_options(worker))
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp)
    if worker.rank == 0:
        trainer_state = {
            "step": worker.step,
            "scheduler": worker.scheduler.state_dict(),
            "run_state": run_state,
            "lora": lora,
        }
        torch.save(trainer_state, tmp / _TRAINER_STATE)
        _write_checksums(tmp)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        if keep_last is not None:
            for old in _step_dirs(Path(root))[:-keep_last]:
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def load_checkpoint(
    worker: PolicyWorker, path: str | os.PathLike[str], *, allow_unverified: bool = False
) -> RunState | None:
    """Restore model, optimizer, scheduler and step from a :func:`save_checkpoint` directory,
    whatever the number of ranks that wrote it; collective. Returns the saved ``run_state``.

    Rank 0 first checks every file against the checkpoint's checksums; a damaged checkpoint (or
    an unreadable file) raises :class:`CheckpointError` naming the file, never a raw traceback
    from torch, and nothing is loaded. One without ``checksums.json`` is refused too unless
    ``allow_unverified`` (``checkpoint.allow_unverified``)."""
    path = Path(path)
    if not (path / _TRAINER_STATE).is_file():
        raise ConfigError(
            f"{str(path)!r} is not a complete checkpoint (no {_TRAINER_STATE}); pass a step_* "
            "directory written by save_checkpoint, or use latest_checkpoint(root)"
        )
    problem = _verified_on_rank0(worker, path, allow_unverified)
    if problem is not None:
        raise CheckpointError(problem)
    trainer_state = _read_trainer_state(path / _TRAINER_STATE)
    _check_lora(path, trainer_state.get("lora"), _lora_record(worker))
    options = _options(worker)
    model_sd, optim_sd = get_state_dict(worker.model, worker.optimizer, options=options)
    try:  # dcp.load fills these dicts in place, re-sharded for this world
        dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
    except Exception as exc:
        raise CheckpointError(
            f"checkpoint {path}: its model/optimizer shards (*.distcp, .metadata) cannot be "
            f"read: {type(exc).__name__}: {exc}; resume from another checkpoint"
        ) from exc
    set_state_dict(
        worker.model,
        worker.optimizer,
        model_state_dict=model_sd,
        optim_state_dict=optim_sd,
        options=options,
    )
    worker.step = int(trainer_state["step"])
    worker.scheduler.load_state_dict(trainer_state["scheduler"])
    run_state: RunState | None = trainer_state.get("run_state")
    return run_state


def verify_checkpoint(
    path: str | os.PathLike[str], *, allow_unverified: bool = False
) -> str | None:
    """None if every file of checkpoint ``path`` matches its checksum, else what is wrong,
    naming the file. A checkpoint without ``checksums.json`` (a copy that left it out, or one
    of an agentloop older than checksums) is refused unless ``allow_unverified``: then it
    passes with a warning. Checksums catch damage, not someone who also rewrites the manifest."""
    path = Path(path)
    manifest = path / CHECKSUMS_FILE
    if not manifest.is_file():
        if not allow_unverified:
            return (
                f"{manifest} is missing, so the checkpoint's files cannot be verified (a copy "
                f"that left it out, or an agentloop older than checksums wrote it); restore it, "
                "or load the checkpoint unverified with checkpoint.allow_unverified=true"
            )
        log.warning("checkpoint %s has no %s: not verified (allow_unverified)", path, manifest.name)
        return None
    try:
        files = json.loads(manifest.read_text())["files"]
        expected = {str(name): (int(f["size"]), str(f["sha256"])) for name, f in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{manifest} is unreadable ({type(exc).__name__}: {exc})"
    unlisted = sorted(
        p.relative_to(path).as_posix()
        for p in path.rglob("*")
        if p.is_file()
        and p.name != CHECKSUMS_FILE
        and p.relative_to(path).as_posix() not in expected
    )
    if unlisted:  # a file added after the save: torch would read it unchecked
        return f"{path / unlisted[0]} is not in {CHECKSUMS_FILE} (added after the checkpoint?)"
    for name, (size, digest) in sorted(expected.items()):
        file = path / name
        if not file.is_file():
            return f"{file} is missing"
        if file.stat().st_size != size:
            return f"{file} has {file.stat().st_size} bytes, its checksum record says {size}"
        if file_sha256(file) != digest:
            return f"{file} does not match its SHA-256 in {CHECKSUMS_FILE} (the file is damaged)"
    return None


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """The complete ``step_*`` directory with the highest step under ``root``, or None (not
    verified; :func:`resume_checkpoint` is what ``resume=auto`` uses)."""
    dirs = _step_dirs(Path(root))
    return dirs[-1] if dirs else None


def resume_checkpoint(
    root: str | os.PathLike[str], *, allow_unverified: bool = False
) -> Path | None:
    """The newest *intact* checkpoint under ``root`` for ``resume=auto``, or None when there is
    none at all.

    A newer checkpoint whose files fail their checksums is skipped, with a warning naming the
    file (so is one without ``checksums.json``, unless ``allow_unverified``); the choice and
    what was skipped are written to ``root/resume.json``, so the run's own
    records say which checkpoint it continued from and why. When every checkpoint is damaged it
    raises :class:`CheckpointError` (quietly starting over would throw the run's steps away)."""
    root = Path(root)
    skipped: list[dict[str, str]] = []
    chosen = None
    for path in reversed(_step_dirs(root)):
        problem = verify_checkpoint(path, allow_unverified=allow_unverified)
        if problem is None:
            chosen = path
            break
        log.warning("checkpoint %s is damaged (%s); falling back to an older one", path, problem)
        skipped.append({"path": str(path), "reason": problem})
    if skipped:
        chosen_name = str(chosen) if chosen else None
        record = {"chosen": chosen_name, "skipped": skipped, "time": time.time()}
        tmp = root / f".{RESUME_FILE}.{os.getpid()}"
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        tmp.replace(root / RESUME_FILE)
        if chosen is None:
            raise CheckpointError(
                f"every checkpoint under {root} is damaged (the newest: {skipped[0]['reason']}); "
                "restore one, or set checkpoint.resume=never to start over"
            )
        log.warning(
            "resume=auto: resuming from %s, %d damaged newer one(s) skipped",
            chosen_name,
            len(skipped),
        )
    return chosen


def _options(worker: PolicyWorker) -> StateDictOptions:
    """A LoRA policy's checkpoint holds the adapters and their optimiser state, not the frozen
    base (a resumed run loads that from ``model.path`` again)."""
    lora = worker.lora is not None
    return StateDictOptions(ignore_frozen_params=lora, strict=not lora)


def _lora_record(worker: PolicyWorker) -> dict[str, Any] | None:
    """What a LoRA checkpoint must match to load: the adapters' shape and the base's
    fingerprint (collective: the fingerprint reduces over the ranks)."""
    if worker.lora is None:
        return None
    cfg = worker.lora.cfg
    return {
        "rank": cfg.rank,
        "alpha": cfg.alpha,
        "targets": worker.lora.targets,
        "base_fingerprint": worker.base_fingerprint(),
    }


def _check_lora(path: Path, saved: dict[str, Any] | None, current: dict[str, Any] | None) -> None:
    """Refuse a checkpoint whose adapters (or their absence) or base model differ from the
    worker's, naming what differs and the fix."""
    if saved is None and current is None:
        return
    if saved is None or current is None:
        kind = "full fine-tuning" if saved is None else f"LoRA (rank {saved['rank']})"
        want = "actor.lora.rank=0" if saved is None else f"actor.lora.rank={saved['rank']}"
        raise CheckpointError(
            f"checkpoint {path} holds a {kind} policy but this worker is configured "
            f"{'with' if current is not None else 'without'} LoRA; set {want} to load it"
        )
    if saved["base_fingerprint"] != current["base_fingerprint"]:
        raise CheckpointError(
            f"checkpoint {path} holds LoRA adapters trained on another base model (fingerprint "
            f"{saved['base_fingerprint']}, this model's is {current['base_fingerprint']}); load "
            "it onto the base model it was trained from (the run's model.path)"
        )
    for key in ("rank", "alpha", "targets"):
        if saved[key] != current[key]:
            raise CheckpointError(
                f"checkpoint {path} has LoRA {key}={saved[key]!r} but this worker's is "
                f"{current[key]!r}; set actor.lora to the checkpoint's settings"
            )


def _write_checksums(directory: Path) -> None:
    files = {
        p.relative_to(directory).as_posix(): {"size": p.stat().st_size, "sha256": file_sha256(p)}
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != CHECKSUMS_FILE
    }
    manifest = {"algorithm": "sha256", "files": files}
    (directory / CHECKSUMS_FILE).write_text(json.dumps(manifest, indent=1) + "\n")


def _verified_on_rank0(worker: PolicyWorker, path: Path, allow_unverified: bool) -> str | None:
    """:func:`verify_checkpoint` on rank 0 (one read of the files), its verdict sent to all."""
    verdict = [
        verify_checkpoint(path, allow_unverified=allow_unverified) if worker.rank == 0 else None
    ]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(verdict, src=0)
    return verdict[0]


def _read_trainer_state(file: Path) -> dict[str, Any]:
    try:
        state = torch.load(file, weights_only=False)
    except Exception as exc:
        raise CheckpointError(
            f"{file} cannot be read ({type(exc).__name__}: {exc}); resume from another checkpoint"
        ) from exc
    if not isinstance(state, dict) or not {"step", "scheduler"} <= state.keys():
        raise CheckpointError(f"{file} is not a trainer state (no step/scheduler entries)")
    return state


def _step_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _STEP_DIR.match(p.name)) and (p / _TRAINER_STATE).is_file()
    ]
    return [p for _, p in sorted(found)]
