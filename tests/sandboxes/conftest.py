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
from sbx_helpers import PROJECT_DIR, SUITE_LIMITS, Host, bwrap_missing, orphaned_sandboxes

from agentloop.errors import SandboxError
from agentloop.sandboxes import SandboxLimits, make_sandbox
from agentloop.sandboxes.podman import PodmanService, ensure_python_image, podman_missing

#: "local-rlimits" is the local backend without cgroups (its limits fall back to rlimits).
BACKENDS = ["local", "local-rlimits", "docker", "remote"]


_MAKERS: set[int] = set()  # this lane's process and every process it started during a test


def _note_makers() -> None:
    import psutil

    me = psutil.Process()
    _MAKERS.update([me.pid, *(p.pid for p in me.children(recursive=True))])


@pytest.fixture(scope="session", autouse=True)
def no_leaked_sandboxes() -> Iterator[None]:
    """After the whole sandbox suite: no sandbox process that this lane (or a server or CLI it
    started) made may be left orphaned. Another lane's run, killed by its own test, is not
    ours to judge: sandboxes are attributed by the maker pid in their cgroup's name."""
    yield
    deadline = time.monotonic() + 15
    while (left := orphaned_sandboxes(_MAKERS)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], f"orphaned sandbox processes: {left}"


@pytest.fixture(autouse=True)
def _record_makers() -> Iterator[None]:
    _note_makers()
    yield
    _note_makers()


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
