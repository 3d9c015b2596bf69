"""Wire format of the sandbox server: run requests, and SandboxFusion's `/run_code` answers."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentloop.errors import ConfigError

from .base import ExecResult, decode_files

__all__ = [
    "FusionRequest",
    "RunRequest",
    "fetch_code",
    "parse_fetched",
    "parse_run_request",
    "sandboxfusion_request",
    "sandboxfusion_response",
]

_MAX_FETCH_FILES = 64


@dataclass(frozen=True, slots=True)
class RunRequest:
    """A validated run request (the body of ``/v1/run`` and ``/v1/sessions/{id}/run``)."""

    code: str
    language: str = "python"
    timeout_s: float | None = None
    stdin: str | None = None
    files: Mapping[str, bytes] = field(default_factory=dict)


def parse_run_request(body: Any) -> RunRequest:
    """Validate a JSON run body; ConfigError names the bad field."""
    if not isinstance(body, dict):
        raise ConfigError(f"request body must be a JSON object, got {type(body).__name__}")
    code, language = body.get("code"), body.get("language", "python")
    timeout, stdin, files = body.get("timeout_s"), body.get("stdin"), body.get("files") or {}
    if not isinstance(code, str):
        raise ConfigError("field 'code' must be a string with the program to run")
    if not isinstance(language, str):
        raise ConfigError(f"field 'language' must be a string, got {language!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)):
        raise ConfigError(f"field 'timeout_s' must be a number of seconds, got {timeout!r}")
    if stdin is not None and not isinstance(stdin, str):
        raise ConfigError(f"field 'stdin' must be a string, got {type(stdin).__name__}")
    if not isinstance(files, dict):
        raise ConfigError("field 'files' must map relative paths to base64 text")
    return RunRequest(code, language, timeout, stdin, decode_files(files))


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


def _memory_limit(value: Any, server_mb: int) -> None:
    """``memory_limit_MB``: a per-run limit this server can keep only when it is at or above
    its own (which then applies); a lower one it cannot set per request, so it is refused."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"field 'memory_limit_MB' must be a number of MB, got {value!r}")
    if value <= 0:
        return  # SandboxFusion's "no limit of its own" (-1): the server's limit applies
    if value < server_mb:
        raise ConfigError(
            f"memory_limit_MB={value:g} is below this server's per-run memory limit of "
            f"{server_mb} MB, which a request cannot lower; send memory_limit_MB >= {server_mb} "
            f"(or -1), or start the server with --memory-mb {int(value)}"
        )


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


def sandboxfusion_request(body: Any, memory_mb: int) -> FusionRequest:
    """A SandboxFusion ``RunCodeRequest`` (``compile_timeout`` is accepted and unused).

    ``run_timeout`` is capped by the server's limit, ``memory_limit_MB`` must be at or above the
    server's ``memory_mb`` (or -1: then the server's applies), ``fetch_files`` (python) are read
    back from the work dir after the run and returned base64-encoded in ``files``.
    """
    if not isinstance(body, dict):
        raise ConfigError("request body must be a JSON object")
    language = str(body.get("language") or "python")
    language = {"python3": "python", "sh": "bash"}.get(language, language)
    _memory_limit(body.get("memory_limit_MB"), memory_mb)
    run = parse_run_request(
        {
            "code": body.get("code"),
            "language": language,
            "timeout_s": body.get("run_timeout"),
            "stdin": body.get("stdin") or None,
            "files": body.get("files") or {},
        }
    )
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
