"""GRPO on several GPUs (marker ``gpu``; skipped with fewer than 2): ``placement: ray`` with one
colocated FSDP2 worker and one vLLM replica per GPU behind the session-sticky router, and the
disaggregated mode (a trainer GPU, a rollout GPU, weights pushed over NCCL in buckets).

Checked by numbers: after every step each replica scores like the trainer's new weights (and
unlike the initial ones); sleeping the engines frees their GPU memory and waking them restores
it; the last step, replayed on one GPU from the multi-GPU checkpoint, gives the same loss and
grad-norm to bf16 tolerance; the rollout GPU serves the trainer's final weights. Run on the GPU
machine with ``bench/gpu/multi_gpu.sh``.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from grpo_helpers import STEPS, TrainRun, engine_vs_trainer, hf_logprobs, probe_prompts
from grpo_helpers import run_overrides as cpu_overrides

from agentloop.trainers.grpo import StepInfo
from agentloop.trainers.metrics import read_metrics

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]
pytest.importorskip("vllm")
pytest.importorskip("ray")

GIB = 1 << 30
KV_CACHE = 2 * GIB  # per engine: large enough that sleeping it shows in the GPU's memory
BF16_SCORE = 0.1  # max |engine − trainer| logprob, bf16 engine vs bf16-compute trainer
CHUNK = 1 << 20  # weight syncs of the tiny model (~3 MB in bf16) load in several chunks


def gpu_overrides(model: Path, out: Path) -> list[str]:
    """The CPU pipeline run (grpo_helpers.run_overrides) moved to CUDA in bf16, with a larger
    learning rate so every step moves the weights well past bf16 noise."""
    return [
        *cpu_overrides(model, out), "actor.device=cuda", "actor.dtype=bfloat16", "actor.lr=1e-2",
        "engine.dtype=bfloat16", f"engine.kv_cache_memory_bytes={KV_CACHE}",
        f"engine.weight_chunk_bytes={CHUNK}", "data.env_kwargs.sandbox=fake",
    ]  # fmt: skip


def used_mib() -> list[int]:
    """Memory in use on each GPU (all processes), from nvidia-smi: the driver creates no
    CUDA context of its own."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [int(line) for line in out.split()]


@dataclass
class GpuRun:
    out: Path
    info: list[dict[str, Any]] = field(default_factory=list)
    # step → per replica, (max |engine − trainer|, mean |engine − initial weights|)
    sync: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    memory: dict[str, list[int]] = field(default_factory=dict)  # awake / asleep / woken → MiB


@pytest.fixture(scope="module")
def gpu_run(train_run: TrainRun, tiny_model_dir: Path, tmp_path_factory: Any) -> GpuRun:
    import ray
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    gpus = torch.cuda.device_count()
    out = tmp_path_factory.mktemp("grpo-gpus") / "run"
    overrides = [*gpu_overrides(tiny_model_dir, out), "trainer.placement=ray",
                 f"trainer.num_workers={gpus}", "checkpoint.every=2"]  # fmt: skip
    run = GpuRun(out)

    async def check(info: StepInfo) -> None:
        run.info = info.group.info
        if info.step == 1:  # sleep frees each engine's memory; waking brings it back
            run.memory["awake"] = used_mib()
            await info.group.sleep_engines()
            run.memory["asleep"] = used_mib()
            await info.group.wake_engines()
            run.memory["woken"] = used_mib()
        rows_per_replica = []
        for replica in info.group.engine.engines:  # type: ignore[union-attr]
            rows = await engine_vs_trainer(replica, info.group, probe_prompts())
            diff = max(float((e - t).abs().max()) for _, _, e, t in rows)
            moved = [float((e - hf_logprobs(initial, p, c)).abs().mean()) for p, c, e, _ in rows]
            rows_per_replica.append((diff, sum(moved) / len(moved)))
        run.sync[info.step] = rows_per_replica

    train_run(overrides, on_step=check)
    assert not ray.is_initialized()  # the run shut down the Ray it started
    print(f"\nGPU run: sync {run.sync}, memory MiB {run.memory}, workers {run.info}")
    return run


def test_each_gpu_runs_one_worker_and_one_replica(gpu_run: GpuRun) -> None:
    gpus = torch.cuda.device_count()
    assert [w["rank"] for w in gpu_run.info] == list(range(gpus))
    assert all(len(per_step) == gpus for per_step in gpu_run.sync.values())


