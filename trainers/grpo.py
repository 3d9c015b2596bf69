"""The GRPO/DAPO recipe: the online RL loop, readable top to bottom.

One step: sample prompts → collect groups with the rollout loop that ``agentloop eval`` uses →
shape rewards (overlong) and, with DAPO dynamic sampling, keep only informative groups → old
(and reference) logprobs → advantages → mini-batch updates × epochs → sync the new weights into
the engines → log → validate (``eval_async`` on the live engines) → checkpoint.

``trainer.mode`` only changes where the batch comes from (``trainers/rollouts.py``): generated
in the step (sync), one step ahead, or streamed by a rollout side running beside the trainer
(async); the training half of the step is the same code. The policy version is the number of
steps trained: pushing step s's weights makes the engines version s, and every sampled token
records its version (off-policy tokens are corrected with the decoupled-PPO weight
``min(π_old/π_behaviour, actor.tis_cap)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import shutil
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from agentloop.chat import TokenBuilder
from agentloop.collect import EnvFactory
from agentloop.engines.base import Engine
from agentloop.errors import AgentLoopError, ConfigError
from agentloop.loop_workers import Collector, batch_collector
from agentloop.sandboxes.remote_pool import pool_stats
from agentloop.tools.recording import tool_tape
from agentloop.tools.runtime import runtime_stats
from agentloop.trainers.advantages import KlInReward, trajectory_advantages
from agentloop.trainers.checkpoint import RngState, RunState, resume_checkpoint
from agentloop.trainers.config import (
    AlgorithmConfig,
    TrainConfig,
    batch_sizes,
    config_to_yaml,
)
from agentloop.trainers.data import PromptSampler, write_step_groups
from agentloop.trainers.group import WorkerGroup, open_worker_group
from agentloop.trainers.guards import RunGuard
from agentloop.trainers.metrics import MetricsLogger, PhaseTimer, mismatch_metrics, rollout_metrics
from agentloop.trainers.notices import RunNotices
from agentloop.trainers.packing import TrainSeq, train_seqs
from agentloop.trainers.preflight import check_start
from agentloop.trainers.rollouts import (
    BatchSource,
    BusyMeter,
    GenContext,
    make_source,
    version_metrics,
)
from agentloop.types import TrajectoryGroup

__all__ = ["StepInfo", "TrainResult", "train", "train_async"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepInfo:
    """What an ``on_step`` hook sees after a step (weights already synced into the engines)."""

    step: int
    metrics: Mapping[str, float]
    groups: tuple[TrajectoryGroup, ...]
    group: WorkerGroup


@dataclass(frozen=True)
class TrainResult:
    """Where a finished run left things."""

    out_dir: Path
    last_step: int
    metrics: Mapping[str, float]
    checkpoint: Path | None
    export_dir: Path | None


StepHook = Callable[[StepInfo], Awaitable[None]]


@dataclass
class _Run:
    """State shared by the phases of a run."""

    cfg: TrainConfig
    out: Path
    model_dir: Path
    builder: TokenBuilder
    sampler: PromptSampler
    group: WorkerGroup
    engine: BusyMeter | None = None  # the group's engine, with its busy time measured
    source: BatchSource | None = None
    notices: RunNotices | None = None
    steps_without_tools: int = 0  # consecutive steps in which no episode called a tool

    def batches(self) -> BatchSource:
        assert self.source is not None
        return self.source


def train(cfg: TrainConfig, *, on_step: StepHook | None = None) -> TrainResult:
    """Run ``cfg`` to ``trainer.total_steps`` (resuming per ``checkpoint.resume``)."""
    return asyncio.run(train_async(cfg, on_step=on_step))


async def train_async(
    cfg: TrainConfig, *, on_step: StepHook | None = None, engine: Engine | None = None
) -> TrainResult:
    """:func:`train` inside a running event loop; ``on_step`` is awaited after every step.
    ``engine`` (local placement) generates instead of a vLLM engine of the run's own."""
    cfg.logging.check_available()  # before the run dir is made (check_start repeats it)
    out = Path(cfg.trainer.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(config_to_yaml(cfg))
    notices = RunNotices(out)
    for message in cfg.notices():
        notices.note(message, message)
    checked = await check_start(cfg)  # env, tools, services, tasks, model, template, parser
    env_of, tasks, builder, model_dir = (
        checked.env_of, checked.tasks, checked.builder, checked.model_dir
    )  # fmt: skip
    assert model_dir is not None and builder is not None  # checked: check_model is on
    print(f"model {model_dir}, {cfg.trainer.placement} placement, run dir {out}")
    print(batch_sizes(cfg, len(tasks)).describe(), flush=True)
    print(f"tool-call parser {builder.parser_for(cfg.rollout.parser)}")
    sampler = PromptSampler(tasks, seed=cfg.trainer.seed, shuffle=cfg.data.shuffle)
    async with (
        open_worker_group(cfg, model_dir, engine=engine) as group,
        tool_tape(cfg.rollout.tool_io(), env=cfg.data.env),  # tool calls taped, if asked
    ):
        meter = BusyMeter(group.engine) if group.engine is not None else None
        async with _collector(cfg, meter, env_of, builder) as play:
            run = _Run(cfg, out, model_dir, builder, sampler, group, meter, notices=notices)
            state = await _restore(run)
            start, source = (state.step, state.source) if state else (0, None)
            run.source = make_source(GenContext.of(cfg, play, sampler), start=start, state=source)
            logger = MetricsLogger(
                cfg.logging,
                out,
                total_steps=cfg.trainer.total_steps,
                start_step=start,
                run_config=dataclasses.asdict(cfg),
            )
            try:
                return await _loop(run, logger, start, on_step)
            finally:
                logger.close()
                await run.batches().aclose()


def _collector(
    cfg: TrainConfig, engine: Engine | None, env_of: EnvFactory, builder: TokenBuilder
) -> contextlib.AbstractAsyncContextManager[Collector | None]:
    """The run's ``collect`` over ``rollout.loop_workers`` processes; None when the run
    generates nothing (a replayed run starts no engine)."""
    if engine is None:
        return contextlib.nullcontext(None)
    rollout = cfg.rollout
    return batch_collector(engine, env_of, builder, rollout.base(), workers=rollout.loop_workers)


async def _loop(
    run: _Run, logger: MetricsLogger, start: int, on_step: StepHook | None
) -> TrainResult:
    cfg, total = run.cfg, run.cfg.trainer.total_steps
    can_generate = run.group.engine is not None
    if cfg.trainer.val_before_train and start == 0 and can_generate:
        logger.log(0, await _validate(run, 0), advance=False)
    metrics: dict[str, float] = {}
    checkpoint: Path | None = None
    guard = RunGuard(cfg.trainer.max_failed_steps, cfg.trainer.tool_error_warn_rise)
    for step in range(start + 1, total + 1):
        timer = PhaseTimer()
        busy0 = run.engine.busy_s() if run.engine is not None else 0.0
        metrics, groups = await _step(run, step, timer)
        trajs = [t for g in groups for t in g.trajectories]
        metrics.update(guard.check(step, trajs, metrics.get("rollout/tool_error_rate", 0.0)))
        for i, pool in enumerate(pool_stats()):  # remote sandbox servers used on this loop
            metrics.update(pool.metrics(f"sandbox{i or ''}"))
        abandoned = runtime_stats()  # tool calls past their deadline whose work went on
        metrics["tools/abandoned_running"] = float(abandoned.abandoned_running)
        metrics["tools/abandoned_total"] = float(abandoned.abandoned_total)
        if guard.should_stop:
            logger.log(step, metrics)  # the failing steps' metrics are kept
            raise guard.stop(step, trajs)
        last = step == total
        val_every = cfg.trainer.val_every
        if can_generate and val_every > 0 and (last or _every(val_every, step)):
            with timer("testing"):
                metrics.update(await _validate(run, step))
        metrics.update(timer.metrics())
        metrics.update(_idle_metrics(metrics, run.engine.busy_s() - busy0 if run.engine else 0.0))
        metrics["perf/tokens_per_s"] = metrics.get("perf/tokens", 0.0) / metrics["timing_s/step"]
        if metrics.get("timing_s/gen", 0.0) > 0 and "perf/sampled_tokens" in metrics:
            metrics["perf/gen_tokens_per_s"] = (
                metrics["perf/sampled_tokens"] / metrics["timing_s/gen"]
            )
        # logged before the step's checkpoint: a run killed once the checkpoint exists resumes
        # after this step, so its metrics line must already be written (a kill in between
        # re-runs the step, whose line is then logged again)
        logger.log(step, metrics)
        if _every(cfg.checkpoint.every, step) or (last and cfg.checkpoint.save_final):
            checkpoint = await _save(run, step)
        if on_step is not None:
            await on_step(StepInfo(step, metrics, tuple(groups), run.group))
    export = None
    if cfg.checkpoint.export_final:
        export = run.out / "final"
        await run.group.export(export)
        print(f"exported the trained model to {export} (an HF model dir)", flush=True)
    return TrainResult(run.out, max(start, total), metrics, checkpoint, export)


def _every(n: int, step: int) -> bool:
    return n > 0 and step % n == 0


_TRAINER_PHASES = ("old_log_prob", "ref", "adv", "update_actor", "sync_weights")


def _idle_metrics(metrics: Mapping[str, float], rollout_busy_s: float) -> dict[str, float]:
    """Shares of the step's wall time the trainer computed nothing, and no generation request
    was in flight (the rollout side was idle)."""
    wall = metrics["timing_s/step"]
    busy = sum(metrics.get(f"timing_s/{p}", 0.0) for p in _TRAINER_PHASES)
    return {
        "perf/trainer_idle_frac": max(0.0, 1.0 - busy / wall),
        "perf/rollout_idle_frac": max(0.0, 1.0 - rollout_busy_s / wall),
    }


def _guard_tool_use(run: _Run, step: int, metrics: dict[str, float]) -> None:
    """``trainer.stop_without_tool_calls``: fail a run whose policy no longer calls tools."""
    limit = run.cfg.trainer.stop_without_tool_calls
    if limit <= 0 or not run.builder.tools:
        return
    used = metrics.get("rollout/tool_episode_frac", 0.0) > 0
    run.steps_without_tools = 0 if used else run.steps_without_tools + 1
    if run.steps_without_tools >= limit:
        raise AgentLoopError(
            f"step {step}: no episode called a tool in the last {run.steps_without_tools} steps "
            f"(trainer.stop_without_tool_calls={limit}): the policy stopped using its tools, so "
            "training is single-turn. Check that rollout.parser reads this model's tool-call "
            "format (auto picks it from the chat template), or raise/disable the guard (0)"
        )


async def _step(
    run: _Run, step: int, timer: PhaseTimer
) -> tuple[dict[str, float], list[TrajectoryGroup]]:
    """One RL step: rollouts → logprobs → advantages → updates → weight sync."""
    cfg, group = run.cfg, run.group
    # async modes keep generating while the trainer works: the engines never sleep
    sleep = cfg.trainer.sleep_engines and group.owns_engines and cfg.trainer.mode == "sync"
    with timer("gen"):
        groups, metrics = await group.serve(run.batches().next_batch(step), version=step - 1)
    if cfg.rollout.save_trajectories:
        write_step_groups(run.out / "trajectories", step, groups, cfg.data.env)
    metrics.update(rollout_metrics(groups))
    _guard_tool_use(run, step, metrics)
    metrics.update(version_metrics(groups, step - 1))
    trajs = [t for g in groups for t in g.trajectories]
    keep = [i for i, t in enumerate(trajs) if t.num_trained_tokens > 0]
    if not keep:
        log.warning("step %d: no trajectory has a trained token; skipping the update", step)
        metrics.update(await _push(run, step, timer))
        return {**metrics, "actor/updates": 0.0}, groups
    if sleep:  # level 2: sync mode reloads every weight below, so none is copied to the host
        # (3B, H100: 0.15 s for sleep + reload; level 1 7.2 s); an adapter-only sync (LoRA)
        # reloads no base weight, so they go to host memory and back (level 1)
        await group.sleep_engines(level=1 if cfg.engine_lora_rank else 2)
    seqs = train_seqs([trajs[i] for i in keep], [0.0] * len(keep), vision=run.builder.vision)
    with timer("old_log_prob"):
        old = await group.compute_logprobs(seqs)
    engine_lp, masks = [s.rollout_logprobs for s in seqs], [s.loss_mask for s in seqs]
    metrics.update(mismatch_metrics(engine_lp, old, masks, tis_cap=cfg.actor.tis_cap))
    ref = None
    if cfg.needs_ref:
        with timer("ref"):
            ref = await group.compute_logprobs(seqs, ref=True)
    with timer("adv"):
        adv = _advantages(cfg.algorithm, groups, keep, old, ref)
    metrics.update(_adv_metrics(adv, seqs))
    seqs = [
        dataclasses.replace(
            s, advantages=a, old_logprobs=o, ref_logprobs=None if ref is None else r
        )
        for s, a, o, r in zip(seqs, adv, old, ref or old, strict=True)
    ]
    with timer("update_actor"):
        metrics.update(await _update(run, seqs, step))
    metrics["perf/tokens"] = float(sum(len(s) for s in seqs))
    if sleep:
        await group.wake_engines(["weights"])
    metrics.update(await _push(run, step, timer))
    if sleep:
        await group.wake_engines(["kv_cache"])
    return metrics, groups


async def _push(run: _Run, step: int, timer: PhaseTimer) -> dict[str, float]:
    """Make the engines policy version ``step`` (every ``push_every`` steps, and after the
    last); an outside engine has no weights to push, and follows the trainer's version."""
    t, group = run.cfg.trainer, run.group
    if not (_every(t.push_every, step) or step == t.total_steps):
        return {}
    metrics: dict[str, float] = {}
    if group.owns_engines:
        interrupt = t.mode != "sync" and t.partial_rollouts
        with timer("sync_weights"):
            metrics = await group.sync_weights(step, interrupt=interrupt)
    run.batches().pushed(step)
    return metrics


def _advantages(
    alg: AlgorithmConfig,
    groups: Sequence[TrajectoryGroup],
    keep: Sequence[int],
    old: Sequence[torch.Tensor],
    ref: Sequence[torch.Tensor] | None,
) -> list[torch.Tensor]:
    """The library estimator with the run's settings; ``old``/``ref`` are aligned with ``keep``."""
    kl = None
    if alg.use_kl_in_reward:
        if ref is None:
            raise ConfigError(
                "algorithm.use_kl_in_reward=true needs the reference model's logprobs; the run "
                "built no reference model (TrainConfig.needs_ref)"
            )
        kl = KlInReward(alg.kl_reward_coef, alg.kl_reward_type, old, ref)
    return trajectory_advantages(
        groups,
        alg.adv_estimator,
        keep=keep,
        kl=kl,
        norm_by_std=alg.norm_by_std,
        epsilon=alg.epsilon,
        gamma=alg.gamma,
    )


def _adv_metrics(adv: Sequence[torch.Tensor], seqs: Sequence[TrainSeq]) -> dict[str, float]:
    m = torch.cat([s.loss_mask for s in seqs]) > 0
    a = torch.cat(list(adv))[m]
    if a.numel() == 0:
        return {}
    return {
        "adv/mean": float(a.mean()),
        "adv/abs_mean": float(a.abs().mean()),
        "adv/max": float(a.max()),
        "adv/min": float(a.min()),
    }


async def _update(run: _Run, seqs: Sequence[TrainSeq], step: int) -> dict[str, float]:
    """``ppo_epochs`` passes over ``mini_batches`` contiguous mini-batches, one optimiser update
    each. Metrics are the mean over updates (``actor/updates`` counts them)."""
    t, world = run.cfg.trainer, run.group.world_size
    # every rank needs a sequence per update; heavy filtering can leave fewer than planned.
    # Not an error (filtering is random), but the run should say so: a warning and a notice
    k = max(1, min(t.mini_batches, len(seqs) // world))
    if k < t.mini_batches and run.notices is not None:
        run.notices.note(
            "fewer_mini_batches",
            f"step {step}: only {len(seqs)} sequences with trained tokens for {world} worker(s), "
            f"so the update used {k} mini-batch(es) instead of trainer.mini_batches="
            f"{t.mini_batches} (warned once; actor/updates has each step's count); lower "
            "mini_batches or raise trainer.prompts_per_step",
            step=step,
        )
    bounds = [round(i * len(seqs) / k) for i in range(k + 1)]
    chunks = [list(seqs[a:b]) for a, b in itertools.pairwise(bounds)]
    results = []
    for _ in range(t.ppo_epochs):
        for chunk in chunks:
            results.append(await run.group.train_step(chunk))
    out = {f"actor/{key}": sum(r[key] for r in results) / len(results) for key in results[0]}
    out["actor/updates"] = float(len(results))
    return out


async def _validate(run: _Run, step: int) -> dict[str, float]:
    """``val/*``: the eval loop (same rollout, same scoring) on the live engines."""
    from agentloop.eval import EvalConfig, eval_async

    cfg = run.cfg
    out = run.out / "val" / f"step_{step:06d}"
    shutil.rmtree(out, ignore_errors=True)  # a resumed run redoes this step's validation
    ecfg = EvalConfig(
        env=cfg.data.env,
        model=str(run.model_dir),
        out=out,
        n=cfg.trainer.val_n,
        num_tasks=cfg.data.num_val_tasks,
        split=cfg.data.val_split,
        engine="vllm",
        seed=cfg.trainer.seed,
        concurrency=cfg.rollout.concurrency,
        rollout=cfg.rollout.base(),
        env_kwargs=cfg.data.env_args(),
        reward=cfg.data.reward,
        tools=tuple(cfg.data.tools),
        tool_io=cfg.rollout.tool_io(),  # the run's tape: validation replays (or records) too
    )
    assert run.engine is not None
    s = await eval_async(ecfg, engine=run.engine, progress=False)
    metrics = {
        "val/reward_mean": s.reward.mean,
        "val/turns_mean": s.mean_turns,
        "val/response_len_mean": s.mean_response_tokens,
        "val/tool_calls_mean": s.tool_calls_per_episode,
        "val/tool_error_rate": s.tool_error_rate,
        "val/episodes": float(s.episodes),
        "val/grader_timeouts": float(s.grader_timeouts),
    }
    if 1 in s.pass_at_k:
        metrics["val/pass@1"] = s.pass_at_k[1]
    return metrics


async def _save(run: _Run, step: int) -> Path:
    state = RunState(step, run.batches().state(), RngState.capture())
    return await run.group.save_checkpoint(
        run.out / "checkpoints", step=step, run_state=state, keep_last=run.cfg.checkpoint.keep_last
    )


async def _restore(run: _Run) -> RunState | None:
    """Load the checkpoint ``checkpoint.resume`` selects and return its run state (None: start
    afresh). The engines get the restored weights (that version) before the first rollout."""
    resume = run.cfg.checkpoint.resume
    if resume == "never":
        return None
    unverified = run.cfg.checkpoint.allow_unverified
    root = run.out / "checkpoints"
    path = (
        resume_checkpoint(root, allow_unverified=unverified) if resume == "auto" else Path(resume)
    )
    if path is None:
        return None
    state = await run.group.load_checkpoint(path, allow_unverified=unverified)
    if state is None:
        raise ConfigError(
            f"checkpoint {path} holds no RL run state (an SFT checkpoint, or one written by an "
            "older agentloop); resume from a GRPO checkpoint, or set checkpoint.resume=never"
        )
    state.rng.restore()
    if run.group.owns_engines:
        await run.group.sync_weights(state.step)
    buffered = state.source.rollout_buffer or {}
    print(
        f"resumed from {path} (step {state.step}; {len(buffered.get('groups', ()))} unconsumed "
        f"groups kept, {len(buffered.get('tasks', ()))} running tasks to replay)",
        flush=True,
    )
    return state
