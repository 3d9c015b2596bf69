"""Trajectories to training batches: padding-free packed micro-batches, DP/micro-batch balancing."""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from agentloop.errors import ConfigError, TrajectoryError
from agentloop.trainers.vlm import ImageInputs, RopeIndex, cat_images, image_inputs
from agentloop.types import Trajectory

if TYPE_CHECKING:
    from agentloop.vision import VisionProcessor

__all__ = [
    "DEFAULT_LINEAR_COEF",
    "MicroBatch",
    "PaddedBatch",
    "TrainSeq",
    "dp_partition",
    "karmarkar_karp",
    "loss_counts",
    "make_micro_batches",
    "micro_batch_partition",
    "pack",
    "pad",
    "seq_workload",
    "train_seqs",
]

# Per layer, a sequence of L tokens costs ~24·L·h² FLOPs in matmuls and ~4·L²·h in attention, i.e.
# ∝ 6h·L + L². 24576 = 6·4096 (a 7B-class model); pass 6·hidden_size for another model.
DEFAULT_LINEAR_COEF = 24576

# Alignment used everywhere below: position t holds the quantities *of token t* — its loss mask,
# advantage, rollout/old/ref logprob — exactly as in Trajectory. The model predicts token t from
# logits at t-1; logprobs.token_logprobs does that shift. The first token of every sequence has no
# prediction: its loss mask is forced to 0 and its logprob is 0.


@dataclass(frozen=True)
class TrainSeq:
    """One trajectory ready for training: ``[L]`` tensors aligned on token positions, and the
    images a vision-language trajectory shows (their placeholder runs are in ``token_ids``)."""

    token_ids: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    rollout_logprobs: torch.Tensor
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    images: ImageInputs | None = None

    def __post_init__(self) -> None:
        n = self.token_ids.shape[0]
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor) and tuple(v.shape) != (n,):
                raise ValueError(f"TrainSeq.{f.name} has shape {tuple(v.shape)}, expected ({n},)")
        if n == 0:
            raise ValueError("TrainSeq needs at least one token")

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])


def train_seqs(
    trajectories: Sequence[Trajectory],
    advantages: Sequence[torch.Tensor | float],
    *,
    vision: VisionProcessor | None = None,
) -> list[TrainSeq]:
    """:class:`TrainSeq` per trajectory; an advantage is ``[L]`` per token or a scalar broadcast
    over the loss mask. A trajectory's images become its ``images`` through ``vision`` (the
    processor the rollout's TokenBuilder used), required when any trajectory has images."""
    if len(trajectories) != len(advantages):
        raise ValueError(f"{len(trajectories)} trajectories but {len(advantages)} advantages")
    out = []
    for t, adv in zip(trajectories, advantages, strict=True):
        if t.images and vision is None:
            raise TrajectoryError(
                f"trajectory {t.task_id!r} shows {len(t.images)} images but no vision processor "
                "was given; pass train_seqs(..., vision=agentloop.vision.vision_of(model_dir))"
            )
        mask = torch.tensor(t.loss_mask, dtype=torch.float32)
        a = torch.as_tensor(adv, dtype=torch.float32)
        out.append(
            TrainSeq(
                token_ids=torch.tensor(t.token_ids, dtype=torch.long),
                loss_mask=mask,
                advantages=a * mask if a.ndim == 0 else a,
                rollout_logprobs=torch.tensor(t.logprobs, dtype=torch.float32),
                images=image_inputs(t, vision) if vision is not None else None,
            )
        )
    return out


def _optional_cat(parts: list[torch.Tensor | None], what: str) -> torch.Tensor | None:
    if all(p is None for p in parts):
        return None
    if any(p is None for p in parts):
        raise ValueError(f"some sequences have {what} and some do not; set it on all or none")
    return torch.cat([p for p in parts if p is not None])