def test_every_replica_gets_the_new_weights_after_every_step(gpu_run: GpuRun) -> None:
    metrics = read_metrics(gpu_run.out)
    assert sorted(metrics) == list(range(1, STEPS + 1))
    assert sorted(gpu_run.sync) == list(range(1, STEPS + 1))
    for step, replicas in gpu_run.sync.items():
        assert metrics[step]["actor/grad_norm"] > 0
        assert metrics[step]["sync/chunks"] > 1  # loaded chunk by chunk
        for diff, moved in replicas:
            assert diff < BF16_SCORE, (step, replicas)  # scores like the trainer now
            assert moved > 2 * diff, (step, replicas)  # and not like the initial weights


def test_sleeping_the_engines_frees_their_memory_and_waking_restores_it(gpu_run: GpuRun) -> None:
    awake, asleep, woken = (gpu_run.memory[k] for k in ("awake", "asleep", "woken"))
    kv_mib = KV_CACHE >> 20
    for gpu in range(torch.cuda.device_count()):
        assert awake[gpu] - asleep[gpu] >= 0.9 * kv_mib, gpu_run.memory
        assert abs(woken[gpu] - awake[gpu]) <= 0.1 * kv_mib, gpu_run.memory


def test_the_last_step_replayed_on_one_gpu_gives_the_same_loss_and_grad_norm(
    gpu_run: GpuRun, train_run: TrainRun, tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "replay"
    overrides = [
        *gpu_overrides(tiny_model_dir, out),
        f"checkpoint.resume={gpu_run.out / 'checkpoints' / 'step_00000002'}",
        f"rollout.replay={gpu_run.out / 'trajectories'}", "trainer.val_every=0",
        "checkpoint.export_final=false",
    ]  # fmt: skip
    assert train_run(overrides).last_step == STEPS
    many, one = read_metrics(gpu_run.out)[STEPS], read_metrics(out)[STEPS]
    print(f"\n{torch.cuda.device_count()} GPUs: {many}\n1 GPU: {one}")
    for key in ("actor/loss", "actor/grad_norm", "actor/entropy", "actor/tokens"):
        assert one[key] == pytest.approx(many[key], rel=2e-2, abs=1e-4), key


@pytest.mark.parametrize("tp", [1, 2], ids=["tp1", "tp2"])
def test_disaggregated_rollouts_on_their_own_gpus_get_the_weights_over_nccl(
    local_ray: None, train_run: TrainRun, tiny_model_dir: Path, tmp_path: Path, tp: int
) -> None:
    """A trainer GPU and a rollout worker whose engine spans ``tp`` GPUs (tensor parallel):
    the push streams over NCCL in buckets and the engine loads it chunk by chunk."""
    if torch.cuda.device_count() < 1 + tp:
        pytest.skip(f"needs {1 + tp} CUDA GPUs")
    out = tmp_path / "disagg"
    overrides = [
        *gpu_overrides(tiny_model_dir, out), "trainer.placement=ray", "trainer.num_workers=1",
        "trainer.rollout_workers=1", "trainer.mode=async", "trainer.max_staleness=1",
        "actor.tis_cap=2.0", "trainer.val_every=0",
        f"engine.tensor_parallel_size={tp}", f"ray.gpus_per_rollout_worker={tp}",
    ]  # fmt: skip
    seen: dict[str, Any] = {}

    async def on_step(info: StepInfo) -> None:
        pool = info.group.pool
        assert pool is not None and info.group.engine is pool
        if info.step == STEPS:  # the rollout GPU serves the trainer's final weights
            rows = await engine_vs_trainer(pool, info.group, probe_prompts())
            seen["diff"] = max(float((e - t).abs().max()) for _, _, e, t in rows)

    train_run(overrides, on_step=on_step)
    metrics = read_metrics(out)
    print(f"\ndisaggregated: {seen}; last step {metrics[STEPS]}")
    assert sorted(metrics) == list(range(1, STEPS + 1))
    assert seen["diff"] < BF16_SCORE, seen
    for step, m in metrics.items():
        assert m["rollout/failed_frac"] == 0 and m["actor/grad_norm"] > 0, step
        assert m["sync/bytes"] > 0 and m["sync/push_s"] > 0, step
        assert m["async/staleness_max"] <= 1, step
