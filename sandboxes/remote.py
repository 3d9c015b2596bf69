"""The `remote` backend: a client of one or more sandbox servers (`agentloop serve-sandbox`)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import aiohttp

from agentloop.errors import ConfigError, SandboxError
from agentloop.sandboxes.base import (
    ExecResult,
    SandboxLimits,
    check_code,
    check_files,
    encode_files,
)
from agentloop.sandboxes.wire import cap_output

__all__ = ["RemoteSandbox", "RemoteSession", "ServerBusy", "ServerUnreachable"]

_RETRY_STATUSES = (429, 503)  # back-pressure and draining: the request did not run
# JSON escapes a byte of output as at most 6 characters (``\u00XX``, ``\ufffd``); two streams
_JSON_PER_OUTPUT_BYTE = 12
_FRAMING_BYTES = 1 << 16  # the other fields of an answer, and an error's message
_PARSE_OFF_LOOP_BYTES = 1 << 20  # answers larger than this are parsed in a thread
_SESSION_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


class ServerUnreachable(SandboxError):
    """The sandbox server could not be reached, or dropped the connection mid-request (it is
    down, crashed or restarted): a pool routes new sessions elsewhere."""


class ServerBusy(SandboxError):
    """The server answered 429 or 503 (at capacity, at this client's session limit, draining):
    the request did not run; ``kind`` is the server's error type (``TooManySessions``, …)."""

    def __init__(self, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind

    def __reduce__(self) -> tuple[type[ServerBusy], tuple[str, str | None]]:
        return (type(self), (str(self), self.kind))


class RemoteSandbox:
    """Runs code on sandbox servers over HTTP.

    ``urls`` is one base URL or several: one-off runs are spread round-robin and fail over to the
    next server when a connection cannot be made; a session stays on the server that created it.
    Only connection failures (the request never reached a server) and 429/503 answers are
    retried, with exponential backoff from ``backoff_s`` — a run that may have executed is never
    re-sent. Each request's deadline is its run timeout plus ``grace_s``; ``limits.timeout_s``
    is only the default timeout sent with runs (the server enforces its own limits), and
    ``limits.max_output_bytes`` is sent as the run's output limit (which a server may only
    lower) and bounds what is read back: an answer longer than that output (as JSON, both
    streams) plus framing is refused unread, as is one whose fields have the wrong types.
    """

    name = "remote"

    def __init__(
        self,
        urls: str | Sequence[str] = "http://127.0.0.1:8080",
        *,
        token: str | None = None,
        limits: SandboxLimits | None = None,
        retries: int = 4,
        backoff_s: float = 0.1,
        connect_timeout_s: float = 5.0,
        grace_s: float = 30.0,
    ) -> None:
        self.urls = [urls] if isinstance(urls, str) else list(urls)
        if not self.urls or not all(
            isinstance(u, str) and u.startswith(("http://", "https://")) for u in self.urls
        ):
            raise ConfigError(
                f"urls must be http(s) base URLs like 'http://10.0.0.5:8080', got {urls!r}"
            )
        self.urls = [u.rstrip("/") for u in self.urls]
        self.token = token
        self.limits = limits or SandboxLimits()
        self.retries = retries
        self.backoff_s = backoff_s
        self.connect_timeout_s = connect_timeout_s
        self.grace_s = grace_s
        self._http: aiohttp.ClientSession | None = None
        self._next = itertools.cycle(range(len(self.urls)))
        self.max_answer_bytes = _JSON_PER_OUTPUT_BYTE * self.limits.max_output_bytes
        self.max_answer_bytes += _FRAMING_BYTES

    async def start(self) -> None:
        if self._http is None:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            self._http = aiohttp.ClientSession(headers=headers)

    async def close(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            await http.close()

    async def __aenter__(self) -> RemoteSandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def health(self, url: str | None = None, timeout_s: float = 10.0) -> dict[str, Any]:
        """The ``/health`` answer of ``url`` (default: the first server) within ``timeout_s``."""
        return await self._request("GET", url or self.urls[0], "/health", None, timeout_s)

    def _body(
        self,
        code: str,
        language: str,
        timeout_s: float | None,
        stdin: str | None,
        files: Mapping[str, bytes | str] | None,
    ) -> tuple[dict[str, Any], float]:
        timeout = self.limits.run_timeout(timeout_s)
        body = {
            "code": check_code(code),
            "language": language,
            "timeout_s": timeout,
            "stdin": stdin,
            "files": encode_files(check_files(files)),
            "max_output_bytes": self.limits.max_output_bytes,
        }
        return body, timeout + self.grace_s

    async def _request(
        self, method: str, base: str, path: str, body: Any, deadline_s: float
    ) -> dict[str, Any]:
        """One request with retries on connection failure / back-pressure; maps errors."""
        if self._http is None:
            raise SandboxError("remote sandbox is not started; use `async with sandbox:`")
        end = time.monotonic() + deadline_s
        for attempt in itertools.count():
            left = end - time.monotonic()
            if left <= 0:
                raise SandboxError(f"sandbox server {base} gave no result within {deadline_s:g}s")
            timeout = aiohttp.ClientTimeout(total=left, sock_connect=self.connect_timeout_s)
            try:
                async with self._http.request(
                    method, base + path, json=body, timeout=timeout
                ) as resp:
                    data = await self._read_json(resp, base)
                    status, retry_after = resp.status, resp.headers.get("Retry-After")
            except aiohttp.ClientConnectorError as exc:
                if attempt >= self.retries:
                    raise ServerUnreachable(
                        f"cannot connect to sandbox server {base} after {attempt + 1} tries: "
                        f"{exc}; is `agentloop serve-sandbox` running there?"
                    ) from None
                await asyncio.sleep(min(self.backoff_s * 2**attempt, max(0.0, left)))
                continue
            except (aiohttp.ClientError, ValueError, RecursionError) as exc:
                fail = ServerUnreachable if isinstance(exc, aiohttp.ClientError) else SandboxError
                raise fail(
                    f"sandbox server {base} failed mid-request ({type(exc).__name__}: {exc}); "
                    "it may have crashed or restarted"
                ) from None
            except TimeoutError:
                raise SandboxError(f"sandbox server {base} timed out ({deadline_s:g}s)") from None
            if status in _RETRY_STATUSES and attempt < self.retries:
                await asyncio.sleep(float(retry_after or self.backoff_s * 2**attempt))
                continue
            if status >= 400 or not isinstance(data, dict):
                raise _error(base, status, data)
            return data
        raise AssertionError("unreachable")

    async def _read_json(self, resp: aiohttp.ClientResponse, base: str) -> Any:
        """The answer's JSON, read only up to :attr:`max_answer_bytes` (a longer one is a
        SandboxError and is not read further); None for an empty body."""
        cap = self.max_answer_bytes
        if resp.content_length is not None and resp.content_length > cap:
            raise _too_long(base, resp.content_length, cap)
        raw = bytearray()
        while chunk := await resp.content.read(1 << 16):
            raw += chunk
            if len(raw) > cap:
                raise _too_long(base, None, cap)
        if not raw:
            return None
        if len(raw) > _PARSE_OFF_LOOP_BYTES:
            return await asyncio.to_thread(json.loads, raw)
        return json.loads(raw)

    async def run(
        self,
        code: str,
        *,
        language: str = "python",
        timeout_s: float | None = None,
        stdin: str | None = None,
        files: Mapping[str, bytes | str] | None = None,
    ) -> ExecResult:
        """Run once on the next server; fail over to the others if it cannot be reached."""
        body, deadline = self._body(code, language, timeout_s, stdin, files)
        first = next(self._next)
        order = self.urls[first:] + self.urls[:first]
        for i, base in enumerate(order):
            try:
                data = await self._request("POST", base, "/v1/run", body, deadline)
                return cap_output(ExecResult.from_dict(data), self.limits.max_output_bytes)
            except ServerUnreachable as exc:
                if i == len(order) - 1 or "cannot connect" not in str(exc):
                    raise
        raise AssertionError("unreachable")

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[RemoteSession]:
        """A session on one server (the next in turn); closed on the server when the block exits."""
        base = self.urls[next(self._next)]
        data = await self._request("POST", base, "/v1/sessions", {}, self.grace_s + 30.0)
        session = RemoteSession(self, base, _session_id(base, data))
        try:
            yield session
        finally:
            with contextlib.suppress(SandboxError, ConfigError):
                await self._request("DELETE", base, f"/v1/sessions/{session.id}", None, 10.0)


class RemoteSession:
    """A session that lives on one sandbox server (session affinity)."""

    def __init__(self, sandbox: RemoteSandbox, base: str, session_id: str) -> None:
        self.id = session_id
        self.server = base
        self._sandbox = sandbox

    async def run(
        self,
        code: str,
        *,
        language: str = "python",
        timeout_s: float | None = None,
        stdin: str | None = None,
        files: Mapping[str, bytes | str] | None = None,
    ) -> ExecResult:
        sb = self._sandbox
        body, deadline = sb._body(code, language, timeout_s, stdin, files)
        data = await sb._request("POST", self.server, f"/v1/sessions/{self.id}/run", body, deadline)
        return cap_output(ExecResult.from_dict(data), sb.limits.max_output_bytes)


def _error(base: str, status: int, data: Any) -> Exception:
    message = data.get("error") if isinstance(data, dict) else None
    kind = data.get("type") if isinstance(data, dict) else None
    text = f"sandbox server {base} answered {status}: {message or data!r}"[:2000]
    if status in _RETRY_STATUSES:
        return ServerBusy(text, kind if isinstance(kind, str) else None)
    return ConfigError(text) if kind == "ConfigError" else SandboxError(text)


def _too_long(base: str, length: int | None, cap: int) -> SandboxError:
    size = f"{length} bytes" if length is not None else "more"
    return SandboxError(
        f"sandbox server {base} answered {size}, over this client's limit of {cap} bytes (its "
        "limits.max_output_bytes of both streams as JSON, plus framing); the server is not "
        "keeping the output limit the client sent, or is not an agentloop sandbox server"
    )


def _session_id(base: str, data: dict[str, Any]) -> str:
    sid = data.get("session_id")
    if not isinstance(sid, str) or not _SESSION_ID.fullmatch(sid):
        raise SandboxError(
            f"sandbox server {base} answered a session open with session_id={sid!r:.100}, not "
            "an id of 1-128 letters, digits, '.', '_' or '-'; is it an agentloop sandbox server?"
        )
    return sid
