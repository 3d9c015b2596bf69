"""Random-init Qwen2 model dirs of real sizes for the GPU benchmarks (no weights to download).

python bench/gpu/models.py --tokenizer .gpu-stage/tiny-qwen2 --models /root/models
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from shapes import QWEN2_SHAPES  # bench/ is not a package: its folder is on sys.path

SIZES = QWEN2_SHAPES
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "vocab.json", "merges.txt")  # fmt: skip


def qwen2_config(size: str, max_len: int = 16384) -> Qwen2Config:
    return Qwen2Config(
        max_position_embeddings=max_len, rope_theta=1e6, rms_norm_eps=1e-6,
        torch_dtype="bfloat16", **SIZES[size],
    )  # fmt: skip


def num_params(config: Qwen2Config) -> int:
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def make_model_dir(size: str, dest: Path, tokenizer_dir: Path, max_len: int = 16384) -> Path:
    """Save a seeded random-init model of ``size`` (bf16 safetensors) with the tokenizer of
    ``tokenizer_dir`` (its ids are a subset of the model's vocab). Reused when present.

    Built on the GPU when there is one (a 7B initialises in seconds there, minutes on a CPU);
    the seed fixes the weights per device kind, not across CPU and GPU."""
    if (dest / "config.json").exists():
        return dest
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with device:
        model = AutoModelForCausalLM.from_config(qwen2_config(size, max_len), dtype=torch.bfloat16)
    tmp = dest.with_name(dest.name + ".partial")  # a killed save leaves no dir that looks done
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, tmp / name)
    tmp.rename(dest)
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokenizer", type=Path, required=True, help="dir with tokenizer files")
    parser.add_argument("--models", type=Path, default=Path("/root/models"))
    parser.add_argument("--sizes", nargs="+", default=["0.5B", "1.5B", "3B"])
    args = parser.parse_args()
    for size in args.sizes:
        print(make_model_dir(size, args.models / f"qwen2-{size}", args.tokenizer), flush=True)


if __name__ == "__main__":
    main()
