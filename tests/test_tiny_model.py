"""The locally generated tiny model: loads offline as a Qwen2.5 checkpoint, ids agree, template."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentloop.models import tiny

VENV_BIN = Path(sys.executable).parent
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run code.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"],
            },
        },
    }
]
CALL = {"type": "function", "function": {"name": "python", "arguments": {"code": "print(2 + 3)"}}}
STRINGS = [
    "What is 347 * 29 + 18?",
    "print(347 * 29 + 18)\n\n\n    x = 1\t\ty",
    "The answer is \\boxed{10081}.",
    "café naïve 数学 🙂 e\u0301 ∑ π → ≤",
    "  leading spaces, trailing   ",
    "\r\n\r\n mixed \n\n\n newlines \r",
    "I'm sure they'll say it's 12,345.67 or 0.5e-3",
    '{"name": "python", "arguments": {"code": "print(1)"}}',
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<tool_call>\n{}\n</tool_call><tool_response>\n42\n</tool_response><|endoftext|>",
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    "",
]


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny.make_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def cli_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "model"
    proc = subprocess.run(
        [str(VENV_BIN / "agentloop"), "make-tiny-model", str(out), "--seed", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert str(out) in proc.stdout
    return out


@pytest.fixture(scope="session")
def trained_tok() -> Any:
    return tiny.train_tokenizer()


@pytest.fixture(scope="session")
def hf_tok(tiny_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="session")
def hf_model(tiny_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir)


def render(tok: Any, messages: list[dict[str, Any]], tools: Any = None, gen: bool = False) -> str:
    out = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=gen, tokenize=False)
    assert isinstance(out, str)
    return out


def test_loads_as_a_qwen2_checkpoint(hf_tok: Any, hf_model: Any) -> None:
    assert type(hf_tok).__name__ == "Qwen2Tokenizer"
    assert len(hf_tok) == 2048
    names = (*tiny.SPECIAL_TOKENS, *tiny.ADDED_TOKENS)
    assert {t: hf_tok.convert_tokens_to_ids(t) for t in names} == tiny.TOKEN_IDS
    assert list(tiny.TOKEN_IDS.values()) == list(range(7))
    assert (hf_tok.pad_token_id, hf_tok.eos_token_id, hf_tok.bos_token_id) == (0, 2, None)
    assert set(hf_tok.all_special_ids) == {0, 1, 2}
    cfg = hf_model.config
    assert (cfg.model_type, cfg.head_dim, cfg.vocab_size, cfg.tie_word_embeddings) == (
        "qwen2",
        64,
        2048,
        False,
    )
    assert (cfg.eos_token_id, cfg.pad_token_id, cfg.bos_token_id) == (2, 0, None)
    assert hf_model.generation_config.eos_token_id == 2
    assert 1_000_000 <= sum(p.numel() for p in hf_model.parameters()) <= 10_000_000


def test_split_regex_is_qwen2s() -> None:
    from transformers.models.qwen2 import tokenization_qwen2

    assert tiny.QWEN2_SPLIT_REGEX == tokenization_qwen2.PRETOKENIZE_REGEX


@pytest.mark.parametrize("text", STRINGS)
def test_autotokenizer_ids_equal_trained_tokenizer_ids(
    hf_tok: Any, trained_tok: Any, text: str
) -> None:
    expected = trained_tok.encode(text, add_special_tokens=False).ids
    assert hf_tok.encode(text, add_special_tokens=False) == expected
    assert hf_tok.decode(expected) == trained_tok.decode(expected, skip_special_tokens=False)
    assert hf_tok.decode(expected) == text.replace("e\u0301", "\u00e9")  # NFC, else lossless


def test_tool_markup_survives_skip_special_tokens(hf_tok: Any) -> None:
    text = '<|im_start|>assistant\n<tool_call>\n{"name": "python"}\n</tool_call><|im_end|>'
    ids = hf_tok.encode(text, add_special_tokens=False)
    assert ids[0] == 1 and ids[-1] == 2 and 3 in ids and 4 in ids
    assert hf_tok.decode(ids, skip_special_tokens=True) == (
        'assistant\n<tool_call>\n{"name": "python"}\n</tool_call>'
    )


def test_template_golden_string_with_tools(hf_tok: Any) -> None:
    messages = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "Let me run it.", "tool_calls": [CALL, CALL]},
        {"role": "tool", "content": "5"},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "\\boxed{5}"},
    ]
    out = render(hf_tok, messages, TOOLS, gen=False)
    call = '<tool_call>\n{"name": "python", "arguments": {"code": "print(2 + 3)"}}\n</tool_call>'
    system, rest = out.split("<|im_end|>\n", 1)
    assert system.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in system
    assert '<tool_call>\n{"name": <function-name>, "arguments": ' in system
    assert rest == (
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        f"<|im_start|>assistant\nLet me run it.\n{call}\n{call}<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n"
        "<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n\\boxed{5}<|im_end|>\n"
    )


def test_template_system_turns(hf_tok: Any) -> None:
    user = [{"role": "user", "content": "hi"}]
    assert render(hf_tok, user, gen=True) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    own = [{"role": "system", "content": "Be brief."}, *user]
    assert render(hf_tok, own).startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    with_tools = render(hf_tok, own, TOOLS)
    assert with_tools.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert with_tools.count("<|im_start|>system") == 1


def test_template_tool_call_shapes(hf_tok: Any) -> None:
    flat = {"name": "python", "arguments": '{"code": "1"}'}  # no "function" wrapper, JSON string
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [flat]}]
    out = render(hf_tok, messages)
    assert out.endswith(
        '<|im_start|>assistant\n<tool_call>\n{"name": "python", "arguments": {"code": "1"}}\n'
        "</tool_call><|im_end|>\n"
    )


CONVERSATIONS = [
    (
        [
            {"role": "user", "content": "What is 1 + 1?"},
            {"role": "assistant", "content": "2"},
            {"role": "user", "content": "And 2 + 2?"},
            {"role": "assistant", "content": "4"},
        ],
        None,
    ),
    (
        [
            {"role": "system", "content": "You solve math."},
            {"role": "user", "content": "What is 347 * 29 + 18?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "content": "10081"},
            {"role": "assistant", "content": "Checking twice.", "tool_calls": [CALL, CALL]},
            {"role": "tool", "content": "10081"},
            {"role": "tool", "content": "Error: café 🙂\n  line 2"},
            {"role": "assistant", "content": "\\boxed{10081}"},
            {"role": "user", "content": "Thanks!"},
        ],
        TOOLS,
    ),
    (
        [
            {"role": "user", "content": "  spaces  \n"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "content": ""},
            {"role": "assistant", "content": "done\n"},
        ],
        TOOLS,
    ),
    (
        [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ],
        None,
    ),
]


def _next_steps(messages: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(k, j): messages[k:j] is a user message, or a whole run of tool messages."""
    steps = []
    for k, m in enumerate(messages):
        if k == 0 or (m["role"] == "tool" and messages[k - 1]["role"] == "tool"):
            continue
        j = k + 1
        while m["role"] == "tool" and j < len(messages) and messages[j]["role"] == "tool":
            j += 1
        steps.append((k, j))
    return steps


