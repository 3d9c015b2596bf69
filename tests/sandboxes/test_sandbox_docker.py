"""The docker backend against a real engine (podman's Docker API): runs, limits, labels, reaper."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from sbx_helpers import SUITE_LIMITS

from agentloop.errors import SandboxError
from agentloop.sandboxes import make_sandbox
from agentloop.sandboxes.docker import LABEL, reap_containers, sandbox_containers
from agentloop.sandboxes.seccomp import docker_profile

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]


def ours(client: Any) -> list[tuple[str, dict[str, str]]]:
    owner = f"{os.uname().nodename}:{os.getpid()}"
    return [c for c in sandbox_containers(client) if c[1].get("agentloop.owner") == owner]


async def test_docker_runs_sessions_and_cleans_up(podman: Any) -> None:
    client = podman.client()
    async with make_sandbox("docker", client=client, limits=SUITE_LIMITS, pool_size=1) as sb:
        res = await sb.run("import os, sys; print(os.getuid(), input())", stdin="in")
        assert res.stdout == "65534 in\n", res
        files = await sb.run("print(open('a/b.txt').read())", files={"a/b.txt": "hello"})
        assert files.stdout == "hello\n", files
        bash = await sb.run("echo $((2 + 3)); exit 3", language="bash")
        assert (bash.stdout, bash.exit_code) == ("5\n", 3)
        async with sb.session() as s:
            await s.run("import os\nos.environ['K'] = 'v'")
            assert (await s.run("print(os.environ['K'])")).stdout == "v\n"
            assert len(ours(client)) >= 1
            labels = ours(client)[0][1]
            assert labels[LABEL] == "1"
    assert ours(client) == []  # every container of this process is gone


async def test_reaper_removes_containers_of_dead_owners(podman: Any) -> None:
    client = podman.client()
    dead_owner = f"{os.uname().nodename}:{2**22 + 777}"
    c = client.containers.create(
        "agentloop-sandbox-python:latest",
        ["python3", "-c", "pass"],
        labels={LABEL: "1", "agentloop.owner": dead_owner},
    )
    assert reap_containers(client) >= 1
    assert c.id not in {cid for cid, _ in sandbox_containers(client)}


async def test_missing_image_and_engine_fail_clearly(podman: Any) -> None:
    with pytest.raises(SandboxError, match=r"agentloop\.sandboxes\.podman --build-image"):
        async with make_sandbox("docker", client=podman.client(), image="nope/none:1"):
            pass
    with pytest.raises(SandboxError, match="cannot reach a Docker engine"):
        async with make_sandbox("docker", base_url="unix:///nonexistent/docker.sock"):
            pass


async def test_the_podman_seccomp_profile_is_a_private_file_of_the_sandbox(podman: Any) -> None:
    """Issue 21: the profile podman reads is a new 0600 file of this sandbox (removed at
    close), never a fixed path in /tmp that another local user could plant first."""
    tmp = Path(tempfile.gettempdir())
    fixed = tmp / "agentloop-seccomp.json"
    planted = '{"defaultAction": "SCMP_ACT_ALLOW"}'  # what another user could leave there
    try:
        fixed.write_text(planted)
    except OSError as exc:
        pytest.skip(f"cannot plant {fixed} here: {exc}")
    before = set(tmp.glob("agentloop-seccomp-*.json"))
    try:
        async with make_sandbox("docker", client=podman.client(), limits=SUITE_LIMITS) as sb:
            unshare = "import ctypes; print(ctypes.CDLL(None).unshare(0x10000000))"  # NEWUSER
            res = await sb.run(unshare)
            assert res.stdout == "-1\n", res  # refused: a profile is in force
            (path,) = set(tmp.glob("agentloop-seccomp-*.json")) - before
            info = path.stat()
            assert (info.st_mode & 0o777, info.st_uid) == (0o600, os.getuid())
            assert json.loads(path.read_text()) == json.loads(docker_profile())
        assert fixed.read_text() == planted  # neither written nor read
        assert set(tmp.glob("agentloop-seccomp-*.json")) == before  # removed at close
    finally:
        fixed.unlink()
