"""OrphanGuard: an engine's child processes die with their owner, even after kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import psutil
from waits import eventually

from agentloop.engines.orphan_guard import OrphanGuard

OWNER = """
import subprocess, sys, time
import psutil
from agentloop.engines.orphan_guard import OrphanGuard
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
guard = OrphanGuard([psutil.Process(child.pid)])
print(child.pid, guard.pid, flush=True)
time.sleep(600)
"""


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_children_die_after_their_owner_is_killed() -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE,
                             env={**os.environ})  # fmt: skip
    try:
        assert owner.stdout is not None
        child, guard = (int(x) for x in owner.stdout.readline().split())
        assert not gone(child)
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        await eventually(lambda: gone(child), timeout=30)
        await eventually(lambda: gone(guard), timeout=30)
    finally:
        owner.kill()
        owner.wait()


async def test_a_closed_guard_leaves_the_processes_alone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        guard = OrphanGuard([psutil.Process(child.pid)])
        guard_pid: Any = guard.pid
        guard.close()
        assert gone(guard_pid) and child.poll() is None
    finally:
        child.kill()
        child.wait()
