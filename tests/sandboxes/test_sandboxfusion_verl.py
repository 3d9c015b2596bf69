"""verl's own SandboxFusion reward client against a real `agentloop serve-sandbox` (issue 41),
and the server's memory after many 1 MB SandboxFusion outputs (issue 39)."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import pytest
from sbx_helpers import needs_bwrap

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240), needs_bwrap]


def verl_sandbox_fusion() -> ModuleType:
    """verl's ``verl.utils.reward_score.sandbox_fusion`` as installed (the package's own files):
    loaded on its own, because ``import verl`` pulls in torch/ray/tensordict; its only import
    beyond the standard library is ``requests``."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl is not installed (make setup installs it, without its dependencies)")
    folder = Path(next(iter(spec.submodule_search_locations))) / "utils/reward_score/sandbox_fusion"
    name = "_verl_sandbox_fusion"
    module_spec = importlib.util.spec_from_file_location(
        name, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    module_spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def serve_sandbox() -> Iterator[tuple[str, int]]:
    """``agentloop serve-sandbox`` with its default limits (1,024 MB, 30 s) on a free port:
    its URL and its pid."""
    argv = [str(Path(sys.executable).parent / "agentloop"), "serve-sandbox", "--port", "0"]
    proc = subprocess.Popen(
        [*argv, "--pool-size", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    found: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if not found and (m := re.search(r"on (http://127\.0\.0\.1:\d+)", line)):
                found.append(m.group(1))

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 60
    while not found and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert found, f"serve-sandbox did not start (exit {proc.poll()})"
    try:
        yield found[0], proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


CASES = {  # program -> verl's (score, status of its one test case)
    "right": ("```python\nn = int(input())\nprint(n * 2)\n```", 1.0, "success"),
    "wrong": ("```python\nn = int(input())\nprint(n + 1)\n```", 0.0, "wrong_answer"),
    "crash": ("```python\nraise ValueError('boom')\n```", 0.0, "runtime_error"),
    "slow": ("```python\nimport time\ntime.sleep(60)\n```", 0.0, "timeout"),
}
# 400 MB filled: over a 256 MB limit, under 1,024 MB
GRAB = "```python\nx = bytearray(400 << 20)\nx[::4096] = b'1' * len(x[::4096])\nprint(42)\n```"


@pytest.mark.parametrize("memory_limit_mb", [256, 1024, 4096])
def test_verls_client_scores_right_wrong_crash_slow(
    serve_sandbox: tuple[str, int], memory_limit_mb: int
) -> None:
    """Below the server's 1,024 MB the limit tightens the run (it was a 400: every reward 0),
    at it nothing changes, above it is clamped to the server's."""
    sf = verl_sandbox_fusion()
    url = serve_sandbox[0] + "/run_code"
    tests = {"inputs": ["21\n"], "outputs": ["42\n"]}
    semaphore = threading.Semaphore(4)
    for name, (program, score, status) in CASES.items():
        timeout = 2 if name == "slow" else 20
        got, meta = sf.compute_score(
            url, semaphore, memory_limit_mb, program, tests, timeout=timeout
        )
        assert (got, meta[0]["status"]) == (score, status), (name, meta)
    got, meta = sf.compute_score(
        url, semaphore, memory_limit_mb, GRAB, {"inputs": [""], "outputs": ["42"]}
    )
    assert got == (0.0 if memory_limit_mb < 1024 else 1.0), meta
    assert meta[0]["status"] == ("runtime_error" if memory_limit_mb < 1024 else "success"), meta


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def test_memory_after_1mb_outputs_is_bounded(serve_sandbox: tuple[str, int]) -> None:
    """Issue 39: the server's RSS after 1 MB SandboxFusion outputs stops growing: two more
    rounds of 16 requests (8 at once) after a first (numbers in docs/guides/sandboxes.md)."""
    url, pid = serve_sandbox
    body: dict[str, Any] = {"code": "print('x' * 1000000)", "language": "python"}

    async def one(http: aiohttp.ClientSession) -> None:
        async with http.post(url + "/run_code", json=body) as r:
            assert r.status == 200 and (await r.json())["status"] == "Success"

    async def round_(http: aiohttp.ClientSession) -> float:
        for _ in range(2):
            await asyncio.gather(*(one(http) for _ in range(8)))
        return _rss_mb(pid)

    async with aiohttp.ClientSession() as http:
        first = await round_(http)
        later = [await round_(http) for _ in range(2)]
    print(f"serve-sandbox RSS MB after rounds of 16 1 MB outputs: {first:.1f}, {later}")
    assert max(later) < first + 8, (first, later)
