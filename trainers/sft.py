"""The SFT recipe: multi-turn tool-call conversations → PolicyWorker.sft_step, top to bottom.

``agentloop sft CONFIG.yaml key=value ...`` runs :func:`run_sft`: read and check the JSONL
conversations, tokenize them with the rollout's token builder (loss on assistant tokens only),
hold out an eval split, then epochs of seeded shuffles cut into fixed-size batches, one optimiser
step each (packed token-budget micro-batches inside), warmup + cosine/linear learning rate,
held-out loss, resumable checkpoints, and a plain HF model dir (``OUT/model``) that
``agentloop eval`` and vLLM load as they are. Under ``torchrun`` each rank trains on its
workload-balanced share of every batch.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from agentloop.errors import ConfigError
from agentloop.trainers.checkpoint import load_checkpoint, resume_checkpoint, save_checkpoint
from agentloop.trainers.config import (
    config_to_yaml,
    local_model_dir,
)
from agentloop.trainers.dist import all_reduce_sum
from agentloop.trainers.packing import TrainSeq, dp_partition
from agentloop.trainers.sft_config import (
    LR_SCHEDULES,
    SFTConfig,
    SFTDataConfig,
    SFTTrainerConfig,
)
from agentloop.trainers.sft_data import SFTTokenizer, holdout_split, load_conversations
from agentloop.trainers.worker import PolicyWorker

__all__ = [
    "LR_SCHEDULES",
    "SFTConfig",
    "SFTDataConfig",
    "SFTResult",
    "SFTTrainerConfig",
    "eval_loss",
    "lr_lambda",
    "run_sft",
    "sft_main",
]


@dataclass(frozen=True)
class SFTResult:
    """What a run did: steps, the last training loss, held-out loss before/after (None without
    an eval split), the exported model dir (None with ``export_final`` off)."""

    out_dir: Path
    steps: int
    train_loss: float
    eval_loss_before: float | None
    eval_loss_after: float | None
    export_dir: Path | None


def lr_lambda(step: int, total: int, warmup: int, schedule: str, min_ratio: float) -> float:
    """The LR multiplier before optimiser step ``step`` (0-based): linear warmup to 1 over
    ``warmup`` steps, then ``schedule`` from 1 down to ``min_ratio`` at the last step."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup - 1))
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1 - progress
    return min_ratio + (1 - min_ratio) * shape


@dataclass(frozen=True)
class _Data:
    train: list[TrainSeq]
    eval: list[TrainSeq]
    dropped: int


def _tokenize(cfg: SFTConfig, model_dir: Path) -> _Data:
    from transformers import AutoTokenizer

    from agentloop.vision import vision_of

    d = cfg.data
    tok = SFTTokenizer(AutoTokenizer.from_pretrained(model_dir), vision=vision_of(model_dir))
    train_convs = load_conversations(d.train)
    if d.eval is not None:
        eval_convs = load_conversations(d.eval)
    else:
        keep, held = holdout_split(len(train_convs), d.eval_fraction, cfg.trainer.seed)
        eval_convs = [train_convs[i] for i in held]
        train_convs = [train_convs[i] for i in keep]
    dropped, out = 0, []
    for convs in (train_convs, eval_convs):
        seqs = []
        for conv in convs:
            seq = tok.train_seq(conv)
            if len(seq) > d.max_seq_len:
                if not d.drop_overlong:
                    raise ConfigError(
                        f"{conv.source}: the conversation is {len(seq)} tokens > data.max_seq_len"
                        f"={d.max_seq_len}; raise max_seq_len, or set data.drop_overlong=true"
                    )
                dropped += 1
                continue
            seqs.append(seq)
        out.append(seqs)
    if len(out[0]) < cfg.trainer.batch_size:
        raise ConfigError(
            f"{len(out[0])} training conversations < trainer.batch_size={cfg.trainer.batch_size};"
            " lower batch_size or add data"
        )
    return _Data(out[0], out[1], dropped)


