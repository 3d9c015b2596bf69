"""Generate a tiny Qwen2-architecture model and tokenizer locally, for tests and the demo.

Nothing is downloaded: the byte-level BPE tokenizer is trained on a synthetic corpus with the
``tokenizers`` library, the model is randomly initialised from a seed, and both are written with
``save_pretrained`` so that the ordinary ``AutoTokenizer`` / ``AutoModelForCausalLM``
``from_pretrained`` path (and vLLM) load them like any Qwen2.5 checkpoint.

Special tokens (ids are fixed): ``<|endoftext|>`` 0 (pad), ``<|im_start|>`` 1, ``<|im_end|>`` 2
(eos), and the *non-special* added tokens ``<tool_call>`` 3, ``</tool_call>`` 4,
``<tool_response>`` 5, ``</tool_response>`` 6 (they survive ``skip_special_tokens=True``).
"""

from __future__ import annotations

import functools
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentloop.cache import DEFAULT_CACHE_DIR, ENV_VAR, cached_build
from agentloop.cache import cache_dir as agentloop_cache_dir
from agentloop.errors import ConfigError
from agentloop.formats import HERMES_TEMPLATE as CHAT_TEMPLATE

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = [
    "ADDED_TOKENS",
    "CHAT_TEMPLATE",
    "DEFAULT_CACHE_DIR",
    "ENV_VAR",
    "QWEN2_SPLIT_REGEX",
    "SPECIAL_TOKENS",
    "TINY_SHAPE",
    "TOKEN_IDS",
    "cached_build",
    "make_tiny_model",
    "save_seeded_model",
    "tiny_model_dir",
    "tiny_model_path",
    "train_tokenizer",
]

#: Marked special: dropped by ``decode(..., skip_special_tokens=True)``. Ids 0, 1, 2.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
#: Added but *not* special: kept by ``skip_special_tokens=True`` so the tool-call parser sees them.
ADDED_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
#: Fixed ids: the trainer reserves the first ids for these, in this order.
TOKEN_IDS = {token: i for i, token in enumerate(SPECIAL_TOKENS + ADDED_TOKENS)}
#: ``(hidden_size, num_layers)`` of the tiny model (3.4M parameters); :func:`make_tiny_model`
#: builds others with the same tokenizer and head_dim.
TINY_SHAPE = (256, 4)
_DTYPES = ("float32", "bfloat16", "float16")
_CORPUS_SEED = 1234  # the tokenizer does not depend on the model seed

#: The pre-tokenizer split regex ``Qwen2Tokenizer`` rebuilds on load; training must use the same.
QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

_WORD_TEXT = (
    "the of and to in is you that it he was for on are as with his they at be this have from "
    "or one had by word but not what all were we when your can said there use an each which she "
    "do how their if will up other about out many then them these so some her would make like "
    "him into time has look two more write go see number no way could people my than first water "
    "been call who oil its now find long down day did get come made may part answer result "
    "compute value python code tool function call response question problem step think total "
    "sum product difference apples books each costs dollars bought sold left remaining first "
    "second third number numbers multiply add subtract divide final therefore hence thus let us "
    "café naïve résumé über straße 数学 答案 ∑ π ≤ ≥ → 🙂"
)
_ONSET_TEXT = "b c d f g h j k l m n p r s t v w y z br ch cl dr fl gr pl pr sh st str th tr"
_VOWEL_TEXT = "a e i o u a e i o ea ee oo ou ai ie"
_WORDS, _ONSETS, _VOWELS = _WORD_TEXT.split(), _ONSET_TEXT.split(), _VOWEL_TEXT.split()
_CODAS = ("", "", "", "n", "r", "s", "t", "d", "ng", "st", "nt", "ck", "ll", "ss", "rd")
_OPS = ("+", "-", "*")
_TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code and return what it prints.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The code to run."}},
            "required": ["code"],
        },
    },
}


def _expression(rng: random.Random) -> tuple[str, int]:
    """A random ``a op b [op c ...]`` with ``op`` in ``+ - *``, and its value."""
    numbers = [rng.randint(1, 999) for _ in range(rng.randint(2, 4))]
    ops = [rng.choice(_OPS) for _ in numbers[1:]]
    expr = str(numbers[0]) + "".join(f" {op} {n}" for op, n in zip(ops, numbers[1:], strict=True))
    total, sign, term = 0, 1, numbers[0]
    for op, n in zip(ops, numbers[1:], strict=True):
        if op == "*":
            term *= n
        else:
            total, sign, term = total + sign * term, (1 if op == "+" else -1), n
    return expr, total + sign * term


