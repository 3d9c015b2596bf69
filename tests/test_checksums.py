"""model_fingerprint: changes when weights are replaced in place, not when they are copied."""

from __future__ import annotations

import shutil
from pathlib import Path

from agentloop.checksums import file_sha256, model_fingerprint


def write_model(root: Path, weights: bytes) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"model_type": "qwen2"}')
    (root / "model.safetensors").write_bytes(weights)
    (root / "README.md").write_text("not part of the model")
    return root


def test_fingerprint_follows_the_files_contents(tmp_path: Path) -> None:
    model = write_model(tmp_path / "m", bytes(range(256)) * 64)
    before = model_fingerprint(model)
    assert before is not None and len(before) == 16
    copy = tmp_path / "copy"
    shutil.copytree(model, copy)  # new timestamps, same bytes
    assert model_fingerprint(copy) == before
    (model / "README.md").write_text("edited")  # not a model file
    assert model_fingerprint(model) == before
    data = bytearray((model / "model.safetensors").read_bytes())
    data[9_000] ^= 1  # one bit of one weight, in the middle
    (model / "model.safetensors").write_bytes(bytes(data))
    assert model_fingerprint(model) != before


def test_no_fingerprint_for_a_served_model_name(tmp_path: Path) -> None:
    assert model_fingerprint("Qwen/Qwen2.5-0.5B") is None
    assert model_fingerprint(tmp_path / "missing") is None


def test_file_sha256(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"abc")
    assert file_sha256(f) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
