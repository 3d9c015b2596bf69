"""Wire format of the sandbox server: run requests, and SandboxFusion's `/run_code` answers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentloop.errors import ConfigError

from .base import ExecResult, decode_files

__all__ = ["RunRequest", "parse_run_request", "sandboxfusion_request", "sandboxfusion_response"]


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


def sandboxfusion_response(result: ExecResult) -> dict[str, Any]:
    """A SandboxFusion ``RunCodeResponse`` for ``result``."""
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
        "files": {},
    }


def sandboxfusion_request(body: Any) -> RunRequest:
    """A SandboxFusion ``RunCodeRequest`` as a run request (``memory_limit_MB``,
    ``compile_timeout`` and ``fetch_files`` are accepted; the server's own limits apply)."""
    if not isinstance(body, dict):
        raise ConfigError("request body must be a JSON object")
    language = str(body.get("language") or "python")
    return parse_run_request(
        {
            "code": body.get("code"),
            "language": {"python3": "python", "sh": "bash"}.get(language, language),
            "timeout_s": body.get("run_timeout"),
            "stdin": body.get("stdin") or None,
            "files": body.get("files") or {},
        }
    )
