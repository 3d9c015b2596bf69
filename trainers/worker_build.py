"""Building a PolicyWorker's model: the device, the fp32 load (or seeded init), the frozen parts
and FSDP2 sharding of every transformer block."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel

from agentloop.errors import ConfigError
from agentloop.trainers.varlen import VARLEN, resolve_attn_implementation
from agentloop.trainers.vlm import model_class, vision_tower
from agentloop.trainers.worker_config import WorkerConfig

__all__ = ["freeze_vision", "full_tensor", "load_model", "pick_device", "shard_model"]

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def pick_device(name: str) -> torch.device:
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ConfigError("WorkerConfig.device='cuda' but no CUDA device is visible; use 'cpu'")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def load_model(
    model: str | os.PathLike[str] | PretrainedConfig | PreTrainedModel,
    cfg: WorkerConfig,
    device: torch.device,
) -> PreTrainedModel:
    """fp32 master weights on the CPU; identical on every rank (loaded, or seeded init). A model
    instance keeps its attention implementation unless ``auto`` resolves to ``varlen``."""
    if isinstance(model, PreTrainedModel):
        config = model.config
    elif isinstance(model, PretrainedConfig):
        config = model
    elif Path(model).is_dir():
        config = AutoConfig.from_pretrained(model)
    else:
        raise ConfigError(f"model path {str(model)!r} is not a directory; pass an HF model dir")
    compute = _DTYPES[cfg.dtype] if device.type == "cuda" else torch.float32
    vision = hasattr(config, "vision_config")
    attn = resolve_attn_implementation(cfg.attn_implementation, device, compute, vision=vision)
    kw: dict[str, Any] = dict(attn_implementation=attn, dtype=torch.float32)
    if isinstance(model, PreTrainedModel):
        if attn == VARLEN:
            model.set_attn_implementation(attn)
        floated: PreTrainedModel = model.float()
        return floated
    if isinstance(model, PretrainedConfig):
        torch.manual_seed(cfg.seed)
        built: PreTrainedModel = model_class(model).from_config(model, **kw)
        return built
    loaded: PreTrainedModel = model_class(config).from_pretrained(model, **kw)
    return loaded


def freeze_vision(model: PreTrainedModel) -> None:
    """Take the vision tower's parameters out of training (``actor.freeze_vision``)."""
    tower = vision_tower(model)
    if tower is None:
        raise ConfigError(
            f"actor.freeze_vision=True but {type(model).__name__} has no vision tower; set it "
            "only for a vision-language model (Qwen2-VL / Qwen2.5-VL)"
        )
    tower.requires_grad_(False)


def shard_model(
    model: PreTrainedModel, cfg: WorkerConfig, device: torch.device, world_size: int
) -> PreTrainedModel:
    """``fully_shard`` every transformer block (``_no_split_modules``), then the root."""
    if cfg.activation_checkpointing:
        # non-reentrant: recomputation re-runs FSDP2's pre-forward hooks, which re-gather
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mesh = init_device_mesh(device.type, (world_size,))
    on_gpu = device.type == "cuda"
    mp = (
        MixedPrecisionPolicy(param_dtype=_DTYPES[cfg.dtype], reduce_dtype=torch.float32)
        if on_gpu
        else MixedPrecisionPolicy()
    )
    offload = CPUOffloadPolicy() if cfg.cpu_offload and on_gpu else OffloadPolicy()
    block_names = set(getattr(model, "_no_split_modules", None) or ())
    for module in list(model.modules()):
        if type(module).__name__ in block_names:
            fully_shard(module, mesh=mesh, mp_policy=mp, offload_policy=offload)
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=offload)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # agg_loss returns each rank's share of the *global* loss: gradients must be summed
            # over ranks, not averaged. Force plain SUM collectives: gloo has no PREMUL_SUM.
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return model


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The full tensor of a shard: all-gathered, or (one rank) the local tensor itself."""
    if not isinstance(t, DTensor):
        return t
    return t.to_local() if t.device_mesh.size() == 1 else t.full_tensor()
