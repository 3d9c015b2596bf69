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
from typing import Any

from agentloop.errors import AgentLoopError, ConfigError

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
    parser.add_argument(
        "--vision", action="store_true", help="a tiny Qwen2.5-VL (with its image processor)"
    )


def _cmd_make_tiny_model(args: argparse.Namespace) -> int:
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


def _add_serve_sandbox(parser: argparse.ArgumentParser) -> None:
    from agentloop.sandboxes.serve_args import build_parser

    build_parser(parser)


def _cmd_serve_sandbox(args: argparse.Namespace) -> int:
    from agentloop.sandboxes.server import run_from_args

    return run_from_args(args)


def _add_serve_search(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--corpus",
        help="JSONL corpus ({id, title, text} or Search-R1 {id, contents}); "
        "'searchqa' writes the SearchQA-v0 corpus; needed to build a missing index",
    )
    add("--index", required=True, help="index directory (built from --corpus if missing)")
    add("--kind", choices=("bm25", "dense", "hybrid"), default="bm25", help="default: bm25")
    add("--rebuild", action="store_true", help="rebuild the index even if DIR holds one")
    add("--host", default="127.0.0.1", help="default: 127.0.0.1")
    add("--port", type=int, default=8000, help="default: 8000")
    add("--max-concurrency", type=int, default=2, help="search worker threads (default: 2)")
    from agentloop.sandboxes.http_limits import add_http_args

    add_http_args(parser)


def _cmd_serve_search(args: argparse.Namespace) -> int:
    from pathlib import Path

    from agentloop.errors import ConfigError
    from agentloop.tools.search_index import build_index, load_index
    from agentloop.tools.search_server import SearchServerConfig, run_search_server

    index_dir = Path(args.index)
    if args.rebuild or not (index_dir / "meta.json").is_file():
        if not args.corpus:
            raise ConfigError(f"{index_dir} holds no index; pass --corpus FILE to build one")
        corpus = args.corpus
        if corpus == "searchqa":
            from agentloop.envs.search_qa import write_corpus

            corpus = write_corpus(index_dir / "searchqa_corpus.jsonl")
        print(f"building a {args.kind} index of {corpus} in {index_dir} ...")
        build_index(corpus, index_dir, kind="hybrid" if args.kind == "hybrid" else args.kind)
    index = load_index(index_dir, kind=args.kind)
    config = SearchServerConfig(max_concurrency=args.max_concurrency)
    print(f"serving {len(index.docs)} passages ({args.kind}) on http://{args.host}:{args.port}")
    from agentloop.sandboxes.http_limits import http_limits_from_args

    http = http_limits_from_args(args)
    run_search_server(index, host=args.host, port=args.port, config=config, http=http)
    return 0


def _add_serve_proxy(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--model", required=True, help="local model directory, or tiny, tiny-calc, tiny-vlm")
    add("--served-model", default="agentloop", help="the model name clients ask for")
    add("--engine", choices=("auto", "vllm", "hf", "openai"), default="auto", help="as in eval")
    add("--base-url", help="API root of the OpenAI-compatible server behind (--engine openai)")
    add("--engine-arg", action="append", default=[], metavar="KEY=VALUE", help="as in eval")
    add("--host", default="127.0.0.1", help="default: 127.0.0.1")
    add("--port", type=int, default=8000, help="default: 8000 (0: any free port)")
    add("--max-turns", type=int, default=8, help="model requests per episode (default: 8)")
    add("--max-prompt-len", type=int, default=1024, help="first prompt's tokens (default: 1024)")
    add("--max-response-len", type=int, default=1024, help="tokens after it (default: 1024)")
    add("--parser", default="auto", help="tool-call parser (default: auto, from the template)")
    add(
        "--token-file",
        help="file with the clients' token(s), one per line (else $AGENTLOOP_PROXY_TOKEN); "
        "with one, the API key is a token and the episode goes in the path",
    )
    add("--max-body-mb", type=float, default=8.0, help="request body limit (default: 8)")
    add("--episode-ttl-s", type=float, default=1800.0, help="idle episode lifetime (default: 1800)")
    add("--max-episodes", type=int, default=1024, help="open episodes (default: 1024)")
    from agentloop.sandboxes.http_limits import add_http_args

    add_http_args(parser)


def _named_model(path: str) -> str:
    """``--model``: a model built here by name (tiny, tiny-calc, tiny-vlm) as its directory."""
    from agentloop.models import MODEL_NAMES, resolve_model_path

    return str(resolve_model_path(path)) if path in MODEL_NAMES else path


def _cmd_serve_proxy(args: argparse.Namespace) -> int:
    import asyncio

    from agentloop.proxy.episode import EpisodeLimits
    from agentloop.proxy.guard import ServerLimits
    from agentloop.sandboxes.http_limits import http_limits_from_args
    from agentloop.serve_proxy import ServeProxyConfig, proxy_tokens, serve_proxy

    limits = EpisodeLimits(args.max_turns, args.max_prompt_len, args.max_response_len)
    server = ServerLimits(
        max_body_bytes=int(args.max_body_mb * (1 << 20)),
        episode_ttl_s=args.episode_ttl_s,
        max_episodes=args.max_episodes,
    )
    config = ServeProxyConfig(
        model=_named_model(args.model),
        served_model=args.served_model,
        engine=args.engine,
        base_url=args.base_url,
        engine_args=_key_values(args.engine_arg),
        host=args.host,
        port=args.port,
        limits=limits,
        parser=args.parser,
        http=http_limits_from_args(args),
        tokens=proxy_tokens(args.token_file),
        server=server,
    )
    asyncio.run(serve_proxy(config))
    return 0


def _add_demo(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="overrides of the recipe's {demo,sft,grpo}.yaml, e.g. demo.out_dir=runs/d2 "
        "sft.trainer.max_steps=300 grpo.trainer.total_steps=20",
    )
    parser.add_argument(
        "--recipe", default=None, help="recipe dir (default: the shipped tiny_retool recipe)"
    )
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="YAML file of demo:/sft:/grpo: sections layered over the recipe, before the "
        "KEY=VALUE overrides (e.g. recipes/tiny_retool/gpu.yaml: the demo on one GPU)",
    )


