"""Package hygiene: one installed package, light imports, explicit public APIs."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"agentloop": "agentloop", "tools": "agentloop.tools", "envs": "agentloop.envs",
           "trainers": "agentloop.trainers", "sandboxes": "agentloop.sandboxes"}  # fmt: skip


def package_modules() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def test_every_layer_is_linked_into_the_package() -> None:
    """agentloop/<layer> is a relative symlink to the top-level folder, so the path a checker or an
    IDE resolves for ``agentloop.tools`` is agentloop/tools/ (see pyproject's packages.find)."""
    for folder in FOLDERS:
        if folder == "agentloop":
            continue
        link = ROOT / "agentloop" / folder
        assert link.is_symlink(), f"agentloop/{folder} must be a symlink: ln -s ../{folder} {link}"
        assert link.readlink() == Path("..", folder), f"agentloop/{folder} -> {link.readlink()}"


def test_the_wheel_holds_every_layer_and_its_data(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True, cwd=tmp_path,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("agentloop-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in FOLDERS:
        prefix = "agentloop/" if folder == "agentloop" else f"agentloop/{folder}/"
        assert f"{prefix}__init__.py" in names, f"the wheel lacks {prefix}"
    assert {"agentloop/py.typed", "agentloop/trainers/configs/grpo_calc_tiny.yaml"} <= names
    demo = {f"agentloop/trainers/configs/tiny_retool/{n}.yaml" for n in ("demo", "sft", "grpo")}
    assert demo <= names, "agentloop demo reads its recipe from the package"


def test_a_plain_checkout_imports_every_layer(tmp_path: Path) -> None:
    """No install, no import hook: a copy of the tree on sys.path imports agentloop.tools."""
    tree = tmp_path / "checkout"
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, tree / folder, symlinks=True)
    code = "import sys, agentloop.tools, agentloop.sandboxes.base;print(agentloop.tools.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tree
    )
    assert out.stdout.strip() == str(tree / "agentloop" / "tools" / "__init__.py")


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
    # Lazy exports (agentloop._lazy) are imported for the type checker under `if TYPE_CHECKING:`.
    lazy = [
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    ]
    imports = [*tree.body, *(stmt for block in lazy for stmt in block.body)]
    defined |= {
        a.asname or a.name.split(".")[0]
        for n in imports
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in n.names
    }
    missing = [name for name in exported if name not in defined]
    assert not missing, f"{path.name}: __all__ names {missing} that the module does not define"
