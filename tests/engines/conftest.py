"""Engine test fixtures: the HF reference model and its logprobs (the shared vLLM engine is in
tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest


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
