"""Wire format of the sandbox server: run requests, and SandboxFusion's `/run_code` answers."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentloop.errors import ConfigError
from agentloop.sandboxes.base import ExecResult, decode_files

__all__ = [
    "FusionRequest",
    "RunRequest",
    "cap_output",
    "fetch_code",
    "parse_fetched",
    "parse_run_request",
    "sandboxfusion_request",
    "sandboxfusion_response",
]

_MAX_FETCH_FILES = 64
_MIN_MEMORY_MB = 32  # SandboxLimits' floor: less cannot hold a Python interpreter


@dataclass(frozen=True, slots=True)
class RunRequest:
    """A validated run request (the body of ``/v1/run`` and ``/v1/sessions/{id}/run``).

    ``timeout_s``, ``memory_mb`` and ``max_output_bytes`` are the client's own limits: None
    (or infinity) leaves the server's; a value may tighten the server's limit, never lift it
    (the server takes the lower of the two).
    """

    code: str
    language: str = "python"
    timeout_s: float | None = None
    stdin: str | None = None
    files: Mapping[str, bytes] = field(default_factory=dict)
    memory_mb: int | None = None
    max_output_bytes: int | None = None


def limit_value(name: str, value: Any, unit: str) -> float | None:
    """A client's limit: a positive number (infinity: none of its own, so None), or None when
    absent; anything that is not a limit (a string, a boolean, NaN, zero or a negative number)
    is a ConfigError naming the field."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ConfigError(f"field {name!r} must be a number of {unit}, got {value!r}")
    if value <= 0:
        raise ConfigError(
            f"field {name!r} must be a positive number of {unit}, got {value!r}; leave it out "
            "to use the server's limit"
        )
    return None if math.isinf(value) else float(value)


def _memory_mb(name: str, value: Any) -> int | None:
    mb = limit_value(name, value, "MB")
    if mb is not None and mb < _MIN_MEMORY_MB:
        raise ConfigError(
            f"field {name!r} is {value!r} MB, too little for a Python interpreter; send at least "
            f"{_MIN_MEMORY_MB}"
        )
    return None if mb is None else int(mb)


def _text(name: str, value: str) -> str:
    """``value`` if it encodes as UTF-8 (a lone surrogate does not), else a ConfigError."""
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise ConfigError(
            f"field {name!r} is not valid Unicode text: {value[exc.start : exc.end]!r} at "
            f"character {exc.start} is a lone surrogate; send UTF-8 text"
        ) from None
    return value


def parse_run_request(body: Any) -> RunRequest:
    """Validate a JSON run body; ConfigError names the bad field."""
    if not isinstance(body, dict):
        raise ConfigError(f"request body must be a JSON object, got {type(body).__name__}")
    code, language = body.get("code"), body.get("language", "python")
    stdin, files = body.get("stdin"), body.get("files") or {}
    if not isinstance(code, str):
        raise ConfigError("field 'code' must be a string with the program to run")
    if not isinstance(language, str):
        raise ConfigError(f"field 'language' must be a string, got {language!r}")
    timeout = limit_value("timeout_s", body.get("timeout_s"), "seconds")
    out = limit_value("max_output_bytes", body.get("max_output_bytes"), "bytes")
    if stdin is not None and not isinstance(stdin, str):
        raise ConfigError(f"field 'stdin' must be a string, got {type(stdin).__name__}")
    if not isinstance(files, dict):
        raise ConfigError("field 'files' must map relative paths to base64 text")
    for path in files:
        _text("files", path)
    return RunRequest(
        _text("code", code),
        language,
        timeout,
        None if stdin is None else _text("stdin", stdin),
        decode_files(files),
        _memory_mb("memory_mb", body.get("memory_mb")),
        None if out is None else max(1, int(out)),
    )


def cap_output(result: ExecResult, max_bytes: int | None) -> ExecResult:
    """``result`` with each stream cut to ``max_bytes`` of UTF-8 (None: as it is)."""
    if max_bytes is None:
        return result
    stdout, stderr = _cut(result.stdout, max_bytes), _cut(result.stderr, max_bytes)
    if stdout is None and stderr is None:
        return result
    return dataclasses.replace(
        result,
        stdout=result.stdout if stdout is None else stdout,
        stderr=result.stderr if stderr is None else stderr,
        truncated=True,
    )


def _cut(text: str, max_bytes: int) -> str | None:
    """``text`` cut to ``max_bytes`` of UTF-8, or None when it fits."""
    if len(text) <= max_bytes // 4:  # a character is at most 4 bytes: shorter ones fit
        return None
    data = text.encode()
    return data[:max_bytes].decode("utf-8", "ignore") if len(data) > max_bytes else None


