"""PolicyWorker on real FSDP2 (gloo on CPU, NCCL on GPUs): learning, mask, invariance, export."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from tiny_models import build_tiny_model, tiny_qwen2_config
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from agentloop.errors import ConfigError
from agentloop.trainers.checkpoint import (
    RngState,
    RunState,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from agentloop.trainers.dist import init_distributed, run_local_ranks
from agentloop.trainers.logprobs import token_logprobs
from agentloop.trainers.packing import TrainSeq, dp_partition, pack
from agentloop.trainers.rollouts import SourceState
from agentloop.trainers.worker import PolicyWorker, WorkerConfig

# prompt (mask 0), response, observation (mask 0), response, trailing observation (mask 0)
LENGTHS = [11, 18, 8, 14, 21, 9, 16, 12]


def _config() -> Qwen2Config:
    return tiny_qwen2_config()


def _model(seed: int = 0) -> Qwen2ForCausalLM:
    return build_tiny_model(seed=seed)


def _wcfg(**kw: Any) -> WorkerConfig:
    base: dict[str, Any] = dict(
        lr=1e-3, device="cpu", max_tokens_per_micro_batch=32, clip_ratio_high=0.28,
        kl_coef=0.1, entropy_coef=0.01, tis_cap=2.0,
    )  # fmt: skip
    return WorkerConfig(**{**base, **kw})


def _mask(n: int) -> torch.Tensor:
    m = torch.zeros(n)
    a, b, c = n // 4, n // 2, n // 2 + 2
    m[a:b] = 1.0
    m[c : n - 2] = 1.0
    return m


def _seqs() -> list[TrainSeq]:
    """Multi-turn-like sequences with old/rollout/ref logprobs near the initial model's."""
    g = torch.Generator().manual_seed(1)
    model = _model()
    out = []
    for i, n in enumerate(LENGTHS):
        m = _mask(n)
        s = TrainSeq(
            token_ids=torch.randint(0, 128, (n,), generator=g),
            loss_mask=m,
            advantages=(1.0 if i % 2 else -0.8) * m,
            rollout_logprobs=torch.zeros(n),
        )
        with torch.no_grad():
            lp = token_logprobs(model, pack([s])).logprobs[0]
        noise = 0.2 * torch.randn(n, generator=g) * m
        out.append(dataclasses.replace(
            s, old_logprobs=lp + noise, rollout_logprobs=lp + 0.5 * noise, ref_logprobs=lp - noise
        ))  # fmt: skip
    return out


@pytest.fixture(scope="module", autouse=True)
def _world_of_one() -> Iterator[None]:
    """The in-process tests run as a world of 1 (what PolicyWorker creates on its own)."""
    created = init_distributed()
    yield
    if created:
        dist.destroy_process_group()


def _grads(w: PolicyWorker) -> dict[str, torch.Tensor]:
    return {
        n: p.grad.full_tensor().clone()  # type: ignore[union-attr]
        for n, p in w.model.named_parameters()
    }


def test_config_errors_name_the_field_and_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"WorkerConfig\.loss_agg_mode='mean'.*one of"):
        WorkerConfig(loss_agg_mode="mean")
    with pytest.raises(ConfigError, match=r"WorkerConfig\.norm_len=None.*max response length"):
        WorkerConfig(loss_agg_mode="seq-mean-token-sum-norm")
    with pytest.raises(ConfigError, match=r"WorkerConfig\.attn_implementation='sdpa_paged'"):
        WorkerConfig(attn_implementation="sdpa_paged")
    with pytest.raises(ConfigError, match=r"WorkerConfig\.lr=-1"):
        WorkerConfig(lr=-1)
    with pytest.raises(ConfigError, match=r"WorkerConfig\.clip_ratio_c=1.0"):
        WorkerConfig(clip_ratio_c=1.0)


