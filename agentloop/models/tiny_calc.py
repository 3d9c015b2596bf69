"""``model.path: tiny-calc``: the tiny model after the demo's cold-start SFT on Calc-v0, cached.

The random tiny model never solves a Calc task, so GRPO from it sees rewards of 0 and learns
nothing. ``tiny-calc`` is the demo's stages 2 and 3 (``trainers/configs/tiny_retool/``: the
scripted expert's traces, then ``sft.yaml``) with the shipped settings: it solves about one held-out
task in eight at temperature 1, so a GRPO group holds mixed rewards and the shipped example
(``grpo_calc_tiny.yaml``) visibly learns within a few steps.

It is cached next to the tiny model under a key of every setting that shapes it (the traces, the
SFT config, the base model), built on first use (about 6 minutes on two CPU cores), and
``agentloop demo`` with the shipped recipe publishes its own SFT model there, so after
``make demo`` it costs nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from agentloop.cache import cached_build
from agentloop.models.demo_config import DemoConfigs, load_demo_configs, make_demo_traces
from agentloop.models.tiny import tiny_model_dir

__all__ = ["publish_tiny_calc", "tiny_calc_dir", "tiny_calc_model_dir"]

_VERSION = 1  # bump when what the key cannot see changes (the trace generator, the SFT code)
#: Settings that do not change the model: where files go, how the traces' tool runs (the fake
#: and bubblewrap sandboxes give the same rows: tests/trainers/test_sft.py), progress output.
#: The base model's shape is in the SFT config's ``model.path`` already.
_DEMO_IGNORED = ("out_dir", "trace_sandbox", "threads", "min_gain", "hidden_size", "num_layers")


def _key(configs: DemoConfigs) -> str:
    demo = {k: v for k, v in dataclasses.asdict(configs.demo).items() if k not in _DEMO_IGNORED}
    sft = dataclasses.asdict(configs.sft)
    sft["data"].pop("train")
    sft["trainer"].pop("out_dir")
    sft.pop("logging")
    base = tiny_model_dir().name if sft["model"]["path"] == "tiny" else sft["model"]["path"]
    text = json.dumps([_VERSION, base, demo, sft], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def tiny_calc_dir(configs: DemoConfigs) -> Path:
    """Where the cold start of ``configs`` is cached (whether or not it is there yet)."""
    base = tiny_model_dir()
    return base.parent / f"{base.name}-calc-sft-{_key(configs)}"


def _copy_model(src: Path, dst: Path) -> None:
    for f in src.iterdir():
        if f.is_file():
            shutil.copy2(f, dst / f.name)


def tiny_calc_model_dir() -> Path:
    """The cached model dir of the shipped recipe's cold start, built on first use."""
    with tempfile.TemporaryDirectory() as tmp:  # the key ignores paths; any out_dir will do
        configs = load_demo_configs([f"demo.out_dir={tmp}", "demo.trace_sandbox=fake"])
        target = tiny_calc_dir(configs)
        if not (target / "model.safetensors").is_file():
            print(
                f"model.path=tiny-calc: building it once into {target} (the demo's traces and "
                f"cold-start SFT, {configs.sft.trainer.max_steps} steps: ~6 min on 2 CPU cores)",
                flush=True,
            )
        return cached_build(target, lambda out: _build(configs, out))


def _build(configs: DemoConfigs, out: Path) -> None:
    import torch

    from agentloop.models.names import resolve_model
    from agentloop.trainers.sft import run_sft

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(configs.demo.seed)  # as run_demo seeds its stages
        make_demo_traces(configs.demo, Path(configs.sft.data.train))
        result = run_sft(resolve_model(configs.sft))
    assert result.export_dir is not None, "the demo's sft.yaml exports its model"
    _copy_model(result.export_dir, out)


def publish_tiny_calc(configs: DemoConfigs, export_dir: Path) -> Path | None:
    """Copy the demo's SFT model into the ``tiny-calc`` cache when ``configs`` would build
    exactly it (the shipped recipe's settings); return where, or ``None`` if they differ."""
    with tempfile.TemporaryDirectory() as tmp:
        shipped = load_demo_configs([f"demo.out_dir={tmp}"])
    if _key(configs) != _key(shipped):
        return None
    return cached_build(tiny_calc_dir(configs), lambda out: _copy_model(export_dir, out))
