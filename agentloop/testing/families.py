"""The tiny model's tokenizer dressed as another model family: its template and special tokens.

The tiny tokenizer reserves ids 0-6 for special and added tokens. :func:`wear_family` renames
them to the family's own markers (ids unchanged, so the tiny model and an engine already serving
it take the same ids), sets the family's stop tokens as EOS, and saves the family's agentloop
chat template: a tokenizer that renders, encodes and stops like that family's checkpoints.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from agentloop.formats import family

__all__ = ["wear_family"]

_RESERVED = 7  # ids 0-6: <|endoftext|> <|im_start|> <|im_end|> and the four tool tags


def wear_family(tiny_dir: str | Path, name: str, out_dir: str | Path) -> Path:
    """Write into ``out_dir`` the tiny tokenizer (from ``tiny_dir``) as family ``name``."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    fam = family(name)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = json.loads((Path(tiny_dir) / "tokenizer.json").read_text())
    renames: dict[str, str] = {}
    for added in data["added_tokens"]:
        if added["id"] < min(_RESERVED, len(fam.special_tokens)):
            new = fam.special_tokens[added["id"]]
            renames[added["content"]] = new
            added["content"] = new
            added["special"] = True
    vocab = data["model"]["vocab"]
    for old, new in renames.items():
        if old in vocab:
            vocab[new] = vocab.pop(old)
    tok = Tokenizer.from_str(json.dumps(data))
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=fam.stop_tokens[0],
        pad_token=fam.special_tokens[0],
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    hf.chat_template = fam.chat_template
    hf.save_pretrained(str(out))
    stop_ids = [tok.token_to_id(t) for t in fam.stop_tokens]
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": stop_ids}) + "\n")
    for extra in ("config.json",):  # lets from_pretrained treat the folder as the model's
        if (Path(tiny_dir) / extra).is_file():
            shutil.copy(Path(tiny_dir) / extra, out / extra)
    return out