class _Plan:
    """Which conversations each optimiser step trains on: epoch ``e`` is a shuffle seeded by
    ``(seed, e)`` alone, so a resumed run sees exactly the batches it would have seen."""

    def __init__(self, n: int, t: SFTTrainerConfig) -> None:
        self.n, self.batch_size, self.seed = n, t.batch_size, t.seed
        self.steps_per_epoch = n // t.batch_size
        total = self.steps_per_epoch * t.epochs
        self.total = min(total, t.max_steps) if t.max_steps else total
        self._orders: dict[int, list[int]] = {}

    def batch(self, step: int) -> list[int]:
        epoch, k = divmod(step, self.steps_per_epoch)
        if epoch not in self._orders:
            order = list(range(self.n))
            random.Random(f"sft/{self.seed}/{epoch}").shuffle(order)
            self._orders = {epoch: order}
        return self._orders[epoch][k * self.batch_size : (k + 1) * self.batch_size]


def _rank_share(seqs: list[TrainSeq], indices: list[int], worker: PolicyWorker) -> list[TrainSeq]:
    if worker.world_size == 1:
        return [seqs[i] for i in indices]
    parts = dp_partition([len(seqs[i]) for i in indices], worker.world_size)
    return [seqs[indices[j]] for j in parts[worker.rank]]


def eval_loss(worker: PolicyWorker, seqs: list[TrainSeq]) -> float | None:
    """Mean NLL per loss token over ``seqs`` (split across ranks); collective."""
    if not seqs:
        return None
    mine = seqs[worker.rank :: worker.world_size]
    total = count = 0.0
    for seq, lp in zip(mine, worker.compute_logprobs(mine), strict=True):
        mask = seq.loss_mask.clone()
        mask[0] = 0.0
        total -= float((lp * mask).sum())
        count += float(mask.sum())
    total, count = all_reduce_sum([total, count])
    return total / max(count, 1.0)


def _resume(worker: PolicyWorker, cfg: SFTConfig, ckpt_root: Path) -> None:
    resume = cfg.checkpoint.resume
    if resume == "never":
        return
    unverified = cfg.checkpoint.allow_unverified
    if resume == "auto":
        path = resume_checkpoint(ckpt_root, allow_unverified=unverified)
    else:
        path = Path(resume)
    if path is not None:
        load_checkpoint(worker, path, allow_unverified=unverified)
        _print(worker, f"resumed from {path} at step {worker.step}")


def _print(worker: PolicyWorker, text: str) -> None:
    if worker.rank == 0:
        print(text, file=sys.stderr, flush=True)


def _describe(data: _Data, plan: _Plan, cfg: SFTConfig, world: int) -> str:
    lens = [len(s) for s in data.train]
    loss_tokens = sum(int(s.loss_mask.sum()) for s in data.train)
    return (
        f"sft: {len(data.train)} train / {len(data.eval)} held-out conversations"
        + (f" ({data.dropped} over max_seq_len dropped)" if data.dropped else "")
        + f"; {sum(lens) / len(lens):.0f} tokens each on average, "
        f"{loss_tokens / sum(lens):.0%} of them trained (assistant)\n"
        f"sft: batch {cfg.trainer.batch_size} conversations ({world} rank(s) × "
        f"{cfg.trainer.batch_size // world}), micro-batches of <= "
        f"{cfg.actor.max_tokens_per_micro_batch} tokens; {plan.steps_per_epoch} steps/epoch, "
        f"{plan.total} steps in all"
    )


def run_sft(cfg: SFTConfig) -> SFTResult:
    """Run the SFT recipe ``cfg`` (collective under torchrun); see the module docstring."""
    result = _run(cfg)
    # The policy went with _run's frame; hand what the CUDA allocator still caches back to the
    # device, so that an engine started next in this process (the demo's GRPO stage) passes
    # vLLM's start-up check of free memory (it failed with 29 of 140 GiB free on an H200).
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def _run(cfg: SFTConfig) -> SFTResult:
    out = Path(cfg.trainer.out_dir)
    model_dir = local_model_dir(cfg.model.path)
    data = _tokenize(cfg, model_dir)
    worker = PolicyWorker(model_dir, cfg.actor)
    if cfg.trainer.batch_size % worker.world_size:
        raise ConfigError(
            f"trainer.batch_size={cfg.trainer.batch_size} is not divisible by the "
            f"{worker.world_size} ranks; make it a multiple of the number of ranks"
        )
    plan = _Plan(len(data.train), cfg.trainer)
    t = cfg.trainer
    worker.scheduler = torch.optim.lr_scheduler.LambdaLR(
        worker.optimizer,
        lambda s: lr_lambda(s, plan.total, cfg.actor.warmup_steps, t.lr_schedule, t.min_lr_ratio),
    )
    if worker.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(config_to_yaml(cfg))
    _resume(worker, cfg, out / "checkpoints")
    _print(worker, _describe(data, plan, cfg, worker.world_size))
    before = eval_loss(worker, data.eval) if worker.step == 0 else None
    train_loss, after = _train(worker, data, plan, cfg, before)
    if worker.step == 0 or after is None:  # nothing trained in this call (already done)
        after = eval_loss(worker, data.eval)
    if cfg.checkpoint.save_final:
        save_checkpoint(worker, out / "checkpoints", keep_last=cfg.checkpoint.keep_last)
    export = out / "model" if cfg.checkpoint.export_final else None
    if export is not None:
        worker.save_pretrained(export)
        _print(worker, f"sft: exported {export} (a plain HF model dir for agentloop eval / vLLM)")
    return SFTResult(out, worker.step, train_loss, before, after, export)


