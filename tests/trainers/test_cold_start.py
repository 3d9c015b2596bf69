"""``model.path: tiny-calc``: the demo's cold-start SFT, cached under a key of what shapes it.

No model is trained here: the demo test (tests/recipes/test_demo.py) trains the real one, and
tests/trainers/test_example_config.py runs the example config from what the demo published.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentloop.models import resolve_model_path
from agentloop.models.cold_start import _key, cached_cold_start, publish_cold_start
from agentloop.models.demo import load_demo_configs
from agentloop.models.tiny import ENV_VAR, tiny_model_dir


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private model cache holding (a link to) the tiny model: tiny-calc goes beside it."""
    root = tmp_path / "cache"
    root.mkdir()
    (root / tiny_model_dir().name).symlink_to(tiny_model_dir())
    monkeypatch.setenv(ENV_VAR, str(root / tiny_model_dir().name))
    return root


def test_the_key_sees_what_shapes_the_model_and_nothing_else(tmp_path: Path) -> None:
    shipped = _key(load_demo_configs([f"demo.out_dir={tmp_path}"]))
    same = ["demo.out_dir=/elsewhere", "demo.trace_sandbox=fake", "demo.threads=1",
            "sft.logging.progress=false", "demo.min_gain=0.5",
            "demo.cached_cold_start=true"]  # fmt: skip
    assert _key(load_demo_configs(same)) == shipped
    for other in ("sft.trainer.max_steps=10", "demo.num_traces=10", "sft.actor.lr=1e-4"):
        assert _key(load_demo_configs([f"demo.out_dir={tmp_path}", other])) != shipped, other


def test_the_demo_publishes_its_sft_as_tiny_calc_only_with_the_shipped_settings(
    cache: Path, tmp_path: Path
) -> None:
    export = tmp_path / "export"
    export.mkdir()
    (export / "model.safetensors").write_bytes(b"weights")
    (export / "config.json").write_text("{}")
    shorter = load_demo_configs([f"demo.out_dir={tmp_path}", "sft.trainer.max_steps=10"])
    assert publish_cold_start(shorter, export) is None
    assert not list(cache.glob("*-retool-sft-*"))
    shipped = load_demo_configs([f"demo.out_dir={tmp_path}", "demo.trace_sandbox=fake"])
    published = publish_cold_start(shipped, export)
    assert published is not None and published.parent == cache
    assert (published / "model.safetensors").read_bytes() == b"weights"
    # the name resolves to it, with nothing built
    assert resolve_model_path("tiny-calc") == published


def test_a_cached_cold_start_is_found_with_the_record_of_its_sft_run(
    cache: Path, tmp_path: Path
) -> None:
    from agentloop.trainers.sft import SFTResult

    export = tmp_path / "export"
    export.mkdir()
    (export / "model.safetensors").write_bytes(b"weights")
    shipped = load_demo_configs([f"demo.out_dir={tmp_path}"], recipe="search_r1")
    assert cached_cold_start(shipped) is None
    sft = SFTResult(tmp_path / "sft", 350, 0.05, 2.5, 0.04, export)
    published = publish_cold_start(shipped, export, sft)
    found = cached_cold_start(shipped)
    assert found is not None and found[0] == published
    assert found[1] == SFTResult(tmp_path / "sft", 350, 0.05, 2.5, 0.04, published)
    # other settings train another model: nothing cached for them
    shorter = load_demo_configs([f"demo.out_dir={tmp_path}", "sft.trainer.max_steps=10"],
                                recipe="search_r1")  # fmt: skip
    assert cached_cold_start(shorter) is None
