"""Benchmark: `collect` of many multi-turn episodes vs the critical path (the ceiling).

Each episode has 4 turns: 3 turns call a tool (50 ms), the 4th answers; every engine call takes
5 ms (FakeEngine, awaited, so calls overlap like a real batched engine). With unlimited
concurrency the fastest possible wall time is one episode's chain: 4 x 5 ms + 3 x 50 ms. We report
measured wall time next to it, with the real tiny tokenizer and chat template in the loop, and the
CPU time the loop itself burns (asyncio runs on one core: once that exceeds the critical path, the
run is CPU-bound and the wall time follows the CPU time, not the latencies). Last, the same
awaits in bare asyncio (the engine's sleep; the tool as its own task under a deadline, as the
dispatcher runs it) and nothing else: the floor that any asyncio loop pays.

    .venv/bin/python bench/collect_bench.py [--episodes 1000] [--concurrency 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence

from agentloop.chat import TokenBuilder
from agentloop.collect import collect
from agentloop.engines.base import SamplingParams
from agentloop.engines.fake import FakeEngine
from agentloop.envs import ToolEnv
from agentloop.rollout import RolloutConfig
from agentloop.tools import tool
from agentloop.types import Message, Task, TrajectoryGroup

ENGINE_S, TOOL_S, TURNS = 0.005, 0.050, 4


@tool
async def lookup(key: str) -> str:
    """Look a key up in a slow service.

    Args:
        key: What to look up.
    """
    await asyncio.sleep(TOOL_S)
    return f"value of {key}"


def reward(task: Task, messages: Sequence[Message]) -> float:
    return 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3, help="runs; the median is reported")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from agentloop.models.tiny import tiny_model_dir

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir())
    builder = TokenBuilder(tokenizer, tools=[lookup.schema])
    call_text = '<tool_call>\n{"name": "lookup", "arguments": {"key": "k"}}\n</tool_call>'
    call = builder.encode(call_text)
    answer = builder.encode("The answer is \\boxed{1}.")
    eos = tokenizer.eos_token_id

    response_id = tokenizer.convert_tokens_to_ids("<tool_response>")

    def script(prompt_ids: Sequence[int], sampling: SamplingParams) -> list[int]:
        turn = prompt_ids.count(response_id)
        return [*(call if turn < TURNS - 1 else answer), eos]

    tasks = [Task(f"q{i}", {"prompt": f"Look up key number {i}."}) for i in range(args.episodes)]
    engine = FakeEngine(script, eos_token_id=eos, latency_s=ENGINE_S)
    config = RolloutConfig(max_turns=TURNS, max_response_len=1024, max_prompt_len=1024)
    walls, cpus, floors = [], [], []
    for _ in range(args.repeat):
        floors.append(_timed(lambda: asyncio.run(asyncio_floor(args.episodes))))
        t0, c0 = time.perf_counter(), time.process_time()
        groups = asyncio.run(
            collect(
                tasks, lambda: ToolEnv([lookup], reward), engine, builder,
                config=config, concurrency=args.concurrency,
            )
        )  # fmt: skip
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        check(groups)
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    floor_wall, floor_cpu = (statistics.median(f[i] for f in floors) for i in (0, 1))
    critical = TURNS * ENGINE_S + (TURNS - 1) * TOOL_S
    turns = args.episodes * TURNS
    result = {
        "episodes": args.episodes,
        "turns_per_episode": TURNS,
        "concurrency": args.concurrency,
        "critical_path_s": round(critical, 3),
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "ratio_wall_over_critical": round(wall / critical, 2),
        "cpu_per_turn_us": round(cpu / turns * 1e6, 1),
        "floor_wall_s": round(floor_wall, 3),
        "floor_cpu_per_turn_us": round(floor_cpu / turns * 1e6, 1),
        "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"load avg {os.getloadavg()[0]:.1f}",
    }
    print(f"{'':34}{'seconds':>10}")
    print(f"{'critical path (the ceiling)':34}{critical:>10.3f}")
    print(f"{'agentloop collect, wall':34}{wall:>10.3f}   ({wall / critical:.2f}x the ceiling)")
    print(f"{'  of which loop CPU (one core)':34}{cpu:>10.3f}   ({cpu / turns * 1e6:.0f} us/turn)")
    floor_ratio = floor_wall / critical
    print(f"{'bare asyncio, same awaits, wall':34}{floor_wall:>10.3f}   ({floor_ratio:.2f}x)")
    print(f"{'  of which CPU':34}{floor_cpu:>10.3f}   ({floor_cpu / turns * 1e6:.0f} us/turn)")
    print(json.dumps(result))


async def asyncio_floor(episodes: int) -> None:
    """The same awaits with nothing else: per turn an engine sleep and, on tool turns, the tool
    as its own task under a deadline (as the dispatcher runs it). What asyncio alone costs."""

    async def episode() -> None:
        loop = asyncio.get_running_loop()
        for turn in range(TURNS):
            await asyncio.sleep(ENGINE_S)
            if turn < TURNS - 1:
                tool_task = loop.create_task(asyncio.sleep(TOOL_S))
                await asyncio.wait({tool_task}, timeout=30.0)

    await asyncio.gather(*(episode() for _ in range(episodes)))


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def check(groups: Sequence[TrajectoryGroup]) -> None:
    trajs = [t for g in groups for t in g.trajectories]
    assert all(t.stop_reason == "done" for t in trajs), {t.stop_reason for t in trajs}
    assert all(len(t.turns) == TURNS for t in trajs), {len(t.turns) for t in trajs}


if __name__ == "__main__":
    main()
