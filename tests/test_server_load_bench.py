"""bench/server_load.py at small scale, once per server, so that the bench cannot rot: its entry
point starts the real server (``agentloop serve-search`` / ``serve-sandbox`` / ``serve-proxy``)
on loopback, holds a few dozen slow connections open while normal requests run, and every
normal request succeeds with the server's memory and log bounded."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from bench_scripts import load_bench

SMALL = ["--slow", "30", "--requests", "20", "--concurrency", "4", "--max-s", "30"]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


# serve-proxy is a fresh process importing torch and transformers (10-20 s on a busy 2-core
# machine), as in tests/test_proxy_cli.py: slow. The other two take ~6 s each.
SERVERS = ["search", "sandbox", pytest.param("proxy", marks=pytest.mark.slow)]


@pytest.mark.parametrize("server", SERVERS)
def test_server_load_bench_at_small_scale(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if server == "sandbox" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    monkeypatch.setenv("SERVER_LOAD_DIR", str(tmp_path))  # the servers' logs stay for a failure
    # a 1 s header timeout cuts the slow connections within the phase (the default is 15 s)
    [r] = load_bench("server_load").main([*SMALL, "--servers", server, "--header-timeout-s", "1"])
    assert r.name == server
    for phase in (r.baseline, r.loaded):
        assert phase.ok == phase.total == 20, (r, (tmp_path / f"{server}.log").read_text())
    assert r.attack.opened >= 30 and r.attack.closed_by_server >= 30, r.attack
    before, _, after = r.rss_kib
    assert after - before < 64 << 10, r.rss_kib  # KiB: 30 connections cost far less
    assert r.logged < 16 << 10, r.logged
