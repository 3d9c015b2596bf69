"""bench/proxy_bench.py at small scale, so that the bench cannot rot: a few concurrent
openai-SDK (and plain-HTTP) episodes through the proxy, none of their requests lost."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_scripts import load_bench

pytestmark = pytest.mark.timeout(120)


def test_proxy_bench_at_small_scale(tiny_model_dir: Path) -> None:
    runs = load_bench("proxy_bench").main(["--episodes", "8", "--turns", "2"])
    assert [r.label for r in runs] == ["proxy, openai SDK", "proxy, plain HTTP", "direct"]
    for r in runs[:2]:  # main() raises if an episode lost a request or was split
        assert (r.requests, r.recorded, r.failed) == (16, 16, 0), r
    assert all(r.elapsed_s > 0 for r in runs)
