"""``agentloop eval``: a model on an env split with the training loop, or two runs compared."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from agentloop.cli.common import key_values, named_model

if TYPE_CHECKING:
    from agentloop.eval import EvalConfig
    from agentloop.eval_report import EvalSummary
    from agentloop.rollout import RolloutConfig

__all__ = ["add_eval", "cmd_eval", "rollout_config"]


def add_eval(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--env",
        help="registered env id, e.g. agentloop/Calc-v0, or another framework's: "
        "skyrl_gym:ENV_CLASS, aviary:NAME",
    )
    add("--model", help="local model directory (tokenizer, template), or tiny, tiny-calc, tiny-vlm")
    add("--out", help="run directory for trajectories.jsonl, config.json, summary.json")
    add("--n", type=int, default=8, help="samples per task (default: 8)")
    add("--num-tasks", type=int, default=None, help="first N tasks of the split (default: all)")
    add("--split", default="test", help="dataset split (default: test)")
    add(
        "--engine",
        choices=("auto", "vllm", "hf", "openai"),
        default="auto",
        help="default: vllm if installed, else hf",
    )
    add("--base-url", help="API root of an OpenAI-compatible server (--engine openai)")
    add(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="engine setting, repeatable (vLLM: enforce_eager=true, kv_cache_memory_bytes=...; "
        "openai: served_model=NAME)",
    )
    add("--env-arg", action="append", default=[], metavar="KEY=VALUE", help="env kwarg, repeatable")
    add(
        "--reward",
        metavar="FILE.py:NAME",
        help="your own reward instead of the env's: 'path/to/file.py:fn' or 'package.module:fn', "
        "verl's compute_score(data_source, solution_str, ground_truth, extra_info) or "
        "fn(task, messages)",
    )
    _add_tool_flags(add)
    _add_rollout_flags(add)
    _add_run_flags(add)


def _add_tool_flags(add: Callable[..., object]) -> None:
    """Extra tools, and recording or replaying the tools' outputs."""
    add(
        "--tools",
        action="append",
        default=[],
        metavar="SPEC",
        help="add an MCP server's tools to the env, repeatable: 'mcp:COMMAND ARGS' (stdio) or "
        "'mcp:http://HOST:PORT/mcp', limits in brackets: 'mcp[max_concurrency=2,timeout_s=10]:"
        "COMMAND ARGS' (also rate_limit_per_s, startup_timeout_s, include=a+b); a tool named "
        "like an env tool replaces it",
    )
    add("--record", metavar="DIR", help="record every tool call to DIR/tool_calls.jsonl")
    add("--replay", metavar="DIR", help="serve tool outputs from a recording instead of the tools")
    add(
        "--replay-miss",
        choices=("error", "fail", "live"),
        default="error",
        help="a call not in the recording: an error observation (default), a failed run, or "
        "the live tool",
    )
    add(
        "--replay-latency",
        choices=("zero", "recorded"),
        default="zero",
        help="replayed calls take no time (default) or their recorded time",
    )


def _add_rollout_flags(add: Callable[..., object]) -> None:
    """One flag per :class:`RolloutConfig` field (``--max-turns`` sets ``max_turns``), its help
    the field's docstring; a flag left unset keeps the field's default."""
    from agentloop.config_docs import field_docs
    from agentloop.rollout import RolloutConfig

    docs = field_docs(RolloutConfig)
    for f in dataclasses.fields(RolloutConfig):
        kind = _ROLLOUT_TYPES[f.type] if isinstance(f.type, str) else f.type
        text = " ".join(docs[f.name].split()).replace("``", "").replace("%", "%%")
        help_ = f"rollout.{f.name}: {text} (default: {f.default})"
        flag = "--" + f.name.replace("_", "-")
        if kind is bool:
            add(flag, action="store_true", default=None, help=help_)
        else:
            add(flag, type=kind, default=None, help=help_)


#: The field types ``RolloutConfig`` declares (its annotations are strings).
_ROLLOUT_TYPES: dict[str, type] = {"int": int, "int | None": int, "float": float, "str": str,
                                   "bool": bool}  # fmt: skip


