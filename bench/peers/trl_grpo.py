"""TRL's GRPO step on the race workload, through its own entry point (``trl.GRPOTrainer``,
vLLM colocated in the trainer's process).

    python bench/peers/trl_grpo.py --model /root/models/race-0.5B --out DIR [--steps 5]

Phases come from TRL's own ``profiling_context`` timers (the ones it reports to wandb/trackio),
read by wrapping ``ProfilingContext.__exit__`` — TRL's code is not changed — and grouped per
optimizer step between the ``on_step_begin`` and ``on_step_end`` callbacks: ``vLLM.generate``
(generation), ``sync_weights``, ``_get_per_token_logps_and_entropies`` outside ``compute_loss``
(old logprobs), and the step's time outside ``_prepare_inputs`` (update: forward, backward and the
optimizer). One line per step, ``RACE_TRL_STEP {json}``, goes to stdout and ``DIR/steps.jsonl``.
The multi variant's episodes come from ``trl_turns.make_rollout_func`` (its generation phase is
the ``rollout_func`` timer, which holds the turns' ``vLLM.generate`` calls).
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from results import TRL_TAG  # noqa: E402  (bench/peers is not a package)
from trl_turns import make_rollout_func  # noqa: E402
from workload import Workload, prompt_text, step_parser  # noqa: E402

Event = tuple[str, float, float]  # (TRL's timer name, start, end) in perf_counter seconds
EVENTS: list[Event] = []


def record_trl_timers() -> None:
    """Keep every interval TRL's ``ProfilingContext`` times (it logs them only to trackers)."""
    from trl.extras.profiling import ProfilingContext

    exit_ = ProfilingContext.__exit__

    def __exit__(self: Any, *exc: Any) -> Any:
        if self._start_time is not None:
            EVENTS.append((self.name, self._start_time, time.perf_counter()))
        return exit_(self, *exc)

    ProfilingContext.__exit__ = __exit__  # type: ignore[method-assign]


def outer(events: list[Event], *names: str) -> list[tuple[float, float]]:
    """The intervals named one of ``names`` (TRL prefixes a class name:
    ``GRPOTrainer.sync_weights``, ``VLLMGeneration.sync_weights``) that no other of them
    contains."""
    # by start, the longer first at a tie: a span's container comes before it
    spans = sorted(((s, e) for n, s, e in events if n.split(".", 1)[-1] in names),
                   key=lambda span: (span[0], -span[1]))  # fmt: skip
    out: list[tuple[float, float]] = []
    for s, e in spans:
        if out and s >= out[-1][0] and e <= out[-1][1]:
            continue
        out.append((s, e))
    return out


def total(spans: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in spans)


def step_phases(events: list[Event], wall: float) -> dict[str, float]:
    """One optimizer step's phases from the TRL timer intervals inside it."""
    loss = outer(events, "compute_loss")
    logps = outer(events, "_get_per_token_logps_and_entropies")
    old = [(s, e) for s, e in logps if not any(ls <= s and e <= le for ls, le in loss)]
    prepare = total(outer(events, "_prepare_inputs"))
    return {
        "wall": wall,
        "gen": total(outer(events, "rollout_func", "vLLM.generate", "transformers.generate")),
        "sync": total(outer(events, "sync_weights")),
        "old_logprobs": total(old),
        "update": wall - prepare,
    }


