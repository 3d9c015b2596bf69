"""`agentloop export`: a checkpoint of a run (`checkpoints/step_N`, DCP) as an HF model dir, or
a LoRA run's adapter alone as a PEFT adapter dir."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentloop.errors import ConfigError
from agentloop.trainers.config import TrainConfig, load_config, local_model_dir
from agentloop.trainers.sft_config import SFTConfig

__all__ = ["Exported", "export_checkpoint"]

_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class Exported:
    """What :func:`export_checkpoint` wrote."""

    path: Path
    adapter: bool
    """True: a PEFT adapter dir (a LoRA run without ``merge``); False: a full HF model dir."""


def export_checkpoint(
    step_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    dtype: str | None = None,
    device: str = "cpu",
    merge: bool = False,
) -> Exported:
    """Write checkpoint ``step_dir`` (``RUN/checkpoints/step_N`` of ``agentloop train`` or
    ``sft``) to ``out`` as an HF model dir: config, safetensors and the source model's tokenizer
    (and processor) files, as the run's ``final/`` is written. The model is built from the run's
    ``config.yaml`` (its ``model`` and ``actor`` sections) and the checkpoint's shards loaded into
    it, verified against their checksums first, whatever the number of ranks that wrote them.
    ``dtype`` (``float32``/``bfloat16``) converts the weights; None keeps the trained dtype.

    A LoRA run (``actor.lora.rank > 0``) exports its adapter alone as a PEFT adapter dir
    (``adapter_config.json``, ``adapter_model.safetensors``: ``PeftModel.from_pretrained(base,
    out)`` loads it, and vLLM serves it with ``--enable-lora``), or with ``merge`` the base with
    the adapters merged in, as a full HF model dir. A full fine-tuning run's export is the full
    model either way."""
    step_dir = Path(step_dir)
    if dtype is not None and dtype not in _DTYPES:
        raise ConfigError(f"--dtype {dtype!r} is not one of {sorted(_DTYPES)}")
    _check_step_dir(step_dir)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{str(out)!r} exists and is not empty; pass a new directory")
    model, actor = _run_model(step_dir.parent.parent / "config.yaml")
    adapter = actor.lora.enabled and not merge
    if adapter and dtype is not None:
        raise ConfigError(
            f"--dtype {dtype} converts full weights; an adapter export keeps the trained dtype: "
            "drop --dtype, or add --merge to write the merged model"
        )
    import torch  # the checks above answer fast, without torch

    from agentloop.trainers.checkpoint import load_checkpoint
    from agentloop.trainers.worker import PolicyWorker

    worker = PolicyWorker(model, dataclasses.replace(actor, device=device))
    load_checkpoint(worker, step_dir)
    if adapter:
        worker.save_adapter(out)
        return Exported(out, adapter=True)
    worker.save_pretrained(out, dtype=None if dtype is None else getattr(torch, dtype))
    return Exported(out, adapter=False)


def _check_step_dir(step_dir: Path) -> None:
    if (step_dir / "trainer_state.pt").is_file():
        return
    root = step_dir / "checkpoints" if (step_dir / "checkpoints").is_dir() else step_dir
    steps = sorted(p.name for p in root.glob("step_*") if (p / "trainer_state.pt").is_file())
    hint = f"; its checkpoints: {[str(root / s) for s in steps]}" if steps else ""
    raise ConfigError(
        f"{str(step_dir)!r} is not a complete checkpoint (no trainer_state.pt); pass a "
        f"RUN/checkpoints/step_N directory{hint}"
    )


def _run_model(config_file: Path) -> tuple[Path, Any]:
    """The model dir and actor settings of the run whose ``config.yaml`` is ``config_file``."""
    if not config_file.is_file():
        raise ConfigError(
            f"{str(config_file)!r} does not exist: the checkpoint must sit in its run's "
            "checkpoints/ folder (RUN/checkpoints/step_N), beside the run's config.yaml"
        )
    from omegaconf import OmegaConf

    keys = set(OmegaConf.to_container(OmegaConf.load(config_file)))  # type: ignore[arg-type]
    schema: type[TrainConfig] | type[SFTConfig] = TrainConfig if "algorithm" in keys else SFTConfig
    cfg = load_config(schema, config_file)  # a run's config.yaml holds the resolved model dir
    return local_model_dir(cfg.model.path), cfg.actor
