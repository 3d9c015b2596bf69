"""Benchmark: how long a vLLM engine takes to shut down, with and without agentloop's vLLM plugin.

Each run starts the tiny model on vLLM in a fresh process (``VLLMEngine``), then times
``shutdown()`` until every engine process is gone. "vLLM" loads vLLM's own plugins only
(``VLLM_PLUGINS``), so its processes run the interpreter's final GC pass; "agentloop" loads
``agentloop.engines.vllm_plugin``, which skips it. The runs alternate.

    .venv/bin/python bench/vllm_shutdown.py [--pairs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

_ONE = """
import asyncio, time
from agentloop.engines.vllm import VLLMEngine
from agentloop.models.tiny import tiny_model_dir

async def main():
    engine = VLLMEngine.create(tiny_model_dir(), dtype="float32", max_model_len=512,
                               kv_cache_memory_bytes=64 << 20, enforce_eager=True)
    await engine.start()
    t0 = time.perf_counter()
    await engine.shutdown()
    print(time.perf_counter() - t0)

if __name__ == "__main__":
    asyncio.run(main())
"""


def _vllm_plugins_only() -> str:
    from importlib.metadata import entry_points

    names = [e.name for e in entry_points(group="vllm.general_plugins")]
    return ",".join(n for n in names if n != "agentloop_fast_exit") or "none"


def _one(plugins: str | None) -> float:
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"}
    if plugins is not None:
        env["VLLM_PLUGINS"] = plugins
    out = subprocess.run(
        [sys.executable, "-c", _ONE], env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    baseline = _vllm_plugins_only()
    times: dict[str, list[float]] = {"vLLM": [], "agentloop": []}
    for _ in range(args.pairs):
        times["vLLM"].append(_one(baseline))
        times["agentloop"].append(_one(None))
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs")
    print(f"{'shutdown':<10} {'median s':>9}   runs")
    for name, runs in times.items():
        print(f"{name:<10} {statistics.median(runs):>9.1f}   {', '.join(f'{t:.1f}' for t in runs)}")
    print(json.dumps({k: statistics.median(v) for k, v in times.items()}))


if __name__ == "__main__":
    main()
