"""Config dataclasses as commented YAML: every key is printed under its field's docstring."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
from typing import Any

__all__ = ["config_to_yaml", "field_docs"]

_WIDTH = 96


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of dataclass ``cls`` and its bases (the string literal right
    under a field, as mkdocstrings reads it), by field name."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        (node,) = ast.parse(textwrap.dedent(inspect.getsource(klass))).body
        assert isinstance(node, ast.ClassDef)
        for field, doc in zip(node.body, node.body[1:], strict=False):
            if (
                isinstance(field, ast.AnnAssign)
                and isinstance(field.target, ast.Name)
                and isinstance(doc, ast.Expr)
                and isinstance(doc.value, ast.Constant)
                and isinstance(doc.value.value, str)
            ):
                docs[field.target.id] = inspect.cleandoc(doc.value.value)
    return docs


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
