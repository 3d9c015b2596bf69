"""VLLMEngine pieces that need no running engine: config, weight packing, output mapping."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agentloop.engines.base import SamplingParams
from agentloop.errors import ConfigError, InferenceError


def test_config_validation(tmp_path: Path) -> None:
    from agentloop.engines.vllm import VLLMConfig, VLLMEngine

    with pytest.raises(ConfigError, match="is not a directory"):
        VLLMConfig(model=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="max_model_len must be >= 1"):
        VLLMConfig(model=str(tmp_path), max_model_len=0)
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        VLLMConfig(model=str(tmp_path), gpu_memory_utilization=1.5)
    with pytest.raises(ConfigError, match="weight_transport"):
        VLLMConfig(model=str(tmp_path), weight_transport="nccl")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"may not set \['logprobs_mode'\]"):
        VLLMConfig(model=str(tmp_path), engine_args={"logprobs_mode": "raw_logprobs"})
    with pytest.raises(ConfigError, match=r"unknown VLLMEngine setting\(s\) \['max_len'\]"):
        VLLMEngine.create(tmp_path, max_len=5)
    cfg = VLLMEngine.create(tmp_path, engine_args={"block_size": 16}).config
    assert cfg.model == str(tmp_path) and cfg.engine_args["block_size"] == 16


async def test_not_started_is_a_clear_error(tmp_path: Path) -> None:
    from agentloop.engines.vllm import VLLMEngine

    engine = VLLMEngine.create(tmp_path)
    assert not engine.started
    with pytest.raises(InferenceError, match=r"not running.*async with VLLMEngine.create"):
        await engine.generate([1, 2], SamplingParams())
    with pytest.raises(InferenceError, match="not running"):
        await engine.update_weights([])
    await engine.shutdown()  # idempotent, and harmless before start


def test_pack_tensors_checks_names_and_shapes_and_unshares() -> None:
    import torch

    from agentloop.engines.vllm_ext import pack_tensors

    shapes = {"model.embed_tokens.weight": (4, 2), "lm_head.weight": (4, 2)}
    tied = torch.ones(4, 2)
    packed = pack_tensors([("model.embed_tokens.weight", tied), ("lm_head.weight", tied)], shapes)
    a, b = packed["model.embed_tokens.weight"], packed["lm_head.weight"]
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    assert torch.equal(a, b)
    with pytest.raises(ConfigError, match=r"did you mean \['model.embed_tokens.weight'\]"):
        pack_tensors([("embed_tokens.weight", tied)], shapes)
    with pytest.raises(ConfigError, match=r"has shape \(2, 4\), the checkpoint has \(4, 2\)"):
        pack_tensors([("lm_head.weight", tied.T)], shapes)
    with pytest.raises(ConfigError, match="twice"):
        pack_tensors([("lm_head.weight", tied), ("lm_head.weight", tied)], shapes)
    assert set(pack_tensors([("anything", tied.T)], {})) == {"anything"}  # no checkpoint: no check


def test_safetensors_round_trip(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load, load_file

    from agentloop.engines.vllm_ext import checkpoint_shapes, safetensors_bytes, write_safetensors

    tensors = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.zeros(1, dtype=torch.bfloat16)}
    path = write_safetensors(tensors, str(tmp_path))
    assert Path(path).parent == tmp_path
    assert checkpoint_shapes(tmp_path) == {"a": (2, 3), "b": (1,)}
    assert torch.equal(load_file(path)["a"], tensors["a"])
    assert torch.equal(load(safetensors_bytes(tensors))["a"], tensors["a"])
    fallback = write_safetensors(tensors, str(tmp_path / "no-such-dir"))
    Path(fallback).unlink()


def _output(**kw: Any) -> Any:
    base = {
        "token_ids": [5, 2],
        "logprobs": [{5: SimpleNamespace(logprob=-1.5)}, {2: SimpleNamespace(logprob=-0.5)}],
        "finish_reason": "stop",
        "stop_reason": None,
    }
    return SimpleNamespace(**{**base, **kw})


def test_output_mapping() -> None:
    from agentloop.engines.vllm import _completion

    out = _completion(_output(), "r1")
    assert (out.token_ids, out.logprobs, out.finish_reason) == ((5, 2), (-1.5, -0.5), "stop")
    assert _completion(_output(finish_reason="length"), "r").finish_reason == "length"
    assert _completion(_output(finish_reason="abort"), "r").finish_reason == "abort"
    with pytest.raises(InferenceError, match="finish reason 'error'"):
        _completion(_output(finish_reason="error"), "r")
    with pytest.raises(InferenceError, match="2 tokens but 1 logprob"):
        _completion(_output(logprobs=[{5: SimpleNamespace(logprob=-1.0)}]), "r")
    with pytest.raises(InferenceError, match="no logprob for sampled token 2"):
        _completion(_output(logprobs=[{5: SimpleNamespace(logprob=-1)}, {7: None}]), "r")


def test_sampling_mapping() -> None:
    pytest.importorskip("vllm")
    from agentloop.engines.vllm import _vllm_sampling

    params = _vllm_sampling(
        SamplingParams(max_tokens=7, temperature=0.5, top_p=0.9, seed=3, stop_token_ids=(2, 4))
    )
    assert (params.max_tokens, params.temperature, params.top_p, params.seed) == (7, 0.5, 0.9, 3)
    assert params.top_k == 0  # vLLM's "off"
    assert params.logprobs == 0 and params.detokenize is False and params.n == 1
    assert list(params.stop_token_ids) == [2, 4]
    assert _vllm_sampling(SamplingParams(top_k=5)).top_k == 5


def test_direct_copy_targets_map_checkpoint_tensors_into_fused_parameters() -> None:
    import torch

    from agentloop.engines.vllm_ext import direct_copy_targets

    class Served(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
            self.attn = torch.nn.Module()
            self.attn.qkv_proj = torch.nn.Linear(4, 8 + 2 + 2)
            self.embed = torch.nn.Embedding(12, 4)  # vocab padded from 10 to 12 rows

    m = Served()
    shapes = [("attn.q_proj.weight", (8, 4)), ("attn.k_proj.weight", (2, 4)),
              ("attn.v_proj.weight", (2, 4)), ("attn.k_proj.bias", (2,)),
              ("attn.q_proj.bias", (8,)), ("attn.v_proj.bias", (2,)),
              ("embed.weight", (10, 4))]  # fmt: skip
    targets = direct_copy_targets(m, shapes)
    assert targets is not None
    qkv_w, qkv_b, emb = m.attn.qkv_proj.weight, m.attn.qkv_proj.bias, m.embed.weight
    expected = [(qkv_w, 0, 8), (qkv_w, 8, 2), (qkv_w, 10, 2), (qkv_b, 8, 2), (qkv_b, 0, 8),
                (qkv_b, 10, 2), (emb, 0, 10)]  # fmt: skip
    # views of the parameters' rows: writing into one writes into the served model
    rows = [(p[s:].data_ptr(), r) for p, s, r in expected]
    assert [(t.data_ptr(), len(t)) for t in targets] == rows
    # no place for a tensor: a missing sibling, other trailing dims, too many rows, unknown name
    assert direct_copy_targets(m, shapes[:1]) is None
    assert direct_copy_targets(m, [("embed.weight", (10, 5))]) is None
    assert direct_copy_targets(m, [("embed.weight", (13, 4))]) is None
    assert direct_copy_targets(m, [("lm_head.weight", (10, 4))]) is None
