"""The proxy's open episodes: who owns each, an idle lifetime and a cap for client-opened ones."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from agentloop.errors import ConfigError
from agentloop.proxy.episode import Episode
from agentloop.proxy.errors import ProxyRequestError

__all__ = ["EpisodeStore"]


@dataclass(slots=True)
class _Entry:
    episode: Episode
    owner: str | None  # the token that opened it (token<i>); None: any client that knows the id
    last_used: float
    managed: bool  # opened for a client (serve-proxy): subject to the lifetime and the cap


class EpisodeStore(Mapping[str, Episode]):
    """Episodes by id. Those opened by the proxy's owner (:meth:`AgentProxy.open_episode`,
    training and eval) live until they are closed. Those opened for clients (``managed``) are
    dropped ``ttl_s`` after their last request, and at most ``max_episodes`` of them are open:
    a new one first evicts expired episodes, then finished ones (a limit ended them), oldest
    first, and is refused with a 429 when all are live. An episode serving a request is never
    evicted."""

    def __init__(
        self, ttl_s: float, max_episodes: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if ttl_s <= 0 or max_episodes < 1:
            raise ConfigError(
                f"episode ttl_s must be > 0 and max_episodes >= 1, got {ttl_s}, {max_episodes}"
            )
        self.ttl_s, self.max_episodes, self.clock = ttl_s, max_episodes, clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._managed = 0
        self.evicted = 0

    def __getitem__(self, eid: str) -> Episode:
        return self._entries[eid].episode

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, eid: str, client: str | None) -> Episode | None:
        """The episode ``client`` may use (its own, or one without owner), marked as used."""
        entry = self._entries.get(eid)
        if entry is None or (entry.owner is not None and entry.owner != client):
            return None
        if entry.managed and self._expired(entry, self.clock()):
            self._drop(eid)
            return None
        entry.last_used = self.clock()
        self._entries.move_to_end(eid)
        return entry.episode

    def add(self, episode: Episode, client: str | None, *, managed: bool) -> None:
        if episode.id in self._entries:
            raise ConfigError(f"episode {episode.id!r} is already open; close it first")
        if managed:
            self._make_room()
            self._managed += 1
        self._entries[episode.id] = _Entry(episode, client, self.clock(), managed)

    def pop(self, eid: str, client: str | None = None) -> Episode | None:
        """Remove ``eid`` (if ``client`` may see it) and return it."""
        entry = self._entries.get(eid)
        if entry is None or (client is not None and entry.owner not in (None, client)):
            return None
        return self._drop(eid).episode

    def _drop(self, eid: str) -> _Entry:
        entry = self._entries.pop(eid)
        self._managed -= entry.managed
        return entry

    def _expired(self, entry: _Entry, now: float) -> bool:
        return now - entry.last_used > self.ttl_s and not entry.episode.lock.locked()

    def _make_room(self) -> None:
        now = self.clock()
        for eid, entry in list(self._entries.items()):  # oldest use first
            if entry.managed and self._expired(entry, now):
                self._drop(eid)
                self.evicted += 1
        if self._managed < self.max_episodes:
            return
        for eid, entry in list(self._entries.items()):
            finished = entry.episode.limit_hit is not None and not entry.episode.lock.locked()
            if entry.managed and finished:
                self._drop(eid)
                self.evicted += 1
                return
        raise ProxyRequestError(
            f"this proxy has {self._managed} open episodes, its limit (max_episodes="
            f"{self.max_episodes}); finish one (DELETE /episodes/<id>) or wait: an idle episode "
            f"is dropped {self.ttl_s:g} s after its last request",
            status=429,
            kind="rate_limit_error",
            code="too_many_episodes",
        )
