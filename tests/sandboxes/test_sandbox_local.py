"""The local bubblewrap backend: semantics of runs and sessions, limits, errors, clean-up."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from sbx_helpers import SUITE_LIMITS, needs_bwrap

from agentloop.errors import ConfigError, SandboxError
from agentloop.sandboxes import ExecResult, SandboxLimits, make_sandbox
from agentloop.sandboxes.cgroups import detect_cgroups
from agentloop.sandboxes.local import LocalSandbox

pytestmark = [pytest.mark.integration, needs_bwrap, pytest.mark.timeout(120)]


@pytest.mark.parametrize(
    ("pool_size", "slots"), [(0, 32), (0, 1), (1, 32)], ids=["cold", "cold-one-slot", "pooled"]
)
async def test_runs_behave_like_python_c(pool_size: int, slots: int) -> None:
    sb = make_sandbox("local", pool_size=pool_size, limits=SUITE_LIMITS, launcher_slots=slots)
    async with sb:
        await asyncio.sleep(0.2 * pool_size)
        ok = await sb.run("import sys; print('hi'); print('err', file=sys.stderr)")
        assert (ok.stdout, ok.stderr, ok.exit_code) == ("hi\n", "err\n", 0)
        assert ok.duration_s > 0 and not ok.truncated
        assert (await sb.run("raise SystemExit(3)")).exit_code == 3
        boom = await sb.run("def f():\n    1 / 0\nf()")
        assert boom.exit_code == 1
        assert boom.stderr.count('File "<string>"') == 2, boom.stderr  # user frames only
        assert "ZeroDivisionError" in boom.stderr
        syntax = await sb.run("def (")
        assert syntax.exit_code == 1 and "SyntaxError" in syntax.stderr
        io = await sb.run(
            "import os; print(input(), open('d/e/f.txt').read(), os.getcwd())",
            stdin="line",
            files={"d/e/f.txt": b"data"},
        )
        assert io.stdout == "line data /sandbox\n", io
        bash = await sb.run("echo $((6 * 7)); exit 4", language="bash")
        assert (bash.stdout, bash.exit_code) == ("42\n", 4)


async def test_cold_runs_reuse_launcher_slots_and_reap_everything() -> None:
    sb = make_sandbox("local", pool_size=0, limits=SUITE_LIMITS, launcher_slots=4)
    async with sb:
        for _ in range(3):
            oom = await sb.run("data = 'x' * (1 << 30)")
            assert oom.oom_killed and oom.exit_code == 137, oom
            assert (await sb.run("print('ok')")).stdout == "ok\n"
        results = await asyncio.gather(*(sb.run(f"print({i})") for i in range(12)))
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(12)]
        assert sb._slots is not None and len(sb._slots._all) <= 4  # reused, capped
        await asyncio.sleep(0.2)
        for slot in sb._slots._all:  # bwrap's init is reaped too: no zombie holds a pid
            assert slot.cgroup is None or slot.cgroup.pids() == {slot.pid}
            children = Path(f"/proc/{slot.pid}/task/{slot.pid}/children").read_text()
            assert children.strip() == ""


async def test_unsupported_language_and_unstarted_sandbox() -> None:
    sb = LocalSandbox(pool_size=0)
    with pytest.raises(SandboxError, match="not started"):
        await sb.run("print(1)")
    async with sb:
        with pytest.raises(ConfigError, match="'ruby' is not supported"):
            await sb.run("puts 1", language="ruby")
        async with sb.session() as s:
            with pytest.raises(ConfigError, match="sessions run Python only"):
                await s.run("echo", language="bash")


async def test_session_state_persists_and_is_private(local_sb: LocalSandbox) -> None:
    async with local_sb.session() as a, local_sb.session() as b:
        await a.run(
            "import math\nx = 41\nopen('note.txt', 'w').write('a')\nimport os; os.chdir('/tmp')"
        )
        await b.run("x = 'b'")
        res = await a.run(
            "print(x + 1, math.pi > 3, open('/sandbox/note.txt').read(), os.getcwd())"
        )
        assert res.stdout == "42 True a /tmp\n", res
        other = await b.run("import os; print(x, os.path.exists('/sandbox/note.txt'))")
        assert other.stdout == "b False\n", other
    fresh = await local_sb.run("print(globals().get('x'))")
    assert fresh.stdout == "None\n"
    with pytest.raises(SandboxError, match="closed"):
        await a.run("print(1)")


@pytest.mark.parametrize(
    ("code", "flag", "reason"),
    [
        ("while True:\n    pass", "timed_out", "timed out"),
        ("import os\nos._exit(7)", None, "restarted"),
        ("data = 'x' * (1 << 30)", "oom_killed", "out of memory"),
    ],
    ids=["timeout", "exit", "oom"],
)
async def test_a_lost_interpreter_is_reported_and_replaced(
    local_sb: LocalSandbox, code: str, flag: str | None, reason: str
) -> None:
    async with local_sb.session() as s:
        await s.run("x = 1")
        res = await s.run(code, timeout_s=1.5)
        assert reason in res.stderr, res
        assert flag is None or getattr(res, flag), res
        if flag is None:
            assert res.exit_code == 7
        after = await s.run("print(globals().get('x'))")
        assert after.stdout == "None\n" and after.ok  # state reset, session usable


@pytest.mark.parametrize("pool_size", [0, 1], ids=["cold", "session"])
async def test_cpu_time_and_file_size_limits(pool_size: int) -> None:
    limits = SandboxLimits(timeout_s=20, cpu_time_s=1, max_file_mb=1)
    async with make_sandbox("local", limits=limits, pool_size=pool_size) as sb:
        if pool_size:
            async with sb.session() as s:
                await _check_cpu_and_file_limits(s)
        else:
            await _check_cpu_and_file_limits(sb)


async def _check_cpu_and_file_limits(target: Any) -> None:
    spin = await target.run("while True:\n    pass")
    assert spin.timed_out and spin.duration_s < 10, spin
    big = await target.run("open('f', 'wb').write(b'x' * (2 << 20))")
    assert big.exit_code == 1 and "File too large" in big.stderr, big


async def test_cold_runs_in_both_languages_start_under_their_limits() -> None:
    """The launcher sets the limits before exec: they hold from the first instruction of the
    program, in Python and in bash alike, and the OOM killer picks the program first."""
    limits = SandboxLimits(timeout_s=20, cpu_time_s=3, max_file_mb=1)
    async with make_sandbox("local", limits=limits, pool_size=0) as sb:
        py = await sb.run(
            "import resource as r\n"
            "print(*(r.getrlimit(k) for k in (r.RLIMIT_FSIZE, r.RLIMIT_CORE, r.RLIMIT_CPU)))\n"
            "print(open('/proc/self/oom_score_adj').read().strip())"
        )
        assert py.stdout.split("\n")[:2] == [f"{(1 << 20,) * 2} (0, 0) (4, 5)", "1000"], py
        script = "ulimit -f; ulimit -c; ulimit -t; cat /proc/self/oom_score_adj"
        sh = await sb.run(script, language="bash")
        assert sh.stdout.split() == ["1024", "0", "4", "1000"], sh


async def test_rlimit_fallback_without_cgroups() -> None:
    limits = SandboxLimits(memory_mb=128, max_processes=16)
    async with make_sandbox("local", limits=limits, pool_size=0, use_cgroups=False) as sb:
        assert sb.cgroup_version is None
        oom = await sb.run("data = 'x' * (1 << 30)")
        assert oom.oom_killed and "MemoryError" in oom.stderr, oom
        async with sb.session() as s:
            await s.run("x = 1")
            in_session = await s.run("data = 'x' * (1 << 30)")
            assert in_session.oom_killed, in_session
            assert (await s.run("print(x)")).stdout == "1\n"  # a MemoryError keeps the state
            slow = await s.run("while True:\n    pass", timeout_s=1)
            assert slow.timed_out
        if os.geteuid() == 0:  # per-uid process limit: exact with the sandbox's own uid
            bomb = await sb.run(
                "import os, time\nn = 0\ntry:\n    while True:\n"
                "        if os.fork() == 0:\n            time.sleep(30)\n        n += 1\n"
                "except OSError:\n    print('blocked', n)"
            )
            assert "blocked" in bomb.stdout, bomb


async def test_a_failing_bwrap_is_retried_then_a_sandbox_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = []

    async def broken(*args: Any) -> ExecResult:
        calls.append(args)
        return ExecResult("", "bwrap: Can't fork for pid 1: Resource temporarily unavailable\n", 1)

    async with make_sandbox("local", pool_size=0) as sb:
        monkeypatch.setattr(sb, "_cold_exec", broken)
        with pytest.raises(SandboxError, match="bubblewrap could not start the sandbox"):
            await sb.run("print(1)")
    assert len(calls) == 2
    with pytest.raises(ConfigError, match="does not exist"):
        async with LocalSandbox(ro_binds=["/no/such/venv"]):
            pass


async def test_missing_bwrap_and_invisible_python_fail_clearly() -> None:
    with pytest.raises(SandboxError, match="apt-get install bubblewrap"):
        async with LocalSandbox(bwrap="/nonexistent/bwrap"):
            pass
    with pytest.raises(ConfigError, match="not an interpreter visible inside the sandbox"):
        async with LocalSandbox(python="/root/.no-such/python3"):
            pass
    with pytest.raises(ConfigError, match="absolute paths"):
        LocalSandbox(ro_binds=["relative/dir"])


async def test_concurrent_runs_and_sessions(local_sb: LocalSandbox) -> None:
    results = await asyncio.gather(*(local_sb.run(f"print({i} * 2)") for i in range(12)))
    assert [r.stdout for r in results] == [f"{i * 2}\n" for i in range(12)]

    async def in_session(i: int) -> str:
        async with local_sb.session() as s:
            await s.run(f"v = {i}")
            return (await s.run("print(v)")).stdout

    assert await asyncio.gather(*(in_session(i) for i in range(6))) == [f"{i}\n" for i in range(6)]


async def test_stale_cgroups_of_dead_processes_are_reaped() -> None:
    root = detect_cgroups()
    if root is None:
        pytest.skip("no writable cgroups here")
    dead = 2**22 + 12345  # above pid_max: never alive
    stale = [parent / f"agentloop-{dead}-1" for _, parent in root.parents]
    for d in stale:
        d.mkdir()
    async with make_sandbox("local", pool_size=0) as sb:
        assert sb.cgroup_version == root.version
        assert not any(Path(d).exists() for d in stale)


_FAIL_WHILE_LAUNCHERS_START = """
import asyncio
from agentloop.sandboxes.base import SandboxLimits
from agentloop.sandboxes.slots import SlotPool