def _word(rng: random.Random) -> str:
    if rng.random() < 0.6:
        return rng.choice(_WORDS)
    syllables = (rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.randint(1, 3)))
    return "".join(syllables) + rng.choice(_CODAS)


def _sentence(rng: random.Random) -> str:
    words = [_word(rng) for _ in range(rng.randint(4, 16))]
    return " ".join(words).capitalize() + rng.choice((".", ".", "?", "!", ",", ":"))


def _conversation(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    expr, value = _expression(rng)
    code = f"print({expr})"
    call = {"type": "function", "function": {"name": "python", "arguments": {"code": code}}}
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": _sentence(rng)})
    messages += [
        {"role": "user", "content": f"What is {expr}? Put the answer in \\boxed{{}}."},
        {"role": "assistant", "content": rng.choice(("", _sentence(rng))), "tool_calls": [call]},
        {"role": "tool", "content": str(value)},
        {"role": "assistant", "content": f"The answer is \\boxed{{{value}}}."},
    ]
    return messages, ([_TOOL_SCHEMA] if rng.random() < 0.7 else None)


@functools.cache
def _template() -> Any:
    """The chat template compiled with plain jinja2 the way transformers does (corpus only)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)
    return env.from_string(CHAT_TEMPLATE)


def _corpus(n: int = 3000) -> Iterator[str]:
    """Synthetic text: prose, word problems, Python, ``\\boxed{}`` answers, tool calls, chats."""
    rng = random.Random(_CORPUS_SEED)
    for i in range(n):
        expr, value = _expression(rng)
        kind = i % 6
        if kind == 0:
            yield " ".join(_sentence(rng) for _ in range(rng.randint(1, 4)))
        elif kind == 1:
            yield f"What is {expr}? {_sentence(rng)} The answer is \\boxed{{{value}}}."
        elif kind == 2:
            yield f"x = {expr}\ny = x * {rng.randint(2, 99)}\nprint(y)\n\nprint({expr})\n"
        elif kind == 3:
            yield json.dumps({"name": "python", "arguments": {"code": f"print({expr})"}})
        else:
            messages, tools = _conversation(rng)
            yield _template().render(messages=messages, tools=tools)


def train_tokenizer(vocab_size: int = 2048) -> Tokenizer:
    """Train the byte-level BPE (a ``tokenizers.Tokenizer``) with Qwen2's own pipeline.

    ``Qwen2Tokenizer`` rebuilds its normalizer and pre-tokenizer from vocab + merges on load, so
    training with exactly that pipeline (NFC, Qwen2 split regex, ByteLevel without its own regex)
    is what makes ids agree between this object and ``AutoTokenizer.from_pretrained``.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    tok = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    added = [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS + ADDED_TOKENS]
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=added,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    # The trainer marks every token it reserves as special; the tool markup must not be.
    spec = json.loads(tok.to_str())
    for entry in spec["added_tokens"]:
        entry["special"] = entry["content"] in SPECIAL_TOKENS
    tok = Tokenizer.from_str(json.dumps(spec))
    got = {token: tok.token_to_id(token) for token in TOKEN_IDS}
    if got != TOKEN_IDS:  # the protocol the rest of agentloop's tests rely on
        raise RuntimeError(f"special token ids moved: {got}, expected {TOKEN_IDS}")
    if tok.get_vocab_size() != vocab_size:
        raise ConfigError(
            f"the tiny tokenizer reached {tok.get_vocab_size()} tokens, not vocab_size="
            f"{vocab_size}; use a smaller vocab_size (the synthetic corpus is small)"
        )
    return tok


def _save_tokenizer(tok: Tokenizer, out: Path, chat_template: str = CHAT_TEMPLATE) -> None:
    """Save as a Qwen2 tokenizer (``tokenizer_class`` named) with the chat template."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        extra_special_tokens=["<|im_start|>", "<|im_end|>"],
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    hf.chat_template = chat_template
    hf.save_pretrained(str(out))
    # Name the real Qwen2 class, so AutoTokenizer loads what a Qwen2.5 checkpoint would.
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "Qwen2Tokenizer"
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False, sort_keys=True) + "\n")


def save_seeded_model(model_class: Any, config: Any, out: Path, *, seed: int, dtype: str) -> None:
    """Save ``model_class(config)`` to ``out`` (safetensors): initialised from ``seed`` without
    touching the caller's RNG, in ``dtype``, generating until the tiny chat's ``<|im_end|>``."""
    import torch
    from transformers import GenerationConfig

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config).to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(
        bos_token_id=None,
        eos_token_id=TOKEN_IDS["<|im_end|>"],
        pad_token_id=TOKEN_IDS["<|endoftext|>"],
    )
    model.save_pretrained(str(out), safe_serialization=True)


def _save_model(
    out: Path, *, seed: int, dtype: str, vocab_size: int, hidden_size: int, num_layers: int
) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    # head_dim is not a declared Qwen2Config field (it defaults to hidden/heads); write it anyway
    # so every reader (vLLM included) sees 64 without recomputing it.
    layout: dict[str, Any] = {"head_dim": 64}
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=hidden_size // 64,
        num_key_value_heads=hidden_size // 128,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=TOKEN_IDS["<|im_end|>"],
        pad_token_id=TOKEN_IDS["<|endoftext|>"],
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        **layout,
    )
    save_seeded_model(Qwen2ForCausalLM, config, out, seed=seed, dtype=dtype)


def make_tiny_model(
    out_dir: str | os.PathLike[str],
    *,
    seed: int = 0,
    dtype: str = "float32",
    vocab_size: int = 2048,
    hidden_size: int = TINY_SHAPE[0],
    num_layers: int = TINY_SHAPE[1],
) -> Path:
    """Build the tiny model + tokenizer into ``out_dir`` (created if missing) and return it.

    Deterministic: the same arguments give the same ``tokenizer.json`` and the same weights.
    ``seed`` only drives the weight init; the tokenizer is the same for every seed and shape.
    The shape: ``num_layers`` Qwen2 blocks of width ``hidden_size`` (a multiple of 128), with
    head_dim 64, half as many KV heads as heads and an MLP twice as wide; the default (256, 4)
    has 3.4M parameters, (768, 12) 67M.
    """
    if dtype not in _DTYPES:
        raise ConfigError(f"dtype={dtype!r} is not supported; use one of {', '.join(_DTYPES)}")
    if vocab_size < 512:
        raise ConfigError(f"vocab_size={vocab_size} is too small; use at least 512")
    if hidden_size < 128 or hidden_size % 128 or num_layers < 1:
        raise ConfigError(
            f"hidden_size={hidden_size}, num_layers={num_layers}: use a hidden_size that is a "
            "multiple of 128 (head_dim 64, heads sharing KV heads in pairs) and num_layers >= 1"
        )
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    _save_tokenizer(train_tokenizer(vocab_size), out)
    _save_model(
        out,
        seed=seed,
        dtype=dtype,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
    )
    return out


def tiny_model_dir(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    hidden_size: int = TINY_SHAPE[0],
    num_layers: int = TINY_SHAPE[1],
) -> Path:
    """Return a directory holding the tiny model (seed 0, float32), building it once.

    Location: ``cache_dir`` if given, else ``$AGENTLOOP_TINY_MODEL``, else
    ``~/.cache/agentloop/tiny-qwen2-v1``; a shape other than :data:`TINY_SHAPE` (see
    :func:`make_tiny_model`) lives beside it, e.g. ``tiny-qwen2-v1-768x12``. Concurrent callers
    are safe: each builds into a private temporary directory and renames it into place
    atomically; the loser discards its copy.
    """
    target = tiny_model_path(cache_dir, hidden_size=hidden_size, num_layers=num_layers)
    return cached_build(
        target, lambda out: make_tiny_model(out, hidden_size=hidden_size, num_layers=num_layers)
    )


def tiny_model_path(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    hidden_size: int = TINY_SHAPE[0],
    num_layers: int = TINY_SHAPE[1],
) -> Path:
    """Where :func:`tiny_model_dir` keeps the model of this shape (built there or not)."""
    target = agentloop_cache_dir(cache_dir)
    if (hidden_size, num_layers) == TINY_SHAPE:
        return target
    return target.with_name(f"{target.name}-{hidden_size}x{num_layers}")
