"""OrphanGuard: a tiny process that kills an engine's child processes when their owner dies.

vLLM runs its EngineCore and workers as separate processes. A clean exit stops them, but after a
``kill -9`` of the process that owns them (a trainer, ``agentloop eval``) nothing does: they
would keep their memory (GPU memory on a GPU) forever. ``PR_SET_PDEATHSIG`` cannot help here:
it must be set inside each child, and it fires when the *thread* that started the child exits
(vLLM starts on a worker thread). So a guard process watches the owner instead: it holds the read
end of a pipe whose write end only the owner has, and the kernel closes that end when the owner
dies, however it dies; it also notices being re-parented (the owner gone while a forked child
kept the pipe open). Then it terminates the engine's processes (and their children), killing
those that do not exit within a few seconds. On a normal shutdown the owner stops the guard
first, and it does nothing. The guard starts before the engine does and, until the engine's
processes are known, takes every process the owner starts: a kill during start-up (loading
weights, profiling, graph capture) leaves nothing behind either.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["OrphanGuard"]

_GUARD = r"""
import os, select, signal, sys
import psutil
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the owner's to handle
owner, me = os.getppid(), psutil.Process()

def parse(marks):
    return dict(m.split(":") for m in marks)

targets = parse(sys.argv[2:])  # pid -> repr(create_time); argv[1] marks a guard
watching = not targets  # start-up: every process the owner starts from now on is a target
pending = b""
while True:  # until the owner's end of the pipe closes (EOF) or the owner is gone
    try:
        kids = psutil.Process(owner).children(recursive=True) if watching else []
    except psutil.Error:
        kids = []
    for p in kids:
        try:
            guard = p.cmdline()[3:4] == [sys.argv[1]]  # another engine's guard
            if p.create_time() >= me.create_time() and p.pid != me.pid and not guard:
                targets.setdefault(str(p.pid), repr(p.create_time()))
        except psutil.Error:
            pass
    ready, _, _ = select.select([0], [], [], 0.2 if watching else 1.0)
    data = os.read(0, 4096) if ready else None
    if data == b"" or os.getppid() != owner:
        break
    pending += data or b""
    while b"\n" in pending:  # the owner names the engine's processes: only those from now on
        line, pending = pending.split(b"\n", 1)
        targets, watching = parse(line.decode().split()), False
procs = []
for pid, created in targets.items():
    try:
        proc = psutil.Process(int(pid))
        if repr(proc.create_time()) == created:  # the same process, not a reused pid
            procs += [proc, *proc.children(recursive=True)]
    except psutil.Error:
        pass
for proc in procs:
    try:
        proc.terminate()
    except psutil.Error:
        pass
_, alive = psutil.wait_procs(procs, timeout=5)
for proc in alive:
    try:
        proc.kill()
    except psutil.Error:
        pass
"""


_GUARD_MARK = "agentloop-orphan-guard"


class OrphanGuard:
    """Guard ``procs`` (``psutil.Process`` handles) against outliving this process.

    With no ``procs`` it guards every process this one starts from now on (polled five times a
    second), which covers an engine's start-up, the longest phase that holds GPU memory;
    :meth:`watch` then narrows it to the engine's own processes once they are known."""

    def __init__(self, procs: Sequence[Any] = ()) -> None:
        self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-c", _GUARD, _GUARD_MARK, *_marks(procs)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def watch(self, procs: Sequence[Any]) -> None:
        """Guard exactly ``procs`` from now on (instead of every new child)."""
        if self._proc is not None and self._proc.stdin is not None:
            self._proc.stdin.write((" ".join(_marks(procs)) + "\n").encode())
            self._proc.stdin.flush()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def close(self) -> None:
        """Stop the guard without it acting (the owner shut the engine down itself)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.kill()  # before closing the pipe: an EOF would make it act
        proc.wait()
        if proc.stdin is not None:
            proc.stdin.close()


def _marks(procs: Sequence[Any]) -> list[str]:
    return [f"{p.pid}:{p.create_time()!r}" for p in procs]