@dataclass(frozen=True, slots=True)
class FusionRequest:
    """A validated SandboxFusion ``RunCodeRequest``: the run, and the files to send back."""

    run: RunRequest
    fetch_files: tuple[str, ...] = ()


def sandboxfusion_response(
    result: ExecResult, files: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A SandboxFusion ``RunCodeResponse`` for ``result`` (``files``: path -> base64)."""
    status = "Success" if result.ok else "Failed"
    return {
        "status": status,
        "message": "",
        "compile_result": None,
        "run_result": {
            "status": "TimeLimitExceeded" if result.timed_out else "Finished",
            "execution_time": result.duration_s,
            "return_code": None if result.timed_out else result.exit_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
        },
        "executor_pod_name": None,
        "files": dict(files or {}),
    }


def _fusion_memory(value: Any) -> int | None:
    """``memory_limit_MB``: -1 is SandboxFusion's default, "no limit of its own"."""
    if value == -1 and not isinstance(value, bool):
        return None
    return _memory_mb("memory_limit_MB", value)


def _fetch_list(value: Any, language: str) -> tuple[str, ...]:
    if not value:
        return ()
    if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
        raise ConfigError(f"field 'fetch_files' must be a list of file paths, got {value!r}")
    if len(value) > _MAX_FETCH_FILES:
        raise ConfigError(
            f"fetch_files lists {len(value)} files, over the limit of {_MAX_FETCH_FILES}"
        )
    if language != "python":
        raise ConfigError(
            f"fetch_files is supported for language 'python' only, got {language!r}; "
            "copy the files out with a python run instead"
        )
    return tuple(value)


def sandboxfusion_request(body: Any) -> FusionRequest:
    """A SandboxFusion ``RunCodeRequest`` (``compile_timeout`` is accepted and unused).

    ``run_timeout`` and ``memory_limit_MB`` are the client's limits, as SandboxFusion has them:
    the server runs with the lower of each and its own (a higher one is clamped to the
    server's; -1, SandboxFusion's default, leaves the server's). ``fetch_files`` (python) are
    read back from the work dir after the run and returned base64-encoded in ``files``.
    """
    if not isinstance(body, dict):
        raise ConfigError("request body must be a JSON object")
    language = str(body.get("language") or "python")
    language = {"python3": "python", "sh": "bash"}.get(language, language)
    run = parse_run_request(
        {
            "code": body.get("code"),
            "language": language,
            "timeout_s": body.get("run_timeout"),
            "stdin": body.get("stdin") or None,
            "files": body.get("files") or {},
        }
    )
    run = dataclasses.replace(run, memory_mb=_fusion_memory(body.get("memory_limit_MB")))
    return FusionRequest(run, _fetch_list(body.get("fetch_files"), language))


def fetch_code(paths: tuple[str, ...]) -> str:
    """A Python program that writes ``{path: base64 or null}`` of ``paths`` as one JSON line,
    to ``sys.stdout`` (which the kernel resets after every run), not through ``print`` (which
    the run before may have replaced); in a function, so the session's variables stay."""
    return (
        "def _agentloop_fetch(paths):\n"
        "    import base64, json, sys\n"
        "    out = {}\n"
        "    for p in paths:\n"
        "        try:\n"
        "            with open(p, 'rb') as f:\n"
        "                out[p] = base64.b64encode(f.read()).decode()\n"
        "        except OSError:\n"
        "            out[p] = None\n"
        "    sys.stdout.write(json.dumps(out) + '\\n')\n"
        f"_agentloop_fetch({list(paths)!r})\n"
        "del _agentloop_fetch\n"
    )


def parse_fetched(result: ExecResult) -> dict[str, str]:
    """The files a :func:`fetch_code` run sent back (missing ones left out); ConfigError when
    the read-back failed or its output is not the ``{path: base64 or null}`` object expected."""
    if result.truncated or not result.ok:
        raise ConfigError(
            "fetch_files could not be read back whole (over the server's output cap of one "
            f"run, or the read failed: {result.stderr.strip()[-300:]!r}); fetch fewer or smaller "
            "files"
        )
    try:
        data = json.loads(result.stdout)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict) or not all(isinstance(b, str | None) for b in data.values()):
        raise ConfigError(
            "fetch_files could not be read back: the read-back run wrote "
            f"{result.stdout[:120]!r}, not a JSON object of base64 file contents (did the code "
            "replace json, sys.stdout.write or open, or leave a thread writing to stdout?); "
            "fetch the files without changing those"
        )
    return {p: b for p, b in data.items() if b is not None}
