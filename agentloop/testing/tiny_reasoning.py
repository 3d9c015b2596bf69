"""The tiny model's reasoning variant: a chat template that drops earlier turns' ``<think>``.

:data:`REASONING_TEMPLATE` is the tiny model's ChatML + Hermes-tools template, written for
agentloop, with one change that reasoning models' templates make (DeepSeek-R1's, Qwen3's): an
assistant message in the history is rendered without its reasoning, i.e. only what follows its
last ``</think>`` (leading newlines dropped). The model samples ``<think>…</think>answer``, and the
next prompt shows only ``answer``: the template is not prefix-stable, so training with it needs
``rollout.thinking=keep`` or ``strip``. :func:`wear_reasoning_template` writes the tiny model
with this template, for tests of both policies (HF, vLLM, eval and training).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from agentloop.models.tiny import CHAT_TEMPLATE

__all__ = ["REASONING_TEMPLATE", "wear_reasoning_template"]

_CONTENT = "{%- set content = text(m.content) -%}"
_STRIPPED = (
    _CONTENT + "{%- if '</think>' in content -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}"
)
REASONING_TEMPLATE = CHAT_TEMPLATE.replace(_CONTENT, _STRIPPED)
if REASONING_TEMPLATE == CHAT_TEMPLATE:  # pragma: no cover -- the tiny template changed
    raise RuntimeError("the tiny chat template has no assistant content line to patch")


def wear_reasoning_template(tiny_dir: str | Path, out_dir: str | Path) -> Path:
    """Copy the tiny model in ``tiny_dir`` to ``out_dir`` with :data:`REASONING_TEMPLATE` as its
    tokenizer's chat template (same weights and ids); return ``out_dir``."""
    out = Path(out_dir)
    shutil.copytree(tiny_dir, out, dirs_exist_ok=True)
    config = json.loads((out / "tokenizer_config.json").read_text())
    if config.pop("chat_template", None) is not None:  # older layouts keep it here
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "chat_template.jinja").write_text(REASONING_TEMPLATE)
    return out
