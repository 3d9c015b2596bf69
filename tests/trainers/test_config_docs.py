"""Config docs: every key a user sets has a field docstring, and ``--print-config`` shows them
as comments in YAML that loads back to the same config."""

from __future__ import annotations

import dataclasses
import subprocess
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentloop.trainers.config import TrainConfig, example_config, load_config
from agentloop.trainers.config_text import field_docs
from agentloop.trainers.sft import SFTConfig


def _sections(cls: type, prefix: str = "") -> Iterator[tuple[str, type]]:
    """``(dotted path, dataclass)`` of ``cls`` and of every section under it."""
    yield prefix or cls.__name__, cls
    for f in dataclasses.fields(cls):
        default = f.default_factory() if callable(f.default_factory) else f.default
        if dataclasses.is_dataclass(default):
            yield from _sections(type(default), f"{prefix}{f.name}.")


def _fields(cfg: Any, indent: str = "") -> Iterator[tuple[str, str, str]]:
    """``(indent, key, docstring)`` of every field of ``cfg`` and its sections, in print order."""
    docs = field_docs(type(cfg))
    for f in dataclasses.fields(cfg):
        yield indent, f.name, docs[f.name]
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            yield from _fields(value, indent + "  ")


@pytest.mark.parametrize("root", [TrainConfig, SFTConfig])
def test_every_field_of_every_section_has_a_docstring(root: type) -> None:
    missing = [
        f"{path}{f.name}" if path.endswith(".") else f"{path}.{f.name}"
        for path, cls in _sections(root)
        for f in dataclasses.fields(cls)
        if not field_docs(cls).get(f.name, "").strip()
    ]
    assert not missing, f"fields without a docstring: {missing}"


def _print_config(command: str, *args: str) -> str:
    agentloop = Path(sysconfig.get_path("scripts")) / "agentloop"
    assert agentloop.is_file(), f"no console script at {agentloop}: run `make setup`"
    proc = subprocess.run(
        [str(agentloop), command, "--print-config", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _assert_commented(out: str, cfg: Any) -> None:
    """Each key's line comes right under a comment block that is its whole docstring."""
    lines, at = out.splitlines(), 0
    for indent, key, doc in _fields(cfg):
        while not lines[at].startswith((f"{indent}{key}:", f"{indent}'{key}':")):
            at += 1
        above = []
        for line in reversed(lines[:at]):
            if not line.startswith(f"{indent}# "):
                break
            above.insert(0, line[len(indent) + 2 :])
        # the wrap may break a line after a hyphen: compare the words without any spacing
        assert "".join("".join(above).split()) == "".join(doc.split()), f"{key}: {above}"
        at += 1


@pytest.mark.parametrize(
    ("command", "schema", "args"),
    [
        ("train", TrainConfig, ("grpo_calc_tiny", "trainer.total_steps=3")),
        ("sft", SFTConfig, ("sft_calc_tiny",)),
    ],
)
def test_print_config_shows_the_docs_and_loads_back_equal(
    command: str, schema: type, args: tuple[str, ...], tmp_path: Path
) -> None:
    out = _print_config(command, *args)
    expected = load_config(schema, example_config(args[0]), list(args[1:]))
    _assert_commented(out, expected)
    printed = tmp_path / "printed.yaml"
    printed.write_text(out)
    assert load_config(schema, printed) == expected
