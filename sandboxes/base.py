"""The sandbox contract: ExecResult, SandboxLimits, the Sandbox protocol, the backend registry."""

from __future__ import annotations

import base64
import binascii
import importlib
import math
import os
import posixpath
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol, runtime_checkable

from agentloop.errors import ConfigError, SandboxError, did_you_mean

__all__ = [
    "LANGUAGES",
    "ExecResult",
    "Sandbox",
    "SandboxFactory",
    "SandboxLimitError",
    "SandboxLimits",
    "SandboxSession",
    "available_sandboxes",
    "check_files",
    "check_language",
    "make_sandbox",
    "pid_alive",
    "register_sandbox",
]

#: Languages a backend may support; sessions (persistent interpreters) are Python only.
LANGUAGES = ("python", "bash")

# Sizes above these are almost certainly a bug in the caller, not a program to run.
_MAX_CODE_BYTES = 4 << 20
_MAX_FILES_BYTES = 64 << 20
_MAX_FILES = 1000


class SandboxLimitError(SandboxError, ConfigError):
    """A run's input is past a sandbox's input limits (code size, file count, file bytes); the
    message names the limit and what to do. A :class:`SandboxError`, as issue 21 asks, and
    still a :class:`ConfigError` (the caller's input), which these checks raised before."""


