"""Config dataclasses as commented YAML: every key is printed under its field's docstring."""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any

from agentloop.config_docs import field_docs

__all__ = ["config_to_yaml", "field_docs"]

_WIDTH = 96


def config_to_yaml(cfg: Any) -> str:
    """``cfg`` (a config dataclass) as YAML that :func:`~agentloop.trainers.config.load_config`
    reads back, each key under its docstring as a comment (what ``--print-config`` shows)."""
    return "\n".join(_lines(cfg, indent="")) + "\n"


def _lines(cfg: Any, indent: str) -> list[str]:
    from omegaconf import OmegaConf

    out: list[str] = []
    cls: type = type(cfg)  # mypy reads type(Any) as a non-Hashable type[Any]
    docs = field_docs(cls)
    for f in dataclasses.fields(cfg):
        if f.name in docs:
            wrapped = textwrap.wrap(
                " ".join(docs[f.name].split()), _WIDTH - len(indent) - 2, break_on_hyphens=False
            )
            out += [f"{indent}# {line}" for line in wrapped]
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            out += [f"{indent}{f.name}:", *_lines(value, indent + "  ")]
            continue
        text = OmegaConf.to_yaml(OmegaConf.create({f.name: value})).rstrip("\n")
        out += [indent + line for line in text.splitlines()]
    return out
