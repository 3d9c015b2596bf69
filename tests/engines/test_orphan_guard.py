"""OrphanGuard: an engine's child processes die with their owner, even after kill -9."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from typing import Any

import psutil
import pytest
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


STARTING_OWNER = """
import subprocess, sys, time
import psutil
from agentloop.engines.orphan_guard import OrphanGuard
guard = OrphanGuard()  # before the engine starts: it guards every new child
time.sleep(0.5)
engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(guard.pid, engine.pid, flush=True)
if sys.argv[1] == "started":  # the engine is up: only its processes are guarded from now on
    guard.watch([psutil.Process(engine.pid)])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(other.pid, flush=True)
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


@pytest.mark.parametrize("killed", ["starting", "started"])
async def test_a_kill_during_start_up_leaves_nothing_behind(killed: str) -> None:
    owner = subprocess.Popen([sys.executable, "-c", STARTING_OWNER, killed],
                             stdout=subprocess.PIPE)  # fmt: skip
    others: list[int] = []
    try:
        assert owner.stdout is not None
        guard, engine = (int(x) for x in owner.stdout.readline().split())
        if killed == "started":
            others.append(int(owner.stdout.readline()))
        await asyncio.sleep(1.0)  # the guard has seen the engine (it looks five times a second)
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        await eventually(lambda: gone(engine), timeout=30)
        await eventually(lambda: gone(guard), timeout=30)
        assert not any(gone(pid) for pid in others)  # not the engine's: left alone
    finally:
        owner.kill()
        owner.wait()
        for pid in others:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
