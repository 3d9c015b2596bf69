"""Engine test fixtures: one vLLM engine for the whole session, and an HF reference model."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # before anything imports vllm

# Settings of the one shared vLLM engine: small, fp32 (exact comparison with HF), eager (no
# torch.compile at start-up on a CPU).
VLLM_SETTINGS: dict[str, Any] = {
    "dtype": "float32",
    "max_model_len": 512,
    "max_num_seqs": 32,
    "kv_cache_memory_bytes": 128 << 20,
    "enforce_eager": True,
    "seed": 0,
}


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def vllm_engine(tiny_model_dir: Path) -> AsyncIterator[Any]:
    """The shared VLLMEngine on the tiny model. Teardown checks that vLLM left no process."""
    pytest.importorskip("vllm")
    import psutil

    from agentloop.engines.vllm import VLLMEngine
    from agentloop.testing.processes import vllm_processes

    started = time.time()
    engine = VLLMEngine.create(tiny_model_dir, **VLLM_SETTINGS)
    async with engine:
        pids = engine.pids
        assert pids, "VLLMEngine found no engine processes to track"
        yield engine
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert not alive, f"vLLM processes {alive} survived shutdown"
    left = vllm_processes(since=started)
    assert not left, f"vLLM processes left: {left}"


@pytest.fixture(scope="session")
def calc_caller_dir(tiny_model_dir: Path) -> Path:
    """The tiny model taught to call Calc's python tool (built once, cached on disk)."""
    from agentloop.testing.calc_caller import calc_caller_model_dir

    return calc_caller_model_dir(base=tiny_model_dir)


@pytest.fixture(scope="session")
def hf_model(tiny_model_dir: Path) -> Any:
    """The tiny model in transformers, fp32, for reference logprobs."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def hf_logprobs() -> Any:
    """The reference-logprob function below, as a fixture (conftest is not importable)."""
    return reference_logprobs


def reference_logprobs(
    model: Any,
    prompt: Sequence[int],
    completion: Sequence[int],
    *,
    temperature: float = 1.0,
    top_k: int = -1,
    banned: Sequence[int] = (),
) -> list[float]:
    """log p(completion[i] | prompt + completion[:i]) under the sampled distribution:
    ``log_softmax(logits / T)`` restricted to the top-k (raw logits when ``T == 0``), with the
    ``banned`` ids' logits at -inf."""
    import torch

    ids = torch.tensor([[*prompt, *completion]])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    logits[:, list(banned)] = float("-inf")
    if temperature > 0:
        logits = logits / temperature
    if top_k > 0:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    logprobs = torch.log_softmax(logits, dim=-1)
    return logprobs.gather(1, torch.tensor(completion)[:, None])[:, 0].tolist()