def _cmd_demo(args: argparse.Namespace) -> int:
    from agentloop.models.demo import load_demo_configs, run_demo

    result = run_demo(load_demo_configs(args.overrides, args.recipe, args.config))
    return 0 if result.passed else 1


def _add_eval(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--env", help="registered env id, e.g. agentloop/Calc-v0")
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
    add(
        "--thinking",
        default=None,
        metavar="POLICY",
        help="thinking-history policy for a chat template that drops earlier <think> blocks: "
        "keep (one trajectory, earlier reasoning kept) or strip (one sample per turn, as the "
        "template renders it); default auto: such a template is an error",
    )
    add("--seed", type=int, default=0, help="sampling seed (default: 0)")
    add("--concurrency", type=int, default=64, help="episodes in flight (default: 64)")
    add(
        "--loop-workers",
        type=int,
        default=1,
        help="processes the rollout loop runs in, the engine staying in this one (default: 1)",
    )
    add("--pass-threshold", type=float, default=1.0, help="reward counted as a pass (default: 1)")
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


def _cmd_eval(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    from agentloop.errors import ConfigError
    from agentloop.eval import EvalConfig, run_eval
    from agentloop.eval_report import compare_runs, print_comparison, print_summary
    from agentloop.rollout import RolloutConfig
    from agentloop.tools.recording import ToolTapeConfig

    if args.compare:
        print_comparison(compare_runs(*args.compare, n_resamples=args.resamples, seed=args.seed))
        return 0
    missing = [f"--{k}" for k in ("env", "model", "out") if getattr(args, k) is None]
    if missing:
        raise ConfigError(f"agentloop eval needs {', '.join(missing)} (or --compare RUN_A RUN_B)")
    names = (
        "max_turns",
        "max_prompt_len",
        "max_response_len",
        "max_tool_output_tokens",
        "temperature",
        "top_p",
        "top_k",
        "timeout_s",
        "parser",
        "thinking",
    )
    rollout = RolloutConfig(**{k: getattr(args, k) for k in names if getattr(args, k) is not None})
    config = EvalConfig(
        env=args.env,
        model=_named_model(args.model),
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
        rollout=rollout,
        env_kwargs=_key_values(args.env_arg),
        engine_args=_key_values(args.engine_arg),
        tools=tuple(args.tools),
        tool_io=ToolTapeConfig.of(args.record, args.replay, args.replay_miss, args.replay_latency),
        reward=args.reward,
    )
    # vLLM logs INFO lines to stdout, into the printed table; VLLM_LOGGING_LEVEL=INFO shows them.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if not 0.0 <= args.max_failed_share <= 1.0:
        raise ConfigError(f"--max-failed-share must be in [0, 1], got {args.max_failed_share}")
    summary = run_eval(config, progress=not args.quiet)
    print_summary(summary)
    print(f"wrote {config.out}/trajectories.jsonl and {config.out}/summary.json")
    if summary.failed_share > args.max_failed_share:
        reasons = ", ".join(f"{k} {v}" for k, v in summary.stop_reasons.items())
        first = "; ".join(f"{k}: {v}" for k, v in summary.errors.items())
        if summary.tool_failed:
            reasons += f"; {summary.tool_failed} with failed tool calls"
            first += f"; tool: {summary.tool_failure}"
        print(
            f"agentloop eval: error: {summary.failed} of {summary.episodes} episodes failed "
            f"({summary.failed_share:.0%} > --max-failed-share {args.max_failed_share:g}); "
            f"stop reasons: {reasons}; first errors: {first}",
            file=sys.stderr,
        )
        return 1
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


def _add_train(parser: argparse.ArgumentParser) -> None:
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


def _cmd_train(args: argparse.Namespace) -> int:
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


def _add_sft(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML SFT config, or a shipped one's name (sft_calc_tiny)")
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="overrides, e.g. trainer.max_steps=50"
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the merged config, then exit"
    )


def _cmd_sft(args: argparse.Namespace) -> int:
    from agentloop.trainers.config import config_to_yaml
    from agentloop.trainers.sft_config import load_sft_config

    cfg = load_sft_config(args.config, args.overrides)
    if args.print_config:
        print(config_to_yaml(cfg), end="")
        return 0
    from agentloop.models import resolve_model
    from agentloop.trainers.sft import sft_main

    return sft_main(resolve_model(cfg))


def _add_export(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="a run's checkpoint: RUN/checkpoints/step_N")
    parser.add_argument("out", help="the HF model directory to write (new or empty)")
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16"), help="convert the weights (default: as trained)"
    )
    parser.add_argument("--device", default="cpu", help="where to load the model (cpu, cuda)")


def _cmd_export(args: argparse.Namespace) -> int:
    from agentloop.trainers.export import export_checkpoint

    out = export_checkpoint(args.checkpoint, args.out, dtype=args.dtype, device=args.device)
    print(f"exported {args.checkpoint} to {out} (an HF model dir)")
    return 0


def _add_make_calc_traces(parser: argparse.ArgumentParser) -> None:
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


def _cmd_make_calc_traces(args: argparse.Namespace) -> int:
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


def _add_doctor(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--only",
        default=None,
        metavar="NAMES",
        help="comma-separated checks to run (python, torch, vllm, ray, sandbox, cgroups, "
        "containers, tiny-model; default: all)",
    )


def _cmd_doctor(args: argparse.Namespace) -> int:
    from agentloop.doctor import CHECKS, run_doctor

    names = args.only.split(",") if args.only else list(CHECKS)
    return run_doctor([name.strip() for name in names])


_COMMANDS: tuple[_Command, ...] = (
    _Command(
        "train",
        "online RL (GRPO/DAPO): vLLM rollouts, FSDP2 updates, weight sync; local or Ray",
        _add_train,
        _cmd_train,
    ),
    _Command(
        "sft",
        "supervised fine-tuning on multi-turn tool-call conversations (JSONL), FSDP2",
        _add_sft,
        _cmd_sft,
    ),
    _Command(
        "export",
        "write a run's checkpoint (checkpoints/step_N) as an HF model directory",
        _add_export,
        _cmd_export,
    ),
    _Command(
        "make-calc-traces",
        "synthetic Calc-v0 SFT conversations: a scripted expert plays the env and its real tool",
        _add_make_calc_traces,
        _cmd_make_calc_traces,
    ),
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
        "the tiny ReTool demo on a CPU: SFT, GRPO with real tools, eval, compare, plot, viewer",
        _add_demo,
        _cmd_demo,
    ),
    _Command(
        "serve-sandbox",
        "serve a sandbox backend over HTTP (auth, back-pressure, sessions, SandboxFusion API)",
        _add_serve_sandbox,
        _cmd_serve_sandbox,
    ),
    _Command(
        "serve-search",
        "serve a BM25 / dense / hybrid index over HTTP (Search-R1's POST /retrieve protocol)",
        _add_serve_search,
        _cmd_serve_search,
    ),
    _Command(
        "serve-proxy",
        "serve a model to agent programs (OpenAI API) and record their episodes token-exactly",
        _add_serve_proxy,
        _cmd_serve_proxy,
    ),
    _Command(
        "make-tiny-model",
        "generate the tiny Qwen2-architecture model and tokenizer used by tests and the demo",
        _add_make_tiny_model,
        _cmd_make_tiny_model,
    ),
    _Command(
        "doctor",
        "check this machine for what runs need (torch, vLLM, sandbox, cgroups, ...) with fixes",
        _add_doctor,
        _cmd_doctor,
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
