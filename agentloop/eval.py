"""Offline evaluation: play an env split with the training rollout loop; resume; write results."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentloop.chat import TokenBuilder
from agentloop.checksums import model_fingerprint
from agentloop.engines.base import Engine
from agentloop.env_maker import EnvMaker, env_factory
from agentloop.envs import Env
from agentloop.envs.base import AnswerHook
from agentloop.errors import ConfigError
from agentloop.eval_report import (
    CONFIG_FILE,
    SUMMARY_FILE,
    TRAJECTORIES_FILE,
    EvalSummary,
    is_final_segment,
    read_episodes,
    read_run,
    summarize,
)
from agentloop.io import JsonlWriter, read_json_object, trajectory_to_dict
from agentloop.loop_workers import batch_collector
from agentloop.model_files import check_model_dir
from agentloop.rollout import RolloutConfig
from agentloop.tools import get_parser
from agentloop.tools.recording import ToolTapeConfig, tool_tape
from agentloop.types import Task, Trajectory
from agentloop.vision import vision_of

__all__ = [
    "ENGINES",
    "AnswerHook",
    "EnvMaker",
    "EvalConfig",
    "config_fingerprint",
    "config_hash",
    "env_factory",
    "eval_async",
    "open_engine",
    "run_eval",
]

log = logging.getLogger(__name__)

ENGINES = ("auto", "vllm", "hf", "openai")


@dataclass(frozen=True)
class EvalConfig:
    """One eval run (the ``agentloop eval`` flags): ``n`` samples of each task of an env's
    split, played with the training rollout loop, written to ``out``."""

    env: str
    """Registered env id (``agentloop.envs.make``)."""
    model: str
    """Local model directory (with ``engine="openai"``: the tokenizer's directory)."""
    out: Path
    """Run directory: the config, the trajectories (JSONL) and ``summary.json``."""
    n: int = 8
    """Samples per task (>= 1): pass@k and majority voting are over them."""
    num_tasks: int | None = None
    """At most this many tasks of ``split`` (>= 1); None: the whole split."""
    split: str = "test"
    """The env's task split to play."""
    engine: str = "auto"
    """``vllm``, ``hf``, ``openai`` (a server at ``base_url``), or ``auto``: vLLM when it is
    installed, else HF."""
    base_url: str | None = None
    """OpenAI-compatible server URL for ``engine="openai"`` (e.g. ``http://127.0.0.1:8000/v1``)."""
    seed: int = 0
    """Seeds the episodes' sampling (and the vLLM engine)."""
    concurrency: int = 64
    """Episodes in flight at once (>= 1)."""
    loop_workers: int = 1
    """Processes the rollout loop runs in (>= 1): above 1, the episodes are spread over that
    many worker processes, the engine staying in this one (:mod:`agentloop.loop_workers`).
    Without tool recording or replay."""
    resume: bool = False
    """Continue the run in ``out``: it needs the same config hash, model, split and seed, and
    may raise ``n`` or ``num_tasks`` to extend it."""
    pass_threshold: float | None = None
    """An episode counts as a success (pass@k) when its reward is at least this; ``None``: when
    the env's verdict says its answer is right (envs that grade an answer, whose reward may pay
    more than correctness: DeepEyes' tool bonus), else when its reward is at least 1."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Episode limits and sampling, as in training."""
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of the env's constructor."""
    engine_args: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of the engine's constructor (vLLM settings; ``served_model`` for the
    OpenAI engine)."""
    tools: tuple[str, ...] = ()
    """Extra tools for the env (a ``ToolEnv``): ``mcp:COMMAND ARGS`` or ``mcp:URL``, an MCP
    server's tools (``agentloop.tools.mcp``); one named like an env tool is an error unless the
    spec asks for it to replace that tool (``mcp[replace=python]:…``)."""
    tool_io: ToolTapeConfig = field(default_factory=ToolTapeConfig)
    """Record every tool call to a directory, or replay tool outputs from one
    (``--record``, ``--replay``, ``--replay-miss``, ``--replay-latency``)."""
    reward: str | None = None
    """``FILE.py:NAME`` or ``MODULE:NAME`` replacing the env's reward (``--reward``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "out", Path(self.out))
        object.__setattr__(self, "model", str(Path(self.model).resolve()))
        if (
            self.n < 1
            or self.concurrency < 1
            or (self.num_tasks is not None and self.num_tasks < 1)
        ):
            raise ConfigError(
                f"eval needs --n >= 1, --concurrency >= 1 and --num-tasks >= 1; got n={self.n}, "
                f"concurrency={self.concurrency}, num_tasks={self.num_tasks}"
            )
        if self.engine not in ENGINES:
            raise ConfigError(f"--engine {self.engine!r} is not one of {ENGINES}")
        self.tool_io.check_loop_workers(self.loop_workers, "--loop-workers")
        if self.engine == "openai" and not self.base_url:
            raise ConfigError("--engine openai needs --base-url (e.g. http://127.0.0.1:8000/v1)")
        check_model_dir(self.model, "--model", weights=self.engine != "openai")


