"""Logprobs on packed batches: equal to per-sequence runs, exact masks, a correct fused backward."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import Qwen2ForCausalLM

from agentloop.errors import ConfigError
from agentloop.trainers.logprobs import logprobs_from_logits, token_logprobs
from agentloop.trainers.losses import agg_loss, entropy_from_logits, kl_penalty, policy_loss
from agentloop.trainers.packing import TrainSeq, pack, pad

LENGTHS = [5, 1, 9, 3]


def _seqs() -> list[TrainSeq]:
    g = torch.Generator().manual_seed(0)
    return [
        TrainSeq(
            token_ids=torch.randint(0, 128, (n,), generator=g),
            loss_mask=torch.ones(n),
            advantages=torch.zeros(n),
            rollout_logprobs=torch.zeros(n),
        )
        for n in LENGTHS
    ]


def _reference(model: torch.nn.Module, ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per-sequence, unpadded: logprob of token t from the logits at t - 1, 0 for token 0."""
    with torch.no_grad():
        logits = model(input_ids=ids[None], use_cache=False).logits[0] / temperature
    lp = torch.log_softmax(logits[:-1], dim=-1).gather(1, ids[1:, None])[:, 0]
    return torch.cat([torch.zeros(1), lp])


@pytest.mark.parametrize("attn", ["sdpa", "eager", "varlen"])
def test_packed_logprobs_equal_per_sequence(
    tiny_model: Callable[..., Qwen2ForCausalLM], attn: str
) -> None:
    """Every packed implementation keeps the sequences apart (``varlen`` on a CPU: SDPA on each
    sequence's slice, no ``T×T`` mask)."""
    from agentloop.trainers.varlen import register

    register()
    model = tiny_model(attn).eval()
    seqs = _seqs()
    mb = pack(seqs)
    with torch.no_grad():
        out = token_logprobs(model, mb, with_entropy=True)
    assert out.logprobs.shape == (1, sum(LENGTHS)) and out.logprobs.dtype == torch.float32
    for part, s in zip(mb.unpack(out.logprobs), seqs, strict=True):
        torch.testing.assert_close(part, _reference(model, s.token_ids), atol=1e-5, rtol=0)
    assert out.entropy is not None
    for part, s in zip(mb.unpack(out.entropy), seqs, strict=True):
        with torch.no_grad():
            logits = model(input_ids=s.token_ids[None], use_cache=False).logits[0]
        expected = torch.cat([torch.zeros(1), entropy_from_logits(logits[:-1])])
        torch.testing.assert_close(part, expected, atol=1e-5, rtol=0)


def test_padded_logprobs_equal_packed(tiny_model: Callable[..., Qwen2ForCausalLM]) -> None:
    model = tiny_model().eval()
    seqs = _seqs()
    with torch.no_grad():
        packed = token_logprobs(model, pack(seqs), temperature=0.7).logprobs
        pb = pad(seqs)
        padded = token_logprobs(model, pb, temperature=0.7).logprobs
    torch.testing.assert_close(padded[pb.attention_mask.bool()], packed[0], atol=1e-5, rtol=0)
    assert padded[~pb.attention_mask.bool()].abs().sum() == 0
    torch.testing.assert_close(
        pack(seqs).unpack(packed)[2], _reference(model, seqs[2].token_ids, 0.7), atol=1e-5, rtol=0
    )


def test_transformers_packs_only_without_a_cache(
    tiny_model: Callable[..., Qwen2ForCausalLM],
) -> None:
    """Fact check (transformers 5.x): packed-sequence detection from position_ids is skipped when
    a cache exists, and config.use_cache=True creates one, so the default call leaks attention
    across sequences. If this starts failing, transformers changed: revisit logprobs.py."""
    model = tiny_model().eval()
    mb = pack(_seqs())
    with torch.no_grad():
        default = model(input_ids=mb.input_ids, position_ids=mb.position_ids).logits
        no_cache = model(
            input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False
        ).logits
        alone = model(input_ids=mb.unpack(mb.input_ids)[2][None], use_cache=False).logits
    start, end = int(mb.cu_seqlens[2]), int(mb.cu_seqlens[3])
    torch.testing.assert_close(no_cache[0, start:end], alone[0], atol=1e-5, rtol=0)
    assert (default[0, start:end] - alone[0]).abs().max() > 1e-2


