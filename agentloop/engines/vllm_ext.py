"""Weight sync for vLLM: packing tensors on the sender side, reloading them in vLLM's workers.

vLLM mixes :class:`WeightSyncExtension` into every worker (``worker_extension_cls=
"agentloop.engines.vllm_ext.WeightSyncExtension"``); ``VLLMEngine.update_weights`` calls its
methods through ``AsyncLLM.collective_rpc``. Tensors cannot be RPC arguments (vLLM's msgpack
decoder has no type hint for them and turns them into nested lists), so the weights travel as one
safetensors file in ``/dev/shm`` (default: one copy, mmapped by every worker), as a safetensors
blob inside the RPC message, or — on CUDA, when trainer and engine share the GPU — as a CUDA IPC
handle to one flat device buffer (``cuda_ipc``: the weights never leave the device).

The workers load through ``model_runner.reload_weights(..., is_checkpoint_format=True)``: the
model's own ``load_weights`` with checkpoint names, then the backend's post-load processing.
Copying into parameters directly is wrong on the CPU backend, which repacks linear weights.

Imported inside vLLM's worker processes: this module imports only torch and safetensors.
"""

from __future__ import annotations

import logging
import os
import pickle
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from agentloop.errors import ConfigError

__all__ = [
    "CudaIpcBuffer",
    "WeightSyncExtension",
    "checkpoint_shapes",
    "direct_copy_targets",
    "pack_tensors",
    "safetensors_bytes",
    "write_safetensors",
]


# ---------------------------------------------------------------------- worker side
# where vLLM warns about the weights a (partial) reload did not name
_PARTIAL_RELOAD_LOGGERS = (
    "vllm.model_executor.model_loader.reload",
    "vllm.v1.worker.gpu_model_runner",
)


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

            self._reload(tensors())
        return {"tensors": float(len(names)), "seconds": time.perf_counter() - t0}

    def agentloop_reload_from_bytes(self, blob: bytes) -> dict[str, float]:
        """Reload every tensor of a safetensors blob (``safetensors.torch.save``)."""
        from safetensors.torch import load

        t0 = time.perf_counter()
        named = load(bytes(blob))
        self._reload(iter(named.items()))
        return {"tensors": float(len(named)), "seconds": time.perf_counter() - t0}

    def agentloop_reload_from_cuda_ipc(self, payload: bytes) -> dict[str, float]:
        """Reload from a :class:`CudaIpcBuffer` payload: views into the sender's device buffer.

        The first update of a given set of names goes through the model's own ``load_weights``
        and then checks whether plain row-slice copies (see :func:`direct_copy_targets`) would
        have produced exactly the same parameters; if so, later updates of those names are just
        those copies (one ``torch._foreach_copy_``), no per-layer reload machinery."""
        from torch.multiprocessing.reductions import shared_cache

        t0 = time.perf_counter()
        (rebuild, args), layout, device_uuid = pickle.loads(payload)
        args = list(args)
        args[6] = _device_index(device_uuid)  # the storage's GPU, as this process numbers it
        # torch caches opened storages by (segment handle, offset): a chunk's buffer can take an
        # earlier, smaller chunk's place in the sender's segment, and the cached storage would
        # then be too small for it ("Trying to resize storage that is not resizable").
        shared_cache.pop((args[7], args[9]), None)
        buffer = rebuild(*args)
        views = [
            (name, buffer[offset : offset + nbytes].view(getattr(torch, dtype)).view(shape))
            for name, dtype, shape, offset, nbytes in layout
        ]
        cache: dict[tuple[str, ...], Any] = self.__dict__.setdefault("_agentloop_direct", {})
        key = tuple(name for name, _ in views)
        targets = cache.get(key)
        if targets:
            # a tensor-parallel worker on another GPU than the buffer: vLLM's sleep-mode (cumem)
            # weights are mapped for their own GPU only, and a peer copy into them fails
            # ("invalid argument"); stage the tensor on the parameter's GPU
            with torch.no_grad():
                torch._foreach_copy_(
                    targets, [v.to(t.device) for t, (_, v) in zip(targets, views, strict=True)]
                )
        else:
            self._reload(iter(views))
            if targets is None:  # first time: would the direct copies have given the same?
                model = self.model_runner.get_model()
                found = direct_copy_targets(model, [(n, tuple(v.shape)) for n, v in views])
                ok = found is not None and all(
                    torch.equal(t, v.to(t.device, t.dtype))
                    for t, (_, v) in zip(found, views, strict=True)
                )
                cache[key] = found if ok else False
        torch.cuda.synchronize()  # the sender frees the buffer once this call has returned
        return {
            "tensors": float(len(layout)),
            "seconds": time.perf_counter() - t0,
            "direct": float(bool(targets)),
        }

    def _reload(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        """vLLM's in-place reload of ``weights`` (checkpoint names). An update comes in chunks
        that name only some weights: vLLM keeps the others and warns about each of them, once
        per chunk; those expected warnings are held back (errors still show)."""
        loggers = [logging.getLogger(name) for name in _PARTIAL_RELOAD_LOGGERS]
        levels = [logger.level for logger in loggers]
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        try:
            self.model_runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)

    def agentloop_weight_sums(self, names: list[str]) -> dict[str, float]:
        """``sum(|w|)`` in float64 of the named model parameters (for tests and debugging).

        Names are vLLM's parameter names (e.g. ``lm_head.weight``), which can differ from
        checkpoint names where vLLM fuses layers (``qkv_proj``)."""
        params = dict(self.model_runner.get_model().named_parameters())
        return {n: float(params[n].detach().double().abs().sum()) for n in names if n in params}


