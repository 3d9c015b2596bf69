"""The ``serve-sandbox`` command line: its arguments and the backend they build (no aiohttp)."""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from agentloop.errors import ConfigError

__all__ = [
    "TOKEN_ENV",
    "backend_kwargs_from_args",
    "build_parser",
    "find_token",
    "is_loopback",
    "read_token_file",
    "read_tokens",
    "warn_open",
]

#: The environment variable holding the server's token (one, or several separated by commas).
TOKEN_ENV = "AGENTLOOP_SANDBOX_TOKEN"


def build_parser(parser: Any = None) -> Any:
    """The ``serve-sandbox`` arguments (pass an argparse sub-parser to extend it)."""
    import argparse

    p = parser or argparse.ArgumentParser(
        prog="agentloop serve-sandbox", description="Serve a sandbox backend over HTTP."
    )
    p.add_argument("--backend", default="local", help="local | docker | subprocess_unsafe")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    p.add_argument("--max-concurrency", type=int, default=os.cpu_count() or 2)
    p.add_argument("--max-queue", type=int, default=None, help="waiting runs before 429")
    p.add_argument(
        "--token-file",
        default=None,
        help=f"file with the auth token(s), one per line: one per client (else ${TOKEN_ENV})",
    )
    p.add_argument("--token", default=None, help=argparse.SUPPRESS)  # refused: visible in ps
    p.add_argument("--pool-size", type=int, default=None, help="pre-warmed interpreters")
    p.add_argument(
        "--timeout-s", type=float, default=30.0, help="per-run wall clock: default and ceiling"
    )
    p.add_argument("--cpu-time-s", type=float, default=None, help="per-run CPU time ceiling")
    p.add_argument("--memory-mb", type=int, default=1024, help="per-sandbox memory ceiling")
    p.add_argument("--max-processes", type=int, default=64)
    p.add_argument("--max-output-bytes", type=int, default=1 << 20, help="per stream, per run")
    p.add_argument("--disk-mb", type=int, default=256, help="size of /sandbox and of /tmp")
    p.add_argument("--session-ttl-s", type=float, default=600.0, help="idle session lifetime")
    p.add_argument("--max-sessions", type=int, default=256, help="open sessions, all clients")
    p.add_argument("--max-sessions-per-client", type=int, default=32, help="per token/peer")
    p.add_argument("--max-request-mb", type=int, default=16)
    p.add_argument("--docker-url", default=None, help="Docker/podman engine URL (docker backend)")
    p.add_argument("--image", default=None, help="container image (docker backend)")
    p.add_argument(
        "--acknowledge-unsafe",
        action="store_true",
        help="required for --backend subprocess_unsafe (no isolation)",
    )
    from agentloop.sandboxes.http_limits import add_http_args

    return add_http_args(p)


def backend_kwargs_from_args(args: Any) -> dict[str, Any]:
    """Backend constructor arguments from parsed ``serve-sandbox`` arguments."""
    from agentloop.sandboxes.base import SandboxLimits

    kw: dict[str, Any] = {
        "limits": SandboxLimits(
            timeout_s=args.timeout_s,
            cpu_time_s=args.cpu_time_s,
            memory_mb=args.memory_mb,
            max_processes=args.max_processes,
            max_output_bytes=args.max_output_bytes,
            disk_mb=args.disk_mb,
        )
    }
    if args.pool_size is not None:
        kw["pool_size"] = args.pool_size
    if args.backend == "docker":
        kw.update({k: v for k, v in (("base_url", args.docker_url), ("image", args.image)) if v})
    if args.backend == "subprocess_unsafe":
        kw["acknowledge_unsafe"] = args.acknowledge_unsafe
    return kw


def read_tokens(args: Any) -> list[str]:
    """The server's tokens: from ``--token-file`` (one per line) or ``$AGENTLOOP_SANDBOX_TOKEN``
    (comma-separated); never from the command line, where ``ps`` shows it to every user."""
    if args.token is not None:
        raise ConfigError(
            "--token puts the token on the command line, where `ps` shows it to every user of "
            f"this machine; put it in a file (--token-file PATH) or in ${TOKEN_ENV}"
        )
    if args.token_file is not None:
        return read_token_file(args.token_file)
    return [t.strip() for t in os.environ.get(TOKEN_ENV, "").split(",") if t.strip()]


def read_token_file(path: str) -> list[str]:
    """The tokens in ``path``, one per line (``--token-file``); a missing or empty file is a
    :class:`ConfigError`."""
    try:
        with open(path) as f:
            tokens = [line.strip() for line in f if line.strip()]
    except OSError as exc:
        raise ConfigError(f"--token-file {path!r} cannot be read: {exc}") from None
    if not tokens:
        raise ConfigError(f"--token-file {path!r} holds no token (one per line)")
    return tokens


def find_token(given: str, tokens: Sequence[bytes]) -> int | None:
    """The index of ``given`` in ``tokens``, or None; every token is compared, each in
    constant time, so the answer's timing tells nothing about any token."""
    found = None
    for i, token in enumerate(tokens):
        if hmac.compare_digest(given.encode(errors="replace"), token):
            found = i
    return found


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or address to bind) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_open(
    host: str,
    *,
    server: str = "sandbox server",
    risk: str = "run code on it",
    env: str = TOKEN_ENV,
    logger: str = "agentloop.sandboxes.server",
) -> None:
    """Say on stderr and in the log that a server on ``host`` is open to anyone."""
    message = (
        f"WARNING: the {server} listens on {host} with NO authentication: anyone who can "
        f"reach this port can {risk}. Set a token (--token-file PATH or {env}) or bind to "
        "127.0.0.1."
    )
    logging.getLogger(logger).warning(message)
    print(message, file=sys.stderr, flush=True)