def _add_run_flags(add: Callable[..., object]) -> None:
    """Seeds, concurrency, passing and failing, resuming, comparing."""
    add("--seed", type=int, default=0, help="sampling seed (default: 0)")
    add("--concurrency", type=int, default=64, help="episodes in flight (default: 64)")
    add(
        "--loop-workers",
        type=int,
        default=1,
        help="processes the rollout loop runs in, the engine staying in this one (default: 1)",
    )
    add(
        "--pass-threshold",
        type=float,
        default=None,
        help="reward counted as a pass (default: the env's verdict of the answer where it gives "
        "one, else a reward of 1)",
    )
    add(
        "--max-failed-share",
        type=float,
        default=0.5,
        help="exit 1 when more than this share of episodes failed (engine_error, env_error, "
        "tool_fatal, timeout, or a tool call that failed for its service: a tool exception or "
        "a tool timeout; default: 0.5)",
    )
    add("--resume", action="store_true", help="continue an interrupted run in --out")
    add("--quiet", action="store_true", help="no progress bar")
    add("--compare", nargs=2, metavar=("RUN_A", "RUN_B"), help="compare two runs (paired test)")
    add("--resamples", type=int, default=10_000, help="bootstrap resamples for --compare")


def cmd_eval(args: argparse.Namespace) -> int:
    import os

    from agentloop.errors import ConfigError
    from agentloop.eval import run_eval
    from agentloop.eval_report import compare_runs, print_comparison, print_summary

    if args.compare:
        print_comparison(compare_runs(*args.compare, n_resamples=args.resamples, seed=args.seed))
        return 0
    missing = [f"--{k}" for k in ("env", "model", "out") if getattr(args, k) is None]
    if missing:
        raise ConfigError(f"agentloop eval needs {', '.join(missing)} (or --compare RUN_A RUN_B)")
    config = _eval_config(args)
    # vLLM logs INFO lines to stdout, into the printed table; VLLM_LOGGING_LEVEL=INFO shows them.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if not 0.0 <= args.max_failed_share <= 1.0:
        raise ConfigError(f"--max-failed-share must be in [0, 1], got {args.max_failed_share}")
    summary = run_eval(config, progress=not args.quiet)
    print_summary(summary)
    print(f"wrote {config.out}/trajectories.jsonl and {config.out}/summary.json")
    if summary.failed_share > args.max_failed_share:
        _report_failures(summary, args.max_failed_share)
        return 1
    return 0


def _eval_config(args: argparse.Namespace) -> EvalConfig:
    """The :class:`EvalConfig` the flags ask for."""
    from pathlib import Path

    from agentloop.eval import EvalConfig
    from agentloop.tools.recording import ToolTapeConfig

    return EvalConfig(
        env=args.env,
        model=named_model(args.model),
        out=Path(args.out),
        n=args.n,
        num_tasks=args.num_tasks,
        split=args.split,
        engine=args.engine,
        base_url=args.base_url,
        seed=args.seed,
        concurrency=args.concurrency,
        loop_workers=args.loop_workers,
        resume=args.resume,
        pass_threshold=args.pass_threshold,
        rollout=rollout_config(args),
        env_kwargs=key_values(args.env_arg),
        engine_args=key_values(args.engine_arg),
        tools=tuple(args.tools),
        tool_io=ToolTapeConfig.of(args.record, args.replay, args.replay_miss, args.replay_latency),
        reward=args.reward,
    )


def rollout_config(args: argparse.Namespace) -> RolloutConfig:
    """The :class:`RolloutConfig` of the rollout flags: the ones given, defaults for the rest."""
    from agentloop.rollout import RolloutConfig

    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(RolloutConfig)}
    return RolloutConfig(**{k: v for k, v in given.items() if v is not None})


def _report_failures(summary: EvalSummary, max_failed_share: float) -> None:
    """Say on stderr why the run counts as failed: the stop reasons and the first errors."""
    reasons = ", ".join(f"{k} {v}" for k, v in summary.stop_reasons.items())
    first = "; ".join(f"{k}: {v}" for k, v in summary.errors.items())
    if summary.tool_failed:
        reasons += f"; {summary.tool_failed} with failed tool calls"
        first += f"; tool: {summary.tool_failure}"
    print(
        f"agentloop eval: error: {summary.failed} of {summary.episodes} episodes failed "
        f"({summary.failed_share:.0%} > --max-failed-share {max_failed_share:g}); "
        f"stop reasons: {reasons}; first errors: {first}",
        file=sys.stderr,
    )