def _device_index(uuid: str) -> int:
    """This process's index of the GPU with ``uuid``: the sender numbers GPUs by its own
    ``CUDA_VISIBLE_DEVICES``, and a tensor-parallel worker sits on another GPU than the buffer.
    A process that does not see that GPU by UUID (a container hiding them) reads its own."""
    for index in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(index).uuid) == uuid:
            return index
    return torch.cuda.current_device()


def direct_copy_targets(
    model: torch.nn.Module, named_shapes: list[tuple[str, tuple[int, ...]]]
) -> list[torch.Tensor] | None:
    """Where each checkpoint tensor lands in the served model, in order: a view of its own
    parameter, or of its rows of a fused one (``q/k/v_proj`` → ``qkv_proj``, ``gate/up_proj`` →
    ``gate_up_proj``, per the model's ``packed_modules_mapping``).
    None when a name has no such place (sharded, quantized or repacked weights): then only the
    model's ``load_weights`` knows how to load it. Callers verify the mapping before using it."""
    params = dict(model.named_parameters())
    packed: dict[str, list[str]] = dict(getattr(model, "packed_modules_mapping", None) or {})
    part_of = {part: (fused, parts) for fused, parts in packed.items() for part in parts}
    rows_of = {name: shape[0] for name, shape in named_shapes if shape}
    out: list[torch.Tensor] = []
    for name, shape in named_shapes:
        prefix, _, rest = name.rpartition(".")
        module_path, _, module = prefix.rpartition(".")
        target, start = params.get(name), 0
        if target is None and module in part_of:
            fused, parts = part_of[module]
            target = params.get(f"{module_path}.{fused}.{rest}")
            siblings = [f"{module_path}.{p}.{rest}" for p in parts]
            if any(s not in rows_of for s in siblings):
                return None
            start = sum(rows_of[s] for s in siblings[: parts.index(module)])
        if target is None or target.dim() == 0 or not shape:
            return None
        if tuple(target.shape[1:]) != tuple(shape[1:]) or start + shape[0] > target.shape[0]:
            return None
        out.append(target.detach().narrow(0, start, shape[0]))
    return out


# ---------------------------------------------------------------------- sender side
def checkpoint_shapes(model_dir: str | os.PathLike[str]) -> dict[str, tuple[int, ...]]:
    """Name → shape of every tensor in a model directory's safetensors files (headers only)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def pack_tensors(
    named_tensors: Iterable[tuple[str, torch.Tensor]], shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU tensors without shared storage (safetensors refuses sharing, e.g.
    tied embeddings), checked against the checkpoint's names and shapes when ``shapes`` is given."""
    out: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for name, tensor in named_tensors:
        if name in out:
            raise ConfigError(f"update_weights got tensor {name!r} twice")
        if shapes:
            _check_against_checkpoint(name, tuple(tensor.shape), shapes)
        t = tensor.detach().to("cpu").contiguous()
        if t.untyped_storage().data_ptr() in storages:
            t = t.clone()
        storages.add(t.untyped_storage().data_ptr())
        out[name] = t
    if not out:
        raise ConfigError("update_weights got no tensors")
    return out


