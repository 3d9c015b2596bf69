"""``agentloop serve-sandbox``, ``serve-search`` and ``serve-proxy``: the HTTP services."""

from __future__ import annotations

import argparse

from agentloop.cli.common import key_values, named_model

__all__ = [
    "add_serve_proxy",
    "add_serve_sandbox",
    "add_serve_search",
    "cmd_serve_proxy",
    "cmd_serve_sandbox",
    "cmd_serve_search",
]


def add_serve_sandbox(parser: argparse.ArgumentParser) -> None:
    from agentloop.sandboxes.serve_args import build_parser

    build_parser(parser)


def cmd_serve_sandbox(args: argparse.Namespace) -> int:
    from agentloop.sandboxes.server import run_from_args

    return run_from_args(args)


def add_serve_search(parser: argparse.ArgumentParser) -> None:
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


def cmd_serve_search(args: argparse.Namespace) -> int:
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


def add_serve_proxy(parser: argparse.ArgumentParser) -> None:
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


def cmd_serve_proxy(args: argparse.Namespace) -> int:
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
        model=named_model(args.model),
        served_model=args.served_model,
        engine=args.engine,
        base_url=args.base_url,
        engine_args=key_values(args.engine_arg),
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
