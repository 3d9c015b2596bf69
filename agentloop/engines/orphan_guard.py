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
first, and it does nothing.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["OrphanGuard"]

_GUARD = r"""
import os, select, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the owner's to handle
owner = os.getppid()
while True:  # until the owner's end of the pipe closes (EOF) or the owner is gone
    ready, _, _ = select.select([0], [], [], 1.0)
    if (ready and not os.read(0, 4096)) or os.getppid() != owner:
        break
import psutil
targets = []
for arg in sys.argv[1:]:
    pid, created = arg.split(":")
    try:
        proc = psutil.Process(int(pid))
        if repr(proc.create_time()) == created:  # the same process, not a reused pid
            targets += [proc, *proc.children(recursive=True)]
    except psutil.Error:
        pass
for proc in targets:
    try:
        proc.terminate()
    except psutil.Error:
        pass
_, alive = psutil.wait_procs(targets, timeout=5)
for proc in alive:
    try:
        proc.kill()
    except psutil.Error:
        pass
"""


class OrphanGuard:
    """Guard ``procs`` (``psutil.Process`` handles) against outliving this process."""

    def __init__(self, procs: Sequence[Any]) -> None:
        marks = [f"{p.pid}:{p.create_time()!r}" for p in procs]
        self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-c", _GUARD, *marks],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

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
