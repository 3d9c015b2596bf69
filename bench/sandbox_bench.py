"""Sandbox latency and throughput, side by side with bare `python3 -c` (the physical floor).

    .venv/bin/python bench/sandbox_bench.py                 # local + remote (+ docker if podman)
    .venv/bin/python bench/sandbox_bench.py --backends local --n 100

For each backend and mode: median and p99 latency of ``print(1)`` run sequentially, and runs/s
with 1, 8 and 32 concurrent callers. Modes: ``cold`` = a fresh sandbox + interpreter per run (no
pool), ``pooled run`` = ``sandbox.run`` with pre-warmed interpreters (one per run, discarded),
``session`` = consecutive runs in an open session (one session per concurrent caller),
``episode`` = a new session, one run, closed (a Calc episode's sandbox: one kernel start each).
``bwrap alone`` starts the local backend's own bubblewrap command line for a cold run directly
(no launcher, no cgroup; as a fresh uid when root, like the backend): the price of the isolation
itself, the floor of ``local cold``.
The machine may be shared and busy, so each row times bare ``python3 -c`` alternately with its
latency runs (one bare run per run) and reports ``×bare`` against that floor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agentloop.sandboxes import SandboxLimits, make_sandbox

CODE = "print(1)"
RunFn = Callable[[], Awaitable[Any]]


@dataclass
class Row:
    backend: str
    mode: str
    p50_ms: float
    p99_ms: float
    floor_ms: float  # bare python3 -c, timed alternately with this row's runs
    rps: dict[int, float]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


async def latency(run: RunFn, n: int) -> tuple[float, float, float]:
    """p50 and p99 of ``run`` (sequential), and the p50 of bare ``python3 -c`` timed alternately
    with it, run by run (the machine may be shared: the floor is taken under the same load)."""
    times: list[float] = []
    floors: list[float] = []
    for i in range(2 * n):
        fn, out = (run, times) if i % 2 == (i // 2) % 2 else (bare_run, floors)  # ABBA order
        start = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - start)
    return (
        statistics.median(times) * 1e3,
        pct(times, 0.99) * 1e3,
        statistics.median(floors) * 1e3,
    )


async def throughput(
    make_worker: Callable[[], AsyncIterator[RunFn]], conc: int, total: int
) -> float:
    """runs/s with ``conc`` callers, each with its own runner (e.g. its own session).

    Runners are opened before the clock starts (session start-up is not a run)."""
    per = max(1, total // conc)
    async with contextlib.AsyncExitStack() as stack:
        opener = contextlib.asynccontextmanager(make_worker)
        runners = await asyncio.gather(*(stack.enter_async_context(opener()) for _ in range(conc)))

        async def worker(run: RunFn) -> None:
            for _ in range(per):
                await run()

        start = time.perf_counter()
        await asyncio.gather(*(worker(r) for r in runners))
        return per * conc / (time.perf_counter() - start)


async def bare_run() -> None:
    await argv_run(["/usr/bin/python3", "-c", CODE])


async def argv_run(argv: list[str], env: dict[str, str] | None = None, **kw: Any) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, env=env, **kw
    )
    out, _ = await proc.communicate()
    assert out == b"1\n", out


def bwrap_alone(sb: Any) -> RunFn:
    """The local backend's own bwrap command line for a cold run, started directly as a fresh
    uid (as the backend does when root): the cost of the isolation itself (namespaces, mounts,
    the unprivileged uid), without agentloop's launchers and limits."""
    from agentloop.sandboxes.bwrap import sandbox_env

    env = sandbox_env(sb.limits)
    argv = [*sb._bwrap_argv(), sb.python, "-c", CODE]

    def as_fresh_uid() -> dict[str, Any]:
        uid = sb._uid()
        return {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}

    async def run() -> None:
        if "--seccomp" not in argv:  # no seccomp filter on this machine
            return await argv_run(argv, env, **as_fresh_uid())
        fd = os.memfd_create("seccomp")  # the backend's filter, on a descriptor of this run's
        os.write(fd, sb._filter)
        os.lseek(fd, 0, os.SEEK_SET)
        at = argv.index("--seccomp") + 1
        try:
            mine = [*argv[:at], str(fd), *argv[at + 1 :]]
            await argv_run(mine, env, pass_fds=(fd,), **as_fresh_uid())
        finally:
            os.close(fd)

    return run


def checked(run: Callable[[], Awaitable[Any]]) -> RunFn:
    async def go() -> None:
        res = await run()
        assert res.stdout == "1\n", res

    return go


async def measure(
    backend: str,
    mode: str,
    one: RunFn,
    make_worker: Callable[[], AsyncIterator[RunFn]],
    n: int,
    concs: list[int],
    scale: float,
) -> Row:
    for _ in range(3):  # warm caches
        await one()
    p50, p99, floor = await latency(one, n)
    rps = {}
    for c in concs:
        rps[c] = await throughput(make_worker, c, max(c * 2, int(n * scale)))
    row = Row(backend, mode, p50, p99, floor, rps)
    print(f"  {backend:<22} {mode:<12} p50 {p50:7.2f} ms", file=sys.stderr, flush=True)
    return row


