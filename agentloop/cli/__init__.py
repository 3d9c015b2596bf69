"""The ``agentloop`` console script: one argparse parser, one small function per subcommand.

Adding a subcommand: in the module of its group (``train``, ``evaluate``, ``serve``, ``tools``)
write ``add_<name>(parser)`` that declares its arguments and ``cmd_<name>(args) -> int`` that
runs it, then add one row to ``_COMMANDS`` here. Heavy imports (torch, transformers, vllm, ray)
go inside the ``cmd_`` function, so ``agentloop --help`` and every other subcommand stay fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agentloop.cli import evaluate, serve, tools, train
from agentloop.errors import AgentLoopError

__all__ = ["build_parser", "main"]


@dataclass(frozen=True)
class _Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


_COMMANDS: tuple[_Command, ...] = (
    _Command(
        "train",
        "online RL (GRPO/DAPO): vLLM rollouts, FSDP2 updates, weight sync; local or Ray",
        train.add_train,
        train.cmd_train,
    ),
    _Command(
        "sft",
        "supervised fine-tuning on multi-turn tool-call conversations (JSONL), FSDP2",
        train.add_sft,
        train.cmd_sft,
    ),
    _Command(
        "export",
        "write a run's checkpoint (checkpoints/step_N) as an HF model directory",
        train.add_export,
        train.cmd_export,
    ),
    _Command(
        "make-calc-traces",
        "synthetic Calc-v0 SFT conversations: a scripted expert plays the env and its real tool",
        tools.add_make_calc_traces,
        tools.cmd_make_calc_traces,
    ),
    _Command(
        "eval",
        "evaluate a model on an env split with the training rollout loop; --compare two runs",
        evaluate.add_eval,
        evaluate.cmd_eval,
    ),
    _Command(
        "view",
        "write a self-contained HTML trajectory viewer for an eval run",
        tools.add_view,
        tools.cmd_view,
    ),
    _Command(
        "demo",
        "the tiny ReTool demo on a CPU: SFT, GRPO with real tools, eval, compare, plot, viewer",
        train.add_demo,
        train.cmd_demo,
    ),
    _Command(
        "serve-sandbox",
        "serve a sandbox backend over HTTP (auth, back-pressure, sessions, SandboxFusion API)",
        serve.add_serve_sandbox,
        serve.cmd_serve_sandbox,
    ),
    _Command(
        "serve-search",
        "serve a BM25 / dense / hybrid index over HTTP (Search-R1's POST /retrieve protocol)",
        serve.add_serve_search,
        serve.cmd_serve_search,
    ),
    _Command(
        "serve-proxy",
        "serve a model to agent programs (OpenAI API) and record their episodes token-exactly",
        serve.add_serve_proxy,
        serve.cmd_serve_proxy,
    ),
    _Command(
        "make-tiny-model",
        "generate the tiny Qwen2-architecture model and tokenizer used by tests and the demo",
        tools.add_make_tiny_model,
        tools.cmd_make_tiny_model,
    ),
    _Command(
        "doctor",
        "check this machine for what runs need (torch, vLLM, sandbox, cgroups, ...) with fixes",
        tools.add_doctor,
        tools.cmd_doctor,
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