@dataclass(frozen=True)
class MicroBatch:
    """Packed, padding-free sequences: ``[1, T]`` tensors, ``T = Σ L_i``, no pad tokens.

    ``position_ids`` restart at 0 per sequence; ``cu_seqlens [S+1]`` (int32) holds the boundaries;
    ``seq_index`` the positions of the sequences in the list they were packed from. A
    vision-language batch also has ``mrope_position_ids [3, 1, T]`` (each sequence's own M-RoPE
    positions, concatenated) and ``images`` (its sequences' images, in sequence order).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    rollout_logprobs: torch.Tensor
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    seq_index: tuple[int, ...] = ()
    mrope_position_ids: torch.Tensor | None = None
    images: ImageInputs | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def num_seqs(self) -> int:
        return len(self.cu_seqlens) - 1

    @property
    def seq_lens(self) -> list[int]:
        return (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).tolist()

    def unpack(self, x_1T: torch.Tensor) -> list[torch.Tensor]:
        """Split a packed ``[1, T]`` tensor back into per-sequence ``[L_i]`` tensors."""
        return list(torch.split(x_1T[0], self.seq_lens))

    def replace(self, **changes: object) -> MicroBatch:
        """A copy with fields replaced, e.g. ``mb.replace(old_logprobs=lp)`` after a forward."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def to(self, device: torch.device | str) -> MicroBatch:
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor | ImageInputs)
        }
        return dataclasses.replace(self, **moved)


def pack(
    seqs: Sequence[TrainSeq],
    indices: Sequence[int] | None = None,
    *,
    rope_index: RopeIndex | None = None,
) -> MicroBatch:
    """Concatenate ``seqs[i] for i in indices`` (default: all) into one :class:`MicroBatch`.

    ``rope_index`` (a vision-language model's, see :class:`~agentloop.trainers.vlm.VisionSpec`)
    adds each sequence's M-RoPE positions and the sequences' images; without it, a sequence
    with images is an error (a text model cannot read them)."""
    idx = list(range(len(seqs))) if indices is None else list(indices)
    if not idx:
        raise ValueError("cannot pack an empty list of sequences")
    chosen = [seqs[i] for i in idx]
    mrope = None
    if rope_index is not None:
        parts = [
            rope_index(s.token_ids, None if s.images is None else s.images.image_grid_thw)
            for s in chosen
        ]
        mrope = torch.cat(parts, dim=1)[:, None]
    elif any(s.images is not None for s in chosen):
        raise ValueError("sequences carry images but the model is not a vision-language model")
    lens = torch.tensor([len(s) for s in chosen])
    cu = torch.zeros(len(chosen) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lens, 0)
    mask = torch.cat([s.loss_mask.float() for s in chosen])
    mask[cu[:-1].long()] = 0.0  # first token of a sequence: nothing predicts it
    return MicroBatch(
        input_ids=torch.cat([s.token_ids for s in chosen])[None],
        position_ids=torch.cat([torch.arange(int(n)) for n in lens])[None],
        cu_seqlens=cu,
        max_seqlen=int(lens.max()),
        loss_mask=mask[None],
        advantages=torch.cat([s.advantages.float() for s in chosen])[None],
        rollout_logprobs=torch.cat([s.rollout_logprobs.float() for s in chosen])[None],
        old_logprobs=_unsqueeze(_optional_cat([s.old_logprobs for s in chosen], "old_logprobs")),
        ref_logprobs=_unsqueeze(_optional_cat([s.ref_logprobs for s in chosen], "ref_logprobs")),
        seq_index=tuple(idx),
        mrope_position_ids=mrope,
        images=cat_images([s.images for s in chosen]),
    )


def _unsqueeze(x: torch.Tensor | None) -> torch.Tensor | None:
    return None if x is None else x[None]