@dataclass(frozen=True, slots=True)
class ExecResult:
    """What one run produced.

    ``stdout``/``stderr`` are decoded UTF-8 (invalid bytes replaced) and capped at
    ``SandboxLimits.max_output_bytes`` each; ``truncated`` says a cap was hit. ``exit_code`` is the
    program's status, ``128 + signal`` when it was killed (137 after a timeout or the OOM killer).
    ``duration_s`` is the wall time of the run inside the sandbox.
    """

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    oom_killed: bool = False
    duration_s: float = 0.0
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """The program ran to completion with exit status 0."""
        return self.exit_code == 0 and not self.timed_out and not self.oom_killed

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the remote protocol's wire format)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExecResult:
        """Inverse of :meth:`to_dict`; unknown keys are ignored, missing required ones and
        fields of the wrong type (a string exit code, a number for a flag) are a SandboxError."""
        names = {f.name for f in fields(cls)}
        try:
            result = cls(**{k: v for k, v in data.items() if k in names})
        except TypeError as exc:
            raise SandboxError(f"malformed sandbox result {str(dict(data))[:300]}: {exc}") from None
        bad = [
            f"{name}={getattr(result, name)!r:.60} (want {want})"
            for name, want, ok in (
                ("stdout", "str", isinstance(result.stdout, str)),
                ("stderr", "str", isinstance(result.stderr, str)),
                ("exit_code", "int", _is_int(result.exit_code)),
                ("timed_out", "bool", isinstance(result.timed_out, bool)),
                ("oom_killed", "bool", isinstance(result.oom_killed, bool)),
                ("duration_s", "number", _is_number(result.duration_s)),
                ("truncated", "bool", isinstance(result.truncated, bool)),
            )
            if not ok
        ]
        if bad:
            raise SandboxError(f"malformed sandbox result: {', '.join(bad)}")
        return result


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _positive(name: str, value: Any, *, integer: bool, fix: str) -> None:
    ok_type = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok_type or not math.isfinite(value) or value <= 0:
        kind = "a positive integer" if integer else "a positive number"
        raise ConfigError(f"SandboxLimits.{name} must be {kind}, got {value!r}; {fix}")


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Resource limits applied to every run (and every session) of a sandbox.

    ``timeout_s`` is the default wall-clock limit of one run; ``cpu_time_s`` the CPU-time limit
    (default: ``timeout_s``). ``memory_mb`` bounds the sandbox's memory (with cgroups, tmpfs
    files included), ``max_processes`` its process count (fork bombs), ``cpus`` its CPU share.
    Output beyond ``max_output_bytes`` per stream is dropped; no single file may exceed
    ``max_file_mb`` and the writable ``/sandbox``, ``/tmp`` and ``/dev/shm`` hold at most
    ``disk_mb`` each.
    """

    timeout_s: float = 30.0
    cpu_time_s: float | None = None
    memory_mb: int = 1024
    max_processes: int = 64
    cpus: float = 1.0
    max_output_bytes: int = 1 << 20
    max_file_mb: int = 64
    disk_mb: int = 256

    def __post_init__(self) -> None:
        _positive("timeout_s", self.timeout_s, integer=False, fix="e.g. timeout_s=30")
        if self.cpu_time_s is not None:
            _positive("cpu_time_s", self.cpu_time_s, integer=False, fix="or None to use timeout_s")
        _positive("memory_mb", self.memory_mb, integer=True, fix="e.g. memory_mb=1024")
        if self.memory_mb < 32:
            raise ConfigError(
                f"SandboxLimits.memory_mb={self.memory_mb} is too small for a Python interpreter; "
                "use at least 32"
            )
        _positive("max_processes", self.max_processes, integer=True, fix="e.g. 64")
        if self.max_processes < 4:
            raise ConfigError(
                f"SandboxLimits.max_processes={self.max_processes} leaves no room for the "
                "interpreter and its supervisor; use at least 4"
            )
        _positive("cpus", self.cpus, integer=False, fix="e.g. cpus=1.0 (one core)")
        _positive("max_output_bytes", self.max_output_bytes, integer=True, fix="e.g. 1 << 20")
        _positive("max_file_mb", self.max_file_mb, integer=True, fix="e.g. 64")
        _positive("disk_mb", self.disk_mb, integer=True, fix="e.g. 256")

    @property
    def cpu_limit_s(self) -> float:
        """The effective CPU-time limit of one run."""
        return self.cpu_time_s if self.cpu_time_s is not None else self.timeout_s

    def run_timeout(self, timeout_s: float | None) -> float:
        """Validate a per-run ``timeout_s`` (None: the default) and return the one to use."""
        if timeout_s is None:
            return self.timeout_s
        if (
            isinstance(timeout_s, bool)
            or not isinstance(timeout_s, int | float)
            or not math.isfinite(timeout_s)
            or timeout_s <= 0
        ):
            raise ConfigError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        return float(timeout_s)


def check_language(language: str, supported: tuple[str, ...] = LANGUAGES) -> str:
    """Return ``language`` if the backend runs it, else raise a ConfigError naming the choices."""
    if language not in supported:
        raise ConfigError(
            f"language {language!r} is not supported by this sandbox; use one of {supported}"
        )
    return language


def check_files(files: Mapping[str, bytes | str] | None) -> dict[str, bytes]:
    """Validate files to place in the work dir: relative paths that stay inside it.

    Values are bytes or text (UTF-8 encoded). Returns ``{normalized_path: bytes}``.
    """
    if not files:
        return {}
    if not isinstance(files, Mapping):
        raise ConfigError(f"files must be a mapping of relative path -> bytes, got {files!r}")
    if len(files) > _MAX_FILES:
        raise SandboxLimitError(
            f"{len(files)} files in one run, over the limit of {_MAX_FILES}; "
            "pack them into an archive and unpack it in the code"
        )
    out: dict[str, bytes] = {}
    total = 0
    for path, data in files.items():
        norm = posixpath.normpath(path) if isinstance(path, str) else ""
        if (
            not norm
            or "\0" in norm
            or norm.startswith("/")
            or norm == "."
            or norm == ".."
            or norm.startswith("../")
        ):
            raise ConfigError(
                f"file path {path!r} must be relative and stay inside the work dir "
                "(no leading '/', no '..'), e.g. 'data/input.txt'"
            )
        blob = data.encode() if isinstance(data, str) else data
        if not isinstance(blob, bytes | bytearray):
            raise ConfigError(f"file {path!r} must be bytes or str, got {type(data).__name__}")
        total += len(blob)
        out[norm] = bytes(blob)
    if total > _MAX_FILES_BYTES:
        raise SandboxLimitError(
            f"files total {total} bytes, over the {_MAX_FILES_BYTES} byte limit; "
            "ship large data inside the image instead"
        )
    return out


def check_code(code: str) -> str:
    """Reject non-text or oversized code with a clear error."""
    if not isinstance(code, str):
        raise ConfigError(f"code must be str, got {type(code).__name__}")
    if len(code) > _MAX_CODE_BYTES:
        raise SandboxLimitError(
            f"code is {len(code)} characters, over the limit of {_MAX_CODE_BYTES}; "
            "ship large data as files instead"
        )
    return code


def encode_files(files: Mapping[str, bytes]) -> dict[str, str]:
    """``{path: base64 text}`` for JSON transport."""
    return {k: base64.b64encode(v).decode("ascii") for k, v in files.items()}


def decode_files(files: Mapping[str, Any] | None) -> dict[str, bytes]:
    """Inverse of :func:`encode_files`, with an error naming the bad entry."""
    out: dict[str, bytes] = {}
    for path, text in (files or {}).items():
        if text is None:  # SandboxFusion allows null contents: an empty file
            out[path] = b""
            continue
        try:
            out[path] = base64.b64decode(text, validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise ConfigError(f"file {path!r} is not valid base64 text") from None
    return out


@runtime_checkable
class SandboxSession(Protocol):
    """A persistent interpreter: consecutive runs share variables, imports and files."""

    id: str

    async def run(
        self,
        code: str,
        *,
        language: str = "python",
        timeout_s: float | None = None,
        stdin: str | None = None,
        files: Mapping[str, bytes | str] | None = None,
    ) -> ExecResult:
        """Run ``code`` in this session's interpreter; raises SandboxError if the backend fails."""
        ...


