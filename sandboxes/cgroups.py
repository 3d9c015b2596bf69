"""Per-sandbox cgroups (v1 or v2) for memory, process and CPU limits, and a stale-group reaper."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from agentloop.sandboxes.base import SandboxLimits, pid_alive

__all__ = ["Cgroup", "CgroupRoot", "detect_cgroups", "reap_stale_cgroups"]

log = logging.getLogger(__name__)
_PREFIX = "agentloop-"
_NAME = re.compile(r"^agentloop-(\d+)-\d+$")
_CONTROLLERS = ("memory", "pids", "cpu")
_counter = itertools.count(1)


@dataclass(frozen=True, slots=True)
class CgroupRoot:
    """Where this process may create cgroups: a parent dir per controller (v1), or one (v2)."""

    version: int
    parents: tuple[tuple[str, Path], ...]  # (controller, parent dir); v2: ("unified", dir)

    def new(self, limits: SandboxLimits) -> Cgroup:
        """Create a cgroup for one sandbox with ``limits`` applied."""
        name = f"{_PREFIX}{os.getpid()}-{next(_counter)}"
        group = Cgroup(self.version, tuple((c, p / name) for c, p in self.parents))
        try:
            group.create(limits)
        except OSError:
            group.remove()
            raise
        return group


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fstype, super options) of every cgroup mount."""
    out = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, _src, opts = [*right.split(), "", "", ""][:3]
            if fstype in ("cgroup", "cgroup2"):
                out.append((left.split()[4], fstype, set(opts.split(","))))
    return out


def _own_paths() -> dict[str, str]:
    """Controller -> this process's cgroup path ("" for the v2 hierarchy)."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as f:
        for line in f:
            _id, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                out[c] = path
    return out


def _writable(parent: Path) -> bool:
    probe = parent / f"{_PREFIX}probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
        return True
    except OSError:
        return False


def detect_cgroups(parent: str | None = None) -> CgroupRoot | None:
    """Find writable cgroup controllers, nesting under this process's own cgroup.

    v1 needs writable ``memory`` and ``pids`` hierarchies (``cpu`` is used when present). v2 needs
    ``memory`` and ``pids`` enabled in the parent's ``cgroup.subtree_control`` — pass a delegated
    ``parent`` dir on systemd machines. Returns None when neither works (rlimits are used then).
    """
    own = _own_paths()
    mounts = _mounts()
    v1: list[tuple[str, Path]] = []
    for ctrl in _CONTROLLERS:
        for point, fstype, opts in mounts:
            if fstype == "cgroup" and ctrl in opts and ctrl in own:
                base = Path(point) / own[ctrl].lstrip("/")
                if _writable(base):
                    v1.append((ctrl, base))
                break
    if {c for c, _ in v1} >= {"memory", "pids"} and parent is None:
        return CgroupRoot(1, tuple(v1))
    for point, fstype, _opts in mounts:
        if fstype != "cgroup2":
            continue
        base = Path(parent) if parent else Path(point) / own.get("", "/").lstrip("/")
        try:
            enabled = set((base / "cgroup.subtree_control").read_text().split())
        except OSError:
            continue
        if {"memory", "pids"} <= enabled and _writable(base):
            return CgroupRoot(2, (("unified", base),))
    return None


def _write(path: Path, value: str) -> None:
    path.write_text(value)


class Cgroup:
    """One sandbox's cgroup(s): limits, attach, OOM-kill count, kill everything, remove."""

    def __init__(self, version: int, dirs: tuple[tuple[str, Path], ...]) -> None:
        self.version = version
        self.dirs = dirs

    def _dir(self, ctrl: str) -> Path | None:
        return next((d for c, d in self.dirs if c in (ctrl, "unified")), None)

    def create(self, limits: SandboxLimits) -> None:
        mem = limits.memory_mb << 20
        for _c, d in self.dirs:
            d.mkdir()
        if self.version == 1:
            memory, pids, cpu = self._dir("memory"), self._dir("pids"), self._dir("cpu")
            if memory is not None:
                _write(memory / "memory.limit_in_bytes", str(mem))
                with contextlib.suppress(OSError):  # no swap accounting: nothing to cap
                    _write(memory / "memory.memsw.limit_in_bytes", str(mem))
            if pids is not None:
                _write(pids / "pids.max", str(limits.max_processes))
            if cpu is not None:
                period = int((cpu / "cpu.cfs_period_us").read_text())
                _write(cpu / "cpu.cfs_quota_us", str(max(1000, int(limits.cpus * period))))
            return
        d = self.dirs[0][1]
        _write(d / "memory.max", str(mem))
        with contextlib.suppress(OSError):
            _write(d / "memory.swap.max", "0")
        _write(d / "pids.max", str(limits.max_processes))
        with contextlib.suppress(OSError):  # cpu may not be delegated
            _write(d / "cpu.max", f"{max(1000, int(limits.cpus * 100000))} 100000")

    def attach(self, pid: int) -> None:
        """Move ``pid`` (before it runs untrusted code) into every controller's group."""
        for _c, d in self.dirs:
            _write(d / "cgroup.procs", str(pid))

    def oom_kills(self) -> int:
        """How many processes the OOM killer took from this group so far."""
        d = self._dir("memory")
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            text = (d / name).read_text() if d else ""
        except OSError:
            return 0
        m = re.search(r"^oom_kill (\d+)$", text, re.M)
        return int(m.group(1)) if m else 0

    def debug_state(self) -> dict[str, str]:
        out = {}
        for _c, d in self.dirs:
            for name in ("cgroup.procs", "tasks", "pids.current", "pids.max", "pids.events"):
                with contextlib.suppress(OSError):
                    out[f"{d.name}/{name}"] = (d / name).read_text().strip()
        return out

    def pids(self) -> set[int]:
        out: set[int] = set()
        for _c, d in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                out.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        return out

    def kill_all(self, exclude: frozenset[int] | set[int] = frozenset()) -> None:
        """SIGKILL every process in the group but ``exclude`` (all are this sandbox's)."""
        for pid in self.pids() - exclude:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, wait_s: float = 2.0) -> bool:
        """Kill what is left and remove the group dirs; False if some dir could not go."""
        deadline = time.monotonic() + wait_s
        ok = True
        for _c, d in self.dirs:
            while d.exists():
                self.kill_all()
                try:
                    d.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        log.warning("could not remove cgroup %s (processes still exiting)", d)
                        ok = False
                        break
                    time.sleep(0.005)
        return ok


def reap_stale_cgroups(root: CgroupRoot) -> int:
    """Remove groups left by agentloop processes that died (a crashed trainer); returns how many."""
    removed = 0
    for ctrl, parent in root.parents:
        with contextlib.suppress(OSError):
            for child in parent.iterdir():
                m = _NAME.match(child.name)
                if m and child.is_dir() and not pid_alive(int(m.group(1))):
                    removed += Cgroup(root.version, ((ctrl, child),)).remove()
    return removed
