"""Package hygiene: one installed package, light imports, explicit public APIs."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"agentloop": "agentloop", "tools": "agentloop.tools", "envs": "agentloop.envs",
           "trainers": "agentloop.trainers", "sandboxes": "agentloop.sandboxes"}  # fmt: skip


def package_modules() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def test_every_sub_package_is_listed_in_pyproject() -> None:
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    for folder, name in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            assert ".".join((name, *rel)) in listed, f"add {'.'.join((name, *rel))} to pyproject"


def test_import_agentloop_is_light() -> None:
    code = (
        "import sys, agentloop, agentloop.tools, agentloop.envs, agentloop.rollout;"
        "heavy = {'torch', 'vllm', 'ray', 'transformers'} & set(sys.modules);"
        "print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"import pulled in {out.stdout.strip()}"


@pytest.mark.parametrize("path", package_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_has_docstring_and_valid_all(path: Path) -> None:
    tree = ast.parse(path.read_text())
    assert ast.get_docstring(tree), f"{path.name}: start with a one-line docstring saying its job"
    names = [n for n in tree.body if isinstance(n, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)]  # fmt: skip
    if path.name == "__init__.py" and not names:
        return
    assert names, f"{path.name}: declare __all__"
    exported = ast.literal_eval(names[0].value)
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef
               | ast.ClassDef)}  # fmt: skip
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign | ast.AnnAssign)
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                if isinstance(t, ast.Name)}  # fmt: skip
    defined |= {a.asname or a.name.split(".")[0] for n in tree.body
                if isinstance(n, ast.Import | ast.ImportFrom) for a in n.names}  # fmt: skip
    missing = [name for name in exported if name not in defined]
    assert not missing, f"{path.name}: __all__ names {missing} that the module does not define"
