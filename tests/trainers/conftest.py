"""Trainer fixtures: tiny models built from a config, and the heavy things the pipeline tests start.

Each fixture that starts something (a GRPO run on vLLM, ``agentloop train`` subprocesses, a Ray
cluster, a run that starts Ray itself) is named in ``tests/tiers.py``: the tests that use one are
tiered by it. ``local_run`` is the one sync GRPO run on vLLM that several modules read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from grpo_helpers import (
    LocalRun,
    TrainCLI,
    TrainMain,
    TrainRun,
    engine_vs_trainer,
    hf_logprobs,
    probe_prompts,
    run_overrides,
)
from grpo_helpers import train_main as run_train_main
from tiny_models import build_tiny_model, write_micro_model
from transformers import Qwen2ForCausalLM

from agentloop.trainers.config import TrainConfig, load_config
from agentloop.trainers.grpo import StepInfo, TrainResult, train_async

OnStep = Callable[[StepInfo], Any]


@pytest.fixture
def tiny_model() -> Callable[..., Qwen2ForCausalLM]:
    return build_tiny_model


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    # tiny tensors: intra-op threads only add contention on a shared 2-core machine
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def micro_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's tokenizer with a much smaller Qwen2 (no vLLM here: any head_dim works)."""
    return write_micro_model(tiny_model_dir, tmp_path_factory.mktemp("micro-model"))


def _train(overrides: Sequence[str], on_step: OnStep | None = None) -> TrainResult:
    return asyncio.run(
        train_async(load_config(TrainConfig, None, list(overrides)), on_step=on_step)
    )


@pytest.fixture(scope="session")
def train_run() -> TrainRun:
    """``train_run(overrides, on_step=None)``: GRPO in this process, with its own vLLM engine(s)
    (and Ray when the overrides ask for it)."""
    pytest.importorskip("vllm")
    return _train


@pytest.fixture(scope="session")
def local_run(
    train_run: TrainRun, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> LocalRun:
    """grpo_helpers.run_overrides in sync local mode (STEPS steps), the weight sync checked by
    numbers after every step; the episodes played by two loop workers (``rollout.loop_workers``),
    so the engine-vs-trainer logprob checks also hold the workers' trajectories token-exact."""
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    out = tmp_path_factory.mktemp("grpo-local") / "run"
    sync: dict[int, tuple[float, float]] = {}

    async def check_sync(info: StepInfo) -> None:
        assert info.group.engine is not None
        rows = await engine_vs_trainer(info.group.engine, info.group, probe_prompts())
        diff = max(float((e - t).abs().max()) for _, _, e, t in rows)
        moved = [float((e - hf_logprobs(initial, p, c)).abs().mean()) for p, c, e, _ in rows]
        sync[info.step] = (diff, sum(moved) / len(moved))

    overrides = [*run_overrides(tiny_model_dir, out), "rollout.loop_workers=2"]
    result = train_run(overrides, on_step=check_sync)
    return LocalRun(out, result, sync)


@pytest.fixture(scope="session")
def train_main() -> TrainMain:
    """``train_main(args, log)``: ``agentloop train ARGS`` in this process (its own vLLM engine),
    output appended to ``log``; returns the exit status."""
    pytest.importorskip("vllm")
    return run_train_main


@pytest.fixture
def train_cli() -> Iterator[TrainCLI]:
    """Spawns ``agentloop train`` runs (each starts vLLM); kills those still running after."""
    pytest.importorskip("vllm")
    cli = TrainCLI()
    yield cli
    for proc in cli.procs:
        if proc.poll() is None:
            cli.kill(proc)


@pytest.fixture(scope="module")  # its processes go when the module is done
def ray_cluster() -> Iterator[Any]:
    """Two Ray nodes of one CPU each, on this machine; shut down (only them) afterwards."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        # nice 0, as agentloop's own Ray (trainers/ray_group.py): at Ray's default 15 the other
        # test lane starves these workers
        head_node_args={
            "num_cpus": 1,
            "object_store_memory": 128 << 20,
            "_system_config": {"worker_niceness": 0},
        },
    )
    try:
        cluster.add_node(num_cpus=1, object_store_memory=128 << 20)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


@pytest.fixture
def local_ray() -> Iterator[None]:
    """For a run that starts Ray itself (``ray.num_cpus``): the run must leave no Ray
    connection behind."""
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    yield
    left_open = ray.is_initialized()
    if left_open:
        ray.shutdown()
    assert not left_open, "the run left its Ray connection open"
