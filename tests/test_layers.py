"""The house's layers, read from every import of the library (an ``ast`` scan, no imports run).

Floors, bottom up: the shared types and errors; ``sandboxes``; ``tools``; ``envs``; the core's
lower rooms (engines, chat template, formats, io, ...); the loop (``rollout``, ``collect``, the
proxy that plays agent programs); what drives the loop (``eval``, ``loop_workers``, ``doctor``, the
standalone proxy server); ``trainers``; and on top the entry points: ``models`` (the models built
here, the demo) and ``cli``. An import may point down or across a floor, never up; no library
module imports ``agentloop.testing``; no import circle holds more than two files. The layer
folders are read through their ``agentloop/`` links, so ``agentloop/trainers`` is ``trainers/``.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import agentloop

PACKAGE = Path(agentloop.__file__).resolve().parent

#: ``(module prefix, floor)``: the longest prefix that matches a module gives its floor.
FLOORS: tuple[tuple[str, int], ...] = (
    ("agentloop.types", 0),
    ("agentloop.errors", 0),
    ("agentloop.sandboxes", 1),
    ("agentloop.tools", 2),
    ("agentloop.envs", 3),
    ("agentloop", 4),  # the core's lower rooms; the package's face is lazy (agentloop/_lazy.py)
    ("agentloop.rollout", 5),
    ("agentloop.rollout_state", 5),
    ("agentloop.collect", 5),
    ("agentloop.proxy", 5),  # agent programs' episodes, played by the same loop
    ("agentloop.eval", 6),
    ("agentloop.loop_workers", 6),
    ("agentloop.loop_worker", 6),  # a loop worker process: the loop, asking the driver
    ("agentloop.doctor", 6),
    ("agentloop.serve_proxy", 7),  # ``agentloop serve-proxy``: the proxy before an engine
    ("agentloop.trainers", 8),
    ("agentloop.models", 9),
    ("agentloop.cli", 9),
    ("agentloop.testing", 10),  # test helpers: nothing in the library imports them
)
FACE_FLOOR = 7
#: Imports that run up a floor on purpose, each with its reason. Empty: none do.
ALLOWED_UP: dict[tuple[str, str], str] = {}
#: Import circles of more than two files allowed, each with its reason. Empty: none are.
ALLOWED_CIRCLES: dict[frozenset[str], str] = {}
#: What the CLI imports only inside the command that needs it, so ``agentloop --help`` and the
#: light commands never import torch, Ray or vLLM.
CLI_LAZY = ("agentloop.trainers", "agentloop.models", "agentloop.proxy", "agentloop.eval")


@dataclass(frozen=True)
class Import:
    """``source`` imports ``target`` at ``line``; ``lazy``: inside a function (or under
    ``if TYPE_CHECKING:``), so not when ``source`` is imported."""

    source: str
    target: str
    line: int
    lazy: bool


def _modules() -> dict[str, Path]:
    """Every module of the package, the layer folders read through their links."""
    found: dict[str, Path] = {}
    for dirpath, dirs, files in os.walk(PACKAGE, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in files:
            if name.endswith(".py"):
                path = Path(dirpath) / name
                parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
                found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _floor(module: str) -> int:
    if module == "agentloop":  # the package's face: it hands on names from the floors below
        return FACE_FLOOR
    best = max((p for p, _ in FLOORS if module == p or module.startswith(p + ".")), key=len)
    return dict(FLOORS)[best]


class _Reader(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, modules: dict[str, Path]) -> None:
        self.module, self.modules, self.depth = module, modules, 0
        self.package = module if is_package else module.rpartition(".")[0]
        self.found: list[Import] = []

    def _function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_If(self, node: ast.If) -> None:
        """``if TYPE_CHECKING:`` imports are read by the checker only: lazy, as in a function."""
        test = node.test
        name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", "")
        if name != "TYPE_CHECKING":
            self.generic_visit(node)
            return
        self.depth += 1
        for child in node.body:
            self.visit(child)
        self.depth -= 1
        for child in node.orelse:
            self.visit(child)

    def _add(self, name: str, line: int) -> None:
        while name and name not in self.modules:  # ``a.b.name``: the module that defines it
            name = name.rpartition(".")[0]
        if name.startswith("agentloop") and name != self.module:
            self.found.append(Import(self.module, name, line, self.depth > 0))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            parts = self.package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
        for alias in node.names:
            self._add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in self.modules else base,
                      node.lineno)  # fmt: skip


@cache
def imports() -> tuple[Import, ...]:
    """Every first-party import of the library, ``TYPE_CHECKING`` and lazy ones included."""
    modules, found = _modules(), []
    for module, path in sorted(modules.items()):
        reader = _Reader(module, path.name == "__init__.py", modules)
        reader.visit(ast.parse(path.read_text(), str(path)))
        found += reader.found
    return tuple(found)


def _circles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[frozenset[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start), on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child), on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(frozenset(component))
    return circles


def test_the_scan_reads_every_layer_through_its_link() -> None:
    modules = _modules()
    for layer in ("sandboxes", "tools", "envs", "trainers"):
        assert (PACKAGE / layer).is_symlink() or (PACKAGE / layer).is_dir()
        assert sum(m.startswith(f"agentloop.{layer}.") for m in modules) >= 10, layer
    assert {"agentloop.trainers.grpo", "agentloop.models.tiny", "agentloop.cli"} <= set(modules)
    assert any(i.lazy for i in imports()) and any(not i.lazy for i in imports())


def test_no_import_runs_up_a_floor() -> None:
    up = [
        f"{i.source}:{i.line} -> {i.target} (floor {_floor(i.source)} -> {_floor(i.target)})"
        for i in imports()
        if _floor(i.target) > _floor(i.source) and (i.source, i.target) not in ALLOWED_UP
    ]
    assert not up, "imports that run back up a floor (see FLOORS):\n" + "\n".join(up)
    assert all(reason for reason in ALLOWED_UP.values())


def test_no_library_module_imports_the_test_helpers() -> None:
    bad = [
        f"{i.source}:{i.line} -> {i.target}"
        for i in imports()
        if i.target.startswith("agentloop.testing") and not i.source.startswith("agentloop.testing")
    ]
    assert not bad, "the library imports agentloop.testing (test helpers):\n" + "\n".join(bad)


def test_no_import_circle_holds_more_than_two_files() -> None:
    edges: dict[str, set[str]] = {}
    for i in imports():
        edges.setdefault(i.source, set()).add(i.target)
    big = [sorted(c) for c in _circles(edges) if len(c) > 2 and c not in ALLOWED_CIRCLES]
    assert not big, f"import circles of more than two files: {big}"
    assert all(reason for reason in ALLOWED_CIRCLES.values())


def test_the_circle_finder_finds_a_circle_of_three() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}}
    assert sorted(map(sorted, _circles(edges))) == [["a", "b", "c"], ["d", "e"]]


def _in_cli(module: str) -> bool:
    return module == "agentloop.cli" or module.startswith("agentloop.cli.")


def test_the_cli_imports_what_needs_torch_ray_or_vllm_only_inside_its_commands() -> None:
    eager = [
        f"{i.source}:{i.line} -> {i.target}"
        for i in imports()
        if _in_cli(i.source) and not i.lazy and i.target.startswith(CLI_LAZY)
    ]
    assert not eager, "the CLI imports these at start-up; import them in the command:\n" + (
        "\n".join(eager)
    )
    lazy = {i.target for i in imports() if _in_cli(i.source) and i.lazy}
    assert {"agentloop.trainers.grpo", "agentloop.models"} <= lazy


#: STYLE.md's budget for a function of the library (its ``def`` line to its last line).
MAX_FUNCTION_LINES = 60
#: Library functions allowed past the budget, each with its reason. Empty: none are.
LONG_FUNCTIONS: dict[str, str] = {}


def function_sizes() -> dict[str, int]:
    """Every function of the library (``module.Class.name``; nested ones too) by its lines."""
    sizes: dict[str, int] = {}
    for module, path in _modules().items():
        if module.startswith("agentloop.testing"):
            continue
        work: list[tuple[str, ast.AST]] = [(module, ast.parse(path.read_text(), str(path)))]
        while work:
            prefix, node = work.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    name = f"{prefix}.{child.name}"
                    if not isinstance(child, ast.ClassDef):
                        sizes[name] = (child.end_lineno or child.lineno) - child.lineno + 1
                    work.append((name, child))
    return sizes


def test_library_functions_stay_within_the_budget() -> None:
    sizes = function_sizes()
    assert "agentloop.rollout._play" in sizes and "agentloop.engines.vllm.VLLMEngine.start" in sizes
    long = [
        f"{name}: {n} lines"
        for name, n in sorted(sizes.items())
        if n > MAX_FUNCTION_LINES and name not in LONG_FUNCTIONS
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (extract helpers):\n" + (
        "\n".join(long)
    )
    assert all(reason for reason in LONG_FUNCTIONS.values())


#: STYLE.md's budget for a file of the library (aim for 400).
MAX_FILE_LINES = 500


def test_library_files_stay_within_the_budget() -> None:
    sizes = {m: len(p.read_text().splitlines()) for m, p in _modules().items()}
    assert sizes["agentloop.trainers.config"] > 100 and sizes["agentloop.engines.vllm"] > 100
    big = [f"{m}: {n} lines" for m, n in sorted(sizes.items()) if n > MAX_FILE_LINES]
    assert not big, f"files over {MAX_FILE_LINES} lines (split them by concern):\n" + "\n".join(big)