class _FixedLogits(torch.nn.Module):
    """A stand-in model whose logits are a leaf parameter, so their gradient can be inspected."""

    def __init__(self, logits: torch.Tensor, attn: str = "sdpa") -> None:
        super().__init__()
        self.logits = torch.nn.Parameter(logits)
        self.config = SimpleNamespace(_attn_implementation=attn)

    def forward(self, **kwargs: Any) -> SimpleNamespace:
        return SimpleNamespace(logits=self.logits)


def test_gradients_at_masked_positions_are_exactly_zero() -> None:
    # two sequences: prompt (mask 0), response, tool observation (mask 0), response
    mask_a = torch.tensor([0, 0, 1, 1, 0, 0, 1], dtype=torch.float32)
    mask_b = torch.tensor([0, 1, 0, 1], dtype=torch.float32)
    torch.manual_seed(0)
    seqs = [
        TrainSeq(
            token_ids=torch.randint(0, 16, (len(m),)),
            loss_mask=m,
            advantages=torch.randn(len(m)) * m,
            rollout_logprobs=-torch.rand(len(m)),
            old_logprobs=-torch.rand(len(m)),
            ref_logprobs=-torch.rand(len(m)),
        )
        for m in (mask_a, mask_b)
    ]
    mb = pack(seqs)
    fake = _FixedLogits(torch.randn(1, mb.num_tokens, 16))
    out = token_logprobs(fake, mb, with_entropy=True)
    assert mb.old_logprobs is not None and mb.ref_logprobs is not None and out.entropy is not None
    out.logprobs.retain_grad()
    pg, _ = policy_loss(
        out.logprobs,
        mb.old_logprobs,
        mb.advantages,
        mb.loss_mask,
        rollout_logprobs=mb.rollout_logprobs,
        tis_cap=2.0,
    )
    kw: dict[str, Any] = {"cu_seqlens": mb.cu_seqlens}
    loss = (
        agg_loss(pg, mb.loss_mask, "token-mean", **kw)
        + 0.1
        * agg_loss(kl_penalty(out.logprobs, mb.ref_logprobs, "k1"), mb.loss_mask, "token-mean")
        - 0.01 * agg_loss(out.entropy, mb.loss_mask, "seq-mean-token-mean", **kw)
    )
    loss.backward()
    masked = mb.loss_mask[0] == 0
    assert out.logprobs.grad is not None and fake.logits.grad is not None
    assert torch.all(out.logprobs.grad[0, masked] == 0)
    assert torch.all(out.logprobs.grad[0, ~masked] != 0)  # (k1 KL: never a zero gradient)
    # token t is predicted by logits row t-1: rows feeding masked tokens get exactly zero
    rows_for_masked = torch.nonzero(masked).squeeze(1) - 1
    rows_for_masked = rows_for_masked[rows_for_masked >= 0]
    assert torch.all(fake.logits.grad[0, rows_for_masked] == 0)
    assert fake.logits.grad[0, -1].abs().sum() == 0  # the last row predicts nothing


def test_unknown_attention_implementation_is_refused() -> None:
    mb = pack(_seqs())
    with pytest.raises(ConfigError, match=r"'paged_attention' is not known to separate packed"):
        token_logprobs(_FixedLogits(torch.zeros(1, mb.num_tokens, 8), "paged_attention"), mb)


@pytest.mark.parametrize("with_entropy", [False, True])
def test_chunked_logprobs_match_autograd(with_entropy: bool) -> None:
    torch.manual_seed(0)
    logits = torch.randn(7, 11, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 11, (7,))
    lp, ent = logprobs_from_logits(
        logits, labels, temperature=0.7, with_entropy=with_entropy, chunk_size=3
    )
    ref_logp = torch.log_softmax(logits / 0.7, dim=-1)
    torch.testing.assert_close(lp, ref_logp.gather(1, labels[:, None])[:, 0].float())
    if with_entropy:
        assert ent is not None
        torch.testing.assert_close(ent, entropy_from_logits(logits / 0.7))

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a, b = logprobs_from_logits(
            x, labels, temperature=0.7, with_entropy=with_entropy, chunk_size=3
        )
        return (a, b) if b is not None else (a,)

    # the op computes in fp32, so compare its backward with autograd's rather than gradcheck
    w_lp, w_ent = torch.randn(7, dtype=torch.float64), torch.randn(7, dtype=torch.float64)
    outs = fn(logits)
    target = (outs[0] * w_lp).sum() + ((outs[1] * w_ent).sum() if with_entropy else 0)
    (grad,) = torch.autograd.grad(target, logits)
    ref_target = (ref_logp.gather(1, labels[:, None])[:, 0] * w_lp).sum()
    if with_entropy:
        ref_target = ref_target + (entropy_from_logits(logits / 0.7).double() * w_ent).sum()
    (ref_grad,) = torch.autograd.grad(ref_target, logits)
    torch.testing.assert_close(grad, ref_grad, atol=1e-5, rtol=1e-5)


