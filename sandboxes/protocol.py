"""Host side of the kernel protocol: framed requests, capped output, one run with a deadline."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import json
import secrets
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from agentloop.errors import SandboxError
from agentloop.sandboxes.base import ExecResult, encode_files

__all__ = [
    "KERNEL_SOURCE",
    "Capture",
    "SectionBuffer",
    "SectionMarks",
    "SectionReader",
    "Sections",
    "StreamKernel",
    "killed_notice",
    "new_key",
]

#: The in-sandbox kernel, shipped as ``python3 -u -c KERNEL_SOURCE MODE LIMITS`` (no file to
#: bind-mount).
KERNEL_SOURCE = (Path(__file__).parent / "kernel.py").read_text()
# a request's body length, seq and CPU seconds (0: none) (kernel.py's _HEADER)
_HEADER = struct.Struct(">Iqd")

_CHUNK = 1 << 16
_MAX_SECTIONS = 4  # stale sections (a death between runs, a restarted worker) are skipped
_MAX_LINE = 1 << 16  # a status line longer than this is cut (and then fails to parse)


def new_key() -> str:
    """A per-kernel secret (32 hex characters) from which the kernel's section marks derive;
    it travels on the kernel's stdin, never in its argv or environment."""
    return secrets.token_hex(16)


class SectionMarks:
    """The marks that end a kernel's output sections: mark ``n`` is an HMAC of ``n`` under the
    kernel's key (kernel.py's ``mark``), so code in the sandbox, which never holds the key, cannot
    write one; each mark is used once."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.size = len(self(0))

    def __call__(self, n: int) -> bytes:
        digest = hmac.new(self.key.encode(), str(n).encode(), hashlib.sha256).hexdigest()
        return ("\x1eagentloop-" + digest[:24] + "\x1e").encode()


def killed_notice(reason: str) -> str:
    """The line appended to stderr when a session's interpreter state is lost."""
    return (
        f"\n[sandbox] the Python interpreter was {reason}; "
        "variables and imports from earlier runs are gone\n"
    )


