"""The docker backend against a real engine (podman's Docker API): runs, limits, labels, reaper."""

from __future__ import annotations

import os
from typing import Any

import pytest
from sbx_helpers import SUITE_LIMITS

from agentloop.errors import SandboxError
from agentloop.sandboxes import make_sandbox
from agentloop.sandboxes.docker import LABEL, reap_containers, sandbox_containers

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
