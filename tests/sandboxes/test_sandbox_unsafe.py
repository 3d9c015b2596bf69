"""The explicit, unisolated subprocess backend: opt-in, same semantics, process-group clean-up."""

from __future__ import annotations

import pytest
from sbx_helpers import wait_gone

from agentloop.sandboxes import SandboxLimits, make_sandbox

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.mark.parametrize("pool_size", [0, 1], ids=["cold", "pooled"])
async def test_unsafe_backend_runs_code_with_rlimits(pool_size: int) -> None:
    limits = SandboxLimits(timeout_s=10, memory_mb=256)
    with pytest.warns(RuntimeWarning, match="unisolated"):
        sb = make_sandbox(
            "subprocess_unsafe", acknowledge_unsafe=True, limits=limits, pool_size=pool_size
        )
    async with sb:
        assert (await sb.run("print(input())", stdin="x")).stdout == "x\n"
        assert (await sb.run("echo hi", language="bash")).stdout == "hi\n"
        oom = await sb.run("data = 'x' * (1 << 30)")
        assert oom.oom_killed and "MemoryError" in oom.stderr
        slow = await sb.run("while True:\n    pass", timeout_s=1)
        assert slow.timed_out
        async with sb.session() as s:
            await s.run("y = 2")
            assert (await s.run("print(y * 21)")).stdout == "42\n"
            spawn = (
                "import subprocess, sys\n"
                "subprocess.Popen([sys.executable, '-c', "
                "\"open('/proc/self/comm','w').write('alunsafe1'); import time; time.sleep(60)\"])"
            )
            await s.run(spawn + "\nimport time; time.sleep(0.3)")
            assert wait_gone("alunsafe1") == []  # the process group is cleaned after each run
