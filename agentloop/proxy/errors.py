"""The proxy's one error type and its OpenAI wire shape (``{"error": {...}}``)."""

from __future__ import annotations

from typing import Any

from agentloop.errors import AgentLoopError

__all__ = ["ProxyRequestError", "error_body"]


class ProxyRequestError(AgentLoopError):
    """A request the proxy refuses; answered with OpenAI's error shape and ``status``."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def __reduce__(self) -> tuple[Any, ...]:  # keyword fields survive pickling
        return (_rebuild, (str(self), self.status, self.param, self.code, self.kind))


def _rebuild(message: str, status: int, param: str | None, code: str | None, kind: str) -> Any:
    return ProxyRequestError(message, status=status, param=param, code=code, kind=kind)


def error_body(err: ProxyRequestError) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}``, what the openai SDK parses."""
    return {"error": {"message": str(err), "type": err.kind, "param": err.param, "code": err.code}}