class Capture:
    """Keeps the first ``cap`` bytes of a stream and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.total = 0

    def add(self, chunk: bytes | bytearray | memoryview) -> None:
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        self.total += len(chunk)

    def extend(self, other: Capture) -> None:
        """Append what ``other`` kept and count what it dropped."""
        self.add(other.data)
        self.total += other.total - len(other.data)

    @property
    def truncated(self) -> bool:
        return self.total > self.cap

    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


class Sections(Protocol):
    """One output stream of a kernel, read section by section (each ends with the sentinel)."""

    async def section(self, sink: Capture) -> bool:
        """Move the next section into ``sink``; False if the stream ended first."""
        ...

    async def line(self) -> bytes:
        """The status line after the sentinel just read (stderr)."""
        ...

    def salvage(self, sink: Capture) -> None:
        """Move what an unfinished section holds into ``sink`` (its run timed out)."""
        ...


class SectionReader:
    """Sections pulled from a pipe as they are read: bytes after a sentinel wait for the next
    read, and what nobody reads stays in the pipe (the writer blocks: bounded backpressure)."""

    def __init__(self, reader: asyncio.StreamReader, marks: SectionMarks) -> None:
        self.reader = reader
        self._marks = marks
        self._n = 0  # the section being read
        self._pending = b""

    async def section(self, sink: Capture) -> bool:
        buf, self._pending = self._pending, b""
        sentinel = self._marks(self._n)
        keep_max = len(sentinel) - 1
        while True:
            idx = buf.find(sentinel)
            if idx >= 0:
                sink.add(buf[:idx])
                self._pending = buf[idx + len(sentinel) :]
                self._n += 1
                return True
            keep = min(len(buf), keep_max)  # a sentinel may straddle two chunks
            sink.add(buf[: len(buf) - keep])
            self._pending = buf = buf[len(buf) - keep :]  # for salvage() if the read times out
            chunk = await self.reader.read(_CHUNK)
            self._pending = b""
            if not chunk:
                sink.add(buf)
                return False
            buf += chunk

    async def line(self) -> bytes:
        buf, self._pending = self._pending, b""
        while b"\n" not in buf:
            chunk = await self.reader.read(_CHUNK)
            if not chunk or len(buf) > _MAX_LINE:
                return b""
            buf += chunk
        line, _, self._pending = buf.partition(b"\n")
        return line

    def salvage(self, sink: Capture) -> None:
        sink.add(self._pending)
        self._pending = b""


class SectionBuffer:
    """Sections split on the way in, for a transport that must be drained as it fills (one
    socket carrying both streams cannot hold one back for the other).

    :meth:`feed` takes bytes as they arrive; each section keeps its first ``cap`` bytes and counts
    the rest, and at most ``_MAX_SECTIONS`` finished sections wait to be read (the oldest go
    first), so memory stays bounded however much the sandbox writes, during a run or after it,
    read or not. With ``status_line``, one line after each sentinel belongs to the section it
    ends (the kernel's stderr).
    """

    def __init__(self, marks: SectionMarks, cap: int, *, status_line: bool = False) -> None:
        self._marks, self._cap, self._status_line = marks, cap, status_line
        self._n = 0  # the section being fed
        self._sentinel = marks(0)
        self._current = Capture(cap)
        self._tail = b""  # the last bytes fed, which may be the start of a sentinel
        self._line: bytearray | None = None  # the status line being read
        self._done: collections.deque[tuple[Capture, bytes]] = collections.deque(
            maxlen=_MAX_SECTIONS
        )
        self._last_line = b""
        self._eof = False
        self._wake = asyncio.Event()

    def feed(self, data: bytes) -> None:
        buf, self._tail = self._tail + data, b""
        while buf:
            if self._line is not None:
                head, newline, buf = buf.partition(b"\n")
                self._line += head[: _MAX_LINE - len(self._line)]
                if newline:
                    self._finish(bytes(self._line))
                continue
            idx = buf.find(self._sentinel)
            if idx < 0:
                keep = min(len(buf), len(self._sentinel) - 1)
                self._current.add(buf[: len(buf) - keep])
                self._tail = buf[len(buf) - keep :]
                return
            self._current.add(buf[:idx])
            buf = buf[idx + len(self._sentinel) :]
            self._n += 1
            self._sentinel = self._marks(self._n)
            if self._status_line:
                self._line = bytearray()
            else:
                self._finish(b"")

    def _finish(self, line: bytes) -> None:
        self._done.append((self._current, line))
        self._current, self._line = Capture(self._cap), None
        self._wake.set()

    def feed_eof(self) -> None:
        self._current.add(self._tail)
        self._tail, self._eof = b"", True
        self._wake.set()

    async def section(self, sink: Capture) -> bool:
        while not (self._done or self._eof):
            self._wake.clear()
            await self._wake.wait()
        if self._done:
            capture, self._last_line = self._done.popleft()
            sink.extend(capture)
            return True
        sink.extend(self._current)  # what came before the end, with no sentinel
        self._current = Capture(self._cap)
        return False

    async def line(self) -> bytes:
        return self._last_line

    def salvage(self, sink: Capture) -> None:
        sink.extend(self._current)
        sink.add(self._tail)
        self._current, self._tail = Capture(self._cap), b""


class StreamKernel:
    """A running kernel reached through its stdout/stderr sections and stdin (process or
    container).

    Subclasses provide the transport: :meth:`_send`, :meth:`kill`, :meth:`exit_code`, and
    optionally :meth:`oom_events` (a host-side OOM-kill counter, e.g. a memory cgroup's).
    """

    def __init__(self, stdout: Sections, stderr: Sections, max_output_bytes: int, key: str) -> None:
        self._key = key
        self._out = stdout
        self._err = stderr
        self._cap = max_output_bytes
        self._seq = 0
        self.alive = True

    async def _send(self, data: bytes) -> None:
        raise NotImplementedError

    async def kill(self) -> None:
        """Kill the whole kernel (every process in the sandbox) now."""
        raise NotImplementedError

    async def exit_code(self) -> int | None:
        """The kernel's exit status once it is gone (None if unknown)."""
        return None

    async def oom_events(self) -> int:
        return 0

    async def close(self) -> None:
        """Stop the kernel and release its resources (idempotent)."""
        self.alive = False
        await self.kill()

    async def _read_info(self, out: Capture, err: Capture) -> dict[str, Any] | None:
        found_out, found_err = await asyncio.gather(self._out.section(out), self._err.section(err))
        if not (found_out and found_err):
            return None
        line = await self._err.line()
        try:
            info = json.loads(line)
        except ValueError:
            raise SandboxError(f"sandbox kernel sent a bad status line {line[:200]!r}") from None
        return info if isinstance(info, dict) else None

    async def handshake(self, timeout_s: float) -> None:
        """Wait for the kernel's ready section. If it does not come (or the wait is cancelled),
        close the kernel; raise SandboxError with its output."""
        try:
            await self._send(self._key.encode())
            await self._ready(timeout_s)
        except BaseException:
            await asyncio.shield(self.close())
            raise

    async def _ready(self, timeout_s: float) -> None:
        out, err = Capture(self._cap), Capture(self._cap)
        try:
            async with asyncio.timeout(timeout_s):
                info = await self._read_info(out, err)
        except TimeoutError:
            info = None
        if not info or not info.get("ready"):
            raise SandboxError(
                f"the sandbox kernel did not start within {timeout_s:.0f}s; its output: "
                f"{(err.text() or out.text()).strip()[-2000:]!r}"
            )

    async def execute(
        self,
        code: str,
        *,
        timeout_s: float,
        cpu_s: float | None,
        stdin: str | None,
        files: Mapping[str, bytes],
    ) -> ExecResult:
        """Run one request; a timeout or a dead kernel becomes a result, never a hang."""
        if not self.alive:
            raise SandboxError("this sandbox kernel is closed; open a new session")
        self._seq += 1
        body = json.dumps({"code": code, "stdin": stdin, "files": encode_files(files)}).encode()
        oom_before = await self.oom_events()
        start = time.perf_counter()
        out, err = Capture(self._cap), Capture(self._cap)
        notes: list[str] = []
        try:
            async with asyncio.timeout(timeout_s):
                await self._send(_HEADER.pack(len(body), self._seq, cpu_s or 0.0) + body)
                info = await self._wait_for_run(out, err, notes)
        except TimeoutError:
            self.alive = False
            await self.kill()
            self._out.salvage(out)  # what the run wrote before its deadline
            self._err.salvage(err)
            notes.append(f"\n[sandbox] run timed out after {timeout_s:g}s and was killed\n")
            return self._result(out, err, notes, 137, start, timed_out=True)
        except (ConnectionError, OSError) as exc:
            info = None
            notes.append(f"\n[sandbox] lost the kernel: {exc}\n")
        if info is None:  # the whole kernel is gone (sandbox-level OOM kill, crash)
            self.alive = False
            await self.kill()
            oom = await self.oom_events() > oom_before
            status = await self.exit_code()
            notes.append(killed_notice("killed (out of memory)" if oom else "terminated"))
            return self._result(out, err, notes, 137 if oom else (status or 137), start, oom=oom)
        oom = bool(info.get("oom")) or await self.oom_events() > oom_before
        cpu = bool(info.get("cpu"))
        if info.get("died"):
            reason = "killed (out of memory)" if oom and not cpu else "restarted"
            notes.append(killed_notice("over its CPU-time limit" if cpu else reason))
        duration = float(info.get("duration") or (time.perf_counter() - start))
        return self._result(
            out, err, notes, int(info["exit_code"]), start, oom=oom, timed_out=cpu, dur=duration
        )

    async def _wait_for_run(
        self, out: Capture, err: Capture, notes: list[str]
    ) -> dict[str, Any] | None:
        for _ in range(_MAX_SECTIONS):
            info = await self._read_info(out, err)
            if info is None or info.get("seq") == self._seq:
                return info
            if info.get("died"):  # the worker died between runs: say so, discard its output
                notes.append(killed_notice("restarted after it died between runs"))
            for capture in (out, err):
                capture.data.clear()
                capture.total = 0
        raise SandboxError("sandbox kernel is out of sync with its host; open a new session")

    def _result(
        self,
        out: Capture,
        err: Capture,
        notes: list[str],
        exit_code: int,
        start: float,
        *,
        timed_out: bool = False,
        oom: bool = False,
        dur: float | None = None,
    ) -> ExecResult:
        return ExecResult(
            stdout=out.text(),
            stderr=err.text() + "".join(notes),
            exit_code=exit_code,
            timed_out=timed_out,
            oom_killed=oom,
            duration_s=dur if dur is not None else time.perf_counter() - start,
            truncated=out.truncated or err.truncated,
        )
