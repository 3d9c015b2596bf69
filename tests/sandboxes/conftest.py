"""Sandbox fixtures: the real backends (bubblewrap, podman, a loopback server) and a host guard."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sbx_helpers import (
    PROJECT_DIR,
    SUITE_LIMITS,
    Host,
    bwrap_missing,
    orphaned_sandboxes,
    sandbox_creator,
)

from agentloop.errors import SandboxError
from agentloop.sandboxes import SandboxLimits, make_sandbox
from agentloop.sandboxes.podman import PodmanService, ensure_python_image, podman_missing

#: "local-rlimits" is the local backend without cgroups (its limits fall back to rlimits).
BACKENDS = ["local", "local-rlimits", "docker", "remote"]


def _makers() -> set[int]:
    """This lane's process and every process it has now (a server, a CLI, a sandbox)."""
    import psutil

    me = psutil.Process()
    return {me.pid, *(p.pid for p in me.children(recursive=True))}


def _describe(pids: list[int]) -> str:
    def one(pid: int) -> str:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120]
        except OSError:
            cmd = b"(gone)"
        return f"{pid} (made by {sandbox_creator(pid)}): {cmd.decode(errors='replace')}"

    return "; ".join(map(one, pids))


@pytest.fixture(autouse=True)
def no_leaked_sandboxes() -> Iterator[None]:
    """After each sandbox test: no sandbox process that the test (or a server or CLI it started)
    made may be left orphaned. Sandboxes are attributed by the maker pid in their cgroup's name
    to the processes this lane had at the test's start and end: another lane's run (killed by
    its own test) is not this test's leak, nor is a pid that the 2^15 pid space handed out again
    over a long session."""
    makers = _makers()
    yield
    makers |= _makers()
    deadline = time.monotonic() + 15
    while (left := orphaned_sandboxes(makers)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], f"orphaned sandbox processes: {_describe(left)}"


@pytest.fixture(scope="session")
def podman() -> Iterator[PodmanService]:
    """A podman Docker-API service on a private socket, with the default image built (cached)."""
    reason = podman_missing()
    if reason:
        pytest.skip(f"no container engine can be started here: {reason}")
    with tempfile.TemporaryDirectory(prefix="agentloop-podman-") as d:
        svc = PodmanService(d)
        try:
            svc.start()
        except SandboxError as exc:
            pytest.skip(f"no container engine can be started here: {exc}")
        try:
            ensure_python_image(svc.client())
            yield svc
        finally:
            svc.stop()


@pytest.fixture
async def local_sb() -> AsyncIterator[Any]:
    if bwrap_missing():
        pytest.skip(str(bwrap_missing()))
    async with make_sandbox("local", limits=SUITE_LIMITS, pool_size=1) as sb:
        yield sb


async def _open(
    backend: str,
    request: pytest.FixtureRequest,
    limits: SandboxLimits = SUITE_LIMITS,
    pool_size: int = 1,
) -> AsyncIterator[Any]:
    if backend != "docker" and bwrap_missing():
        pytest.skip(str(bwrap_missing()))
    if backend.startswith("local"):
        cgroups = backend == "local"
        async with make_sandbox(
            "local", limits=limits, pool_size=pool_size, use_cgroups=cgroups
        ) as sb:
            yield sb
    elif backend == "docker":
        svc = request.getfixturevalue("podman")
        async with make_sandbox(
            "docker", client=svc.client(), limits=limits, pool_size=pool_size
        ) as sb:
            yield sb
    else:
        from agentloop.sandboxes.server import SandboxServer

        async with make_sandbox("local", limits=limits, pool_size=pool_size) as backend_sb:
            server = SandboxServer(backend_sb, max_concurrency=4, token="t0ken")
            port = await server.start("127.0.0.1", 0)
            try:
                url = f"http://127.0.0.1:{port}"
                async with make_sandbox("remote", urls=url, token="t0ken", limits=limits) as sb:
                    yield sb
            finally:
                await server.stop(drain_timeout_s=5)


@pytest.fixture(params=BACKENDS)
async def sandbox(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """Each real backend in turn: local (bwrap), local without cgroups (rlimits), docker
    (podman), remote (server on loopback)."""
    async for sb in _open(request.param, request):
        yield sb


@pytest.fixture(params=BACKENDS)
async def cpu_capped(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """Each real backend with a CPU-time limit of 1 s per run (wall clock: the suite's 20 s)."""
    async for sb in _open(request.param, request, replace(SUITE_LIMITS, cpu_time_s=1)):
        yield sb


@pytest.fixture(params=BACKENDS)
async def disk_capped(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """Each real backend with ``disk_mb=16``: not the suite's 64, a size engines also default to
    (podman's ``/dev/shm``), so a bound that holds is this limit's and no default's."""
    async for sb in _open(request.param, request, replace(SUITE_LIMITS, disk_mb=16)):
        yield sb


@pytest.fixture(params=BACKENDS)
async def cold(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """Each real backend with no warm kernel (``pool_size=0``): every run starts cold."""
    limits = replace(SUITE_LIMITS, timeout_s=60)
    async for sb in _open(request.param, request, limits, pool_size=0):
        yield sb


@pytest.fixture
def host() -> Iterator[Host]:
    token = secrets.token_hex(4)
    secret_dir = Path(tempfile.mkdtemp(prefix="agentloop-secret-"))
    secret_path = secret_dir / "secret.txt"
    secret = f"top-secret-{token}"
    secret_path.write_text(secret)
    os.chmod(secret_path, 0o600)
    os.chmod(secret_dir, 0o755)  # the dir is visible; only the file is root-only
    name = f"escape-{token}"
    escape = [Path("/") / name, Path("/root") / name, Path("/etc") / name]
    escape += [PROJECT_DIR / name, Path(tempfile.gettempdir()) / name]
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    h = Host(token, secret_path, secret, escape, f"albomb{token}", sleeper, listener)
    try:
        yield h
        h.check()
    finally:
        sleeper.kill()
        sleeper.wait()
        listener.close()
        shutil.rmtree(secret_dir, ignore_errors=True)
        for p in h.escape_paths + h.extra_paths:
            if p.is_file():
                p.unlink()
