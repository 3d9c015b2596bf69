"""The sandbox contract: records, limits validation, file checks, the registry, package hygiene."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import agentloop.sandboxes as sandboxes
from agentloop.errors import ConfigError, SandboxError
from agentloop.sandboxes import ExecResult, SandboxLimits, available_sandboxes, make_sandbox
from agentloop.sandboxes.base import check_files, check_language, decode_files, encode_files

PKG_DIR = Path(sandboxes.__file__).parent
MODULES = sorted(p.stem for p in PKG_DIR.glob("*.py") if p.stem != "__init__")


def test_exec_result_round_trips_and_ok() -> None:
    res = ExecResult("out", "err", 0, duration_s=0.5)
    assert res.ok
    assert ExecResult.from_dict({**res.to_dict(), "extra": 1}) == res
    assert not ExecResult("", "", 0, timed_out=True).ok
    assert not ExecResult("", "", 137, oom_killed=True).ok
    with pytest.raises(SandboxError, match="malformed sandbox result"):
        ExecResult.from_dict({"stdout": "x"})


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("timeout_s", 0, "timeout_s must be a positive number"),
        ("timeout_s", float("inf"), "timeout_s"),
        ("memory_mb", 1.5, "memory_mb must be a positive integer"),
        ("memory_mb", 16, "too small"),
        ("max_processes", 2, "at least 4"),
        ("cpus", -1, "cpus"),
        ("max_output_bytes", True, "max_output_bytes"),
        ("cpu_time_s", 0, "cpu_time_s"),
    ],
)
def test_limits_are_validated_with_clear_messages(field: str, value: object, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as info:
        SandboxLimits(**{field: value})  # type: ignore[arg-type]
    assert repr(value) in str(info.value) or str(value) in str(info.value)


def test_limits_defaults_and_run_timeout() -> None:
    lim = SandboxLimits(timeout_s=5)
    assert lim.cpu_limit_s == 5 and lim.run_timeout(None) == 5 and lim.run_timeout(2) == 2.0
    assert SandboxLimits(timeout_s=5, cpu_time_s=1).cpu_limit_s == 1
    with pytest.raises(ConfigError, match="timeout_s must be a positive number"):
        lim.run_timeout(-1)
    with pytest.raises(AttributeError):
        lim.timeout_s = 3  # type: ignore[misc]


def test_check_files_keeps_paths_inside_the_work_dir() -> None:
    assert check_files({"a/./b.txt": "x", "c": b"\x00"}) == {"a/b.txt": b"x", "c": b"\x00"}
    assert check_files(None) == {}
    for bad in ("/etc/passwd", "../x", "a/../../x", ".", "", "a\0b"):
        with pytest.raises(ConfigError, match="must be relative"):
            check_files({bad: "x"})
    with pytest.raises(ConfigError, match="must be bytes or str"):
        check_files({"x": 3})  # type: ignore[dict-item]
    assert decode_files(encode_files({"x": b"\xff"})) == {"x": b"\xff"}
    with pytest.raises(ConfigError, match="not valid base64"):
        decode_files({"x": "!!"})


def test_check_language() -> None:
    assert check_language("python") == "python"
    with pytest.raises(ConfigError, match="'cpp' is not supported"):
        check_language("cpp")


def test_registry_builds_backends_and_suggests_names() -> None:
    assert {"local", "docker", "remote", "fake", "subprocess_unsafe"} <= set(available_sandboxes())
    assert make_sandbox("fake").name == "fake"
    with pytest.raises(ConfigError, match="Did you mean 'local'"):
        make_sandbox("locl")
    with pytest.raises(ConfigError, match="already registered"):
        sandboxes.register_sandbox("fake", sandboxes.FakeSandbox)
    with pytest.raises(ConfigError, match=r"'fake' cannot be built with \['pool_size'\]"):
        make_sandbox("fake", pool_size=2)


def test_unsafe_backend_needs_an_explicit_opt_in() -> None:
    with pytest.raises(ConfigError, match="WITHOUT isolation"):
        make_sandbox("subprocess_unsafe")


@pytest.mark.parametrize("module", MODULES)
def test_module_all_is_explicit_and_complete(module: str) -> None:
    mod = importlib.import_module(f"agentloop.sandboxes.{module}")
    if module == "kernel":  # runs inside the sandbox as a script
        return
    assert mod.__doc__ and "\n" not in mod.__doc__.strip().splitlines()[0]
    assert isinstance(mod.__all__, list)
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.__all__ names missing {name}"


def test_package_imports_only_the_shared_floor_of_agentloop() -> None:
    for path in PKG_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            module = node.module or "" if isinstance(node, ast.ImportFrom) else ""
            if module.startswith("agentloop") and not module.startswith("agentloop.sandboxes"):
                assert node.module in ("agentloop.errors", "agentloop.types"), path
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("agentloop"), path


def test_import_is_light() -> None:
    code = (
        "import sys, agentloop.sandboxes as s; s.available_sandboxes();"
        "print(sorted(m for m in ('aiohttp', 'docker', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_modules_stay_small() -> None:
    for path in PKG_DIR.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 420, path.name
