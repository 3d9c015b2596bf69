"""FakeEngine and HFEngine: token-in/token-out, finish reasons, seeds, logprobs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from agentloop.cli import main
from agentloop.engines.base import Engine, SamplingParams
from agentloop.engines.fake import FakeEngine
from agentloop.engines.hf import HFEngine
from agentloop.errors import ConfigError, InferenceError


def test_sampling_params_validate() -> None:
    with pytest.raises(ConfigError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ConfigError, match="max_tokens"):
        SamplingParams(max_tokens=0)


def test_fake_engine_stops_like_an_engine() -> None:
    engine = FakeEngine([[5, 6, 2, 7], [5, 6, 7, 8, 9]], eos_token_id=2)
    assert isinstance(engine, Engine)
    first = asyncio.run(engine.generate([1], SamplingParams(max_tokens=10)))
    assert first.token_ids == (5, 6, 2) and first.finish_reason == "stop"
    cut = asyncio.run(engine.generate([1], SamplingParams(max_tokens=3)))
    assert cut.token_ids == (5, 6, 7) and cut.finish_reason == "length"
    with pytest.raises(InferenceError, match="script has 2 responses"):
        asyncio.run(engine.generate([1], SamplingParams()))


@pytest.fixture(scope="module")
def hf_engine(tiny_model_dir: Path) -> HFEngine:
    return HFEngine.from_pretrained(tiny_model_dir)


def test_hf_engine_token_in_token_out(hf_engine: HFEngine, tokenizer: Any) -> None:
    prompt = tokenizer.encode("What is 2 + 2?", add_special_tokens=False)
    sampling = SamplingParams(max_tokens=12, temperature=1.0, seed=7)
    out = asyncio.run(hf_engine.generate(prompt, sampling))
    assert 1 <= len(out.token_ids) <= 12 and len(out.logprobs) == len(out.token_ids)
    assert out.finish_reason in ("stop", "length")
    again = asyncio.run(hf_engine.generate(prompt, sampling))
    assert again == out  # a fixed seed reproduces
    other = asyncio.run(hf_engine.generate(prompt, sampling.with_(seed=8)))
    assert other.token_ids != out.token_ids

    # Logprobs are those of the sampled tokens under the model, recomputed independently.
    ids = torch.tensor([prompt + list(out.token_ids)])
    with torch.no_grad():
        logits = hf_engine.model(ids).logits[0, len(prompt) - 1 : -1].float()
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-4)


def test_hf_engine_rejects_overlong_requests(hf_engine: HFEngine) -> None:
    with pytest.raises(InferenceError, match="max_position_embeddings"):
        asyncio.run(hf_engine.generate([1] * 10, SamplingParams(max_tokens=100_000)))


def test_hf_engine_settings_are_checked_by_name(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``agentloop eval --engine hf`` with a vLLM setting or a bad dtype: a clear error, exit 2."""
    base = ["eval", "--env", "agentloop/Calc-v0", "--model", str(tiny_model_dir), "--engine", "hf"]
    assert main([*base, "--out", str(tmp_path / "a"), "--engine-arg", "enforce_eager=true"]) == 2
    err = capsys.readouterr().err
    known = "known: ['dtype', 'weight_sync_timeout_s']"
    assert f"unknown HFEngine setting(s) ['enforce_eager']; {known}" in err
    assert "Traceback" not in err
    with pytest.raises(ConfigError, match=r"HFEngine dtype='float16x': must be one of"):
        HFEngine.from_settings(tiny_model_dir, {"dtype": "float16x"})
