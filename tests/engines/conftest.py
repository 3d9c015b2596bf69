"""Engine test fixtures: the HF reference model and its logprobs, the shared vLLM engine serving
the Calc tool caller (the engine itself is in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from vllm_calls import load_weights


@pytest.fixture(scope="session")
def hf_model(tiny_model_dir: Path) -> Any:
    """The tiny model in transformers, fp32, for reference logprobs."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def caller_engine(
    vllm_engine: Any, calc_caller_dir: Path, tiny_model_dir: Path
) -> AsyncIterator[Any]:
    """The shared engine serving the Calc tool caller for one module (multi-turn episodes); the
    tiny model's weights are put back afterwards."""
    await vllm_engine.update_weights(load_weights(calc_caller_dir).items())
    try:
        yield vllm_engine
    finally:
        await vllm_engine.update_weights(load_weights(tiny_model_dir).items())


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