def make_callback(out: Path) -> Any:
    import torch
    from transformers import TrainerCallback

    cuda = torch.cuda.is_available()

    class RaceSteps(TrainerCallback):  # type: ignore[misc]
        """Times each optimizer step and prints its phases with TRL's logged completion length."""

        def __init__(self) -> None:
            self.t0 = 0.0
            self.first = 0
            self.pending: dict[str, Any] | None = None

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            self.t0, self.first = time.perf_counter(), len(EVENTS)

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if cuda:
                torch.cuda.synchronize()
            wall = time.perf_counter() - self.t0
            phases = step_phases(EVENTS[self.first :], wall)
            peak = torch.cuda.max_memory_allocated() / 1e9 if cuda else None
            self.pending = {"step": state.global_step, **phases, "peak_mem_gb": peak}

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if self.pending is None or not logs or "completions/mean_length" not in logs:
                return
            row = {**self.pending, "mean_completion_len": logs["completions/mean_length"],
                   "trl_logs": {k: v for k, v in logs.items()
                                if isinstance(v, int | float)}}  # fmt: skip
            self.pending = None
            line = TRL_TAG + json.dumps(row)
            print(line, flush=True)
            with open(out / "steps.jsonl", "a") as f:
                f.write(line[len(TRL_TAG) :] + "\n")

    return RaceSteps()


def grpo_config(
    w: Workload, out: Path, micro_batch: int, prompt_len: int, cpu_smoke: bool = False
) -> Any:
    """TRL 1.16's GRPOConfig for one update per step of ``w.sequences`` sequences (``cpu_smoke``:
    the same on a CPU with transformers' generate instead of vLLM, to check the API here)."""
    from trl import GRPOConfig

    if w.sequences % micro_batch:
        raise ValueError(f"--micro-batch {micro_batch} must divide {w.sequences} sequences")
    accum = w.sequences // micro_batch
    # vLLM's SamplingParams take these over TRL's (max_tokens: the whole completion's budget)
    turn_cap = {"max_tokens": w.turn_tokens} if w.turns > 1 else {}
    gen_kwargs = {"ignore_eos": True, **turn_cap}
    if cpu_smoke:  # transformers' generate (the single variant; the multi one's turns set theirs)
        gen_kwargs = {"min_new_tokens": w.response_len}
    return GRPOConfig(
        output_dir=str(out / "trl_out"), max_steps=w.steps, learning_rate=w.lr,
        per_device_train_batch_size=micro_batch, gradient_accumulation_steps=accum,
        steps_per_generation=accum, num_generations=w.samples, num_iterations=1,
        max_completion_length=w.max_response, temperature=1.0, top_p=1.0, beta=0.0,
        generation_kwargs=gen_kwargs,
        bf16=not cpu_smoke, use_cpu=cpu_smoke, gradient_checkpointing=False,
        use_vllm=not cpu_smoke, vllm_mode="colocate", vllm_gpu_memory_utilization=0.15,
        vllm_max_model_length=prompt_len + w.max_response, logging_steps=1, report_to="none",
        save_strategy="no", lr_scheduler_type="constant", warmup_steps=0, seed=0,
        dataloader_num_workers=0, log_completions=False,
    )  # fmt: skip


def random_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """Rewards that vary within every group (nonzero advantages), the same rule for all systems."""
    return [random.random() for _ in completions]


def main() -> None:
    parser = step_parser(__doc__)
    parser.add_argument("--micro-batch", type=int, default=32, help="sequences per micro-batch")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--response-len", type=int, default=512)
    parser.add_argument("--cpu-smoke", action="store_true", help="no vLLM, on the CPU (API check)")
    args = parser.parse_args()
    w = Workload(shape=args.shape, variant=args.variant, steps=args.steps, prompts=args.prompts,
                 response_len=args.response_len)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    random.seed(0)
    record_trl_timers()
    from datasets import Dataset
    from trl import GRPOTrainer

    rows = [[{"role": "user", "content": prompt_text(i)}] for i in range(w.prompts)]
    trainer = GRPOTrainer(
        model=str(args.model), reward_funcs=random_reward,
        args=grpo_config(w, args.out, args.micro_batch, prompt_len=512, cpu_smoke=args.cpu_smoke),
        train_dataset=Dataset.from_dict({"prompt": rows}),
        callbacks=[make_callback(args.out)],
        rollout_func=make_rollout_func(w) if w.turns > 1 else None,
    )  # fmt: skip
    trainer.train()


if __name__ == "__main__":
    main()