def test_train_step_learns_a_fixed_batch() -> None:
    seqs = _seqs()
    w = PolicyWorker(_config(), _wcfg(lr=3e-3, kl_coef=0.0, entropy_coef=0.0, warmup_steps=2))
    before = w.compute_logprobs(seqs)
    metrics = [w.train_step(seqs) for _ in range(3)]
    after = w.compute_logprobs(seqs)
    losses = [m["loss"] for m in metrics]
    assert losses[-1] < losses[0] - 0.05, losses
    assert [m["lr"] for m in metrics] == pytest.approx([1.5e-3, 3e-3, 3e-3])
    assert metrics[0]["tokens"] == sum(float(_mask(n)[1:].sum()) for n in LENGTHS)
    assert all(m["grad_norm"] > 0 and m["step_skipped"] == 0 for m in metrics)
    assert metrics[-1]["clipfrac"] > metrics[0]["clipfrac"]  # ratios moved out of the trust region
    assert metrics[0]["rollout_abs_diff"] > 0 and metrics[0]["tis_mean"] > 0
    # positive advantages raised their sampled tokens' logprobs, negative ones lowered them
    for s, b, a in zip(seqs, before, after, strict=True):
        delta = ((a - b) * s.loss_mask).sum()
        assert delta * s.advantages.sum() > 0


def test_masked_positions_give_exactly_zero_gradient() -> None:
    """Anything at loss-mask-0 positions (advantages, logprobs, trailing observation tokens)
    leaves the gradient bit-for-bit unchanged."""
    seqs = _seqs()
    g = torch.Generator().manual_seed(7)
    noisy = []
    for s in seqs:
        off = s.loss_mask == 0
        tail = torch.zeros_like(off)
        tail[-2:] = True  # after the last loss token: no loss token ever sees these ids

        def junk(x: torch.Tensor, where: torch.Tensor = off) -> torch.Tensor:
            return torch.where(where, 50 * torch.randn(x.shape, generator=g), x)

        ids = torch.where(tail, torch.randint(0, 128, s.token_ids.shape, generator=g), s.token_ids)
        assert s.old_logprobs is not None and s.ref_logprobs is not None
        noisy.append(dataclasses.replace(
            s, token_ids=ids, advantages=junk(s.advantages), old_logprobs=junk(s.old_logprobs),
            rollout_logprobs=junk(s.rollout_logprobs), ref_logprobs=junk(s.ref_logprobs),
        ))  # fmt: skip
    assert any(not torch.equal(a.token_ids, b.token_ids) for a, b in zip(seqs, noisy, strict=True))
    grads = []
    for batch in (seqs, noisy):
        w = PolicyWorker(_model(), _wcfg())
        m = w.train_step(batch)
        assert m["kl"] > 0 and m["entropy"] > 0
        grads.append(_grads(w))
    for name, g0 in grads[0].items():
        assert torch.equal(g0, grads[1][name]), name
    assert max(float(x.abs().max()) for x in grads[0].values()) > 1e-3


def test_without_old_logprobs_the_step_is_on_policy() -> None:
    seqs = [dataclasses.replace(s, old_logprobs=None, ref_logprobs=None) for s in _seqs()]
    w = PolicyWorker(_config(), _wcfg(kl_coef=0.1))
    with pytest.raises(ConfigError, match=r"kl_coef=0.1 but some sequences have no ref_logprobs"):
        w.train_step(seqs)
    w = PolicyWorker(_config(), _wcfg(kl_coef=0.0, tis_cap=None))
    m = w.train_step(seqs)
    assert m["approx_kl"] == 0.0 and m["clipfrac"] == 0.0 and m["kl"] == 0.0
    # ratio 1: the PPO loss is minus the token-mean advantage
    adv = sum(float((s.advantages * s.loss_mask)[1:].sum()) for s in seqs)
    assert m["pg_loss"] == pytest.approx(-adv / m["tokens"], rel=1e-6)


