"""Helpers shared by the GRPO pipeline tests: the run settings, the weight-sync probe, and
``agentloop train`` in a subprocess (for kill-and-resume)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentloop.engines.base import SamplingParams
from agentloop.io import read_jsonl
from agentloop.trainers.grpo import TrainResult
from agentloop.trainers.packing import TrainSeq

STEPS = 3
#: The ``train_run`` fixture: ``train_run(overrides, on_step=None)`` runs GRPO in this process.
TrainRun = Callable[..., TrainResult]
#: The ``train_main`` fixture: ``train_main(args, log)``, ``agentloop train ARGS`` in this process.
TrainMain = Callable[[Sequence[str], Path], int]


@dataclass
class LocalRun:
    """The shared sync run (fixture ``local_run``): its out dir, its result, and per step (max
    |engine − trainer|, mean |engine − initial weights|) on the probe prompts after the sync."""

    out: Path
    result: TrainResult
    sync: dict[int, tuple[float, float]] = field(default_factory=dict)


def run_overrides(model: Path, out: Path) -> list[str]:
    """A tiny but complete run: 2 prompts × 4 samples, 2 updates per step, checkpoints every
    step, validation at the end. The entropy bonus makes every update move the weights (the
    random tiny model never solves Calc, so its GRPO advantages are 0)."""
    return [
        f"model.path={model}", f"trainer.out_dir={out}", f"trainer.total_steps={STEPS}",
        "trainer.prompts_per_step=2", "trainer.mini_batches=2", f"trainer.val_every={STEPS}",
        "rollout.n=4", "rollout.max_turns=2", "rollout.max_prompt_len=384",
        "rollout.max_response_len=48", "rollout.max_tool_output_tokens=32",
        "data.num_train_tasks=16", "data.num_val_tasks=4",
        "actor.lr=1e-3", "actor.entropy_coef=0.01", "actor.device=cpu",
        "actor.max_tokens_per_micro_batch=2048",
        "engine.dtype=float32", "engine.kv_cache_memory_bytes=67108864",
        "engine.max_num_seqs=16", "engine.enforce_eager=true",
        "checkpoint.every=1", "checkpoint.keep_last=2",
        "logging.progress=false", "logging.wandb=false",
    ]  # fmt: skip


def probe_prompts() -> list[list[int]]:
    """Fixed token ids to score on the engine and the trainer."""
    g = torch.Generator().manual_seed(7)
    return [torch.randint(7, 2048, (n,), generator=g).tolist() for n in (30, 45, 60)]


async def engine_vs_trainer(engine: Any, group: Any, prompts: list[list[int]]) -> list[Any]:
    """The engine samples from each prompt; the trainer scores the same ids. Returns, per
    prompt, ``(prompt, completion ids, engine logprobs, trainer logprobs)``."""
    outs = await asyncio.gather(*(
        engine.generate(p, SamplingParams(max_tokens=12, seed=i), session_id=f"probe{i}")
        for i, p in enumerate(prompts)
    ))  # fmt: skip
    seqs = []
    for p, out in zip(prompts, outs, strict=True):
        ids = torch.tensor([*p, *out.token_ids])
        mask = torch.tensor([0.0] * len(p) + [1.0] * len(out.token_ids))
        seqs.append(TrainSeq(ids, mask, torch.zeros(len(ids)), torch.zeros(len(ids))))
    lps = await group.compute_logprobs(seqs)
    return [
        (p, list(o.token_ids), torch.tensor(o.logprobs), lp[len(p) :])
        for p, o, lp in zip(prompts, outs, lps, strict=True)
    ]


def hf_logprobs(model: Any, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """log p(completion | prompt) per token under an HF model (temperature 1)."""
    ids = torch.tensor([[*prompt, *completion]])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0]


class TrainCLI:
    """``agentloop train`` in subprocesses, each in its own session: SIGKILL to the group takes
    vLLM's processes down with it, like a crash. Killed on teardown if still running."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(
        self, args: Sequence[str], log: Path, *, pythonpath: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """The run, ``pythonpath`` (a folder of modules it imports) in front of PYTHONPATH."""
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
        if pythonpath is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")])
        with log.open("ab") as f:
            proc = subprocess.Popen(
                [sys.executable, "-m", "agentloop.cli", "train", *args],
                stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip
        self.procs.append(proc)
        return proc

    @contextlib.contextmanager
    def finished(
        self, args: Sequence[str], log: Path, *, pythonpath: Path | None = None
    ) -> Iterator[None]:
        """A run that must exit 0 within 900 s (its log's tail in the failure); killed on exit
        of the block if still running."""
        proc = self.spawn(args, log, pythonpath=pythonpath)
        try:
            assert proc.wait(900) == 0, log.read_text()[-3000:]
            yield
        finally:
            if proc.poll() is None:
                self.kill(proc)

    @staticmethod
    def wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float) -> None:
        """Poll (every 0.1 s) until ``path`` exists; fail if the run exits first or time is up."""
        deadline = time.monotonic() + timeout
        while not path.exists():
            assert proc.poll() is None, f"the run exited ({proc.returncode}) before {path} appeared"
            assert time.monotonic() < deadline, f"{path} did not appear in {timeout} s"
            time.sleep(0.1)

    @staticmethod
    def kill(proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL the run's whole process group and reap it."""
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(60)


def train_main(args: Sequence[str], log: Path) -> int:
    """``agentloop train ARGS`` through the console script's entry point (``agentloop.cli.main``:
    the YAML + key=value parsing, the start-up checks, the run, the exit status) in this process,
    what it prints appended to ``log``. A subprocess would add only its interpreter start and its
    imports of torch and vLLM (~10 s a run on a quiet core)."""
    from agentloop.cli import main

    with log.open("a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        return main(["train", *args])


def saved_rows(out: Path, steps: Sequence[int]) -> list[dict[str, Any]]:
    """The trajectory records a run in ``out`` saved for ``steps``, in step order."""
    return [r for s in steps for r in read_jsonl(out / "trajectories" / f"step_{s:06d}.jsonl")]