def test_bf16_logits_get_bf16_gradients() -> None:
    logits = torch.randn(5, 32).to(torch.bfloat16).requires_grad_(True)
    lp, _ = logprobs_from_logits(logits, torch.arange(5))
    assert lp.dtype == torch.float32
    lp.sum().backward()
    assert logits.grad is not None and logits.grad.dtype == torch.bfloat16


def test_temperature_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="temperature must be > 0"):
        logprobs_from_logits(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), temperature=0.0)


def test_varlen_implementation_scores_padded_batches_like_sdpa(
    tiny_model: Callable[..., Qwen2ForCausalLM],
) -> None:
    """A padded batch (the padded baseline in bench/train_throughput.py) has no ``cu_seqlens``:
    the ``varlen`` implementation falls back to SDPA, turning the flash-style 2-D padding mask
    into a causal 4-D one. It must score exactly as ``sdpa`` does."""
    from agentloop.trainers.varlen import register

    register()
    varlen, sdpa = tiny_model("varlen").eval(), tiny_model("sdpa").eval()
    seqs = _seqs()
    pb = pad(seqs)
    with torch.no_grad():
        got = token_logprobs(varlen, pb).logprobs
        want = token_logprobs(sdpa, pb).logprobs
    valid = pb.attention_mask.bool()
    torch.testing.assert_close(got[valid], want[valid], atol=1e-5, rtol=0)
    assert torch.isfinite(got).all()


def test_varlen_on_a_cpu_gives_the_masked_sdpa_gradients(
    tiny_model: Callable[..., Qwen2ForCausalLM],
) -> None:
    """On a CPU ``auto`` is ``varlen`` for text and vision models alike: per-sequence SDPA, whose
    packed logprobs and gradients are masked SDPA's to fp32 rounding."""
    from agentloop.trainers.varlen import register, resolve_attn_implementation

    cpu = torch.device("cpu")
    assert resolve_attn_implementation("auto", cpu, torch.float32) == "varlen"
    assert resolve_attn_implementation("auto", cpu, torch.float32, vision=True) == "varlen"
    register()
    mb = pack(_seqs())
    grads = []
    for attn in ("varlen", "sdpa"):
        model = tiny_model(attn)
        out = token_logprobs(model, mb, with_entropy=True)
        assert out.entropy is not None
        (out.logprobs.sum() + out.entropy.sum()).backward()
        grads.append(
            torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        )
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_varlen_attention_equals_per_sequence_sdpa_on_cuda(
    tiny_model: Callable[..., Qwen2ForCausalLM],
) -> None:
    """PyTorch's varlen FlashAttention kernel on a packed batch (no T×T mask) gives the same
    logprobs and gradients as unpacked SDPA, sequence by sequence (bf16 tolerance)."""
    from agentloop.trainers.varlen import resolve_attn_implementation

    cuda = torch.device("cuda")
    assert resolve_attn_implementation("auto", cuda, torch.bfloat16) == "varlen"
    assert resolve_attn_implementation("auto", cuda, torch.float32) == "sdpa"  # FA takes no fp32
    varlen = tiny_model("varlen").to("cuda", torch.bfloat16)
    sdpa = tiny_model("sdpa").to("cuda", torch.bfloat16)
    seqs = _seqs()
    mb = pack(seqs).to("cuda")
    packed = token_logprobs(varlen, mb).logprobs
    packed.sum().backward()
    for part, s in zip(mb.unpack(packed.detach().float().cpu()), seqs, strict=True):
        ids = s.token_ids.to("cuda")
        with torch.no_grad():
            logits = sdpa(input_ids=ids[None], use_cache=False).logits[0].float()
        lp = torch.log_softmax(logits[:-1], -1).gather(1, ids[1:, None])[:, 0]
        want = torch.cat([torch.zeros(1, device="cuda"), lp])
        torch.testing.assert_close(part, want.cpu(), atol=0.05, rtol=0)
    loss = sum(token_logprobs(sdpa, pack([s]).to("cuda")).logprobs.sum() for s in seqs)
    assert isinstance(loss, torch.Tensor)
    loss.backward()
    g_varlen = varlen.model.layers[0].self_attn.q_proj.weight.grad.float()
    g_sdpa = sdpa.model.layers[0].self_attn.q_proj.weight.grad.float()
    assert (g_varlen - g_sdpa).norm() <= 0.05 * g_sdpa.norm()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("banned", [(), (3, 5000)])