def test_compute_logprobs_and_inference_state_dict_match_the_plain_model(tmp_path: Path) -> None:
    seqs = _seqs()
    plain = _model()
    w = PolicyWorker(copy.deepcopy(plain), _wcfg(max_tokens_per_micro_batch=20))
    got = w.compute_logprobs(seqs)
    for s, lp in zip(seqs, got, strict=True):
        with torch.no_grad():
            want = token_logprobs(plain, pack([s])).logprobs[0]
        torch.testing.assert_close(lp, want, atol=1e-5, rtol=1e-5)
    exported = dict(w.state_dict_for_inference())
    reference = plain.state_dict()
    assert list(exported) == list(reference) and "lm_head.weight" in exported
    for name, t in reference.items():
        assert torch.equal(exported[name], t), name
    bf16 = next(iter(w.state_dict_for_inference(dtype=torch.bfloat16)))[1]
    assert bf16.dtype == torch.bfloat16


@pytest.mark.parametrize("tied", [False, True])
def test_save_pretrained_round_trips_through_from_pretrained(tmp_path: Path, tied: bool) -> None:
    src = tmp_path / "src"
    plain = _model()
    if tied:
        plain.config.tie_word_embeddings = True
        plain.tie_weights()
        assert plain.lm_head.weight is plain.model.embed_tokens.weight
    plain.save_pretrained(src)
    (src / "tokenizer.json").write_text("{}")
    w = PolicyWorker(src, _wcfg())
    w.train_step(_seqs())
    names = [n for n, _ in w.state_dict_for_inference()]
    # the checkpoint's names: a tied lm_head is not stored (vLLM's reload expects exactly these)
    assert names == [n for n in plain.state_dict() if not (tied and n == "lm_head.weight")]
    w.save_pretrained(tmp_path / "out")
    w.save_pretrained(tmp_path / "bf16", dtype=torch.bfloat16)
    assert (tmp_path / "out" / "tokenizer.json").read_text() == "{}"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    ids = torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(3))
    w.model.eval()
    with torch.no_grad():
        want = w.model(input_ids=ids, use_cache=False).logits
        got = loaded(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    half = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype="auto")
    assert half.dtype == torch.bfloat16
    assert (half.lm_head.weight is half.model.embed_tokens.weight) == tied


def test_release_memory_frees_the_gradients_and_the_next_step_still_trains() -> None:
    """What a colocated worker calls before its engine wakes (the engine gets that memory)."""
    w = PolicyWorker(_model(), _wcfg())
    w.train_step(_seqs())
    assert all(p.grad is not None for p in w.model.parameters())
    w.release_memory()
    assert all(p.grad is None for p in w.model.parameters())
    assert w.train_step(_seqs())["grad_norm"] > 0


def test_activation_checkpointing_gives_the_same_gradients() -> None:
    seqs = _seqs()
    grads = []
    for ac in (False, True):
        w = PolicyWorker(_model(), _wcfg(activation_checkpointing=ac))
        w.train_step(seqs)
        grads.append(_grads(w))
    for name, g0 in grads[0].items():
        torch.testing.assert_close(grads[1][name], g0, atol=1e-6, rtol=1e-5, msg=name)


