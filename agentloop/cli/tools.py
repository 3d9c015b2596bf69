"""``agentloop make-tiny-model``, ``make-calc-traces``, ``view`` and ``doctor``."""

from __future__ import annotations

import argparse

from agentloop.errors import ConfigError

__all__ = [
    "add_doctor",
    "add_make_calc_traces",
    "add_make_tiny_model",
    "add_view",
    "cmd_doctor",
    "cmd_make_calc_traces",
    "cmd_make_tiny_model",
    "cmd_view",
]


def add_make_tiny_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", help="output directory (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="weight-init seed (default: 0)")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="dtype of the saved weights (default: float32)",
    )
    parser.add_argument(
        "--vision", action="store_true", help="a tiny Qwen2.5-VL (with its image processor)"
    )


def cmd_make_tiny_model(args: argparse.Namespace) -> int:
    from pathlib import Path

    if Path(args.dir).exists() and not Path(args.dir).is_dir():
        raise ConfigError(f"{args.dir!r} is a file; pass a new or an existing directory's path")
    if args.vision:
        from agentloop.models.tiny_vlm import make_tiny_vlm as make
    else:
        from agentloop.models.tiny import make_tiny_model as make

    out = make(args.dir, seed=args.seed, dtype=args.dtype)
    print(f"tiny {'VLM' if args.vision else 'model'} written to {out}")
    return 0


def add_make_calc_traces(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("out", help="output JSONL file")
    add("--num", type=int, default=1000, help="rollout-format rows, one question each")
    add("--num-compact", type=int, default=0, help="compact rows (no tool schema in the prompt)")
    add("--questions-per-compact", type=int, default=4, help="questions per compact row")
    add("--split", default="train", help="task split (default: train)")
    add("--start-index", type=int, default=0, help="first task index (default: 0)")
    add("--digits", type=int, default=3, help="digits of the first operand (default: 3)")
    add("--typo-rate", type=float, default=0.0, help="fraction of episodes with a mistyped digit")
    add("--seed", type=int, default=0, help="shuffle/typo seed (default: 0)")
    add("--sandbox", default="local", help="sandbox backend running the tool (default: local)")


def cmd_make_calc_traces(args: argparse.Namespace) -> int:
    import asyncio

    from agentloop.envs.calc_traces import TraceConfig, make_calc_traces, write_traces

    cfg = TraceConfig(
        num_traces=args.num,
        num_compact=args.num_compact,
        questions_per_compact=args.questions_per_compact,
        split=args.split,
        start_index=args.start_index,
        digits=args.digits,
        typo_rate=args.typo_rate,
        seed=args.seed,
        sandbox=args.sandbox,
    )
    rows = asyncio.run(make_calc_traces(cfg))
    out = write_traces(rows, args.out)
    print(f"wrote {len(rows)} conversations ({cfg.num_episodes} episodes) to {out}")
    return 0


def add_view(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir", metavar="RUN", help="eval run directory (or a trajectories .jsonl file)"
    )
    parser.add_argument("-o", "--output", default=None, help="HTML file (default: RUN/view.html)")
    parser.add_argument(
        "--model", default=None, help="tokenizer dir to show tokens as text (default: the run's)"
    )
    parser.add_argument("--limit", type=int, default=None, help="at most this many trajectories")


def cmd_view(args: argparse.Namespace) -> int:
    from agentloop.viewer import write_view

    out = write_view(args.run_dir, args.output, model=args.model, limit=args.limit)
    print(f"wrote {out} (open it in a browser; it needs no network)")
    return 0


def add_doctor(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--only",
        default=None,
        metavar="NAMES",
        help="comma-separated checks to run (python, torch, vllm, ray, sandbox, cgroups, "
        "containers, tiny-model; default: all)",
    )


def cmd_doctor(args: argparse.Namespace) -> int:
    from agentloop.doctor import CHECKS, run_doctor

    names = args.only.split(",") if args.only else list(CHECKS)
    return run_doctor([name.strip() for name in names])
