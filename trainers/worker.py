"""PolicyWorker: an HF causal LM or VLM in FSDP2 that scores sequences, trains, exports weights."""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import PretrainedConfig, PreTrainedModel

from agentloop.engines.base import AdapterWeights
from agentloop.errors import ConfigError
from agentloop.hf_names import CheckpointNames
from agentloop.trainers.dist import all_reduce_max, all_reduce_sum, init_distributed
from agentloop.trainers.logprobs import token_logprobs
from agentloop.trainers.lora import LoraAdapters, apply_lora, base_fingerprint, store_base_in
from agentloop.trainers.losses import agg_loss, kl_penalty, policy_loss
from agentloop.trainers.packing import (
    MicroBatch,
    TrainSeq,
    loss_counts,
    micro_batch_partition,
    pack,
)
from agentloop.trainers.vlm import vision_spec
from agentloop.trainers.worker_build import (
    freeze_vision,
    full_tensor,
    load_model,
    pick_device,
    shard_model,
)
from agentloop.trainers.worker_config import WorkerConfig

__all__ = ["PolicyWorker", "WorkerConfig"]

log = logging.getLogger(__name__)

# Files a model dir needs besides the weights and config, copied on save_pretrained so the export
# works with `agentloop eval` and vLLM as it is.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
)