def _dp_rank(
    rank: int,
    world: int,
    seqs: list[TrainSeq],
    budgets: list[int],
    out_dir: str,
    overrides: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One rank: one worker per micro-batch budget, two steps each on this rank's dp_partition
    share (a negative budget: a lopsided share, the last sequence alone on the last rank); the
    first worker checkpoints between its steps and exports an HF dir at the end."""
    results = []
    for budget in budgets:
        if budget > 0:
            share = dp_partition([len(s) for s in seqs], world)[rank]
        else:
            share = list(range(len(seqs)))[-1:] if rank == world - 1 else list(range(len(seqs) - 1))
        local = [seqs[i] for i in share]
        cfg = _wcfg(max_tokens_per_micro_batch=abs(budget), warmup_steps=2, **(overrides or {}))
        w = PolicyWorker(_config(), cfg)
        metrics = [w.train_step(local)]
        grads = {n: g.cpu() for n, g in _grads(w).items()}
        if budget == budgets[0]:
            state = RunState(1, SourceState({"world": world}), RngState.capture())
            save_checkpoint(w, Path(out_dir) / "ckpt", run_state=state)
        metrics.append(w.train_step(local))
        weights = dict(w.state_dict_for_inference(device="cpu"))
        if budget == budgets[0]:
            w.save_pretrained(Path(out_dir) / "hf")
        results.append(dict(metrics=metrics, grads=grads, weights=weights))
    return results


def _assert_same(a: dict[str, Any], b: dict[str, Any], what: str, tolerance: float = 1) -> None:
    for key in ("loss", "pg_loss", "kl_loss", "entropy", "clipfrac", "grad_norm", "lr", "tokens"):
        for ma, mb in zip(a["metrics"], b["metrics"], strict=True):
            assert ma[key] == pytest.approx(mb[key], rel=1e-5 * tolerance, abs=1e-6 * tolerance), (
                what,
                key,
            )
    # Adam divides by sqrt(v): where a gradient is ~eps, fp-level differences move a weight by a
    # fraction of lr; the gradients above are the strict check (Adam would hide a scale error)
    for kind, atol in (("grads", 1e-6), ("weights", 1e-4)):
        for name, x in a.get(kind, {}).items():
            torch.testing.assert_close(
                b[kind][name], x, atol=atol * tolerance, rtol=1e-4 * tolerance, msg=(what, kind)
            )


BUDGETS = [64, 12, -12]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    """The 2-process gloo run, shared by the tests below (process start-up dominates)."""
    root = tmp_path_factory.mktemp("two")
    return root, run_local_ranks(_dp_rank, 2, _seqs(), BUDGETS, str(root))


@pytest.mark.integration
def test_one_rank_and_two_fsdp2_ranks_give_the_same_step(
    tmp_path: Path, two_ranks: tuple[Path, list[Any]]
) -> None:
    """Same batch: 1 gloo rank vs 2 gloo ranks (real FSDP2 sharding, gradient reduce-scatter,
    DTensor grad clipping), different micro-batch budgets, a lopsided split (one rank pads with
    empty micro-batches) -> same losses, gradients and updated weights; both ranks export the
    same weights; rank 0's HF export reloads."""
    root, two = two_ranks
    one = _dp_rank(0, 1, _seqs(), BUDGETS[:1], str(tmp_path))[0]
    assert one["metrics"][0]["micro_batches"] != two[0][1]["metrics"][0]["micro_batches"]
    assert two[0][2]["metrics"][0]["micro_batches"] > 1  # rank 1 has 1 sequence: it padded
    for r in range(2):
        for b in range(len(BUDGETS)):
            _assert_same(one, two[r][b], f"rank {r} of 2, budget {BUDGETS[b]}")
        for name, x in two[0][0]["weights"].items():
            assert torch.equal(two[r][0]["weights"][name], x), name
    loaded = AutoModelForCausalLM.from_pretrained(root / "hf", dtype=torch.float32)
    for name, x in loaded.state_dict().items():
        assert torch.equal(x, two[0][0]["weights"][name]), name


@pytest.mark.integration
def test_a_two_rank_checkpoint_resumes_on_one_rank(
    tmp_path: Path, two_ranks: tuple[Path, list[Any]]
) -> None:
    """Saved by 2 ranks after step 1, loaded by 1 rank (DCP re-sharding): step 2 gives the
    2-rank run's step 2 (weights, Adam moments, step and warmup LR all restored)."""
    root, two = two_ranks
    path = latest_checkpoint(root / "ckpt")
    assert path is not None and path.name == "step_00000001"
    w = PolicyWorker(_config(), _wcfg(max_tokens_per_micro_batch=64, warmup_steps=2, seed=5))
    state = load_checkpoint(w, path)
    assert state is not None and state.source == SourceState({"world": 2}) and w.step == 1
    step2 = w.train_step(_seqs())
    weights = dict(w.state_dict_for_inference())
    _assert_same({"metrics": [step2], "weights": weights},
                 {"metrics": two[0][0]["metrics"][1:], "weights": two[0][0]["weights"]},
                 "resumed on 1 rank")  # fmt: skip
    # only complete step dirs count, and keep_last prunes the older ones
    (tmp_path / "step_00000009.tmp").mkdir()
    for _ in range(2):
        save_checkpoint(w, tmp_path, keep_last=1)
        w.step += 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000003", "step_00000009.tmp"]
    assert latest_checkpoint(tmp_path) == tmp_path / "step_00000003"


def _logprobs_rank(rank: int, world: int, seqs: list[TrainSeq]) -> list[torch.Tensor]:
    """Rank 0 scores every sequence, the others none (more ranks than sequences)."""
    return PolicyWorker(_config(), _wcfg()).compute_logprobs(seqs if rank == 0 else [])


@pytest.mark.slow  # two gloo ranks in processes of their own (~25 s to start)
def test_a_rank_with_no_sequences_scores_nothing_and_keeps_the_others_in_step() -> None:
    seqs = _seqs()[:1]
    ranks = run_local_ranks(_logprobs_rank, 2, seqs)
    assert [len(r) for r in ranks] == [1, 0]
    assert ranks[0][0].shape == seqs[0].token_ids.shape


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("cpu_offload", [False, True])
def test_cuda_bf16_mixed_precision_trains_and_scores(cpu_offload: bool) -> None:
    """bf16 compute / fp32 master weights and reduction, activation checkpointing, optional
    CPU offload: logprobs stay close to the fp32 model's and the batch is learned."""
    seqs = _seqs()
    plain = _model()
    cfg = _wcfg(device="cuda", dtype="bfloat16", activation_checkpointing=True,
                cpu_offload=cpu_offload, lr=3e-3, kl_coef=0.0, entropy_coef=0.0)  # fmt: skip
    w = PolicyWorker(copy.deepcopy(plain), cfg)
    for s, lp in zip(seqs, w.compute_logprobs(seqs), strict=True):
        with torch.no_grad():
            want = token_logprobs(plain, pack([s])).logprobs[0]
        torch.testing.assert_close(lp, want, atol=0.05, rtol=0.02)
    losses = [w.train_step(seqs)["loss"] for _ in range(3)]
    assert losses[-1] < losses[0] - 0.05, losses
    name, first = next(iter(w.state_dict_for_inference()))
    assert first.dtype == torch.float32 and first.shape == plain.state_dict()[name].shape


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_two_nccl_ranks_match_one_cpu_rank(tmp_path: Path) -> None:
    seqs = _seqs()
    one = _dp_rank(0, 1, seqs, [64], str(tmp_path / "one"), {"device": "cpu"})[0]
    two = run_local_ranks(
        _dp_rank, 2, seqs, [64], str(tmp_path / "two"), {"device": "cuda", "dtype": "float32"},
        backend="cpu:gloo,cuda:nccl",
    )  # fmt: skip
    for r in range(2):
        _assert_same(one, two[r][0], f"cuda rank {r} of 2", tolerance=100)


def test_a_non_finite_step_is_skipped_loudly(caplog: pytest.LogCaptureFixture) -> None:
    seqs = [dataclasses.replace(s, advantages=s.advantages * float("nan")) for s in _seqs()]
    w = PolicyWorker(_config(), _wcfg(kl_coef=0.0, entropy_coef=0.0))
    before = {n: p.full_tensor().clone() for n, p in w.model.named_parameters()}
    with caplog.at_level("WARNING", logger="agentloop.trainers.worker"):
        metrics = w.train_step(seqs)
    assert metrics["step_skipped"] == 1.0
    assert "train step 1 skipped" in caplog.text and "non-finite" in caplog.text
    for n, p in w.model.named_parameters():
        assert torch.equal(p.full_tensor(), before[n]), f"{n} changed on a skipped step"
