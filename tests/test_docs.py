"""Every code block in README.md and docs/ runs: Python is executed, shell commands are run.

Each Markdown file's Python blocks run in order in one namespace, in a subprocess (top-level
``await`` allowed, as in ``python -m asyncio``); its ``bash`` blocks run in order in one shell
working directory (the repository's ``recipes/`` and ``bench/`` linked in), with ``$MODEL`` set
to the tiny model and ``$CALLER`` to the tiny model taught to call Calc's tool (so that tool
record/replay commands replay real calls). A block that must not run here (a long training run,
a GPU cluster) carries an annotation on the line above it,
``<!-- test: skip; covered by tests/x.py::test_y -->``, naming the test that covers it instead;
that test must exist. ``text`` blocks are not code; ``yaml``
and ``json`` blocks must parse.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

__all__: list[str] = []

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
DOC_FILES = sorted(
    [ROOT / "README.md", ROOT / "recipes" / "README.md", *(ROOT / "docs").rglob("*.md")]
)
CODE_LANGS = {"python", "bash"}
KNOWN_LANGS = CODE_LANGS | {"text", "yaml", "json"}
README_BUDGET_BYTES = 12 * 1024

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,})(?P<info>[^`]*)$")
_SKIP = re.compile(r"<!--\s*test:\s*skip\b(?P<note>.*?)-->")
_COVER = re.compile(r"(?P<path>tests/[\w/]+\.py|\.ci/run)(?:::(?P<name>\w+))?")


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its language, its code, and its skip note (if any)."""

    path: Path
    line: int
    lang: str
    code: str
    skip: str | None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def parse_blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, with the skip annotation on the line above each."""
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, fence = len(m["indent"]), m["fence"]
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == fence)
        code = "\n".join(line[indent:] for line in lines[i + 1 : end]) + "\n"
        lang = (m["info"].split() or [""])[0]
        blocks.append(Block(path, i + 1, lang, code, _skip_note(lines, i)))
        i = end + 1
    return blocks


def _skip_note(lines: list[str], fence_index: int) -> str | None:
    above = next((s for s in reversed(lines[:fence_index]) if s.strip()), "")
    m = _SKIP.search(above)
    return m["note"].strip() if m else None


ALL_BLOCKS = [b for path in DOC_FILES for b in parse_blocks(path)]


def _files_with(lang: str) -> list[Path]:
    return sorted({b.path for b in ALL_BLOCKS if b.lang == lang and b.skip is None})


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


def test_every_block_declares_a_known_language() -> None:
    unknown = [f"{b.where}: {b.lang!r}" for b in ALL_BLOCKS if b.lang not in KNOWN_LANGS]
    assert not unknown, f"give these blocks a language ({sorted(KNOWN_LANGS)}): {unknown}"


def test_every_skip_names_a_covering_test_that_exists() -> None:
    problems = []
    for b in (b for b in ALL_BLOCKS if b.skip is not None):
        refs = list(_COVER.finditer(b.skip))
        if not refs:
            problems.append(f"{b.where}: the skip names no covering test: {b.skip!r}")
        for ref in refs:
            target = ROOT / ref["path"]
            if not target.is_file():
                problems.append(f"{b.where}: {ref['path']} does not exist")
            elif ref["name"] and not re.search(rf"def {ref['name']}\b", target.read_text()):
                problems.append(f"{b.where}: {ref['path']} has no test {ref['name']}")
    assert not problems, "\n".join(problems)


def test_data_blocks_parse() -> None:
    for b in ALL_BLOCKS:
        if b.lang == "yaml":
            yaml.safe_load(b.code)
        elif b.lang == "json":
            json.loads(b.code)


def test_the_readme_is_a_front_door() -> None:
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_BUDGET_BYTES, f"README.md is {size} bytes; move detail into docs/"


# Runs a file's Python blocks in order in one namespace and one event loop, so blocks may use
# top-level await; each block compiles under its doc location, so a traceback names the line.
_RUNNER = """
import asyncio, ast, inspect, json, sys
blocks = json.loads(sys.stdin.read())
namespace = {"__name__": "__main__"}
loop = asyncio.new_event_loop()
try:
    for where, code in blocks:
        print(f"--- {where}", flush=True)
        compiled = compile(code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        if compiled.co_flags & inspect.CO_COROUTINE:
            loop.run_until_complete(eval(compiled, namespace))
        else:
            exec(compiled, namespace)
finally:
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()
"""


def _env(tiny_model_dir: Path, caller_dir: Path | None = None) -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "AGENTLOOP_TINY_MODEL": str(tiny_model_dir),
        "MODEL": str(tiny_model_dir),
        **({"CALLER": str(caller_dir)} if caller_dir is not None else {}),
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }


def _check(proc: subprocess.CompletedProcess[str], what: str) -> None:
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"


@pytest.mark.parametrize("path", _files_with("python"), ids=_ids(_files_with("python")))
def test_python_blocks_run(path: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    blocks = [(b.where, b.code) for b in _runnable(path, "python")]
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER],
        input=json.dumps(blocks),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(tiny_model_dir),
        timeout=540,
    )
    _check(proc, f"the Python blocks of {path.relative_to(ROOT)}")


def _runnable(path: Path, lang: str) -> list[Block]:
    return [b for b in ALL_BLOCKS if b.path == path and b.lang == lang and b.skip is None]


@pytest.mark.slow  # each `agentloop` command is a fresh process importing torch; one trains SFT
@pytest.mark.parametrize("path", _files_with("bash"), ids=_ids(_files_with("bash")))
def test_shell_blocks_run(
    path: Path, tiny_model_dir: Path, calc_caller_dir: Path, tmp_path: Path
) -> None:
    for folder in ("recipes", "bench"):  # commands name repository paths, as from its root
        (tmp_path / folder).symlink_to(ROOT / folder)
    for b in _runnable(path, "bash"):
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", b.code],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=_env(tiny_model_dir, calc_caller_dir),
            timeout=540,
        )
        _check(proc, f"the shell block at {b.where}")
    for recording in _REPLAYED.get(str(path.relative_to(ROOT)), ()):
        calls = (tmp_path / recording / "tool_calls.jsonl").read_text()
        assert calls.strip(), f"{path.name}: {recording} recorded no tool call: the replay is empty"


#: Tool recordings a file's commands make and replay: each must hold calls, or the identity its
#: commands check would hold trivially.
_REPLAYED = {"README.md": ("tape",), "docs/guides/mcp-and-replay.md": ("tapes/calc",)}


@pytest.mark.slow
def test_mkdocs_build_is_strict_clean(tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(VENV_BIN / "mkdocs"), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=540,
    )
    _check(proc, "mkdocs build --strict")
    assert "WARNING" not in proc.stderr, proc.stderr
    assert (tmp_path / "site" / "reference" / "tools" / "index.html").is_file()


_LINK = re.compile(r"\]\((?P<target>[^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("name", ["README.md", "recipes/README.md"])
def test_links_outside_the_site_resolve(name: str) -> None:
    """mkdocs checks the links of docs/; these two files live outside it."""
    path = ROOT / name
    targets = [m["target"] for m in _LINK.finditer(path.read_text())]
    broken = [t for t in targets if "://" not in t and not (path.parent / t).exists()]
    assert targets and not broken, f"{name}: broken links {broken}"
