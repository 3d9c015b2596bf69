"""LoRA on the policy: PEFT's LoRA layers injected into the HF model before FSDP2 shards it, the
merged weights for the engines, the base model's fingerprint, and the adapter in PEFT's format.

PEFT's ``inject_adapter_in_model`` replaces each targeted ``nn.Linear`` in place by a
``LoraLayer`` (``base_layer`` + ``lora_A``/``lora_B``) and keeps the HF model class, so the
forward, packing, VLM inputs and FSDP2's per-block sharding are those of full fine-tuning; FSDP2
shards frozen and trainable parameters of one block alike and reduces gradients only for the
adapters. Without a ``PeftModel`` wrapper the model's own names stay as they are, with
``.base_layer`` / ``.lora_A.default`` inserted.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import PreTrainedModel

from agentloop.errors import ConfigError
from agentloop.trainers.lora_config import LoraConfig
from agentloop.trainers.vlm import vision_tower

__all__ = [
    "ADAPTER",
    "LoraAdapters",
    "apply_lora",
    "base_fingerprint",
    "lora_targets",
    "store_base_in",
]

ADAPTER = "default"
"""PEFT's adapter name of the one adapter the policy trains."""
Gather = Callable[[torch.Tensor], torch.Tensor]


def lora_targets(model: PreTrainedModel, cfg: LoraConfig) -> list[str]:
    """Qualified names of the linear layers that get adapters: the language model's
    ``nn.Linear`` modules whose last name part is in ``cfg.target_modules`` (never the vision
    tower's, never an output head tied to the embeddings). A name matching none raises, naming
    the model's linear layers."""
    tower = vision_tower(model)
    skip = {id(m) for m in tower.modules()} if tower is not None else set()
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    tied = head if head is not None and head.weight is embed.weight else None
    found: dict[str, list[str]] = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and id(module) not in skip and module is not tied:
            found.setdefault(name.rpartition(".")[2], []).append(name)
    missing = [t for t in cfg.target_modules if t not in found]
    if missing:
        raise ConfigError(
            f"actor.lora.target_modules={list(cfg.target_modules)}: {missing} match no linear "
            f"layer of {type(model).__name__}'s language model; its linear layers are named "
            f"{sorted(found)}"
        )
    return sorted(n for t in cfg.target_modules for n in found[t])


