"""ColocatedWorker: one device's FSDP2 policy shard, optional reference model and vLLM engine.

The same class runs in-process (local mode) and as a Ray actor (one per placement bundle). Its
methods are async; torch work runs on one dedicated thread in an actor (so the actor's event
loop, which drives vLLM's output handler, stays responsive) and inline in local mode (so a
``breakpoint()`` in the trainer stops the one process being debugged). Methods that touch the
policy are collective: the driver calls them on every rank at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from agentloop.engines.base import AdapterEngine, SamplingParams, generate
from agentloop.errors import ConfigError, InferenceError
from agentloop.trainers.lora_config import LoraConfig
from agentloop.trainers.packing import TrainSeq
from agentloop.trainers.weight_push import PushGroup, buckets, stream
from agentloop.trainers.worker import PolicyWorker, WorkerConfig
from agentloop.types import Completion

if TYPE_CHECKING:
    from agentloop.engines.base import TrainEngine
    from agentloop.trainers.checkpoint import RunState

__all__ = ["ColocatedWorker", "WorkerSpec"]

log = logging.getLogger(__name__)
R = TypeVar("R")


@dataclass(frozen=True)
class WorkerSpec:
    """What each worker builds: the policy from ``model_dir`` with ``actor`` settings, a frozen
    copy as the reference model when ``with_ref``, and a vLLM engine with ``engine`` settings
    (:class:`VLLMConfig` fields) unless ``engine`` is None (replay: nothing to generate)."""

    model_dir: str
    actor: WorkerConfig
    engine: dict[str, Any] | None
    with_ref: bool = False
    threaded: bool = True


class ColocatedWorker:
    """A policy shard and an engine on one device. Call :meth:`start_engine` before
    :meth:`setup`: vLLM forks its processes, and they must not inherit a process group."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.policy: PolicyWorker | None = None
        self.ref: PolicyWorker | None = None
        self.engine: TrainEngine | None = None
        self.rank = 0
        self._owns_group = False
        self._pool = ThreadPoolExecutor(1, "agentloop-torch") if spec.threaded else None
        self._push: PushGroup | None = None  # rank 0's weight-push group (disaggregated placement)

    async def _torch(self, fn: Callable[..., R], *args: Any) -> R:
        if self._pool is None:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # ------------------------------------------------------------------ lifecycle
    async def start_engine(self) -> tuple[int, ...]:
        """Start this worker's vLLM engine (if it has one); returns its process ids."""
        if self.spec.engine is None:
            return ()
        import torch.distributed as dist

        from agentloop.engines.backends import start_train_engine

        if dist.is_initialized():
            # a forked engine would inherit this process group and try to use it as its own
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
        self.engine = await start_train_engine(self.spec.model_dir, self.spec.engine)
        return self.engine.pids

    def address(self) -> tuple[str, int]:
        """This host's address and a free TCP port: the rendezvous point when this is rank 0."""
        try:
            import ray

            host = ray.util.get_node_ip_address()
        except Exception:  # not in Ray: a local world
            host = "127.0.0.1"
        with socket.socket() as s:
            s.bind(("", 0))
            return host, int(s.getsockname()[1])

    async def setup(self, rank: int, world_size: int, init_method: str | None) -> dict[str, Any]:
        """Join the process group and build the policy (and reference) shards; collective."""
        await self._torch(self._build, rank, world_size, init_method)
        node = ""
        try:
            import ray

            if ray.is_initialized():
                node = ray.get_runtime_context().get_node_id()
        except ImportError:
            pass
        return {"rank": rank, "pid": os.getpid(), "node_id": node}

    def _build(self, rank: int, world_size: int, init_method: str | None) -> None:
        from agentloop.trainers.dist import init_distributed

        if init_method is not None:
            self._owns_group = init_distributed(
                rank=rank, world_size=world_size, init_method=init_method
            )
        else:
            self._owns_group = init_distributed()
        self.rank = rank
        self.policy = PolicyWorker(self.spec.model_dir, self.spec.actor)
        if self.spec.with_ref:  # the base model itself: a LoRA policy's reference has no adapters
            ref_actor = dataclasses.replace(self.spec.actor, lora=LoraConfig())
            self.ref = PolicyWorker(self.spec.model_dir, ref_actor)

    async def close(self) -> None:
        """Stop the engine and leave the process group (if this worker created it)."""
        if self.engine is not None:
            engine, self.engine = self.engine, None
            await engine.shutdown()
        self.policy = self.ref = None
        if self._owns_group:
            import torch.distributed as dist

            await self._torch(dist.destroy_process_group)
            self._owns_group = False
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    # ------------------------------------------------------------------ engine
    async def generate(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        session_id: str | None = None,
        images: Sequence[Any] = (),
    ) -> Completion:
        if self.engine is None:
            raise InferenceError("this worker has no engine (replay mode); nothing can generate")
        return await generate(
            self.engine, prompt_ids, sampling, session_id=session_id, images=images
        )

    async def sleep_engine(self, level: int = 1) -> None:
        """Put the engine to sleep (``level`` 1 keeps its weights in host memory, 2 drops them:
        for when every weight is synced before it generates again)."""
        if self.engine is not None:
            await self.engine.sleep(level)

    async def wake_engine(self, tags: list[str] | None = None) -> None:
        """Wake the engine, after the trainer has freed its gradients and allocator cache."""
        if self.engine is not None:
            if self.policy is not None:
                await self._torch(self.policy.release_memory)
            await self.engine.wake_up(tags)

    async def sync_weights(
        self, version: int | None = None, interrupt: bool = False
    ) -> dict[str, float]:
        """Gather the full weights (collective) and reload them into this worker's engine as
        policy ``version``; ``interrupt`` aborts running requests and resumes them on the new
        weights (partial rollouts) instead of waiting for them.

        The weights stream into the engine, which casts each into its own dtype as it packs
        it and loads them chunk by chunk (``engine.weight_chunk_bytes``): on one rank they are
        the live parameters, and the extra memory is one packed chunk whatever the model's
        size (on several, one bucket of gathered tensors more). A LoRA policy whose engine
        serves an adapter (``engine.lora_rank``) sends the adapter alone, which the engine
        reloads in place; with any other engine it sends the merged weights."""
        if self.engine is None:
            return {}
        policy, engine = self._policy(), self.engine
        if policy.lora is not None and isinstance(engine, AdapterEngine) and engine.serves_lora:
            adapter = await self._torch(policy.adapter_weights, engine.weight_dtype)
            stats = await engine.update_adapter(adapter, version=version, interrupt=interrupt)
            return {
                "sync/bytes": float(stats.num_bytes),
                "sync/tensors": float(stats.num_tensors),
                "sync/engine_load_s": stats.load_s,
            }
        gathered = stream(buckets(policy.state_dict_for_inference()), self._torch)
        try:
            stats = await self.engine.update_weights(gathered, version=version, interrupt=interrupt)
        finally:
            await gathered.aclose()  # a failed load still takes part in every gather
        return {
            "sync/bytes": float(stats.num_bytes),
            "sync/tensors": float(stats.num_tensors),
            "sync/chunks": float(stats.chunks),
            "sync/engine_load_s": stats.load_s,
        }

    # ------------------------------------------------------------------ disaggregated push
    def push_backend(self) -> str:
        """The collective backend of this trainer's weight pushes: NCCL on a GPU, else gloo."""
        return "nccl" if self._policy().device.type == "cuda" else "gloo"

    async def join_push_group(
        self, host: str, port: int, world_size: int, timeout_s: float
    ) -> None:
        """Host (as rank 0) a new push group with ``world_size - 1`` rollout workers (rank 0)."""
        from agentloop.trainers.weight_push import open_push_group

        backend = self.push_backend()
        self._push = await self._torch(
            lambda: open_push_group(host, port, 0, world_size, backend=backend, timeout_s=timeout_s)
        )

    async def push_weights(self, dtype: str) -> dict[str, float]:
        """Gather the full weights (collective over the trainer ranks) in the engines' weight
        ``dtype`` (e.g. ``"bfloat16"``); rank 0 broadcasts them to its push group, whose members
        receive at the same time."""
        push = self._push
        torch_dtype = getattr(torch, dtype)

        def run() -> int:
            named = self._policy().state_dict_for_inference(dtype=torch_dtype)
            if self.rank != 0 or push is None:
                for _ in named:  # every rank takes part in every gather
                    pass
                return 0
            return push.send(named)

        sent = await self._torch(run)
        return {"sync/bytes": float(sent)} if self.rank == 0 else {}

    def leave_push_group(self) -> None:
        self._push = None

    # ------------------------------------------------------------------ training
    def _policy(self) -> PolicyWorker:
        if self.policy is None:
            raise RuntimeError("ColocatedWorker.setup() has not run")
        return self.policy

    async def compute_logprobs(
        self, seqs: Sequence[TrainSeq], ref: bool = False
    ) -> list[torch.Tensor]:
        worker = self.ref if ref else self._policy()
        if worker is None:
            raise ConfigError(
                "reference logprobs were asked for but the workers hold no reference model; it "
                "is built when actor.kl_coef > 0 or algorithm.use_kl_in_reward=true"
            )
        return await self._torch(worker.compute_logprobs, seqs)

    async def train_step(self, seqs: Sequence[TrainSeq]) -> dict[str, float]:
        return await self._torch(self._policy().train_step, seqs)

    async def save_checkpoint(
        self, root: str, step: int, run_state: RunState | None, keep_last: int | None
    ) -> str:
        from agentloop.trainers.checkpoint import save_checkpoint

        def save() -> Path:
            return save_checkpoint(
                self._policy(), root, step=step, run_state=run_state, keep_last=keep_last
            )

        return str(await self._torch(save))

    async def load_checkpoint(self, path: str, allow_unverified: bool = False) -> RunState | None:
        from agentloop.trainers.checkpoint import load_checkpoint

        def load() -> RunState | None:
            return load_checkpoint(self._policy(), path, allow_unverified=allow_unverified)

        return await self._torch(load)

    async def export(self, path: str) -> None:
        """Write the policy as a plain HF model dir (rank 0 writes; collective)."""
        await self._torch(self._policy().save_pretrained, path)
