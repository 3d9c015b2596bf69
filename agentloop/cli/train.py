"""``agentloop train``, ``sft`` and ``demo``: the training entry points."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = [
    "add_demo",
    "add_export",
    "add_sft",
    "add_train",
    "cmd_demo",
    "cmd_export",
    "cmd_sft",
    "cmd_train",
]


def add_train(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config", help="YAML run config, or the name of a shipped one (e.g. grpo_calc_tiny)"
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="overrides, e.g. trainer.total_steps=10"
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the merged config and derived batch sizes, then exit (put it before CONFIG)",
    )


def cmd_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from agentloop.trainers.config import (
        TrainConfig,
        batch_sizes,
        config_to_yaml,
        example_config,
        load_config,
    )

    path = Path(args.config)
    if not path.exists() and example_config(args.config).is_file():
        path = example_config(args.config)
    cfg = load_config(TrainConfig, path, args.overrides)  # names the model; builds nothing
    if args.print_config:
        print(config_to_yaml(cfg), end="")
        # the sizes as YAML comments: the whole output stays a config that loads back
        print("\n".join(f"# {line}" for line in batch_sizes(cfg).describe().splitlines()))
        print("".join(f"# notice: {notice}\n" for notice in cfg.notices()), end="", flush=True)
        _check_start(cfg, model=False)  # train's checks, starting nothing
        return 0
    from agentloop.models import resolve_model
    from agentloop.trainers.grpo import train

    _check_start(cfg, model=True)
    result = train(resolve_model(cfg))
    print(f"done at step {result.last_step}: metrics in {result.out_dir / 'metrics.jsonl'}")
    return 0


def _check_start(cfg: Any, *, model: bool) -> None:  # a TrainConfig (trainers: lazily)
    """Train's start-up checks before a named model (``tiny-calc``) is built on first use,
    minutes of CPU work: a dead sandbox URL fails in a second, not after the build.
    ``model`` false (``--print-config``) checks a model directory too, never a name's build;
    ``model`` true leaves a directory's checks to ``train`` itself."""
    import asyncio

    from agentloop.models import MODEL_NAMES
    from agentloop.trainers.preflight import check_start

    named = cfg.model.path in MODEL_NAMES
    if named or not model:
        asyncio.run(check_start(cfg, check_model=not named))


def add_sft(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML SFT config, or a shipped one's name (sft_calc_tiny)")
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="overrides, e.g. trainer.max_steps=50"
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the merged config, then exit"
    )


def cmd_sft(args: argparse.Namespace) -> int:
    from agentloop.trainers.config import config_to_yaml
    from agentloop.trainers.sft_config import load_sft_config

    cfg = load_sft_config(args.config, args.overrides)
    if args.print_config:
        print(config_to_yaml(cfg), end="")
        return 0
    from agentloop.models import resolve_model
    from agentloop.trainers.sft import sft_main

    return sft_main(resolve_model(cfg))


def add_demo(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="overrides of the recipe's {demo,sft,grpo}.yaml, e.g. demo.out_dir=runs/d2 "
        "sft.trainer.max_steps=300 grpo.trainer.total_steps=20",
    )
    parser.add_argument(
        "--recipe",
        default=None,
        metavar="NAME|DIR",
        help="a demo family (retool: the default; deepeyes; search_r1) or a recipe dir of "
        "demo.yaml, sft.yaml and grpo.yaml",
    )
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="YAML file of demo:/sft:/grpo: sections layered over the recipe, before the "
        "KEY=VALUE overrides (e.g. recipes/tiny_retool/gpu.yaml: the demo on one GPU)",
    )


def cmd_demo(args: argparse.Namespace) -> int:
    from agentloop.models.demo import load_demo_configs, run_demo

    result = run_demo(load_demo_configs(args.overrides, args.recipe, args.config))
    return 0 if result.passed else 1


def add_export(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="a run's checkpoint: RUN/checkpoints/step_N")
    parser.add_argument("out", help="the HF model directory to write (new or empty)")
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16"), help="convert the weights (default: as trained)"
    )
    parser.add_argument("--device", default="cpu", help="where to load the model (cpu, cuda)")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="a LoRA run: write the base with the adapters merged in, as a full HF model dir "
        "(default: the adapter alone, in PEFT's format)",
    )


def cmd_export(args: argparse.Namespace) -> int:
    from agentloop.trainers.export import export_checkpoint

    out = export_checkpoint(
        args.checkpoint, args.out, dtype=args.dtype, device=args.device, merge=args.merge
    )
    what = "a PEFT adapter dir" if out.adapter else "an HF model dir"
    print(f"exported {args.checkpoint} to {out.path} ({what})")
    return 0