def test_compiled_logprob_blocks_on_cuda_are_as_exact_as_the_op_by_op_ones(
    banned: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On CUDA the chunked log-softmax's block math runs compiled. Against a float64 reference
    its logprobs, entropies and gradients (bf16 logits of a 152k vocabulary, a last chunk shorter
    than the rest) are as close as the same math run op by op, as on a CPU, is. (The two differ
    from each other by fp32 summation order: entropy is a difference of two ~20-nat sums.)
    Passed on an H200: logprob error 2.4e-6 compiled vs 3.5e-6 op by op, entropy 3.7e-5 vs
    2.6e-5, gradients 1.5e-2 both (bf16 rounding)."""
    from agentloop.trainers import logprobs as module

    torch.manual_seed(0)
    n, vocab, temp = 2500, 151936, 0.7
    logits = (torch.randn(n, vocab, device="cuda") * 3).to(torch.bfloat16)
    labels = torch.randint(0, vocab, (n,), device="cuda")
    w_lp, w_ent = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")

    def run() -> tuple[torch.Tensor, ...]:
        x = logits.clone().requires_grad_(True)
        lp, ent = logprobs_from_logits(
            x, labels, temperature=temp, with_entropy=True, chunk_size=1024,
            banned_token_ids=banned,
        )  # fmt: skip
        assert ent is not None
        ((lp * w_lp).sum() + (ent * w_ent).sum()).backward()
        assert x.grad is not None
        return lp, ent, x.grad

    def reference() -> tuple[torch.Tensor, ...]:
        x = logits.double().requires_grad_(True)
        z = x / temp
        if banned:
            z = z.index_fill(1, torch.tensor(banned, device="cuda"), float("-inf"))
        logp = torch.log_softmax(z, dim=-1)
        lp = (x / temp).gather(1, labels[:, None])[:, 0] - torch.logsumexp(z, dim=-1)
        ent = -(logp.exp() * torch.nan_to_num(logp, neginf=0.0)).sum(-1)
        ((lp * w_lp).sum() + (ent * w_ent).sum()).backward()
        assert x.grad is not None
        return lp, ent, x.grad

    compiled = run()
    monkeypatch.setattr(
        module, "_block_fns", lambda _device: (module._chunk_forward, module._chunk_backward)
    )
    eager, exact = run(), reference()
    for got, base, want in zip(compiled, eager, exact, strict=True):
        err = float((got.double() - want).abs().max())
        base_err = float((base.double() - want).abs().max())
        assert err <= 4 * base_err + 1e-6, (err, base_err)


def test_auto_attention_of_a_vision_language_model_is_sdpa_even_where_varlen_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where ``auto`` picks the varlen kernel for a text model (CUDA, bf16), a VLM gets sdpa:
    with varlen, the tiny Qwen2.5-VL's trainer logprobs were NaN on an H200 (2026-11-27)."""
    from agentloop.trainers import varlen

    monkeypatch.setattr(varlen, "varlen_available", lambda: True)
    monkeypatch.setattr(varlen, "register", lambda: None)
    cuda = torch.device("cuda")  # a device object only: nothing runs on it
    assert varlen.resolve_attn_implementation("auto", cuda, torch.bfloat16) == "varlen"
    got = varlen.resolve_attn_implementation("auto", cuda, torch.bfloat16, vision=True)
    assert got == "sdpa"
