"""The HTTP servers under 1,000 slow or half-open connections: normal traffic's success, latency.

    python bench/server_load.py [--slow 1000] [--requests 200] [--concurrency 8]
                                [--servers search,sandbox,proxy] [--max-s 120] [--ulimit N]
                                [--header-timeout-s S]

For each server (``agentloop serve-search`` on the SearchQA BM25 index, ``agentloop
serve-sandbox --backend local`` running ``print(1)``, ``agentloop serve-proxy --engine hf`` on
the tiny model of :mod:`agentloop.models.tiny` answering a chat completion of at most 4
tokens, each request its own episode), started as users start it, on loopback:

1. *baseline*: ``--requests`` normal requests, ``--concurrency`` in flight (one keep-alive
   client session), no other traffic;
2. *under attack*: the same requests while ``--slow`` connections are held open — a third
   send nothing, a third trickle a request head one byte a second (slowloris), a third send a
   head and then trickle its body. Each one the server closes is reopened at once, as an
   attacker would (at most ``20 × --slow`` opens in all).

It prints, per server and phase: normal requests' success rate and p50/p99 latency, the
server's RSS before and after (``VmRSS``; peak ``VmHWM``), and the bytes it logged. Bounded:
loopback only, a fixed number of requests and connections, and ``--max-s`` seconds per phase.
The servers' logs and the index go to a temporary directory (``SERVER_LOAD_DIR=DIR`` keeps them).
``--header-timeout-s`` is passed to the servers (default: theirs); a short one makes a small run
quick (tests/test_server_load_bench.py runs :func:`main` that way).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

HOST = "127.0.0.1"


@dataclass
class Attack:
    """Counts of the slow connections' fate."""

    opened: int = 0
    closed_by_server: int = 0
    answered: dict[str, int] = field(default_factory=dict)  # status line → count
    connect_errors: int = 0


@dataclass(frozen=True)
class Phase:
    ok: int
    total: int
    p50_ms: float
    p99_ms: float
    wall_s: float


@dataclass(frozen=True)
class Target:
    name: str
    argv: list[str]
    path: str
    payload: dict[str, Any]
    health: str = "/health"
    episode_per_request: bool = False
    """Send each request as its own episode (the proxy: ``Authorization: Bearer <new id>``),
    then collect it (``DELETE /episodes/<id>``, untimed; both must succeed)."""


@dataclass(frozen=True)
class Result:
    """One server's figures: both phases, its RSS in KiB, the bytes it logged, the attack."""

    name: str
    baseline: Phase
    loaded: Phase
    rss_kib: tuple[int, int, int]  # before, after the baseline, after the attack
    peak_kib: int
    logged: int
    attack: Attack


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _limit_fds(n: int | None) -> Any:
    """What the server process runs before exec: ``ulimit -n n`` (soft and hard), if given."""
    if n is None:
        return None
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


def _rss_kib(pid: int) -> tuple[int, int]:
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


async def _wait_healthy(
    port: int, path: str, proc: subprocess.Popen[bytes], deadline_s: float
) -> None:
    deadline = time.monotonic() + deadline_s
    async with aiohttp.ClientSession() as http:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"server exited with {proc.returncode}")
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"http://{HOST}:{port}{path}") as r:
                    if r.status == 200:
                        return
            if time.monotonic() > deadline:
                raise SystemExit(f"server not healthy after {deadline_s} s")
            await asyncio.sleep(0.2)


_episodes = iter(range(1 << 62))  # request ids (the proxy's episodes), unique across phases