@dataclass(frozen=True)
class PaddedBatch:
    """The same data right-padded to ``[B, L_max]`` (for comparison with packing)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    rollout_logprobs: torch.Tensor
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    seq_index: tuple[int, ...] = ()


def pad(
    seqs: Sequence[TrainSeq], indices: Sequence[int] | None = None, *, pad_token_id: int = 0
) -> PaddedBatch:
    """Right-pad ``seqs[i] for i in indices`` into a :class:`PaddedBatch` (pad positions: 0)."""
    idx = list(range(len(seqs))) if indices is None else list(indices)
    if not idx:
        raise ValueError("cannot pad an empty list of sequences")
    chosen = [seqs[i] for i in idx]
    width = max(len(s) for s in chosen)

    def stack(
        get: Callable[[TrainSeq], torch.Tensor | None], fill: float, dtype: torch.dtype
    ) -> torch.Tensor:
        out = torch.full((len(chosen), width), fill, dtype=dtype)
        for row, s in enumerate(chosen):
            value = get(s)
            assert value is not None  # optional fields: all present (_optional_cat checked)
            out[row, : len(s)] = value
        return out

    mask = stack(lambda s: s.loss_mask, 0.0, torch.float32)
    mask[:, 0] = 0.0
    has_old = _optional_cat([s.old_logprobs for s in chosen], "old_logprobs") is not None
    has_ref = _optional_cat([s.ref_logprobs for s in chosen], "ref_logprobs") is not None
    return PaddedBatch(
        input_ids=stack(lambda s: s.token_ids, pad_token_id, torch.long),
        attention_mask=stack(lambda s: torch.ones(len(s)), 0, torch.long),
        position_ids=stack(lambda s: torch.arange(len(s)), 0, torch.long),
        loss_mask=mask,
        advantages=stack(lambda s: s.advantages, 0.0, torch.float32),
        rollout_logprobs=stack(lambda s: s.rollout_logprobs, 0.0, torch.float32),
        old_logprobs=stack(lambda s: s.old_logprobs, 0.0, torch.float32) if has_old else None,
        ref_logprobs=stack(lambda s: s.ref_logprobs, 0.0, torch.float32) if has_ref else None,
        seq_index=tuple(idx),
    )


def seq_workload(lengths: Sequence[int], linear_coef: float = DEFAULT_LINEAR_COEF) -> list[float]:
    """Relative compute cost ``a·L + L²`` of each sequence (see ``DEFAULT_LINEAR_COEF``)."""
    return [linear_coef * n + n * n for n in lengths]


def karmarkar_karp(costs: Sequence[float], k: int, *, equal_size: bool = False) -> list[list[int]]:
    """Split item indices into ``k`` parts of near-equal total cost (largest differencing method).

    Every item starts as a k-tuple of parts (with ``equal_size``, each chunk of ``k`` items sorted
    by cost forms one tuple, one item per part, so all parts end with ``n/k`` items). The two
    tuples with the largest spread (max − min part sum) are merged, heaviest part with lightest,
    until one remains. Deterministic: ties break on item index. Parts are returned with sorted
    indices, heaviest part first.
    """
    n = len(costs)
    if k < 1:
        raise ConfigError(f"number of partitions must be >= 1, got {k}")
    if equal_size and n % k:
        raise ConfigError(
            f"{n} sequences cannot be split into {k} equal-size parts; make the number of "
            f"sequences per step a multiple of {k} (e.g. the DP size)"
        )
    order = sorted(range(n), key=lambda i: (-costs[i], i))
    states: list[tuple[float, int, list[tuple[float, list[int]]]]] = []
    chunks = [order[i : i + k] for i in range(0, n, k)] if equal_size else [[i] for i in order]
    for tick, chunk in enumerate(chunks):
        parts = [(costs[i], [i]) for i in chunk] + [(0.0, []) for _ in range(k - len(chunk))]
        heapq.heappush(states, (-_spread(parts), tick, parts))
    tick = len(chunks)
    while len(states) > 1:
        a, b = heapq.heappop(states)[2], heapq.heappop(states)[2]
        a_desc = sorted(a, key=lambda p: (-p[0], p[1]))
        b_asc = sorted(b, key=lambda p: (p[0], p[1]))
        merged = [(x[0] + y[0], x[1] + y[1]) for x, y in zip(a_desc, b_asc, strict=True)]
        heapq.heappush(states, (-_spread(merged), tick, merged))
        tick += 1
    final = states[0][2] if states else [(0.0, []) for _ in range(k)]
    result = [(total, sorted(items)) for total, items in final]
    result.sort(key=lambda p: (-p[0], p[1][:1] or [n]))
    return [items for _, items in result]


def _spread(parts: list[tuple[float, list[int]]]) -> float:
    sums = [p[0] for p in parts]
    return max(sums) - min(sums)


def dp_partition(
    lengths: Sequence[int],
    dp_size: int,
    *,
    linear_coef: float = DEFAULT_LINEAR_COEF,
    equal_size: bool = True,
) -> list[list[int]]:
    """Sequence indices for each DP rank, balanced on :func:`seq_workload`.

    ``equal_size`` (default) gives every rank the same number of sequences, so every rank can
    run the same number of micro-batches (FSDP collectives need that); it requires
    ``len(lengths) % dp_size == 0``.
    """
    return karmarkar_karp(seq_workload(lengths, linear_coef), dp_size, equal_size=equal_size)


def micro_batch_partition(
    lengths: Sequence[int],
    max_tokens_per_micro_batch: int,
    *,
    min_num_micro_batches: int = 1,
    linear_coef: float = DEFAULT_LINEAR_COEF,
) -> list[list[int]]:
    """Group sequence indices into micro-batches of at most ``max_tokens_per_micro_batch`` tokens.

    Rule for a sequence longer than the budget: it is never split and never shares — it is a
    micro-batch of its own. The count starts at ``max(ceil(total/budget), min_num_micro_batches)``
    and grows until a token-balanced Karmarkar–Karp split fits the budget. Micro-batches come
    heaviest workload first, so neighbours (and the i-th micro-batch of each DP rank) are alike.
    To give every DP rank the same count, all-reduce (MAX) ``len(result)`` and call again with
    ``min_num_micro_batches`` set to it.
    """
    if max_tokens_per_micro_batch < 1:
        raise ConfigError(
            f"max_tokens_per_micro_batch must be >= 1, got {max_tokens_per_micro_batch}"
        )
    n = len(lengths)
    if n == 0 and min_num_micro_batches <= 1:
        return []
    if min_num_micro_batches > n:
        raise ConfigError(
            f"min_num_micro_batches={min_num_micro_batches} exceeds the {n} sequences on this "
            "rank; give every rank the same number of sequences (dp_partition equal_size=True)"
        )
    k = max(math.ceil(sum(lengths) / max_tokens_per_micro_batch), min_num_micro_batches, 1)
    while True:
        parts = [p for p in karmarkar_karp(lengths, min(k, n)) if p]
        fits = all(
            len(p) == 1 or sum(lengths[i] for i in p) <= max_tokens_per_micro_batch for p in parts
        )
        if fits or k >= n:
            break
        k += 1
    work = seq_workload(lengths, linear_coef)
    parts.sort(key=lambda p: (-sum(work[i] for i in p), p[0]))
    return parts


def make_micro_batches(
    seqs: Sequence[TrainSeq],
    max_tokens_per_micro_batch: int,
    *,
    min_num_micro_batches: int = 1,
    linear_coef: float = DEFAULT_LINEAR_COEF,
) -> list[MicroBatch]:
    """:func:`micro_batch_partition` then :func:`pack` each part."""
    parts = micro_batch_partition(
        [len(s) for s in seqs],
        max_tokens_per_micro_batch,
        min_num_micro_batches=min_num_micro_batches,
        linear_coef=linear_coef,
    )
    return [pack(seqs, p) for p in parts]


def loss_counts(batches: Sequence[MicroBatch | PaddedBatch]) -> tuple[int, int]:
    """``(loss tokens, sequences with >= 1 loss token)`` over local micro-batches; all-reduce
    (SUM) both across DP ranks and pass them to ``agg_loss`` as the global counts."""
    tokens = seqs = 0
    for b in batches:
        m = b.loss_mask > 0
        tokens += int(m.sum())
        if isinstance(b, MicroBatch):
            per_seq = torch.split(m[0], b.seq_lens)
            seqs += sum(int(x.any()) for x in per_seq)
        else:
            seqs += int(m.any(dim=1).sum())
    return tokens, seqs
