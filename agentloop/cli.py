"""The ``agentloop`` console script: one argparse parser, one small function per subcommand.

Adding a subcommand: write ``_add_<name>(subparsers)`` that declares its arguments and
``_cmd_<name>(args) -> int`` that runs it, then add one row to ``_COMMANDS``. Heavy imports
(torch, transformers, vllm, ray) go inside the ``_cmd_`` function, so ``agentloop --help`` and
every other subcommand stay fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agentloop.errors import AgentLoopError

__all__ = ["build_parser", "main"]


@dataclass(frozen=True)
class _Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _add_make_tiny_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", help="output directory (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="weight-init seed (default: 0)")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="dtype of the saved weights (default: float32)",
    )


def _cmd_make_tiny_model(args: argparse.Namespace) -> int:
    from agentloop.testing.tiny import make_tiny_model

    out = make_tiny_model(args.dir, seed=args.seed, dtype=args.dtype)
    print(f"tiny model written to {out}")
    return 0


def _add_demo(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model dir (default: the tiny model)")
    parser.add_argument("--tasks", type=int, default=3, help="held-out Calc tasks (default: 3)")
    parser.add_argument("--group-size", type=int, default=2, help="episodes per task (default: 2)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")


def _cmd_demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from agentloop.demo import run_demo

    model = Path(args.model) if args.model else None
    run_demo(model, tasks=args.tasks, group_size=args.group_size, seed=args.seed)
    return 0


def _add_eval(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--env", help="registered env id, e.g. agentloop/Calc-v0")
    add("--model", help="local model directory (its tokenizer and chat template are used)")
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
    add("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
        help="engine setting, repeatable (vLLM: enforce_eager=true, kv_cache_memory_bytes=...; "
             "openai: served_model=NAME)")  # fmt: skip
    add("--env-arg", action="append", default=[], metavar="KEY=VALUE", help="env kwarg, repeatable")
    for flag, kind in (
        ("max-turns", int),
        ("max-prompt-len", int),
        ("max-response-len", int),
        ("max-tool-output-tokens", int),
        ("temperature", float),
        ("top-p", float),
        ("top-k", int),
        ("timeout-s", float),
        ("parser", str),
    ):
        add(f"--{flag}", type=kind, default=None, help="rollout setting (default: RolloutConfig)")
    add("--seed", type=int, default=0, help="sampling seed (default: 0)")
    add("--concurrency", type=int, default=64, help="episodes in flight (default: 64)")
    add("--pass-threshold", type=float, default=1.0, help="reward counted as a pass (default: 1)")
    add("--resume", action="store_true", help="continue an interrupted run in --out")
    add("--quiet", action="store_true", help="no progress bar")
    add("--compare", nargs=2, metavar=("RUN_A", "RUN_B"), help="compare two runs (paired test)")
    add("--resamples", type=int, default=10_000, help="bootstrap resamples for --compare")


def _cmd_eval(args: argparse.Namespace) -> int:
    from pathlib import Path

    from agentloop.errors import ConfigError
    from agentloop.eval import EvalConfig, run_eval
    from agentloop.eval_report import compare_runs, print_comparison, print_summary
    from agentloop.rollout import RolloutConfig

    if args.compare:
        print_comparison(compare_runs(*args.compare, n_resamples=args.resamples, seed=args.seed))
        return 0
    missing = [f"--{k}" for k in ("env", "model", "out") if getattr(args, k) is None]
    if missing:
        raise ConfigError(f"agentloop eval needs {', '.join(missing)} (or --compare RUN_A RUN_B)")
    names = ("max_turns", "max_prompt_len", "max_response_len", "max_tool_output_tokens",
             "temperature", "top_p", "top_k", "timeout_s", "parser")  # fmt: skip
    rollout = RolloutConfig(**{k: getattr(args, k) for k in names if getattr(args, k) is not None})
    config = EvalConfig(
        env=args.env, model=args.model, out=Path(args.out), n=args.n, num_tasks=args.num_tasks,
        split=args.split, engine=args.engine, base_url=args.base_url, seed=args.seed,
        concurrency=args.concurrency, resume=args.resume, pass_threshold=args.pass_threshold,
        rollout=rollout, env_kwargs=_key_values(args.env_arg),
        engine_args=_key_values(args.engine_arg),
    )  # fmt: skip
    summary = run_eval(config, progress=not args.quiet)
    print_summary(summary)
    print(f"wrote {config.out}/trajectories.jsonl and {config.out}/summary.json")
    return 0


def _key_values(items: Sequence[str]) -> dict[str, object]:
    """``KEY=VALUE`` pairs; values are JSON when they parse (numbers, true, null), else strings."""
    import json

    from agentloop.errors import ConfigError

    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{item!r} is not KEY=VALUE (e.g. enforce_eager=true)")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def _add_view(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir", metavar="RUN", help="eval run directory (or a trajectories .jsonl file)"
    )
    parser.add_argument("-o", "--output", default=None, help="HTML file (default: RUN/view.html)")
    parser.add_argument(
        "--model", default=None, help="tokenizer dir to show tokens as text (default: the run's)"
    )
    parser.add_argument("--limit", type=int, default=None, help="at most this many trajectories")


def _cmd_view(args: argparse.Namespace) -> int:
    from agentloop.viewer import write_view

    out = write_view(args.run_dir, args.output, model=args.model, limit=args.limit)
    print(f"wrote {out} (open it in a browser; it needs no network)")
    return 0


_COMMANDS: tuple[_Command, ...] = (
    _Command(
        "eval",
        "evaluate a model on an env split with the training rollout loop; --compare two runs",
        _add_eval,
        _cmd_eval,
    ),
    _Command(
        "view",
        "write a self-contained HTML trajectory viewer for an eval run",
        _add_view,
        _cmd_view,
    ),
    _Command(
        "demo",
        "play a few Calc episodes with the tiny model through the rollout loop",
        _add_demo,
        _cmd_demo,
    ),
    _Command(
        "make-tiny-model",
        "generate the tiny Qwen2-architecture model and tokenizer used by tests and the demo",
        _add_make_tiny_model,
        _cmd_make_tiny_model,
    ),
)


def build_parser() -> argparse.ArgumentParser:
    """The full parser; each subcommand stores its runner in ``args.run``."""
    parser = argparse.ArgumentParser(
        prog="agentloop", description="Agentic multi-turn RL for LLMs."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in _COMMANDS:
        sub = subparsers.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(sub)
        sub.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``agentloop`` script; returns the process exit status."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except AgentLoopError as exc:  # expected failures: a clear message, no stack trace
        print(f"agentloop {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
