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


_COMMANDS: tuple[_Command, ...] = (
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
