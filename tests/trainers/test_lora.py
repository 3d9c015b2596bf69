"""LoRA on the FSDP2 policy (``actor.lora``): config checks, adapter-only training, the merged
weights the engines get, checkpoints that refuse another base, PEFT-format export (PEFT itself is
the oracle)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from test_trainer_worker import _seqs, _wcfg
from tiny_models import build_tiny_model
from torch.distributed.checkpoint import FileSystemReader
from transformers import AutoModelForCausalLM

from agentloop.errors import ConfigError
from agentloop.trainers.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from agentloop.trainers.config import TrainConfig, load_config
from agentloop.trainers.dist import init_distributed
from agentloop.trainers.lora_config import LoraConfig
from agentloop.trainers.worker import PolicyWorker

LORA = LoraConfig(rank=4, alpha=8)


@pytest.fixture(scope="module", autouse=True)
def _world_of_one() -> Iterator[None]:
    created = init_distributed()
    yield
    if created:
        dist.destroy_process_group()


def _worker(model: Any = None, **kw: Any) -> PolicyWorker:
    model = build_tiny_model() if model is None else model
    return PolicyWorker(model, _wcfg(lr=1e-2, lora=kw.pop("lora", LORA), **kw))


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local().detach().clone()  # type: ignore[attr-defined]


def _logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


IDS = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(3))


def test_lora_config_errors_name_the_value_and_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"LoraConfig\.rank=-1.*>= 0"):
        LoraConfig(rank=-1)
    with pytest.raises(ConfigError, match=r"LoraConfig\.dropout=1\.0.*\[0, 1\)"):
        LoraConfig(rank=4, dropout=1.0)
    with pytest.raises(ConfigError, match=r"LoraConfig\.target_modules=\(\).*non-empty"):
        LoraConfig(rank=4, target_modules=())
    cfg = load_config(
        TrainConfig, None, ["actor.lora.rank=8", "actor.lora.target_modules=[q_proj]"]
    )
    assert cfg.actor.lora == LoraConfig(rank=8, target_modules=("q_proj",))
    assert not load_config(TrainConfig, None, []).actor.lora.enabled  # off by default


def test_a_target_module_that_matches_nothing_names_the_models_modules() -> None:
    with pytest.raises(
        ConfigError, match=r"\['qkv'\] match no linear layer.*'down_proj'.*'q_proj'"
    ):
        _worker(lora=LoraConfig(rank=4, target_modules=("q_proj", "qkv")))


def test_only_the_adapters_train_and_hold_optimiser_state() -> None:
    w = _worker()
    before = {n: _local(p) for n, p in w.model.named_parameters()}
    trainable = {n for n, p in w.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # every linear of both blocks: 7 targets x 2 layers x (A, B)
    assert len(trainable) == 28 and len(w.optimizer.param_groups[0]["params"]) == 28
    w.train_step(_seqs())
    w.train_step(_seqs())
    changed = {n for n, p in w.model.named_parameters() if not torch.equal(before[n], _local(p))}
    assert changed == trainable
    assert all(p.grad is None for n, p in w.model.named_parameters() if n not in trainable)
    assert len(w.optimizer.state) == 28  # Adam moments for the adapters only


def test_the_engine_weights_are_the_merged_model() -> None:
    """``state_dict_for_inference`` is the plain model's names with ``W + s·B·A``: a plain model
    loading them gives the LoRA model's logits."""
    plain = build_tiny_model()
    w = _worker(copy.deepcopy(plain))
    names = [n for n, _ in w.state_dict_for_inference()]
    assert names == list(plain.state_dict())
    step0 = dict(w.state_dict_for_inference())  # B = 0: the base itself
    assert all(torch.equal(step0[n], t) for n, t in plain.state_dict().items())
    w.train_step(_seqs())
    merged = copy.deepcopy(plain)
    merged.load_state_dict(dict(w.state_dict_for_inference()))
    want = _logits(w.model, IDS)
    torch.testing.assert_close(_logits(merged, IDS), want, atol=1e-5, rtol=0)
    assert not torch.allclose(_logits(plain, IDS), want, atol=1e-3)  # the adapters did move


def test_a_lora_checkpoint_resumes_identically_and_refuses_another_base(tmp_path: Path) -> None:
    """The checkpoint holds the adapters and their Adam state (not the frozen base); a fresh
    worker on the same base continues with the very same step; another base is refused."""
    seqs = _seqs()
    w = _worker(warmup_steps=3)
    w.train_step(seqs)
    path = save_checkpoint(w, tmp_path)
    saved = FileSystemReader(path).read_metadata().state_dict_metadata
    weights = {k.removeprefix("model.") for k in saved if k.startswith("model.")}
    assert weights == {n for n, p in w.model.named_parameters() if p.requires_grad}
    want = w.train_step(seqs)
    resumed = _worker(warmup_steps=3)
    load_checkpoint(resumed, path)
    assert resumed.step == 1
    got = resumed.train_step(seqs)
    for key in ("loss", "grad_norm", "lr", "clipfrac"):
        assert got[key] == want[key], key
    for (n, a), (_, b) in zip(
        w.state_dict_for_inference(), resumed.state_dict_for_inference(), strict=True
    ):
        assert torch.equal(a, b), n
    with pytest.raises(CheckpointError, match=r"another base model.*fingerprint"):
        load_checkpoint(_worker(build_tiny_model(seed=1)), path)
    with pytest.raises(CheckpointError, match=r"LoRA rank=4 but this worker's is 8"):
        load_checkpoint(_worker(lora=LoraConfig(rank=8, alpha=8)), path)
    with pytest.raises(CheckpointError, match=r"LoRA \(rank 4\).*actor\.lora\.rank=4"):
        load_checkpoint(PolicyWorker(build_tiny_model(), _wcfg()), path)


def test_the_adapter_exports_in_peft_format_and_merged(tmp_path: Path) -> None:
    """PEFT's own loader reads the adapter dir onto the base and gives the trained logits;
    ``save_pretrained`` writes the merged model, which transformers loads as a plain model."""
    from peft import PeftModel

    base_dir = tmp_path / "base"
    build_tiny_model().save_pretrained(base_dir)
    w = _worker(base_dir)
    w.train_step(_seqs())
    want = _logits(w.model, IDS)
    w.save_adapter(tmp_path / "adapter")
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    peft = PeftModel.from_pretrained(base, tmp_path / "adapter")
    torch.testing.assert_close(_logits(peft, IDS), want, atol=1e-6, rtol=0)
    w.save_pretrained(tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    torch.testing.assert_close(_logits(merged, IDS), want, atol=1e-5, rtol=0)
    with pytest.raises(ConfigError, match="save_adapter needs a LoRA policy"):
        PolicyWorker(build_tiny_model(), _wcfg()).save_adapter(tmp_path / "nothing")