async def _collect(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.delete(url) as r:
            await r.read()
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def _normal(t: Target, url: str, n: int, concurrency: int) -> Phase:
    latencies: list[float] = []
    ok = 0
    timeout = aiohttp.ClientTimeout(total=60)
    connector = aiohttp.TCPConnector(limit=concurrency)
    started = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        slots = asyncio.Semaphore(concurrency)

        async def one() -> None:
            nonlocal ok
            async with slots:
                eid = f"load-{next(_episodes)}"
                headers = {"Authorization": f"Bearer {eid}"} if t.episode_per_request else {}
                t0, done = time.perf_counter(), False
                try:
                    async with http.post(url, json=t.payload, headers=headers) as r:
                        await r.read()
                        done = r.status == 200
                except (aiohttp.ClientError, TimeoutError):
                    pass
                latencies.append(time.perf_counter() - t0)
                if done and t.episode_per_request:  # collected and forgotten, as a trainer does
                    done = await _collect(http, url.split("/v1/")[0] + f"/episodes/{eid}")
                ok += done

        await asyncio.gather(*(one() for _ in range(n)))
    wall = time.perf_counter() - started
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return Phase(ok, n, 1e3 * statistics.median(latencies), 1e3 * q[98], wall)


async def _slow_client(
    kind: int, port: int, path: str, stop: asyncio.Event, a: Attack, budget: int
) -> None:
    """Hold one slow connection open; reopen it whenever the server closes it."""
    head = f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
    first = (b"", (head + "X-Slow: ").encode(), (head + "Content-Length: 1000\r\n\r\n").encode())
    while not stop.is_set() and a.opened < budget:
        try:
            reader, writer = await asyncio.open_connection(HOST, port)
        except OSError:
            a.connect_errors += 1
            await asyncio.sleep(0.1)
            continue
        a.opened += 1
        try:
            writer.write(first[kind])
            while not stop.is_set():
                try:
                    data = await asyncio.wait_for(reader.read(4096), 1.0)
                except TimeoutError:
                    if kind:
                        writer.write(b"a")  # a byte a second keeps a naive read timer happy
                    continue
                if not data:
                    a.closed_by_server += 1
                    break
                status = data.split(b"\r\n", 1)[0].decode(errors="replace")
                a.answered[status] = a.answered.get(status, 0) + 1
        except (ConnectionError, OSError):
            a.closed_by_server += 1
        finally:
            writer.close()


async def _phase_under_attack(
    t: Target, port: int, args: argparse.Namespace
) -> tuple[Phase, Attack]:
    stop, attack = asyncio.Event(), Attack()
    budget = 20 * args.slow
    clients = [
        asyncio.create_task(_slow_client(i % 3, port, t.path, stop, attack, budget))
        for i in range(args.slow)
    ]
    deadline = time.monotonic() + args.max_s
    while attack.opened < args.slow and time.monotonic() < deadline:  # all open first
        await asyncio.sleep(0.05)
    url = f"http://{HOST}:{port}{t.path}"
    try:
        phase = await asyncio.wait_for(_normal(t, url, args.requests, args.concurrency), args.max_s)
        # Hold the attack until the server's header timeout has cut every slow connection
        # once (each is reopened at once), so what is measured next includes that churn.
        while attack.closed_by_server < args.slow and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await asyncio.gather(*clients, return_exceptions=True)
    return phase, attack


async def bench(t: Target, args: argparse.Namespace, workdir: Path) -> Result:
    port = _free_port()
    log_path = workdir / f"{t.name}.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    argv = [*t.argv, "--port", str(port)]
    if args.header_timeout_s is not None:
        argv += ["--header-timeout-s", str(args.header_timeout_s)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentloop.cli", *argv],
            stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=_limit_fds(args.ulimit),
        )  # fmt: skip
    try:
        await _wait_healthy(port, t.health, proc, 300)
        url = f"http://{HOST}:{port}{t.path}"
        await _normal(t, url, 10, 2)  # warm-up
        rss0, _ = _rss_kib(proc.pid)
        log0 = log_path.stat().st_size
        base = await asyncio.wait_for(_normal(t, url, args.requests, args.concurrency), args.max_s)
        rss1, _ = _rss_kib(proc.pid)
        loaded, attack = await _phase_under_attack(t, port, args)
        rss2, peak = _rss_kib(proc.pid)
        logged = log_path.stat().st_size - log0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for label, p in (("baseline", base), (f"{args.slow} slow conns", loaded)):
        print(
            f"{t.name:8} {label:16} ok {p.ok}/{p.total} ({100 * p.ok / p.total:5.1f} %)  "
            f"p50 {p.p50_ms:7.1f} ms  p99 {p.p99_ms:7.1f} ms  {p.total / p.wall_s:6.1f} req/s"
        )
    print(
        f"{t.name:8} server RSS {rss0 / 1024:.1f} MiB before, {rss1 / 1024:.1f} after baseline, "
        f"{rss2 / 1024:.1f} after attack (peak {peak / 1024:.1f}); logged {logged} bytes"
    )
    print(
        f"{t.name:8} slow connections opened {attack.opened}, closed by the server "
        f"{attack.closed_by_server}, answered {attack.answered or '-'}, "
        f"connect errors {attack.connect_errors}",
        flush=True,
    )
    return Result(t.name, base, loaded, (rss0, rss1, rss2), peak, logged, attack)


def _targets(names: Sequence[str], workdir: Path) -> dict[str, Target]:
    unknown = sorted(set(names) - {"search", "sandbox", "proxy"})
    if unknown:
        raise SystemExit(f"unknown server(s) {unknown}; known: search, sandbox, proxy")
    targets = {
        "search": Target(
            "search",
            ["serve-search", "--corpus", "searchqa", "--index", str(workdir / "idx")],
            "/retrieve",
            {"queries": ["Who founded Vaiduth?"], "topk": 3},
        ),
        "sandbox": Target(
            "sandbox",
            ["serve-sandbox", "--backend", "local", "--max-concurrency", "4"],
            "/v1/run",
            {"code": "print(1)"},
        ),
    }
    if "proxy" in names:  # generates the tiny model on first use (cached on disk)
        from agentloop.models.tiny import tiny_model_dir

        chat = {"model": "agentloop", "messages": [{"role": "user", "content": "What is 6 * 7?"}]}
        targets["proxy"] = Target(
            "proxy",
            ["serve-proxy", "--model", str(tiny_model_dir()), "--engine", "hf"],
            "/v1/chat/completions",
            {**chat, "max_tokens": 4},
            health="/v1/models",
            episode_per_request=True,
        )
    return targets


def main(argv: Sequence[str] | None = None) -> list[Result]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--slow", type=int, default=1000)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--servers", default="search,sandbox,proxy")
    p.add_argument("--max-s", type=float, default=120.0, help="bound on each phase")
    p.add_argument("--ulimit", type=int, default=None, help="the servers' ulimit -n (e.g. 1024)")
    p.add_argument("--header-timeout-s", type=float, help="the servers' (default: theirs)")
    args = p.parse_args(argv)
    names = args.servers.split(",")
    with tempfile.TemporaryDirectory(prefix="server-load-") as tmp:
        workdir = Path(os.environ.get("SERVER_LOAD_DIR", tmp))
        targets = _targets(names, workdir)
        return [asyncio.run(bench(targets[name], args, workdir)) for name in names]


if __name__ == "__main__":
    main()