@pytest.mark.parametrize(("messages", "tools"), CONVERSATIONS)
def test_template_is_prefix_stable(hf_tok: Any, messages: Any, tools: Any) -> None:
    steps = _next_steps(messages)
    assert steps
    for k, j in steps:
        # user / tool turns: render(C) prefixes render(C + M, gen); an assistant turn also
        # continues the generation prompt: render(C, gen) prefixes render(C + [assistant]).
        assistant = messages[k]["role"] == "assistant"
        prefix = render(hf_tok, messages[:k], tools, gen=assistant)
        after = render(hf_tok, messages[:j], tools, gen=not assistant)
        assert after.startswith(prefix), (k, j)
        prefix_ids = hf_tok.encode(prefix, add_special_tokens=False)
        after_ids = hf_tok.encode(after, add_special_tokens=False)
        assert after_ids[: len(prefix_ids)] == prefix_ids, (k, j)


def test_model_generates(hf_tok: Any, hf_model: Any) -> None:
    import torch

    prompt = render(hf_tok, [{"role": "user", "content": "What is 2 + 3?"}], TOOLS, gen=True)
    ids = torch.tensor([hf_tok.encode(prompt, add_special_tokens=False)])
    out = hf_model.generate(ids, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 5)
    assert torch.equal(out[0, : ids.shape[1]], ids[0])
    assert isinstance(hf_tok.decode(out[0, ids.shape[1] :]), str)