# ---------------------------------------------------------------------- config hash
def config_fingerprint(
    builder: TokenBuilder, config: EvalConfig, hook: AnswerHook | None
) -> dict[str, str]:
    """sha256 per part of what makes two evals comparable: template, parser, tools, rollout
    limits, sampling, env and scoring. The model, engine and seed are deliberately not in it."""
    r = config.rollout
    name = builder.parser_for(r.parser)  # "auto" resolved here, at start-up
    parser = type(get_parser(name))
    parts: dict[str, Any] = {
        "chat_template": builder.chat_template,
        "parser": [name, f"{parser.__module__}.{parser.__qualname__}"],
        "tools": builder.tools or [],
        "rollout": dataclasses.asdict(r),
        "sampling": {
            "temperature": r.temperature,
            "top_p": r.top_p,
            "top_k": r.top_k,
            "stop_token_ids": list(builder.stop_token_ids),
        },
        "env": {"id": config.env, "kwargs": dict(config.env_kwargs)}
        | ({"reward": config.reward} if config.reward else {}),  # older runs' hashes hold
        "scoring": {"pass_threshold": config.pass_threshold, "answer_hook": hook is not None},
    }
    return {k: _sha256(v) for k, v in parts.items()}


def _sha256(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def config_hash(parts: Mapping[str, str]) -> str:
    """The one hash over all parts of :func:`config_fingerprint`."""
    return _sha256(dict(parts))


# ---------------------------------------------------------------------- running
@contextlib.asynccontextmanager
async def open_engine(config: EvalConfig) -> AsyncIterator[Engine]:
    """The engine ``config.engine`` names, started, and shut down on exit."""
    kind = config.engine
    if kind == "auto":
        kind = "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    if kind == "hf":
        from agentloop.engines.hf import HFEngine

        yield HFEngine.from_settings(config.model, config.engine_args)
    elif kind == "vllm":
        from agentloop.engines.vllm import VLLMEngine

        r = config.rollout
        settings = {
            "max_model_len": r.max_prompt_len + r.max_response_len,
            "seed": config.seed,
            **config.engine_args,
        }
        async with VLLMEngine.create(config.model, **settings) as engine:
            yield engine
    else:
        from agentloop.engines.openai_http import OpenAIEngine

        api_key = os.environ.get("OPENAI_API_KEY")
        args = (str(config.base_url), config.model, config.engine_args, api_key)
        async with OpenAIEngine.from_settings(*args) as engine:
            yield engine


def run_eval(config: EvalConfig, *, progress: bool = True) -> EvalSummary:
    """Evaluate ``config.model`` on ``config.n`` samples of each task. Writes ``config.json``
    first, appends to ``trajectories.jsonl`` as each episode finishes, then writes
    ``summary.json``, all in ``config.out``. With ``resume`` the (task, sample) pairs already in
    the file are kept and not played again."""
    return asyncio.run(eval_async(config, progress=progress))


async def eval_async(
    config: EvalConfig, *, engine: Engine | None = None, progress: bool = True
) -> EvalSummary:
    """:func:`run_eval` in a running event loop, optionally with an engine already started in
    it (validation during training, tests); without one the engine ``config.engine`` is started
    and shut down here. One eval at a time writes to a run directory (see :func:`_run_lock`).
    Tool calls are recorded or replayed as ``config.tool_io`` says."""
    with _run_lock(config.out), tool_tape(config.tool_io, env=config.env):
        return await _eval_locked(config, engine, progress)


#: Held (``flock``) by the eval writing to a run directory; the OS drops it when that process
#: ends, however it ends, so a killed run never leaves a stale lock.
_LOCK_FILE = ".lock"


@contextlib.contextmanager
def _run_lock(out: Path) -> Iterator[None]:
    """Fail at once when another eval (here or in another process) holds ``out``: two writers
    would play the same episodes twice. Failing beats waiting: the other run may take hours,
    and once it ends, ``--resume`` continues from what it wrote."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / _LOCK_FILE).open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"another agentloop eval is writing to {out} (it holds {out / _LOCK_FILE}); wait "
                "for it to finish and then --resume, or choose another --out"
            ) from None
        yield


async def _eval_locked(config: EvalConfig, engine: Engine | None, progress: bool) -> EvalSummary:
    factory = env_factory(
        config.env, config.env_kwargs, config.tools, config.tool_io, config.reward
    )
    env = factory()
    builder = _token_builder(config, env)
    hook = env.answer_hook()
    parts = config_fingerprint(builder, config, hook)
    chash = config_hash(parts)
    tasks = list(env.tasks(config.split, config.num_tasks))
    # The output dir is checked before any service starts (a refused --out starts no sandbox).
    # On a thread: it hashes the model's files (seconds for a large model), and the loop may
    # already serve others (a shared engine, an agent proxy).
    done = await asyncio.to_thread(_prepare_out, config, parts, chash)
    if config.tool_io.uses_live_tools:  # a replay needs no tool service
        await env.preflight()  # a wrong sandbox URL or token fails here, named, not as tool errors
    wanted = {(t.id, i) for t in tasks for i in range(config.n)}
    pending = len(wanted - done)
    log.info("%d episodes to play, %d already done", pending, len(wanted & done))
    task_by_id = {t.id: t for t in tasks}
    started, tokens = time.perf_counter(), 0
    bar = _progress_bar(pending, progress)
    try:
        with JsonlWriter(config.out / TRAJECTORIES_FILE) as writer:

            def on_trajectory(t: Trajectory) -> None:
                nonlocal tokens
                if (t.task_id, t.sample_index) in done:
                    return  # replayed for a half-finished task: the first copy stays
                writer.write(_record(t, config.env, hook, task_by_id[t.task_id]))
                tokens += t.num_trained_tokens
                if is_final_segment(t.metrics):  # a proxied agent's episode may have several
                    done.add((t.task_id, t.sample_index))
                    bar.update(1)

            gen_s = await _collect_missing(
                tasks, set(done), config, builder, on_trajectory, engine, factory
            )
    finally:
        bar.close()
    elapsed = time.perf_counter() - started
    episodes = [e for e in read_episodes(config.out) if e.key in wanted]
    summary = summarize(
        episodes,
        env=config.env,
        model=config.model,
        split=config.split,
        samples_per_task=config.n,
        pass_threshold=config.pass_threshold,
        config_hash=chash,
        tokens_per_s=tokens / gen_s if pending and gen_s > 0 else None,
        elapsed_s=elapsed,
    )
    _write_summary(config.out, summary, parts)
    return summary


def _token_builder(config: EvalConfig, env: Env) -> TokenBuilder:
    """The model's chat template with the env's tools (and the model's vision processor)."""
    from transformers import AutoTokenizer

    return TokenBuilder(
        AutoTokenizer.from_pretrained(config.model),
        tools=env.tool_schemas,
        thinking=config.rollout.thinking,  # a template that rewrites history fails here, named
        vision=vision_of(config.model),  # a vision-language model's images expand to its tokens
    )


def _write_summary(out: Path, summary: EvalSummary, parts: Mapping[str, Any]) -> None:
    """``summary.json``: the summary, the config's fingerprint, the sandbox pools' metrics and
    the tool calls abandoned past their deadline."""
    from agentloop.sandboxes.remote_pool import pool_stats
    from agentloop.tools.runtime import runtime_stats

    pools = [p.to_dict() for p in pool_stats()]  # per-server sandbox metrics, if a pool was used
    extra = {"config_parts": parts, **({"sandbox_pools": pools} if pools else {})}
    abandoned = runtime_stats()  # tool calls past their deadline whose work went on
    extra["tool_calls_abandoned"] = dataclasses.asdict(abandoned)
    _write_json(out / SUMMARY_FILE, {**summary.to_dict(), **extra})


async def _collect_missing(
    tasks: Sequence[Task],
    done: set[tuple[str, int]],
    config: EvalConfig,
    builder: TokenBuilder,
    on_trajectory: Callable[[Trajectory], None],
    engine: Engine | None,
    factory: Callable[[], Env],
) -> float:
    """``collect`` the (task, sample) pairs not in ``done``; return the seconds spent playing
    (engine start-up excluded). ``collect`` plays sample indices
    ``0..group_size-1``, so a task cut short by a kill replays up to its last missing index and
    ``on_trajectory`` drops the repeats. Such tasks are few (the episodes in flight at the kill);
    untouched tasks, the bulk, go in one call."""
    by_size: dict[int, list[Task]] = {}
    for task in tasks:
        missing = [i for i in range(config.n) if (task.id, i) not in done]
        if missing:
            size = config.n if len(missing) == config.n else missing[-1] + 1
            by_size.setdefault(size, []).append(task)
    if not by_size:
        return 0.0
    opened = open_engine(config) if engine is None else contextlib.nullcontext(engine)
    async with (
        opened as live,
        batch_collector(
            live, factory, builder, config.rollout, workers=config.loop_workers
        ) as play,
    ):
        started = time.perf_counter()
        for size, group in sorted(by_size.items()):
            await play(
                group,
                group_size=size,
                concurrency=config.concurrency,
                seed=config.seed,
                on_trajectory=on_trajectory,
            )
        return time.perf_counter() - started


def _record(t: Trajectory, env_id: str, hook: AnswerHook | None, task: Task) -> dict[str, Any]:
    record = {**trajectory_to_dict(t), "env": env_id}
    if hook is not None:
        try:
            answer = hook.extract(t.messages)
            key = hook.normalize(answer) if answer is not None else None
            correct = None if answer is None else hook.decide(answer, task, t.verdict)
        except Exception as exc:  # a broken hook must not stop the eval
            log.warning("answer hook failed on %s: %r", t.task_id, exc)
            answer = key = correct = None
        record.update(answer=answer, answer_key=key, answer_correct=correct)
    return record


def _prepare_out(config: EvalConfig, parts: Mapping[str, str], chash: str) -> set[tuple[str, int]]:
    """Check the output dir against ``--resume``; write ``config.json``; return the done pairs."""
    path, cfg_path = config.out / TRAJECTORIES_FILE, config.out / CONFIG_FILE
    has_data = path.exists() and path.stat().st_size > 0
    if has_data and not config.resume:
        raise ConfigError(
            f"{path} already holds trajectories; pass --resume to continue that run, or choose "
            "another --out"
        )
    done: set[tuple[str, int]] = set()
    fingerprint = model_fingerprint(config.model)
    if has_data:
        if not cfg_path.exists():
            raise ConfigError(f"cannot resume {config.out}: {CONFIG_FILE} is missing")
        old = read_json_object(cfg_path)
        _check_resumable(old, config, parts, chash)
        _check_same_weights(old, config, fingerprint)
        done = {(r["task_id"], r["sample_index"]) for r in read_run(config.out)}
    config.out.mkdir(parents=True, exist_ok=True)
    info = {
        "config_hash": chash,
        "config_parts": dict(parts),
        "env": config.env,
        "model": config.model,
        "model_fingerprint": fingerprint,
        "split": config.split,
        "seed": config.seed,
        "n": config.n,
        "num_tasks": config.num_tasks,
        "engine": config.engine,
        "tools": list(config.tools),
        "rollout": dataclasses.asdict(config.rollout),
        "created": time.time(),
    }
    _write_json(cfg_path, info)
    return done


def _check_resumable(
    old: Mapping[str, Any], config: EvalConfig, parts: Mapping[str, str], chash: str
) -> None:
    if old.get("config_hash") != chash:
        old_parts = old.get("config_parts")
        old_parts = old_parts if isinstance(old_parts, dict) else {}  # a damaged file: all differ
        differ = sorted(k for k, v in parts.items() if old_parts.get(k) != v)
        raise ConfigError(
            f"cannot resume {config.out}: its config hash is {old.get('config_hash')}, this run's "
            f"is {chash} (differs in: {', '.join(differ) or '?'}). Resume with the same settings, "
            "or start a new run with another --out"
        )
    for key in ("model", "split", "seed"):
        if old.get(key) != getattr(config, key):
            raise ConfigError(
                f"cannot resume {config.out}: it was run with {key}={old.get(key)!r}, this run "
                f"has {key}={getattr(config, key)!r}; use the same value or another --out"
            )


def _check_same_weights(
    old: Mapping[str, Any], config: EvalConfig, fingerprint: str | None
) -> None:
    """The model files at ``config.model`` must be the ones the run started on: results of two
    different models must not be pooled under one path."""
    recorded = old.get("model_fingerprint")
    if recorded is not None and fingerprint is not None and recorded != fingerprint:
        raise ConfigError(
            f"cannot resume {config.out}: it evaluated {config.model} with model fingerprint "
            f"{recorded}, but the files there now have fingerprint {fingerprint} (the weights "
            "were replaced); evaluate them into another --out"
        )


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
    tmp.replace(path)  # atomic: a kill never leaves half a summary


def _progress_bar(total: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc="eval", unit="ep", file=sys.stderr, disable=not enabled)
