"""Benchmark: the rollout loop's turns/s in one process, over N loop workers, and N independent
processes (the ceiling).

The episodes of ``bench/collect_bench.py`` (4 turns: 3 call a 50 ms tool, the 4th answers; the
engine answers each call after 5 ms; the real tiny tokenizer and chat template) are played three
ways, side by side in one run:

- ``collect`` in this process: the loop's Python on one core;
- ``LoopWorkers`` with N workers (``agentloop.loop_workers``): the episodes spread over N
  processes, every engine call coming back to the one engine here;
- the ceiling: N independent processes, each playing its share with an engine of its own (no
  shared engine, nothing crossing processes), timed from a common start to the last one done.

With thousands of episodes the latencies overlap and the loop's CPU sets the pace, so turns/s
measures how far the loop scales past one core. Worker start-up (each imports transformers) is
outside the timed runs, as it is once per training run.

    .venv/bin/python bench/loop_workers_bench.py [--episodes 4000] [--workers 1 2 4 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))  # collect_bench, here and in spawned processes

from collect_bench import ENGINE_S, TURNS, check, lookup, reward

from agentloop.chat import TokenBuilder
from agentloop.collect import collect
from agentloop.engines.base import SamplingParams
from agentloop.engines.fake import FakeEngine
from agentloop.envs import Env, ToolEnv
from agentloop.loop_workers import LoopWorkers
from agentloop.rollout import RolloutConfig
from agentloop.types import Task

CONFIG = RolloutConfig(max_turns=TURNS, max_response_len=1024, max_prompt_len=1024)


def bench_env() -> Env:
    """The benchmark's env (top level: the spawned workers import it)."""
    return ToolEnv([lookup], reward)


def parts() -> tuple[TokenBuilder, FakeEngine]:
    """The tiny model's builder and the scripted engine: a tool call on each of the first
    TURNS - 1 turns, then an answer."""
    from transformers import AutoTokenizer

    from agentloop.models.tiny import tiny_model_dir

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir())
    builder = TokenBuilder(tokenizer, tools=[lookup.schema])
    call = builder.encode(
        '<tool_call>\n{"name": "lookup", "arguments": {"key": "k"}}\n</tool_call>'
    )
    answer = builder.encode("The answer is \\boxed{1}.")
    eos, response = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<tool_response>")

    def script(prompt_ids: Sequence[int], sampling: SamplingParams) -> list[int]:
        turn = list(prompt_ids).count(response)
        return [*(call if turn < TURNS - 1 else answer), eos]

    return builder, FakeEngine(script, eos_token_id=eos, latency_s=ENGINE_S)


def tasks(n: int, offset: int = 0) -> list[Task]:
    return [Task(f"q{offset + i}", {"prompt": f"Look up key number {i}."}) for i in range(n)]


async def timed_collect(play: Any, batch: list[Task]) -> float:
    t0 = time.perf_counter()
    groups = await play(batch)
    elapsed = time.perf_counter() - t0
    check(groups)
    return elapsed


def _independent(share: int, offset: int, barrier: Any, results: Any) -> None:
    """One process of the ceiling: its own engine, its share of the episodes."""
    builder, engine = parts()

    async def run() -> None:
        await collect(tasks(4, offset), bench_env, engine, builder, config=CONFIG)  # warm-up
        batch = tasks(share, offset)
        barrier.wait()
        t0 = time.perf_counter()
        groups = await collect(batch, bench_env, engine, builder, config=CONFIG, concurrency=share)
        results.put((t0, time.perf_counter()))
        check(groups)

    asyncio.run(run())


def ceiling(episodes: int, workers: int) -> float:
    """Wall time of ``workers`` independent processes from a common start to the last done."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(workers + 1), ctx.Queue()
    shares = [episodes // workers + (i < episodes % workers) for i in range(workers)]
    procs = [
        ctx.Process(target=_independent, args=(share, 1_000_000 * i, barrier, results))
        for i, share in enumerate(shares)
    ]
    for proc in procs:
        proc.start()
    barrier.wait()
    spans = [results.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join()
    return max(end for _, end in spans) - min(start for start, _ in spans)


async def ours(builder: TokenBuilder, engine: FakeEngine, args: Any, workers: int) -> list[float]:
    async with LoopWorkers(engine, bench_env, builder, CONFIG, workers=workers) as pool:
        await timed_collect(pool.collect, tasks(4 * workers))  # warm-up
        play = lambda batch: pool.collect(batch, concurrency=args.episodes)  # noqa: E731
        return [await timed_collect(play, tasks(args.episodes)) for _ in range(args.repeat)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=4000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; the median is kept")
    parser.add_argument("--out", default=None, help="also write the JSON result to this file")
    args = parser.parse_args()
    builder, engine = parts()
    turns = args.episodes * TURNS

    async def one_process() -> list[float]:
        def play(batch: list[Task]) -> Any:
            return collect(batch, bench_env, engine, builder, config=CONFIG, concurrency=len(batch))

        await timed_collect(play, tasks(4))  # warm-up
        return [await timed_collect(play, tasks(args.episodes)) for _ in range(args.repeat)]

    single = statistics.median(asyncio.run(one_process()))
    rows = []
    for workers in args.workers:
        spread = statistics.median(asyncio.run(ours(builder, engine, args, workers)))
        ceil = statistics.median(ceiling(args.episodes, workers) for _ in range(args.repeat))
        rows.append({"workers": workers, "loop_workers_s": round(spread, 3),
                     "independent_s": round(ceil, 3),
                     "loop_workers_turns_per_s": round(turns / spread),
                     "independent_turns_per_s": round(turns / ceil),
                     "speedup_over_one_process": round(single / spread, 2),
                     "ratio_to_ceiling": round(ceil / spread, 2)})  # fmt: skip
    print(f"{args.episodes} episodes x {TURNS} turns; one process: {single:.3f} s, "
          f"{turns / single:,.0f} turns/s")  # fmt: skip
    print(f"{'workers':>8}{'LoopWorkers turns/s':>22}{'independent (ceiling)':>24}"
          f"{'vs one process':>16}{'vs ceiling':>12}")  # fmt: skip
    for r in rows:
        print(f"{r['workers']:>8}{r['loop_workers_turns_per_s']:>22,}"
              f"{r['independent_turns_per_s']:>24,}{r['speedup_over_one_process']:>15.2f}x"
              f"{r['ratio_to_ceiling']:>11.2f}")  # fmt: skip
    result = {
        "episodes": args.episodes, "turns_per_episode": TURNS, "repeat": args.repeat,
        "one_process_s": round(single, 3), "one_process_turns_per_s": round(turns / single),
        "rows": rows,
        "machine": f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}, load avg {os.getloadavg()[0]:.1f}",
    }  # fmt: skip
    print(json.dumps(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
