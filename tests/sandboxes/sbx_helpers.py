"""Helpers shared by the sandbox tests: limits of the suite, host guards, process lookups."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agentloop.sandboxes import SandboxLimits

PROJECT_DIR = Path(__file__).resolve().parents[2]
#: Tight limits so the bombs in the security suite finish fast.
SUITE_LIMITS = SandboxLimits(
    timeout_s=20, memory_mb=256, max_processes=32, max_output_bytes=64 << 10, disk_mb=64
)


def procs_named(comm: str) -> list[int]:
    """Host pids whose process name is ``comm`` (sandboxed code renames its children to it)."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                name = Path(f"/proc/{pid}/comm").read_text().strip()
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if name == comm and state != "Z":
                out.append(int(pid))
    return out


def wait_gone(comm: str, timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := procs_named(comm)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@dataclass
class Host:
    """What sandboxed code must not touch; ``check()`` asserts the host is unchanged."""

    token: str
    secret_path: Path
    secret: str
    escape_paths: list[Path]
    comm: str
    sleeper: subprocess.Popen[bytes]
    listener: socket.socket
    extra_paths: list[Path] = field(default_factory=list)

    def check(self) -> None:
        assert self.secret_path.read_text() == self.secret, "host secret was modified"
        for p in self.escape_paths + self.extra_paths:
            assert not p.exists(), f"sandboxed code created {p} on the host"
        assert self.sleeper.poll() is None, "a host process was killed from the sandbox"
        assert wait_gone(self.comm) == [], "sandboxed processes outlived their run"
        self.listener.settimeout(0)
        with pytest.raises(BlockingIOError):
            self.listener.accept()


_CREATOR = re.compile(r"/agentloop-(\d+)-\d+$", re.M)


def sandbox_creator(pid: int) -> int | None:
    """The pid of the process that made sandbox process ``pid``: the local backend names each
    sandbox's cgroup ``agentloop-<creator pid>-<n>``; None without such a cgroup."""
    try:
        found = _CREATOR.search(Path(f"/proc/{pid}/cgroup").read_text())
    except OSError:
        return None
    return int(found.group(1)) if found else None


def orphaned_sandboxes(creators: Collection[int] | None = None) -> list[int]:
    """Host pids of local sandbox processes that lost their parent (a leak): they run under the
    fresh uids (>= 1e6) the local backend starts sandboxes with, re-parented to init. With
    ``creators``, only those whose cgroup names one of these pids as its maker (or none): a
    parallel test lane's own sandboxes are not this lane's leak."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        uid = int(fields.get("Uid", "0").split()[0])
        if (
            uid >= 1_000_000
            and fields.get("PPid", "").strip() == "1"
            and "Z" not in fields["State"]
        ):
            creator = sandbox_creator(int(pid))
            if creators is None or creator is None or creator in creators:
                out.append(int(pid))
    return out


def bwrap_missing() -> str | None:
    return (
        None
        if shutil.which("bwrap")
        else "bubblewrap is not installed (apt-get install bubblewrap)"
    )


needs_bwrap = pytest.mark.skipif(bwrap_missing() is not None, reason=str(bwrap_missing()))
