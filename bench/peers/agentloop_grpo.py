"""agentloop's GRPO step on the race workload, through its own entry point (``agentloop train``
with ``bench/peers/agentloop_race.yaml`` and ``key=value`` overrides).

    python bench/peers/agentloop_grpo.py --model /root/models/race-0.5B --out DIR [--steps 5]

The phases are agentloop's own ``metrics.jsonl`` timers (``timing_s/gen``, ``old_log_prob``,
``update_actor``, ``sync_weights``), read by ``results.parse_agentloop``. agentloop has no
``ignore_eos``: a random-init model ends a reply early only by sampling one of its 2 stop ids
(about 0.7% of 512-token replies); the sampled-token count it logs says how many ran.

The multi variant: ``race_env`` answers each of the 3 turns with a fixed user message whatever
the model wrote and ends the episode after the third, and ``rollout.max_turn_tokens`` caps each
turn at ``turn_tokens`` (a turn cut there goes on to the next; one that samples a stop id early
just ends that turn early).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from workload import Workload, step_parser, workload_of  # noqa: E402  (bench/peers is not a package)

CONFIG = HERE / "agentloop_race.yaml"


def overrides(w: Workload, model: Path, out: Path) -> list[str]:
    """``agentloop train agentloop_race.yaml`` overrides: the model, the step count, the variant's
    turns and lengths, where the run goes."""
    return [
        f"model.path={model}", f"trainer.total_steps={w.steps}", f"trainer.out_dir={out / 'run'}",
        f"data.env_kwargs.turns={w.turns}", f"data.env_kwargs.prompts={w.prompts}",
        f"data.num_train_tasks={w.prompts}", f"trainer.prompts_per_step={w.prompts}",
        f"rollout.n={w.samples}", f"rollout.max_turns={w.turns}",
        f"rollout.max_response_len={w.max_response}", f"rollout.concurrency={w.sequences}",
        f"engine.max_num_seqs={w.sequences}", f"actor.lr={w.lr}",
        f"engine.kv_cache_memory_bytes={int(w.kv_cache_gb * 2**30)}",
        *([f"rollout.max_turn_tokens={w.turn_tokens}"] if w.turns > 1 else []),
    ]  # fmt: skip


def main() -> None:
    parser = step_parser(__doc__)
    parser.add_argument("--print", action="store_true", help="print the command and stop")
    args = parser.parse_args()
    w = workload_of(args)
    argv = ["train", str(CONFIG), *overrides(w, args.model, args.out)]
    if args.print:
        print(" ".join(argv))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    os.chdir("/tmp")  # the repo root's agentloop/ would shadow setup.sh's link tree
    from agentloop.cli import main as cli_main

    sys.exit(cli_main(argv))


if __name__ == "__main__":
    main()