class PolicyWorker:
    """One rank of an FSDP2-sharded HF causal LM, or Qwen2-VL-family VLM, with its AdamW
    optimiser.

    Every rank of the default process group constructs one, with the same arguments; all methods
    are collective (every rank calls them, in the same order). Without a process group, a
    world of 1 is created, so a single local process runs the same code as N ranks.
    ``model`` is an HF model dir, a config (seeded random init) or a model instance. A frozen
    reference model for KL is a second ``PolicyWorker`` used only for :meth:`compute_logprobs`.
    A VLM scores and trains sequences with their ``images`` (pixel inputs and M-RoPE positions,
    per packed sequence) and leaves its vision tokens out of the softmax, as the sampler did.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | PretrainedConfig | PreTrainedModel,
        config: WorkerConfig | None = None,
    ) -> None:
        self.config = cfg = config or WorkerConfig()
        init_distributed()
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device = pick_device(cfg.device)
        self.source_dir = Path(model) if isinstance(model, str | os.PathLike) else None
        loaded = load_model(model, cfg, self.device)
        if cfg.freeze_vision:
            freeze_vision(loaded)
        if cfg.lora.enabled:
            apply_lora(loaded, cfg.lora, seed=cfg.seed)
            if self.device.type == "cuda" and cfg.dtype == "bfloat16":
                store_base_in(loaded, torch.bfloat16)
        self.model = shard_model(loaded, cfg, self.device, self.world_size)
        self.lora = LoraAdapters(self.model, cfg.lora) if cfg.lora.enabled else None
        self._checkpoint_names = CheckpointNames(self.model)
        # a vision-language model's image inputs, M-RoPE index and banned (vision) ids
        self.vision = vision_spec(self.model, self.source_dir)
        self._banned = self.vision.banned_token_ids if self.vision is not None else ()
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=cfg.lr,
            betas=cfg.betas,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
        )
        warmup = cfg.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0
        )
        self.step = 0

    def _micro_batches(self, seqs: Sequence[TrainSeq]) -> list[MicroBatch]:
        """Token-budget micro-batches, the same number on every rank (FSDP2 collectives run once
        per forward): the count is all-reduced (MAX) until every rank can reach it; a rank with
        fewer sequences than the count pads with 1-token fully-masked batches (zero loss and
        zero gradient)."""
        lengths = [len(s) for s in seqs]
        budget = self.config.max_tokens_per_micro_batch
        target = 1
        while True:
            want = max(1, min(target, len(lengths)))
            parts = micro_batch_partition(lengths, budget, min_num_micro_batches=want)
            agreed = int(all_reduce_max([float(len(parts))])[0])
            if agreed == target:
                break
            target = agreed
        batches = [self._pack(seqs, p) for p in parts]
        if len(batches) < target:
            batches += [self._empty_batch(seqs)] * (target - len(batches))
        return batches

    def _empty_batch(self, seqs: Sequence[TrainSeq]) -> MicroBatch:
        zero = torch.zeros(1)
        has_old = bool(seqs) and seqs[0].old_logprobs is not None
        has_ref = not seqs or seqs[0].ref_logprobs is not None
        seq = TrainSeq(
            token_ids=torch.zeros(1, dtype=torch.long),
            loss_mask=zero,
            advantages=zero,
            rollout_logprobs=zero,
            old_logprobs=zero if has_old else None,
            ref_logprobs=zero if has_ref else None,
        )
        return dataclasses.replace(self._pack([seq]), seq_index=())

    def _pack(self, seqs: Sequence[TrainSeq], indices: Sequence[int] | None = None) -> MicroBatch:
        rope = self.vision.rope_index if self.vision is not None else None
        return pack(seqs, indices, rope_index=rope)

    @torch.no_grad()
    def compute_logprobs(self, seqs: Sequence[TrainSeq]) -> list[torch.Tensor]:
        """Per-sequence logprobs ``[L_i]`` (fp32, CPU) under the current weights, at the config's
        temperature, in the order given; position 0 of each is 0 (nothing predicts it)."""
        self.model.eval()
        out: list[torch.Tensor | None] = [None] * len(seqs)
        for mb in self._micro_batches(seqs):
            lp = token_logprobs(
                self.model,
                mb.to(self.device),
                temperature=self.config.temperature,
                banned_token_ids=self._banned,
            ).logprobs
            if not mb.seq_index:  # padding: its forward only keeps this rank in step
                continue
            for i, x in zip(mb.seq_index, mb.unpack(lp.float().cpu()), strict=True):
                out[i] = x
        return [x for x in out if x is not None]

    def train_step(self, seqs: Sequence[TrainSeq]) -> dict[str, float]:
        """One optimiser step on this rank's share of a mini-batch; metrics are global.

        ``old_logprobs`` are the behaviour policy's, from :meth:`compute_logprobs`; sequences
        without them train on-policy (old = current logprobs, detached: exact only for the
        first optimiser step on freshly generated data). ``ref_logprobs`` are required when
        ``kl_coef > 0``. A non-finite gradient norm skips the update (``step_skipped`` 1).

        Metrics: ``loss``, ``pg_loss``, ``kl_loss``, ``entropy_loss`` (the loss terms, aggregated
        with ``loss_agg_mode``); ``entropy``, ``kl`` and the policy metrics of
        :class:`~agentloop.trainers.losses.PolicyLossMetrics` (``clipfrac``, ``approx_kl``,
        ``tis_*``, ``rollout_abs_diff``: engine vs trainer) as means over loss tokens;
        ``grad_norm`` (before clipping), ``lr``, ``tokens``/``seqs`` (global loss tokens and
        sequences), ``micro_batches`` (per rank).
        """
        cfg = self.config
        if cfg.kl_coef > 0 and any(s.ref_logprobs is None for s in seqs):
            raise ConfigError(
                f"kl_coef={cfg.kl_coef} but some sequences have no ref_logprobs; compute them "
                "with the reference worker's compute_logprobs, or set kl_coef=0"
            )
        batches, tokens, num_seqs = self._begin_step(seqs)
        sums = torch.zeros(len(_SUM_KEYS), dtype=torch.float64, device=self.device)
        tis_max = torch.zeros((), device=self.device)
        for mb in batches:
            loss, stats, mb_tis_max = self._loss(mb.to(self.device), tokens, num_seqs)
            loss.backward()
            sums += stats  # stays on the device: one sync per step, not per micro-batch
            tis_max = torch.maximum(tis_max, mb_tis_max)
        common = self._finish_step(batches, tokens, num_seqs)
        total = all_reduce_sum(sums.tolist())
        out = dict(zip(_SUM_KEYS, total, strict=True))
        for k in ("entropy", "kl", *_TOKEN_MEAN_KEYS):
            out[k] /= max(tokens, 1.0)
        return {**out, "tis_max": all_reduce_max([float(tis_max)])[0], **common}

    def sft_step(self, seqs: Sequence[TrainSeq]) -> dict[str, float]:
        """One optimiser step of supervised fine-tuning on this rank's share of a batch: the mean
        negative log-likelihood over the global loss tokens (``loss_mask``; token-mean at
        temperature 1, so it does not depend on packing, micro-batch or DP size). Other
        ``TrainSeq`` fields are ignored. Metrics: ``loss`` (that NLL, before the step),
        ``grad_norm``, ``step_skipped``, ``lr``, ``tokens``, ``seqs``, ``micro_batches``."""
        batches, tokens, num_seqs = self._begin_step(seqs)
        nll = torch.zeros((), dtype=torch.float64, device=self.device)
        for mb in batches:
            mb = mb.to(self.device)
            lp = token_logprobs(self.model, mb, banned_token_ids=self._banned).logprobs
            loss = agg_loss(-lp, mb.loss_mask, "token-mean", global_token_count=tokens)
            loss.backward()
            nll += loss.detach().double()
        common = self._finish_step(batches, tokens, num_seqs)
        return {"loss": all_reduce_sum([float(nll)])[0], **common}

    def _begin_step(self, seqs: Sequence[TrainSeq]) -> tuple[list[MicroBatch], float, float]:
        """Train mode and zeroed gradients; this rank's micro-batches of ``seqs`` with the global
        (all-rank) counts of loss tokens and sequences that normalise every loss."""
        self.model.train()
        batches = self._micro_batches(seqs)
        tokens, num_seqs = all_reduce_sum([float(c) for c in loss_counts(batches)])
        self.optimizer.zero_grad(set_to_none=True)
        return batches, tokens, num_seqs

    def _finish_step(
        self, batches: Sequence[MicroBatch], tokens: float, num_seqs: float
    ) -> dict[str, float]:
        """Clip and step the optimiser and the schedule; the metrics every kind of step reports
        (``lr`` is the one the step used)."""
        lr = float(self.scheduler.get_last_lr()[0])
        grad_norm = self._clip_and_step()
        self.scheduler.step()
        self.step += 1
        return {
            "grad_norm": grad_norm,
            "step_skipped": float(not math.isfinite(grad_norm)),
            "lr": lr,
            "tokens": tokens,
            "seqs": num_seqs,
            "micro_batches": float(len(batches)),
        }

    def _loss(
        self, mb: MicroBatch, tokens: float, num_seqs: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This micro-batch's share of the global loss, its detached ``_SUM_KEYS`` vector, and
        its largest TIS weight."""
        cfg = self.config
        out = token_logprobs(
            self.model,
            mb,
            temperature=cfg.temperature,
            with_entropy=True,
            banned_token_ids=self._banned,
        )
        assert out.entropy is not None
        lp, mask, cu = out.logprobs, mb.loss_mask, mb.cu_seqlens
        old = mb.old_logprobs if mb.old_logprobs is not None else lp.detach()
        pg_mat, pm = policy_loss(
            lp,
            old,
            mb.advantages,
            mask,
            cfg.policy_loss,
            clip_ratio_low=cfg.clip_ratio_low,
            clip_ratio_high=cfg.clip_ratio_high,
            clip_ratio_c=cfg.clip_ratio_c,
            rollout_logprobs=mb.rollout_logprobs,
            tis_cap=cfg.tis_cap,
            cu_seqlens=cu,
        )

        def agg(x: torch.Tensor) -> torch.Tensor:
            return agg_loss(
                x,
                mask,
                cfg.loss_agg_mode,
                cu_seqlens=cu,
                global_token_count=tokens,
                global_seq_count=num_seqs,
                norm_len=cfg.norm_len,
            )

        kl_mat = (
            kl_penalty(lp, mb.ref_logprobs, cfg.kl_type)
            if mb.ref_logprobs is not None
            else torch.zeros_like(lp)
        )
        pg, kl, ent = agg(pg_mat), agg(kl_mat), agg(out.entropy)
        loss = pg
        if cfg.kl_coef:
            loss = loss + cfg.kl_coef * kl
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * ent
        n = pm.num_tokens
        sums = [loss, pg, kl, ent, _masked_sum(out.entropy, mask), _masked_sum(kl_mat, mask)]
        sums += [n * getattr(pm, k) for k in _TOKEN_MEAN_KEYS]
        return loss, torch.stack(sums).detach().double(), pm.tis_max

    def _clip_and_step(self) -> float:
        """Clip by the global gradient norm (DTensor-aware) and step; skip on a non-finite norm."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.config.grad_clip or math.inf
        norm = float(full_tensor(torch.nn.utils.clip_grad_norm_(params, max_norm)))
        if math.isfinite(norm):
            self.optimizer.step()
        else:  # loud: a skipped update is reported (log + ``step_skipped``), never silent
            log.warning(
                "train step %d skipped: the gradient norm is %s (non-finite), so the optimizer did "
                "not step; check the batch's rewards/advantages and the learning rate",
                self.step + 1,
                norm,
            )
            self.optimizer.zero_grad(set_to_none=True)
        return norm

    def release_memory(self) -> None:
        """Free the gradients (the next step zeroes them anyway) and hand what the allocator
        caches (activations) back to the device, so that a colocated engine waking next finds
        it free: measured on a 7B step, gradients and cache together were as large as the
        engine's whole budget."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    @torch.no_grad()  # DTensor.to_local is an autograd op: ~10x slower with grad mode on
    def state_dict_for_inference(
        self, *, dtype: torch.dtype | None = None, device: torch.device | str | None = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, full tensor)`` per parameter/buffer of the HF state dict, one at a time.

        Collective: every rank iterates to the end (each tensor is all-gathered from its shards
        when reached), so peak extra memory is one full tensor. Names are the HF checkpoint
        names (transformers' load-time renamings reverted), as vLLM's
        ``reload_weights(is_checkpoint_format=True)`` expects; a tied weight appears once, under
        its first name, as in a saved checkpoint (``lm_head.weight`` is not in a checkpoint whose
        embeddings are tied). With LoRA (``actor.lora``) each adapted weight is the merged
        ``W + scaling · B·A`` under the plain model's name, and the adapters are left out.
        ``dtype``/``device`` convert each tensor (e.g. bf16 for the engine,
        ``"cpu"`` to hand it across processes). On a single rank, a tensor that needs no
        conversion is a view of the live parameter (no gather, no copy): clone it to keep it
        across a later ``train_step``.
        """
        seen: set[tuple[int, tuple[int, ...]]] = set()
        # keep_vars: the parameters themselves; state_dict() would detach each DTensor, a
        # dispatched op that was the sync's largest cost after the renaming (~30 us a tensor)
        lora = self.lora
        for model_name, shard in self.model.state_dict(keep_vars=True).items():
            name = model_name if lora is None else lora.inference_name(model_name)
            if name is None:  # an adapter: merged into its base weight below
                continue
            local = shard.to_local() if isinstance(shard, DTensor) else shard
            key = (local.data_ptr(), tuple(shard.shape))
            if key in seen:  # the same parameter under a second name (tied weights)
                continue
            seen.add(key)
            full = full_tensor(shard).detach()
            if lora is not None:
                full = lora.merge(name, full, full_tensor)
            if dtype is not None or device is not None:
                full = full.to(device=device, dtype=dtype)
            yield from self._checkpoint_names(name, full).items()

    def base_fingerprint(self) -> str:
        """A digest of the frozen base weights under LoRA (see
        :func:`~agentloop.trainers.lora.base_fingerprint`); collective."""
        return base_fingerprint(self.model, self.device)

    def adapter_weights(self, dtype: torch.dtype | None = None) -> AdapterWeights:
        """The LoRA adapter in PEFT's format, its full tensors in the CPU memory of every rank
        (for a LoRA engine's in-place update), converted to ``dtype`` (the engine's) if given;
        collective."""
        if self.lora is None:
            raise ConfigError("adapter_weights needs a LoRA policy (actor.lora.rank > 0)")
        with torch.no_grad():
            named = self.lora.adapter_tensors(full_tensor)
            tensors = {k: v.to(device="cpu", dtype=dtype) for k, v in named}
        return AdapterWeights(tensors, self.lora.peft_config(self.source_dir))

    def save_adapter(self, path: str | os.PathLike[str]) -> None:
        """Write the LoRA adapter alone as a PEFT adapter dir (rank 0 writes; collective)."""
        if self.lora is None:
            raise ConfigError(
                "save_adapter needs a LoRA policy (actor.lora.rank > 0); this one trains every "
                "weight: write it whole with save_pretrained"
            )
        fingerprint = self.base_fingerprint()
        with torch.no_grad():
            tensors = {k: v.cpu() for k, v in self.lora.adapter_tensors(full_tensor)}
        if self.rank == 0:
            self.lora.save_adapter(Path(path), tensors, self.source_dir, fingerprint)
        dist.barrier()

    def save_pretrained(
        self, path: str | os.PathLike[str], *, dtype: torch.dtype | None = None
    ) -> None:
        """Write an HF model dir (config, safetensors, tokenizer files of the source dir) from
        rank 0; collective. The full weights are gathered into rank 0's CPU memory first;
        ``dtype`` (e.g. bf16) converts them, and the config records it."""
        state: dict[str, torch.Tensor] = {}
        for name, tensor in self.state_dict_for_inference(dtype=dtype, device="cpu"):
            if self.rank == 0:
                state[name] = tensor
        if self.rank == 0:
            out = Path(path)
            self.model.save_pretrained(out, state_dict=state, save_original_format=False)
            if dtype is not None:  # HF wrote the live (fp32) params' dtype
                config = copy.deepcopy(self.model.config)
                config.dtype = dtype
                config.save_pretrained(out)
            if self.source_dir is not None:
                for fname in _TOKENIZER_FILES:
                    if (self.source_dir / fname).is_file():
                        shutil.copy2(self.source_dir / fname, out / fname)
        dist.barrier()


# train_step's summed quantities: the loss shares (summed over micro-batches and ranks = global
# values), then entropy/KL sums over loss tokens, then token-weighted policy metrics.
_TOKEN_MEAN_KEYS = (
    "clipfrac",
    "clipfrac_lower",
    "approx_kl",
    "tis_mean",
    "tis_capped_frac",
    "rollout_abs_diff",
)
_SUM_KEYS = ("loss", "pg_loss", "kl_loss", "entropy_loss", "entropy", "kl", *_TOKEN_MEAN_KEYS)


def _masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over the loss mask, detached (for metrics)."""
    return torch.where(mask > 0, x.detach(), 0.0).sum()
