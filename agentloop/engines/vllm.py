"""VLLMEngine: the Engine protocol on vLLM's AsyncLLM, with in-place weight reload.

The adapter holds the lifecycle and ``generate``; beside it, ``vllm_config`` holds its settings,
``vllm_process`` starts and reaps vLLM's processes, ``vllm_weights`` loads weight updates."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import os
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentloop.engines.base import (
    AdapterWeights,
    NamedTensors,
    SamplingParams,
    WeightSyncStats,
    prompt_token_ids,
)
from agentloop.engines.gate import WeightGate, resumable
from agentloop.engines.orphan_guard import OrphanGuard
from agentloop.engines.vllm_config import (
    WEIGHT_TRANSPORTS,
    VLLMConfig,
    WeightTransport,
    check_settings,
)
from agentloop.engines.vllm_lora import ADAPTER_ID, AdapterDir
from agentloop.engines.vllm_process import engine_args, engine_processes, reap, start_async_llm
from agentloop.engines.vllm_requests import completion as _completion
from agentloop.engines.vllm_requests import inference_error as _inference_error
from agentloop.engines.vllm_requests import vllm_sampling as _vllm_sampling
from agentloop.engines.vllm_weights import load_in_chunks, merged_stats
from agentloop.errors import ConfigError, InferenceError
from agentloop.types import Completion

if TYPE_CHECKING:
    import torch

__all__ = ["VLLMConfig", "VLLMEngine", "WeightSyncStats", "WeightTransport", "check_settings"]

log = logging.getLogger(__name__)


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
        self._adapter_dir: AdapterDir | None = None  # lora_rank > 0: the adapter vLLM reloads
        self._lora_request: Any = None  # every request's LoRARequest, once an adapter is loaded

    @property
    def version(self) -> int:
        """The policy version of the weights loaded now (see ``update_weights``)."""
        return self._gate.version

    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype of the weights the started engine holds, ``dtype: auto`` resolved as vLLM
        resolves it (the model's own; a float32 model downcast on a GPU): the dtype a weight
        update should arrive in, so that nothing wider is gathered and shipped."""
        dtype: torch.dtype = self._require_llm().model_config.dtype
        return dtype

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
    def serves_lora(self) -> bool:
        """Whether the engine has a LoRA adapter slot (``lora_rank > 0``): see
        :meth:`update_adapter`."""
        return self.config.lora_rank > 0

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
        args = engine_args(cfg, self._sleep_mode)
        self._ckpt_shapes = checkpoint_shapes(cfg.model)
        self._vision = vision_of(cfg.model)
        t0 = time.perf_counter()
        self._guard = OrphanGuard()  # guards the start-up too: it holds GPU memory the longest
        os.environ[FAST_EXIT_ENV] = "1"  # for vLLM's processes, which inherit it (vllm_plugin.py)
        try:
            # No local name for the AsyncLLM: a frame kept alive by a stored traceback would
            # otherwise keep it alive past shutdown (its __del__ then fails at interpreter exit).
            self._llm = await asyncio.to_thread(start_async_llm, AsyncEngineArgs(**args))
        except Exception as e:
            raise InferenceError(
                f"vLLM could not start on {cfg.model!r}: {type(e).__name__}: {e}"
                + start_failure_hint(cfg.model)
            ) from e
        self._loop = asyncio.get_running_loop()
        self._procs = engine_processes(self._llm)
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
        self._lora_request = None
        if self._adapter_dir is not None:
            self._adapter_dir.remove()
            self._adapter_dir = None
        # Stop the output handler first: it would otherwise log the engine's exit as a crash.
        if (handler := getattr(llm, "output_handler", None)) is not None:
            handler.cancel()
            await asyncio.wait([handler], timeout=self.config.shutdown_timeout_s)
        try:
            await asyncio.to_thread(llm.shutdown, self.config.shutdown_timeout_s)
        finally:
            del llm
            gc.collect()  # AsyncLLM sits in reference cycles; its __del__ fails at interpreter exit
            await asyncio.to_thread(reap, procs, self.config.shutdown_timeout_s)
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
            async for out in llm.generate(
                inputs, params, request_id, lora_request=self._lora_request
            ):
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
        if transport not in WEIGHT_TRANSPORTS:
            raise ConfigError(f"weight transport {transport!r} is not one of {WEIGHT_TRANSPORTS}")

        async def abort_running() -> None:
            await llm.abort(list(self._live))

        t0 = time.perf_counter()
        async with self._gate.update(abort_running if interrupt else None):
            loads = await load_in_chunks(
                llm, named_tensors, transport, self._ckpt_shapes, self.weight_dtype, self.config
            )
            if not loads:
                raise ConfigError("update_weights got no tensors")
            await llm.reset_prefix_cache(reset_running_requests=True)
            if version is not None:
                self._gate.version = version
        stats = merged_stats(loads, time.perf_counter() - t0)
        log.info(
            "updated %d tensors (%.1f MB in %d chunks, %s) in %.3f s",
            stats.num_tensors,
            stats.num_bytes / 1e6,
            stats.chunks,
            transport,
            stats.total_s,
        )
        return stats

    async def update_adapter(
        self, adapter: AdapterWeights, *, version: int | None = None, interrupt: bool = False
    ) -> WeightSyncStats:
        """Replace the LoRA adapter (PEFT format) that every later request is served with, in
        place under one adapter id (vLLM's ``load_inplace`` reload of a directory in
        ``shm_dir``), and reset the prefix cache; the base weights stay as they are. Needs
        ``lora_rank > 0``; ``version`` and ``interrupt`` as in :meth:`update_weights`."""
        from vllm.lora.request import LoRARequest

        llm = self._require_llm()
        if not self.serves_lora:
            raise ConfigError(
                "update_adapter needs an engine with a LoRA slot: start it with lora_rank set "
                "to the adapter's rank (engine.lora_rank), or sync merged weights instead"
            )
        if self._adapter_dir is None:
            self._adapter_dir = AdapterDir(self.config.shm_dir)
        path = str(self._adapter_dir.path)

        async def abort_running() -> None:
            await llm.abort(list(self._live))

        t0 = time.perf_counter()
        async with self._gate.update(abort_running if interrupt else None):
            await asyncio.to_thread(self._adapter_dir.write, adapter)
            t1 = time.perf_counter()
            request = LoRARequest("agentloop-policy", ADAPTER_ID, path, load_inplace=True)
            await asyncio.wait_for(llm.add_lora(request), self.config.weight_sync_timeout_s)
            self._lora_request = LoRARequest("agentloop-policy", ADAPTER_ID, path)
            await llm.reset_prefix_cache(reset_running_requests=True)
            if version is not None:
                self._gate.version = version
        t2 = time.perf_counter()
        return WeightSyncStats(
            num_tensors=len(adapter.tensors),
            num_bytes=adapter.num_bytes,
            serialize_s=t1 - t0,
            load_s=t2 - t1,
            total_s=t2 - t0,
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
