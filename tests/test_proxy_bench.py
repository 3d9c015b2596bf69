"""bench/proxy_bench.py at small scale, so that the bench cannot rot: a few concurrent
openai-SDK (and plain-HTTP) episodes through the proxy, none of their requests lost."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "proxy_bench.py"

pytestmark = pytest.mark.timeout(120)


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("proxy_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_proxy_bench_at_small_scale(tiny_model_dir: Path) -> None:
    runs = _bench().main(["--episodes", "8", "--turns", "2"])
    assert [r.label for r in runs] == ["proxy, openai SDK", "proxy, plain HTTP", "direct"]
    for r in runs[:2]:  # main() raises if an episode lost a request or was split
        assert (r.requests, r.recorded, r.failed) == (16, 16, 0), r
    assert all(r.elapsed_s > 0 for r in runs)