def _train(
    worker: PolicyWorker, data: _Data, plan: _Plan, cfg: SFTConfig, before: float | None
) -> tuple[float, float | None]:
    """The step loop, then the final held-out loss; returns (last training loss, that loss).
    Rank 0 logs (console line, progress bar, metrics.jsonl, TensorBoard, W&B)."""
    from agentloop.trainers.metrics import MetricsLogger

    out, t = Path(cfg.trainer.out_dir), cfg.trainer
    logger = None
    if worker.rank == 0:
        logger = MetricsLogger(
            dataclasses.replace(cfg.logging, console=False),
            out,
            total_steps=plan.total,
            start_step=worker.step,
        )
    loss, after = math.nan, None
    try:
        if logger is not None and before is not None:
            logger.log(0, {"val/loss": before}, advance=False)
        while worker.step < plan.total:
            t0 = time.perf_counter()
            batch = plan.batch(worker.step)
            m = worker.sft_step(_rank_share(data.train, batch, worker))
            step, loss, secs = worker.step, m["loss"], time.perf_counter() - t0
            tokens = sum(len(data.train[i]) for i in batch)
            metrics = {
                "sft/loss": loss,
                "actor/grad_norm": m["grad_norm"],
                "actor/lr": m["lr"],
                "sft/loss_tokens": m["tokens"],
                "sft/tokens": tokens,
                "perf/tokens_per_s": tokens / secs,
                "timing_s/step": secs,
                "sft/epoch": step / plan.steps_per_epoch,
            }
            last = step == plan.total
            if last or (t.eval_every and step % t.eval_every == 0):
                after = eval_loss(worker, data.eval)
                if after is not None:
                    metrics["val/loss"] = after
            if logger is not None:
                logger.log(step, metrics)
                if cfg.logging.console:
                    _write(_line(step, plan.total, metrics), progress=cfg.logging.progress)
            every = cfg.checkpoint.every
            if every and step % every == 0 and not last:
                save_checkpoint(worker, out / "checkpoints", keep_last=cfg.checkpoint.keep_last)
    finally:
        if logger is not None:
            logger.close()
    return loss, after


def _write(line: str, *, progress: bool) -> None:
    if progress:  # above the progress bar, not through it
        from tqdm import tqdm

        tqdm.write(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr, flush=True)


def _line(step: int, total: int, m: dict[str, float]) -> str:
    val = f" | val {m['val/loss']:.4f}" if "val/loss" in m else ""
    return (
        f"step {step}/{total} | loss {m['sft/loss']:.4f}{val} | lr {m['actor/lr']:.2e} | "
        f"gnorm {m['actor/grad_norm']:.3f} | tok/s {m['perf/tokens_per_s']:.0f}"
    )


def sft_main(cfg: SFTConfig) -> int:
    """``agentloop sft CONFIG key=value ...`` once the config is loaded (``load_sft_config``):
    run, report. Returns the exit status."""
    result = run_sft(cfg)
    if result.out_dir.exists():  # rank 0
        before, after = result.eval_loss_before, result.eval_loss_after
        held = f"; held-out loss {before:.4f} -> {after:.4f}" if before and after else ""
        print(f"sft: {result.steps} steps, last loss {result.train_loss:.4f}{held}")
        if result.export_dir is not None:
            print(f"sft: model in {result.export_dir}")
    return 0