async def bench_sandbox(name: str, sb: Any, n: int, concs: list[int], scale: float) -> list[Row]:
    rows = []
    one = checked(lambda: sb.run(CODE))

    async def fresh() -> AsyncIterator[RunFn]:
        yield one

    mode = "cold" if getattr(sb, "pool_size", 1) == 0 else "pooled run"
    rows.append(await measure(name, mode, one, fresh, n, concs, scale))
    if mode == "cold":
        return rows

    async def episode() -> None:  # an episode's sandbox: a new session, one run, closed
        async with sb.session() as s:
            await checked(lambda: s.run(CODE))()

    async def episodes() -> AsyncIterator[RunFn]:
        yield episode

    await asyncio.sleep(5)  # the pool refills after the last row's burst
    rows.append(await measure(name, "episode", episode, episodes, n, concs, scale))

    async def in_session() -> AsyncIterator[RunFn]:
        async with sb.session() as s:
            yield checked(lambda: s.run(CODE))

    async with sb.session() as s:
        one_s = checked(lambda: s.run(CODE))
        # the pool refills after the last row's burst: that is not this row's cost
        await asyncio.sleep(5)
        rows.append(await measure(name, "session", one_s, in_session, n * 4, concs, 4 * scale))
    return rows


@contextlib.asynccontextmanager
async def server_process(backend: str, pool: int, conc: int) -> AsyncIterator[str]:
    argv = [sys.executable, "-m", "agentloop.sandboxes.server", "--backend", backend]
    argv += ["--port", "0", "--pool-size", str(pool), "--max-concurrency", str(conc)]
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        port = re.search(r":(\d+)\s*$", line)
        assert port, line
        yield f"http://127.0.0.1:{port.group(1)}"
    finally:
        proc.terminate()
        await proc.wait()


async def main(args: argparse.Namespace) -> list[Row]:
    concs = [1, 8, 32]
    rows: list[Row] = []
    limits = SandboxLimits(timeout_s=60)

    async def bare_worker() -> AsyncIterator[RunFn]:
        yield bare_run

    rows.append(await measure("bare python3 -c", "cold", bare_run, bare_worker, args.n, concs, 1))
    if "local" in args.backends:
        async with make_sandbox("local", pool_size=0, limits=limits) as sb:
            floor = bwrap_alone(sb)

            async def floor_worker() -> AsyncIterator[RunFn]:
                yield floor

            rows.append(await measure("bwrap alone", "cold", floor, floor_worker, args.n, concs, 1))
            rows += await bench_sandbox("local", sb, args.n, concs, 1)
        async with make_sandbox("local", pool_size=args.pool, limits=limits) as sb:
            await asyncio.sleep(1)
            rows += await bench_sandbox("local", sb, args.n, concs, 1)
    if "remote" in args.backends:
        async with (
            server_process("local", args.pool, 32) as url,
            make_sandbox("remote", urls=url, limits=limits) as sb,
        ):
            rows += await bench_sandbox("remote (local)", sb, args.n, concs, 1)
    if "docker" in args.backends:
        rows += await bench_docker(args, concs, limits)
    return rows


async def bench_docker(args: argparse.Namespace, concs: list[int], limits: Any) -> list[Row]:
    from agentloop.sandboxes.podman import PodmanService, ensure_python_image, podman_missing

    reason = podman_missing()
    if reason:
        print(f"  docker: skipped ({reason})", file=sys.stderr)
        return []
    rows: list[Row] = []
    with PodmanService() as svc:
        client = svc.client()
        ensure_python_image(client)
        async with make_sandbox("docker", client=client, pool_size=0, limits=limits) as sb:
            rows += await bench_sandbox("docker (podman)", sb, max(5, args.n // 5), concs, 0.2)
        async with make_sandbox("docker", client=client, pool_size=args.pool, limits=limits) as sb:
            await asyncio.sleep(3)
            rows += await bench_sandbox("docker (podman)", sb, args.n, concs, 0.5)
    return rows


def table(rows: list[Row]) -> str:
    """p50/p99 of the backend; ×bare against bare python3 -c timed alternately with it."""
    head = (
        f"| {'backend':<18} | {'mode':<10} | p50 ms | p99 ms | bare p50 | ×bare "
        "| runs/s c=1 | c=8 | c=32 |"
    )
    lines = [head, "|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|"]
    for r in rows:
        lines.append(
            f"| {r.backend:<18} | {r.mode:<10} | {r.p50_ms:6.2f} | {r.p99_ms:6.2f} | "
            f"{r.floor_ms:8.2f} | {r.p50_ms / r.floor_ms:5.2f} | {r.rps[1]:10.0f} | "
            f"{r.rps[8]:3.0f} | {r.rps[32]:4.0f} |"
        )
    return "\n".join(lines)


def machine() -> str:
    cpu = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    bwrap = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
    return (
        f"{platform.node()}: {os.cpu_count()} CPUs ({cpu}), Linux {platform.release()}, "
        f"Python {platform.python_version()}, {bwrap or 'no bwrap'}, "
        f"load avg {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="local,remote,docker")
    parser.add_argument("--n", type=int, default=50, help="sequential runs for latency")
    parser.add_argument("--pool", type=int, default=8, help="pool size of pooled modes")
    ns = parser.parse_args()
    ns.backends = ns.backends.split(",")
    result = asyncio.run(main(ns))
    print(machine())
    print(table(result))