@pytest.mark.slow  # two fresh `agentloop` processes importing torch and transformers: ~25 s
def test_same_seed_same_files_and_cli_loads_offline(tiny_dir: Path, cli_dir: Path) -> None:
    for name in ("tokenizer.json", "model.safetensors", "config.json", "chat_template.jinja"):
        assert (tiny_dir / name).read_bytes() == (cli_dir / name).read_bytes(), name
    code = (
        "import sys; from transformers import AutoTokenizer, AutoModelForCausalLM; "
        "t = AutoTokenizer.from_pretrained(sys.argv[1]); "
        "m = AutoModelForCausalLM.from_pretrained(sys.argv[1]); "
        "print(type(t).__name__, len(t), m.config.model_type)"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(cli_dir)], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["Qwen2Tokenizer", "2048", "qwen2"]


def test_other_seed_and_dtype(tiny_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    other = tiny.make_tiny_model(tmp_path / "m", seed=1, dtype="bfloat16")
    assert (other / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()
    a, b = load_file(tiny_dir / "model.safetensors"), load_file(other / "model.safetensors")
    assert a.keys() == b.keys()
    name = "model.layers.0.self_attn.q_proj.weight"
    assert b[name].dtype.is_floating_point and str(b[name].dtype) == "torch.bfloat16"
    assert not (a[name].bfloat16() == b[name]).all()


def test_bad_arguments_name_the_value(tmp_path: Path) -> None:
    from agentloop.errors import ConfigError

    with pytest.raises(ConfigError, match="float64"):
        tiny.make_tiny_model(tmp_path, dtype="float64")
    with pytest.raises(ConfigError, match="vocab_size=100"):
        tiny.make_tiny_model(tmp_path, vocab_size=100)


def test_other_shapes_share_the_tokenizer(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bigger random-init model (the GPU demo's 768 x 12) is the same tokenizer and head_dim
    in another shape, cached beside the tiny model under a name that says the shape."""
    from agentloop.errors import ConfigError

    other = tiny.make_tiny_model(tmp_path / "m", hidden_size=384, num_layers=2)
    config = json.loads((other / "config.json").read_text())
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
    assert [config[k] for k in (*keys, "intermediate_size", "head_dim")] == [384, 2, 6, 3, 768, 64]
    assert (other / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()
    monkeypatch.setenv(tiny.ENV_VAR, str(tmp_path / "cache" / "tiny"))
    assert tiny.tiny_model_path() == tmp_path / "cache" / "tiny"
    big = tiny.tiny_model_path(hidden_size=768, num_layers=12)
    assert big == tmp_path / "cache" / "tiny-768x12"
    for bad in ({"hidden_size": 320}, {"hidden_size": 64}, {"num_layers": 0}):
        with pytest.raises(ConfigError, match="multiple of 128"):
            tiny.make_tiny_model(tmp_path / "bad", **bad)
    assert not (tmp_path / "bad").exists()


def test_tiny_model_dir_builds_once_and_survives_a_race(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    cached, raced = tmp_path / "a" / "cache", tmp_path / "raced"

    def fake_make(out: Path, **shape: int) -> Path:
        calls.append(Path(out))
        (Path(out) / "model.safetensors").write_text("mine")
        if len(calls) == 2:  # another process finishes first and renames its copy into place
            raced.mkdir()
            (raced / "model.safetensors").write_text("theirs")
        return Path(out)

    monkeypatch.setattr(tiny, "make_tiny_model", fake_make)
    assert tiny.tiny_model_dir(cached) == cached
    assert tiny.tiny_model_dir(cached) == cached  # cached: no second build
    assert (cached / "model.safetensors").read_text() == "mine" and len(calls) == 1

    monkeypatch.setenv(tiny.ENV_VAR, str(raced))
    assert tiny.tiny_model_dir() == raced
    assert (raced / "model.safetensors").read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "raced"]  # temp dirs removed