@runtime_checkable
class Sandbox(Protocol):
    """Runs untrusted code. Use as ``async with make_sandbox("local") as sb: await sb.run(...)``.

    ``run`` gets a fresh interpreter every call (nothing leaks between calls). ``session()``
    returns an async context manager whose runs share state like a notebook kernel; sessions never
    share state with each other. A run whose *code* fails still returns an ExecResult (non-zero
    ``exit_code``, ``timed_out``, ``oom_killed``); only a backend failure raises SandboxError.
    """

    name: str
    limits: SandboxLimits

    async def start(self) -> None:
        """Prepare the backend (idempotent); called by ``__aenter__``."""
        ...

    async def close(self) -> None:
        """Release every process, container and session (idempotent)."""
        ...

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(self, *exc: object) -> None: ...

    async def run(
        self,
        code: str,
        *,
        language: str = "python",
        timeout_s: float | None = None,
        stdin: str | None = None,
        files: Mapping[str, bytes | str] | None = None,
    ) -> ExecResult:
        """Run ``code`` once in a fresh interpreter."""
        ...

    def session(self) -> AbstractAsyncContextManager[SandboxSession]:
        """A stateful interpreter for the duration of the ``async with`` block."""
        ...


SandboxFactory = Callable[..., Sandbox]
_REGISTRY: dict[str, SandboxFactory | str] = {}


def register_sandbox(name: str, factory: SandboxFactory | str, *, replace: bool = False) -> None:
    """Register a backend under ``name``: a callable or a lazy ``"module:attr"`` entry point."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"sandbox backend name must be a non-empty string, got {name!r}")
    if name in _REGISTRY and not replace:
        raise ConfigError(
            f"sandbox backend {name!r} is already registered; pass replace=True to override it"
        )
    _REGISTRY[name] = factory


def available_sandboxes() -> list[str]:
    """Names accepted by :func:`make_sandbox`."""
    return sorted(_REGISTRY)


def make_sandbox(name: str, **kwargs: Any) -> Sandbox:
    """Build the backend registered as ``name`` with ``kwargs`` (e.g. ``limits=...``)."""
    entry = _REGISTRY.get(name)
    if entry is None:
        raise ConfigError(
            f"unknown sandbox backend {name!r}.{did_you_mean(name, _REGISTRY)} "
            f"Registered: {available_sandboxes()}"
        )
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = getattr(importlib.import_module(module), attr)
    try:
        return entry(**kwargs)
    except TypeError as exc:  # an option this backend does not have
        raise ConfigError(
            f"sandbox backend {name!r} cannot be built with {sorted(kwargs)}: {exc}"
        ) from None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (it may belong to another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
