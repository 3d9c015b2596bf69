"""Checkpoints carry checksums: damage is caught on load, resume=auto falls back and says so."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from tiny_models import tiny_qwen2_config

from agentloop.trainers.checkpoint import (
    CHECKSUMS_FILE,
    RESUME_FILE,
    CheckpointError,
    load_checkpoint,
    resume_checkpoint,
    save_checkpoint,
)
from agentloop.trainers.dist import init_distributed
from agentloop.trainers.worker import PolicyWorker, WorkerConfig


@pytest.fixture(scope="module", autouse=True)
def _world_of_one() -> Iterator[None]:
    created = init_distributed()
    yield
    if created:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def worker() -> PolicyWorker:
    return PolicyWorker(tiny_qwen2_config(), WorkerConfig(lr=1e-3, device="cpu"))


def flip_a_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def a_shard(checkpoint: Path) -> Path:
    return sorted(checkpoint.glob("*.distcp"))[0]


def test_a_bit_flip_in_a_shard_is_caught_on_load(worker: PolicyWorker, tmp_path: Path) -> None:
    path = save_checkpoint(worker, tmp_path, step=1)
    manifest = json.loads((path / CHECKSUMS_FILE).read_text())["files"]
    assert a_shard(path).name in manifest and "trainer_state.pt" in manifest
    load_checkpoint(worker, path)  # intact: loads
    flip_a_bit(a_shard(path))
    before = {n: p.full_tensor().clone() for n, p in worker.model.named_parameters()}
    with pytest.raises(CheckpointError, match=rf"{a_shard(path).name} does not match its SHA-256"):
        load_checkpoint(worker, path)
    for n, p in worker.model.named_parameters():  # nothing was loaded from the damaged files
        assert torch.equal(p.full_tensor(), before[n])


def test_resume_auto_falls_back_to_the_newest_intact_checkpoint(
    worker: PolicyWorker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = save_checkpoint(worker, tmp_path, step=1)
    newest = save_checkpoint(worker, tmp_path, step=2)
    assert resume_checkpoint(tmp_path) == newest and not (tmp_path / RESUME_FILE).exists()
    flip_a_bit(newest / "trainer_state.pt")
    with caplog.at_level("WARNING", logger="agentloop.trainers.checkpoint"):
        assert resume_checkpoint(tmp_path) == first
    assert "step_00000002 is damaged" in caplog.text and "resuming from" in caplog.text
    record = json.loads((tmp_path / RESUME_FILE).read_text())
    assert record["chosen"] == str(first)
    (skipped,) = record["skipped"]
    assert skipped["path"] == str(newest) and "trainer_state.pt" in skipped["reason"]
    flip_a_bit(a_shard(first))  # none intact: an error, not a silent start from scratch
    with pytest.raises(CheckpointError, match=r"every checkpoint under .* is damaged"):
        resume_checkpoint(tmp_path)


def test_other_damage_is_a_clean_error_naming_the_file(
    worker: PolicyWorker, tmp_path: Path
) -> None:
    path = save_checkpoint(worker, tmp_path / "a", step=1)
    (path / CHECKSUMS_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match=rf"{CHECKSUMS_FILE} is unreadable"):
        load_checkpoint(worker, path)

    path = save_checkpoint(worker, tmp_path / "b", step=1)
    (path / "__extra.distcp").write_bytes(a_shard(path).read_bytes())  # added after the save
    with pytest.raises(CheckpointError, match=rf"__extra\.distcp is not in {CHECKSUMS_FILE}"):
        load_checkpoint(worker, path)
    (path / "__extra.distcp").unlink()
    a_shard(path).unlink()
    with pytest.raises(CheckpointError, match=r"\.distcp is missing"):
        load_checkpoint(worker, path)

    # a checkpoint from before checksums, loaded unverified on request: a truncated file is
    # still named, not a torch traceback
    path = save_checkpoint(worker, tmp_path / "c", step=1)
    (path / CHECKSUMS_FILE).unlink()
    state = path / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=r"trainer_state\.pt cannot be read"):
        load_checkpoint(worker, path, allow_unverified=True)


def test_a_checkpoint_without_its_manifest_is_refused_unless_allowed(
    worker: PolicyWorker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A deleted checksums.json does not switch verification off: a bit-flipped shard with no
    manifest is refused by name (resume=auto falls back to the older verified checkpoint);
    ``allow_unverified`` (checkpoint.allow_unverified=true) loads it, with a warning."""
    first = save_checkpoint(worker, tmp_path, step=1)
    newest = save_checkpoint(worker, tmp_path, step=2)
    flip_a_bit(a_shard(newest))
    (newest / CHECKSUMS_FILE).unlink()
    fix = r"checkpoint\.allow_unverified=true"
    with pytest.raises(CheckpointError, match=rf"{CHECKSUMS_FILE} is missing.*{fix}"):
        load_checkpoint(worker, newest)
    assert resume_checkpoint(tmp_path) == first
    (skipped,) = json.loads((tmp_path / RESUME_FILE).read_text())["skipped"]
    assert skipped["path"] == str(newest) and f"{CHECKSUMS_FILE} is missing" in skipped["reason"]
    with caplog.at_level("WARNING", logger="agentloop.trainers.checkpoint"):
        assert resume_checkpoint(tmp_path, allow_unverified=True) == newest
    assert "not verified" in caplog.text
    (first / CHECKSUMS_FILE).unlink()
    with pytest.raises(CheckpointError, match=r"every checkpoint under .* is damaged"):
        resume_checkpoint(tmp_path)


def test_the_opt_out_is_a_config_key() -> None:
    from agentloop.trainers.config import CheckpointConfig, TrainConfig, load_config

    assert CheckpointConfig().allow_unverified is False
    cfg = load_config(TrainConfig, None, ["checkpoint.allow_unverified=true"])
    assert cfg.checkpoint.allow_unverified is True
