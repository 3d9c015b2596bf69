"""Config dataclasses' attribute docstrings, read from their source (``--print-config``, flags)."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap

__all__ = ["field_docs"]


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