async def main():
    # the launchers start in the loop's last round, then every task is cancelled
    SlotPool(None, SandboxLimits(), "/usr/bin/python3").prewarm(4)
    raise RuntimeError("the run failed")

asyncio.run(main())
"""


def test_a_run_failing_while_launchers_start_shuts_down() -> None:
    """``asyncio.run`` cancels every task at once when its coroutine fails: launchers still
    starting then (a sandbox's pre-warm, right after a failed start-up check) must not hang it.
    asyncio's subprocess transport did: the task that finishes its start was cancelled too, and
    the exit of the killed launcher never reached the waiting task (the CI hang of 2026-11-27)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _FAIL_WHILE_LAUNCHERS_START],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "RuntimeError: the run failed" in done.stderr, done.stderr


async def test_closing_the_slot_pool_finishes_a_drop_it_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slot being dropped (its launcher stopped, its cgroup removed with any sandbox still in
    it) stays the pool's until the drop is done: closing the pool mid-drop finishes it rather than
    leave the cgroup, and a sandbox that escaped the last kill, behind (seen under load)."""
    import signal

    from agentloop.sandboxes import slots as slots_module

    real_drop = slots_module.drop_launcher
    started = asyncio.Event()
    dropped: list[int] = []

    async def slow_drop(slot: Any) -> None:
        if not started.is_set():  # the first drop stalls: a cgroup whose processes die slowly
            started.set()
            await asyncio.Event().wait()
        await real_drop(slot)
        dropped.append(slot.pid)

    monkeypatch.setattr(slots_module, "drop_launcher", slow_drop)
    pool = slots_module.SlotPool(detect_cgroups(), SUITE_LIMITS, "/usr/bin/python3", max_slots=2)
    slot = await pool.take()
    os.kill(slot.pid, signal.SIGKILL)  # the launcher is lost: its release drops it
    await asyncio.to_thread(slot.proc.wait)
    pool.release(slot)
    await started.wait()
    await pool.close()
    assert dropped == [slot.pid]
    assert slot.cgroup is None or not slot.cgroup.dirs[0][1].exists()


async def test_closing_a_launcher_without_a_cgroup_kills_what_it_started() -> None:
    """Without a cgroup (the rlimits mode) the launcher's close is what kills a sandbox that
    lost its way: here a started program's child that no parent death signal reaches, as a bwrap
    init is when its outer bwrap is killed before ``--die-with-parent`` takes hold. It used to
    go on to pid 1 and outlive the suite (seen in CI with each lane pinned to one core)."""
    import psutil

    from agentloop.sandboxes.launcher import Launcher

    code = "import os, time\nif os.fork() == 0:\n    time.sleep(600)\ntime.sleep(600)"
    launcher = await Launcher.start("/usr/bin/python3", None)
    proc = await launcher.launch(["/usr/bin/python3", "-c", code], {}, None, {}, False)
    started = psutil.Process(proc.pid)
    deadline = asyncio.get_running_loop().time() + 30
    while not started.children() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)  # the fork
    grandchild = started.children()[0]
    await launcher.close()
    for p in (started, grandchild):
        assert not p.is_running() or p.status() == psutil.STATUS_ZOMBIE, p
