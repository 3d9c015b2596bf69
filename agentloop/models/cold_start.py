"""The demo families' cold-start SFT models by name (``model.path: tiny-calc``), cached.

A random tiny model never solves a task, so GRPO from it sees rewards of 0 and learns nothing.
``tiny-calc`` is the ReTool demo's stages 2 and 3 (``trainers/configs/tiny_retool/``: the scripted
expert's traces, then ``sft.yaml``) with the shipped settings: it solves about one held-out task
in eight at temperature 1, so a GRPO group holds mixed rewards and the shipped example
(``grpo_calc_tiny.yaml``) visibly learns within a few steps. Every demo family names its cold
start so (:attr:`~agentloop.models.demo_config.DemoFamily.model_name`).

Each is cached next to the tiny model under a key of every setting that shapes it (the family,
its traces, the SFT config, the base model), built on first use (minutes on two CPU cores), and
``agentloop demo`` with a shipped recipe publishes its own SFT model there, so after the demo it
costs nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentloop.cache import cached_build
from agentloop.models.demo_config import DemoConfigs, DemoFamily, load_family_configs
from agentloop.models.demo_recipes import family_named
from agentloop.models.tiny import tiny_model_dir

if TYPE_CHECKING:
    from agentloop.trainers.sft import SFTResult

__all__ = ["cached_cold_start", "cold_start_dir", "cold_start_model_dir", "publish_cold_start"]

_VERSION = 2  # bump when what the key cannot see changes (the trace generators, the SFT code)
#: Settings of every family that do not change the model: where files go, threads, the bar,
#: whether the demo reuses the cached model.
_DEMO_IGNORED = ("out_dir", "threads", "min_gain", "cached_cold_start")
#: The record of the SFT run that made a cached model, beside it (``SFTResult`` as JSON).
_RECORD = "sft_result.json"


def _key(configs: DemoConfigs[Any]) -> str:
    ignored = (*_DEMO_IGNORED, *configs.family.cache_ignored)
    demo = {k: v for k, v in dataclasses.asdict(configs.demo).items() if k not in ignored}
    sft = dataclasses.asdict(configs.sft)
    sft["data"].pop("train")
    sft["trainer"].pop("out_dir")
    sft.pop("logging")
    base = tiny_model_dir().name if sft["model"]["path"] == "tiny" else sft["model"]["path"]
    text = json.dumps([_VERSION, base, demo, sft], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def cold_start_dir(configs: DemoConfigs[Any]) -> Path:
    """Where the cold start of ``configs`` is cached (whether or not it is there yet)."""
    base = tiny_model_dir()
    return base.parent / f"{base.name}-{configs.family.name}-sft-{_key(configs)}"


def _copy_model(src: Path, dst: Path, sft: SFTResult | None = None) -> None:
    for f in src.iterdir():
        if f.is_file():
            shutil.copy2(f, dst / f.name)
    if sft is not None:
        (dst / _RECORD).write_text(json.dumps(dataclasses.asdict(sft), indent=1, default=str))


def _read_record(model: Path, configs: DemoConfigs[Any]) -> SFTResult:
    """The SFT record cached beside ``model``; a cache without one (written before records
    were kept) reads as the config's step count with no losses known."""
    from agentloop.trainers.sft import SFTResult

    path = model / _RECORD
    if not path.is_file():
        steps = configs.sft.trainer.max_steps or 0
        return SFTResult(model, steps, float("nan"), None, None, model)
    data = json.loads(path.read_text())
    return SFTResult(
        Path(data["out_dir"]),
        int(data["steps"]),
        float(data["train_loss"]),
        data["eval_loss_before"],
        data["eval_loss_after"],
        model,
    )


def cached_cold_start(configs: DemoConfigs[Any]) -> tuple[Path, SFTResult] | None:
    """The cold start ``configs`` would train, if it is cached (the demo published it, or its
    named model was built): its model dir and the record of the SFT run that made it."""
    target = cold_start_dir(configs)
    if not (target / "model.safetensors").is_file():
        return None
    return target, _read_record(target, configs)


def _shipped(family: DemoFamily[Any], out_dir: str, *overrides: str) -> DemoConfigs[Any]:
    return load_family_configs(family, family.recipe_dir, [f"demo.out_dir={out_dir}", *overrides])


def cold_start_model_dir(name: str) -> Path:
    """The cached model dir of family ``name``'s shipped cold start, built on first use."""
    family = family_named(name)
    with tempfile.TemporaryDirectory() as tmp:  # the key ignores paths; any out_dir will do
        configs = _shipped(family, tmp, *family.cache_build_overrides)
        target = cold_start_dir(configs)
        if not (target / "model.safetensors").is_file():
            print(
                f"model.path={configs.family.model_name}: building it once into {target} (the "
                f"{name} demo's traces and cold-start SFT: minutes on 2 CPU cores)",
                flush=True,
            )
        return cached_build(target, lambda out: _build(configs, out))


def _build(configs: DemoConfigs[Any], out: Path) -> None:
    import torch

    from agentloop.models.names import resolve_model
    from agentloop.trainers.sft import run_sft

    with torch.random.fork_rng(devices=[]), configs.family.services(configs) as served:
        torch.manual_seed(served.demo.seed)  # as run_demo seeds its stages
        served.family.base_model(served.demo)
        served.family.make_traces(served.demo, Path(served.sft.data.train))
        result = run_sft(resolve_model(served.sft))
    assert result.export_dir is not None, "the demo's sft.yaml exports its model"
    _copy_model(result.export_dir, out, result)


def publish_cold_start(
    configs: DemoConfigs[Any], export_dir: Path, sft: SFTResult | None = None
) -> Path | None:
    """Copy the demo's SFT model (and ``sft``, the record of its run) into its family's
    named-model cache when ``configs`` would build exactly it (the shipped recipe's settings);
    return where, or ``None`` if they differ."""
    with tempfile.TemporaryDirectory() as tmp:
        shipped = _shipped(configs.family, tmp)
    if _key(configs) != _key(shipped):
        return None
    return cached_build(cold_start_dir(configs), lambda out: _copy_model(export_dir, out, sft))