def apply_lora(model: PreTrainedModel, cfg: LoraConfig, *, seed: int) -> None:
    """Freeze ``model`` and inject trainable adapters (PEFT's LoRA layers) in place; ``A`` is
    drawn from a generator seeded with ``seed``, so every rank starts from the same adapters."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import inject_adapter_in_model

    targets = lora_targets(model, cfg)
    model.requires_grad_(False)
    peft_cfg = PeftLoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=targets,
        bias="none",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        inject_adapter_in_model(peft_cfg, model, adapter_name=ADAPTER)
    for name, param in model.named_parameters():
        param.requires_grad_(_is_adapter(name))
    model.agentloop_lora_targets = targets  # type: ignore[assignment]


def store_base_in(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Keep the frozen base weights in ``dtype`` (the compute dtype, e.g. bf16 on a GPU): they
    get no update, so an fp32 master copy would only double their memory (a 7B base: 15 GB
    instead of 30 GB); the adapters stay fp32 master weights."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not _is_adapter(name):
                param.data = param.data.to(dtype)


def _is_adapter(name: str) -> bool:
    return any(part.startswith("lora_") for part in name.split("."))


@dataclass(frozen=True)
class _Adapted:
    a: torch.Tensor
    b: torch.Tensor


class LoraAdapters:
    """The adapted layers of a (sharded) model with injected LoRA: what the weight sync merges
    and the export writes. Every method that gathers is collective."""

    def __init__(self, model: torch.nn.Module, cfg: LoraConfig) -> None:
        self.cfg = cfg
        self.layers: dict[str, _Adapted] = {}
        for name, module in model.named_modules():
            lora_a = getattr(module, "lora_A", None)
            if isinstance(lora_a, torch.nn.ModuleDict) and ADAPTER in lora_a:
                a, b = lora_a[ADAPTER].weight, module.lora_B[ADAPTER].weight
                assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                self.layers[name] = _Adapted(a, b)
        self.targets: list[str] = list(getattr(model, "agentloop_lora_targets", self.layers))

    def inference_name(self, name: str) -> str | None:
        """The plain model's name of state-dict entry ``name`` (``….base_layer.weight`` →
        ``….weight``); None for an adapter tensor, which the merged weights leave out."""
        if _is_adapter(name):
            return None
        owner, _, leaf = name.rpartition(".")
        layer, _, part = owner.rpartition(".")
        return f"{layer}.{leaf}" if part == "base_layer" and layer in self.layers else name

    def merge(self, name: str, full: torch.Tensor, gather: Gather) -> torch.Tensor:
        """``full`` (the base weight under its plain ``name``) plus its adapter's update
        ``scaling · B·A`` if ``name`` is an adapted weight; else ``full`` itself."""
        layer, _, leaf = name.rpartition(".")
        adapted = self.layers.get(layer) if leaf == "weight" else None
        if adapted is None:
            return full
        delta = gather(adapted.b).detach().float() @ gather(adapted.a).detach().float()
        return full.float() + delta * self.cfg.scaling  # fp32 even over a bf16 base

    def adapter_tensors(self, gather: Gather) -> Iterator[tuple[str, torch.Tensor]]:
        """``(PEFT key, full tensor)`` of every adapter matrix, in layer order."""
        for layer, adapted in self.layers.items():
            for kind, param in (("lora_A", adapted.a), ("lora_B", adapted.b)):
                yield f"base_model.model.{layer}.{kind}.weight", gather(param).detach()

    def peft_config(self, base: str | os.PathLike[str] | None) -> dict[str, Any]:
        """``adapter_config.json`` of the adapter (PEFT's ``LoraConfig``)."""
        from peft import LoraConfig as PeftLoraConfig

        cfg = PeftLoraConfig(
            r=self.cfg.rank,
            lora_alpha=self.cfg.alpha,
            lora_dropout=self.cfg.dropout,
            target_modules=self.targets,
            bias="none",
            base_model_name_or_path=None if base is None else str(base),
        )
        config: dict[str, Any] = cfg.to_dict()  # type: ignore[no-untyped-call]  # PEFT's own
        return config

    def save_adapter(
        self,
        out: Path,
        tensors: dict[str, torch.Tensor],
        base: str | os.PathLike[str] | None,
        fingerprint: str,
    ) -> None:
        """Write ``out`` as a PEFT adapter dir (``adapter_config.json``,
        ``adapter_model.safetensors``) that ``PeftModel.from_pretrained(base, out)`` loads."""
        from peft import LoraConfig as PeftLoraConfig
        from safetensors.torch import save_file

        out.mkdir(parents=True, exist_ok=True)
        PeftLoraConfig(**self.peft_config(base)).save_pretrained(str(out))
        meta = {"format": "pt", "agentloop_base_fingerprint": fingerprint}
        save_file(
            {k: v.contiguous() for k, v in tensors.items()}, out / "adapter_model.safetensors", meta
        )


_BITS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
_CHUNK = 1 << 24


def base_fingerprint(model: torch.nn.Module, device: torch.device) -> str:
    """A digest of the frozen base weights (names, shapes and an exact integer sum of each
    tensor's bit patterns over its shards), the same whatever the number of ranks; collective.
    A LoRA checkpoint records it and refuses to load onto another base."""
    from torch.distributed.tensor import DTensor

    names, sums = [], []
    for name, param in model.named_parameters():
        if _is_adapter(name):
            continue
        local = param.to_local() if isinstance(param, DTensor) else param
        flat = local.detach().contiguous().view(-1).view(_BITS[local.element_size()])
        total = torch.zeros((), dtype=torch.int64, device=flat.device)
        for start in range(0, flat.numel(), _CHUNK):
            total += flat[start : start + _CHUNK].to(torch.int64).sum()
        names.append((name, list(param.shape), str(param.dtype)))
        sums.append(total.to(device))
    stacked = torch.stack(sums) if sums else torch.zeros(0, dtype=torch.int64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(stacked, op=dist.ReduceOp.SUM)
    record = json.dumps([names, stacked.cpu().tolist()]).encode()
    return hashlib.sha256(record).hexdigest()[:32]