def _check_against_checkpoint(
    name: str, shape: tuple[int, ...], shapes: Mapping[str, tuple[int, ...]]
) -> None:
    if name not in shapes:
        close = [n for n in shapes if n.endswith(name) or name.endswith(n)][:3]
        raise ConfigError(
            f"update_weights: {name!r} is not a tensor of the served checkpoint; use checkpoint "
            f"names (e.g. {next(iter(shapes))!r})" + (f"; did you mean {close}?" if close else "")
        )
    if shape != shapes[name]:
        raise ConfigError(
            f"update_weights: {name!r} has shape {shape}, the checkpoint has {shapes[name]}"
        )


class CudaIpcBuffer:
    """One flat CUDA buffer of ``capacity`` bytes (and the slots' alignment) that a chunk of a
    weight update is packed into, tensor by tensor: :meth:`add` checks each against the
    checkpoint's ``shapes`` and casts it to ``dtype`` into its aligned slot as it arrives.
    :meth:`payload` is the pickled IPC handle and layout that
    :meth:`WeightSyncExtension.agentloop_reload_from_cuda_ipc` opens in the engine's process;
    :meth:`clear` starts the next chunk in the same buffer, once that call has returned. Keep the
    object alive until then."""

    _ALIGN = 256  # bytes; every view starts aligned for any dtype

    def __init__(
        self,
        capacity: int,
        shapes: Mapping[str, tuple[int, ...]],
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if not shapes:
            raise ConfigError("cuda_ipc weight transport needs the checkpoint's tensor shapes")
        self.shapes, self.dtype = shapes, dtype
        self.itemsize = torch.empty((), dtype=dtype).element_size()
        # each slot starts aligned: room for the padding of every tensor a chunk may hold (a
        # capacity of the whole checkpoint's bytes, as for a small model, holds it all)
        slack = self._ALIGN * len(shapes)
        self.buffer = torch.empty(capacity + slack, dtype=torch.uint8, device=device)
        self._uuid = str(torch.cuda.get_device_properties(device).uuid)
        self.clear()

    def clear(self) -> None:
        self._layout: list[tuple[str, str, tuple[int, ...], int, int]] = []
        self._names: set[str] = set()
        self._end = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        _check_cuda_tensor(name, tensor, self.shapes)
        if name in self._names:
            raise ConfigError(f"update_weights got tensor {name!r} twice")
        nbytes = self.itemsize * tensor.numel()
        if self._end + nbytes > self.buffer.numel():
            raise ConfigError(
                f"update_weights: {name!r} does not fit in the chunk's {self.buffer.numel()} "
                "bytes; the tensors of one block (model.layers.N) must arrive one after another"
            )
        shape = tuple(tensor.shape)
        slot = self.buffer[self._end : self._end + nbytes].view(self.dtype).view(shape)
        slot.copy_(tensor)  # cast on the device, asynchronously
        dtype = str(self.dtype).removeprefix("torch.")
        self._layout.append((name, dtype, shape, self._end, nbytes))
        self._names.add(name)
        self._end += -(-nbytes // self._ALIGN) * self._ALIGN

    @property
    def num_tensors(self) -> int:
        return len(self._layout)

    @property
    def num_bytes(self) -> int:
        return sum(entry[4] for entry in self._layout)

    def payload(self) -> bytes:
        """The chunk so far, once every copy into the buffer has finished."""
        from torch.multiprocessing.reductions import reduce_tensor

        if not self._layout:
            raise ConfigError("update_weights got no tensors")
        torch.cuda.synchronize(self.buffer.device)
        return pickle.dumps((reduce_tensor(self.buffer), self._layout, self._uuid))


def _check_cuda_tensor(
    name: str, tensor: torch.Tensor, shapes: Mapping[str, tuple[int, ...]]
) -> None:
    _check_against_checkpoint(name, tuple(tensor.shape), shapes)
    if not (tensor.is_cuda and tensor.is_floating_point()):
        raise ConfigError(
            f"cuda_ipc weight transport needs floating-point CUDA tensors; {name!r} is "
            f"{tensor.dtype} on {tensor.device}"
        )


def write_safetensors(tensors: dict[str, torch.Tensor], directory: str) -> str:
    """Write ``tensors`` to a fresh file in ``directory`` (the temp dir if it does not exist)
    and return its path; the caller deletes it."""
    from safetensors.torch import save_file

    dest = directory if os.path.isdir(directory) else tempfile.gettempdir()
    fd, path = tempfile.mkstemp(prefix="agentloop-weights-", suffix=".safetensors", dir=dest)
    os.close(fd)
    try:
        save_file(tensors, path)
    except BaseException:
        Path(path).unlink(missing_ok=True)
        raise
    return path


def safetensors_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    """``tensors`` as one safetensors blob."""
    from safetensors.torch import save

    return save(tensors)
