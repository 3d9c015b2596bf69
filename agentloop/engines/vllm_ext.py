"""vLLM worker extension: in-place weight reload from a safetensors file or blob.

vLLM mixes this class into every worker (``worker_extension_cls=
"agentloop.engines.vllm_ext.WeightSyncExtension"``); the engine process calls its methods through
``AsyncLLM.collective_rpc``. Tensors cannot be RPC arguments (vLLM's msgpack decoder has no type
hint for them and turns them into nested lists), so the weights travel as a safetensors file in
``/dev/shm`` (the default: one copy, read with mmap by every worker) or as raw safetensors bytes.

The weights go through ``model_runner.reload_weights(..., is_checkpoint_format=True)``: the model's
own ``load_weights`` with checkpoint names, followed by the backend's post-load processing. Copying
into parameters directly is wrong on the CPU backend, which repacks linear weights at load time.

This module is imported inside vLLM's worker processes; it imports only torch and safetensors.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["WeightSyncExtension"]


class WeightSyncExtension:
    """Methods added to each vLLM worker. Names carry an ``agentloop_`` prefix so they never
    shadow a method of vLLM's own worker classes."""

    model_runner: Any  # set by the vLLM worker this class is mixed into

    def agentloop_reload_from_file(self, path: str) -> dict[str, float]:
        """Reload every tensor of the safetensors file at ``path``; returns timing stats."""
        from safetensors import safe_open

        t0 = time.perf_counter()
        with safe_open(path, framework="pt", device="cpu") as f:
            names = list(f.keys())

            def tensors() -> Iterator[tuple[str, torch.Tensor]]:
                for name in names:
                    yield name, f.get_tensor(name)

            self.model_runner.reload_weights(weights_iterator=tensors(), is_checkpoint_format=True)
        return {"tensors": float(len(names)), "seconds": time.perf_counter() - t0}

    def agentloop_reload_from_bytes(self, blob: bytes) -> dict[str, float]:
        """Reload every tensor of a safetensors blob (``safetensors.torch.save``)."""
        from safetensors.torch import load

        t0 = time.perf_counter()
        named = load(bytes(blob))
        self.model_runner.reload_weights(
            weights_iterator=iter(named.items()), is_checkpoint_format=True
        )
        return {"tensors": float(len(named)), "seconds": time.perf_counter() - t0}

    def agentloop_weight_sums(self, names: list[str]) -> dict[str, float]:
        """``sum(|w|)`` in float64 of the named model parameters (for tests and debugging).

        Names are vLLM's parameter names (e.g. ``lm_head.weight``), which can differ from
        checkpoint names where vLLM fuses layers (``qkv_proj``)."""
        params = dict(self.model_runner.get_model().named_parameters())
        return {n: float(params[n].detach().double().abs().sum()) for n in names if n in params}
