"""Helpers shared by the async-mode pipeline tests: the run settings and the recorded versions."""

from __future__ import annotations

from pathlib import Path

from agentloop.io import read_jsonl

STEPS = 3


def overrides(model: Path, out: Path, *extra: str) -> list[str]:
    """2 prompts × 4 samples of up to 48 tokens per step, a checkpoint every step; the entropy
    bonus makes every update move the weights (the random tiny model never solves Calc)."""
    return [
        f"model.path={model}", f"trainer.out_dir={out}", f"trainer.total_steps={STEPS}",
        "trainer.prompts_per_step=2", "rollout.n=4", "rollout.max_turns=2",
        "rollout.max_prompt_len=384", "rollout.max_response_len=48",
        "rollout.max_tool_output_tokens=32", "data.num_train_tasks=32", "actor.lr=1e-3",
        "actor.entropy_coef=0.01", "actor.device=cpu", "actor.max_tokens_per_micro_batch=2048",
        "actor.tis_cap=2.0", "engine.dtype=float32", "engine.kv_cache_memory_bytes=67108864",
        "engine.max_num_seqs=16", "engine.enforce_eager=true", "checkpoint.every=1",
        "checkpoint.keep_last=2", "checkpoint.export_final=false", "logging.progress=false",
        "logging.wandb=false", "logging.tensorboard=false", *extra,
    ]  # fmt: skip


def trained_versions(out: Path) -> dict[int, list[int]]:
    """Step → the policy versions of every trained token of that step's batch."""
    found = {}
    for path in sorted((out / "trajectories").glob("step_*.jsonl")):
        rows = read_jsonl(path)
        step = int(rows[0]["step"])
        pairs = ((v, m) for r in rows for v, m in zip(r["versions"], r["loss_mask"], strict=True))
        found[step] = [v for v, m in pairs if m]
    return found
