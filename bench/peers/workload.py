"""The one GRPO step every system in the race runs: model, prompts, lengths, and the model dir.

    python bench/peers/workload.py --tokenizer .gpu-stage/tiny-qwen2 --out /root/models/race-0.5B

The model is a random-init Qwen2 of a real shape (``bench/shapes.py``, built by
``bench/gpu/models.py``). Its tokenizer is the staged tiny BPE one with its vocabulary padded to
the model's 151,936 ids (filler tokens no merge makes), so every id a random model samples
decodes in every system (vLLM's detokenizer, TRL's reward text, verl's reward manager)."""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import shutil
import string
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # bench/ is not a package: shapes.py is a sibling

SHAPES = {"0.5b": "0.5B", "1.5b": "1.5B"}
VARIANTS = ("single", "multi")
# Chat-template tokens around one observation, over its own: the closing of the cut turn, the
# user turn's header and end, the next assistant header (18 with the race tokenizer), with room
TEMPLATE_TOKENS = 32


@dataclass(frozen=True)
class Workload:
    """What each system runs per step: ``prompts`` × ``samples`` episodes of ``turns`` turns
    (single: 1; multi: 3), each turn exactly ``turn_tokens`` sampled tokens (``response_len``
    split evenly: 512, or 170 a turn), and between two turns a fixed user message of
    ``tool_tokens`` tokens whatever the model wrote (masked out of the loss); ``steps`` steps,
    the first a warm-up."""

    shape: str = "0.5b"
    variant: str = "single"
    prompts: int = 64
    samples: int = 8
    response_len: int = 512
    tool_tokens: int = 64
    steps: int = 5
    lr: float = 1e-6
    kv_cache_gb: float = 8.0

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"--shape {self.shape!r} is not one of {sorted(SHAPES)}")
        if self.variant not in VARIANTS:
            raise ValueError(f"--variant {self.variant!r} is not one of {list(VARIANTS)}")
        if self.steps < 2:
            raise ValueError(f"--steps must be >= 2 (one warm-up, one timed), got {self.steps}")

    @property
    def turns(self) -> int:
        return 3 if self.variant == "multi" else 1

    @property
    def turn_tokens(self) -> int:
        """Tokens every turn samples (EOS ignored): 512 single, 170 in each of the 3 turns."""
        return self.response_len // self.turns

    @property
    def sampled_tokens(self) -> int:
        """Tokens one episode samples, all its turns together (512, or 510)."""
        return self.turns * self.turn_tokens

    @property
    def max_response(self) -> int:
        """Tokens after the prompt: every turn's reply plus the observations between them."""
        return self.sampled_tokens + (self.turns - 1) * (self.tool_tokens + TEMPLATE_TOKENS)

    @property
    def sequences(self) -> int:
        return self.prompts * self.samples


PROMPT_WORDS = [
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "is",
    "def",
    "print",
    "return",
    "if",
    "else",
    "for",
]


def step_parser(description: str | None) -> argparse.ArgumentParser:
    """The arguments every system's GRPO-step script takes (race.py passes them)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shape", default="0.5b")
    parser.add_argument("--variant", default="single")
    parser.add_argument("--steps", type=int, default=5)
    return parser


def workload_of(args: argparse.Namespace) -> Workload:
    """The workload a step script's parsed arguments name."""
    return Workload(shape=args.shape, variant=args.variant, steps=args.steps)


def prompt_text(i: int) -> str:
    """Prompt ``i``: a fixed sentence of about 100 tokens, distinct per ``i``."""
    words = [PROMPT_WORDS[(i * 7 + k * 3) % len(PROMPT_WORDS)] for k in range(96)]
    return f"Task {i}: " + " ".join(words)


def tool_result_text(tokens: int = 64) -> str:
    """The fixed observation of the multi-turn variant: ``tokens`` tokens with the race
    tokenizer (``a`` and `` a`` are one token each; ``0`` and `` 0`` would be 127)."""
    return " ".join(["a"] * tokens)


def gpu_models() -> Any:
    """``bench/gpu/models.py`` (the GPU benches' model builder), loaded by path."""
    spec = importlib.util.spec_from_file_location(
        "bench_gpu_models", HERE.parent / "gpu" / "models.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pad_vocab(tokenizer_json: dict, size: int) -> dict:
    """``tokenizer_json`` (a byte-level BPE) with filler tokens up to ``size`` ids."""
    vocab: dict[str, int] = tokenizer_json["model"]["vocab"]
    used = set(vocab.values()) | {t["id"] for t in tokenizer_json.get("added_tokens", [])}
    next_id = max(used) + 1
    fillers = ("Ġ" + "".join(c) for c in itertools.product(string.ascii_lowercase, repeat=4))
    for word in fillers:
        if next_id >= size:
            break
        if word not in vocab:
            vocab[word] = next_id
            next_id += 1
    return tokenizer_json


def race_tokenizer(src: Path, dest: Path, size: int) -> Path:
    """Copy the tokenizer files of ``src`` to ``dest`` with the vocabulary padded to ``size``."""
    TOKENIZER_FILES = gpu_models().TOKENIZER_FILES

    dest.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy(src / name, dest / name)
    tj = json.loads((src / "tokenizer.json").read_text())
    (dest / "tokenizer.json").write_text(json.dumps(pad_vocab(tj, size), ensure_ascii=False))
    return dest


def build_model(shape: str, tokenizer: Path, out: Path) -> Path:
    """The race's model dir (reused when present): random-init ``shape``, padded tokenizer."""
    if (out / "config.json").exists():  # built by an earlier command on this machine
        return out
    models = gpu_models()
    size = SHAPES[shape]
    vocab = models.SIZES[size]["vocab_size"]
    tok = race_tokenizer(tokenizer, out.with_name(out.name + ".tokenizer"), vocab)
    return Path(models.make_model_dir(size, out, tok, max_len=4096))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shape", default="0.5b", choices=sorted(SHAPES))
    args = parser.parse_args()
    print(build_model(args.shape, args.tokenizer, args.out), flush=True)


if __name__ == "__main__":
    main()
