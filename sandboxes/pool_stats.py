"""Metrics of a remote sandbox pool: each server's state and counts, and the pool's totals."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["PoolStats", "ServerStats"]


@dataclass(frozen=True, slots=True)
class ServerStats:
    """One server of a pool: whether it is in use, its open sessions, what it has done."""

    url: str
    up: bool
    active_sessions: int
    sessions_opened: int
    runs: int
    errors: int
    last_error: str | None = None
    session_cap: int | None = None  # sessions per client the server allows (its /health)


@dataclass(frozen=True, slots=True)
class PoolStats:
    """A pool's servers and their totals (``RemotePool.stats()``)."""

    servers: tuple[ServerStats, ...]
    sessions_waiting: int = 0  # session opens waiting for a server's session limit

    @property
    def servers_up(self) -> int:
        return sum(s.up for s in self.servers)

    @property
    def active_sessions(self) -> int:
        return sum(s.active_sessions for s in self.servers)

    @property
    def sessions_opened(self) -> int:
        return sum(s.sessions_opened for s in self.servers)

    @property
    def runs(self) -> int:
        return sum(s.runs for s in self.servers)

    @property
    def errors(self) -> int:
        return sum(s.errors for s in self.servers)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the totals and each server's numbers."""
        totals: tuple[str, ...] = ("servers_up", "active_sessions", "sessions_opened", "runs")
        totals += ("errors", "sessions_waiting")
        return {
            **{name: getattr(self, name) for name in totals},
            "servers": [dataclasses.asdict(s) for s in self.servers],
        }

    def metrics(self, prefix: str = "sandbox") -> dict[str, float]:
        """Flat numbers for a metrics log: the pool's totals and ``server{i}/...`` per server."""
        out = {
            f"{prefix}/servers_up": float(self.servers_up),
            f"{prefix}/active_sessions": float(self.active_sessions),
            f"{prefix}/errors": float(self.errors),
            f"{prefix}/sessions_waiting": float(self.sessions_waiting),
        }
        for i, s in enumerate(self.servers):
            out[f"{prefix}/server{i}/up"] = float(s.up)
            out[f"{prefix}/server{i}/active_sessions"] = float(s.active_sessions)
            out[f"{prefix}/server{i}/sessions_opened"] = float(s.sessions_opened)
            out[f"{prefix}/server{i}/errors"] = float(s.errors)
        return out
