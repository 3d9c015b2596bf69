"""The ``serve-sandbox`` command line: its arguments and the backend they build (no aiohttp)."""

from __future__ import annotations

from typing import Any

__all__ = ["backend_kwargs_from_args", "build_parser"]


def build_parser(parser: Any = None) -> Any:
    """The ``serve-sandbox`` arguments (pass an argparse sub-parser to extend it)."""
    import argparse
    import os

    p = parser or argparse.ArgumentParser(
        prog="agentloop serve-sandbox", description="Serve a sandbox backend over HTTP."
    )
    p.add_argument("--backend", default="local", help="local | docker | subprocess_unsafe")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    p.add_argument("--max-concurrency", type=int, default=os.cpu_count() or 2)
    p.add_argument("--max-queue", type=int, default=None, help="waiting runs before 429")
    p.add_argument("--token", default=os.environ.get("AGENTLOOP_SANDBOX_TOKEN"))
    p.add_argument("--pool-size", type=int, default=None, help="pre-warmed interpreters")
    p.add_argument("--timeout-s", type=float, default=30.0, help="default per-run wall clock")
    p.add_argument("--memory-mb", type=int, default=1024)
    p.add_argument("--max-processes", type=int, default=64)
    p.add_argument("--session-ttl-s", type=float, default=600.0, help="idle session lifetime")
    p.add_argument("--max-request-mb", type=int, default=16)
    p.add_argument("--docker-url", default=None, help="Docker/podman engine URL (docker backend)")
    p.add_argument("--image", default=None, help="container image (docker backend)")
    p.add_argument(
        "--acknowledge-unsafe",
        action="store_true",
        help="required for --backend subprocess_unsafe (no isolation)",
    )
    return p


def backend_kwargs_from_args(args: Any) -> dict[str, Any]:
    """Backend constructor arguments from parsed ``serve-sandbox`` arguments."""
    from .base import SandboxLimits

    kw: dict[str, Any] = {
        "limits": SandboxLimits(
            timeout_s=args.timeout_s, memory_mb=args.memory_mb, max_processes=args.max_processes
        )
    }
    if args.pool_size is not None:
        kw["pool_size"] = args.pool_size
    if args.backend == "docker":
        kw.update({k: v for k, v in (("base_url", args.docker_url), ("image", args.image)) if v})
    if args.backend == "subprocess_unsafe":
        kw["acknowledge_unsafe"] = args.acknowledge_unsafe
    return kw
