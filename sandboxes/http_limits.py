"""Operator-set limits of agentloop's HTTP servers, their command-line flags, rate-limited logs.

Kept apart from :mod:`agentloop.sandboxes.http_server` so that building the command line
(``agentloop serve-sandbox --help``) does not import aiohttp.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from agentloop.errors import ConfigError

__all__ = [
    "NOISY_LOGGERS",
    "HttpLimits",
    "RateLimitFilter",
    "add_http_args",
    "http_limits_from_args",
    "limit_logging",
]

#: Loggers that can repeat one message per connection or per accept: always rate-limited.
NOISY_LOGGERS = (
    "asyncio",
    "aiohttp.server",
    "aiohttp.web",
    "aiohttp.access",
    "agentloop.sandboxes.http_server",
)


@dataclass(frozen=True)
class HttpLimits:
    """Transport limits of an agentloop HTTP server (set by the operator, never by a client)."""

    header_timeout_s: float = 15.0
    """A connection must send a complete request head within this many seconds of opening (or of
    its previous response); half-sent and idle connections are closed after it."""
    body_timeout_s: float = 60.0
    """A request's whole body must arrive within this many seconds of its head (else 408)."""
    max_connections: int | None = None
    """Open connections at most (None: 2048, or what the descriptor limit ``ulimit -Hn``
    allows); at the cap a new one replaces the oldest half-open or idle one, or gets 503 when
    every connection is busy with a request."""
    log_per_minute: int = 20
    """Each distinct log message is written at most this many times a minute; the rest are
    counted and the count is logged."""

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if not value > 0:
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{flag} must be > 0 seconds, got {value}")
        if self.max_connections is not None and self.max_connections < 1:
            raise ConfigError(f"--max-connections must be >= 1, got {self.max_connections}")
        if self.log_per_minute < 1:
            raise ConfigError(f"--log-per-minute must be >= 1, got {self.log_per_minute}")


def add_http_args(parser: Any) -> Any:
    """Add the :class:`HttpLimits` flags to an argparse parser (defaults from the dataclass)."""
    d = HttpLimits()
    add = parser.add_argument
    add(
        "--header-timeout-s",
        type=float,
        default=d.header_timeout_s,
        help="close a connection whose request head is not complete this many seconds after "
        f"it opened (or after its last response) (default: {d.header_timeout_s:g})",
    )
    add(
        "--body-timeout-s",
        type=float,
        default=d.body_timeout_s,
        help="answer 408 when a request body takes longer than this many seconds "
        f"(default: {d.body_timeout_s:g})",
    )
    add(
        "--max-connections",
        type=int,
        default=d.max_connections,
        help="open connections at most; half-open and idle ones make room first, then new ones "
        "get 503 (default: 2048, or fewer if ulimit -Hn is lower)",
    )
    add(
        "--log-per-minute",
        type=int,
        default=d.log_per_minute,
        help="write each distinct log message at most this often a minute, then a count "
        f"(default: {d.log_per_minute})",
    )
    return parser


def http_limits_from_args(args: Any) -> HttpLimits:
    """:class:`HttpLimits` from arguments parsed with :func:`add_http_args`."""
    return HttpLimits(
        header_timeout_s=args.header_timeout_s,
        body_timeout_s=args.body_timeout_s,
        max_connections=args.max_connections,
        log_per_minute=args.log_per_minute,
    )


# ---------------------------------------------------------------------- logging
class RateLimitFilter(logging.Filter):
    """Lets each (logger, message format) through at most ``per_minute`` times per minute; the
    first record after a suppressed stretch says how many were dropped."""

    def __init__(self, per_minute: int) -> None:
        super().__init__()
        self.per_minute = per_minute
        self._lock = threading.Lock()
        self._windows: dict[tuple[str, str], list[float]] = {}  # key → [start, count, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = time.monotonic()
        with self._lock:
            window = self._windows.get(key)
            if window is None or now - window[0] >= 60.0:
                dropped = int(window[2]) if window else 0
                if len(self._windows) > 1024:  # bounded: forget stale keys
                    self._windows = {k: w for k, w in self._windows.items() if now - w[0] < 60}
                self._windows[key] = [now, 1, 0]
                if dropped:
                    record.msg = f"{record.msg} [{dropped} more like this in the last minute]"
                return True
            if window[1] < self.per_minute:
                window[1] += 1
                return True
            window[2] += 1
            return False


def limit_logging(per_minute: int, names: Iterable[str] = ()) -> RateLimitFilter:
    """Rate-limit the noisy loggers and ``names`` (idempotent: one filter per logger, its
    limit updated to ``per_minute``)."""
    shared: RateLimitFilter | None = None
    for name in (*NOISY_LOGGERS, *names):
        logger = logging.getLogger(name)
        mine = next((f for f in logger.filters if isinstance(f, RateLimitFilter)), None)
        if mine is None:
            mine = shared or RateLimitFilter(per_minute)
            logger.addFilter(mine)
        mine.per_minute = per_minute
        shared = shared or mine
    assert shared is not None
    return shared
