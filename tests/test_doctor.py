"""``agentloop doctor`` through the console script: one line per check, a fix for each failure,
and a non-zero exit exactly when a required check fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentloop.doctor import CHECKS

AGENTLOOP = Path(sys.executable).parent / "agentloop"  # the installed console script


def _doctor(*args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path if path is not None else os.environ.get("PATH", "")}
    return subprocess.run(
        [str(AGENTLOOP), "doctor", *args], capture_output=True, text=True, env=env, timeout=900
    )


def _lines(stdout: str) -> dict[str, str]:
    """check name -> status (ok / warn / FAIL) from the per-check lines."""
    rows = [line.split(None, 2) for line in stdout.splitlines() if not line.startswith("doctor:")]
    return {name: status for status, name, *_ in rows}


@pytest.mark.slow  # a fresh process importing vLLM, Ray and torch: ~15 s
def test_doctor_reports_every_check_and_passes_here() -> None:
    proc = _doctor()
    statuses = _lines(proc.stdout)
    assert list(statuses) == list(CHECKS), proc.stdout
    assert set(statuses.values()) <= {"ok", "warn", "FAIL"}
    # this machine runs the whole test suite, so the required checks, vLLM and Ray pass here
    for name in ("python", "torch", "vllm", "ray", "sandbox"):
        assert statuses[name] == "ok", proc.stdout
    assert "print(1) ran in the local sandbox" in proc.stdout
    for line in proc.stdout.splitlines():  # every warning says how to fix it
        assert not line.startswith("warn") or " -- fix: " in line, line
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("doctor: every required check passed")


def test_missing_bubblewrap_fails_with_the_install_hint(tmp_path: Path) -> None:
    proc = _doctor("--only", "python,sandbox", path=str(tmp_path))  # an empty PATH: no bwrap
    assert _lines(proc.stdout) == {"python": "ok", "sandbox": "FAIL"}, proc.stdout
    assert "bwrap not found on PATH -- fix: " in proc.stdout
    assert "apt-get install bubblewrap" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "doctor: required check(s) failed: sandbox"
    assert proc.returncode == 1


def test_an_unknown_check_is_a_clear_error() -> None:
    proc = _doctor("--only", "cgrups")
    assert proc.returncode == 2
    assert "no doctor check named 'cgrups'. Did you mean 'cgroups'?" in proc.stderr
