"""Where a remote sandbox pool finds its servers and token: arguments or the environment."""

from __future__ import annotations

import os
from collections.abc import Sequence

from agentloop.errors import ConfigError

__all__ = ["DEFAULT_URL", "TOKEN_ENV", "URLS_ENV", "resolve_token", "resolve_urls"]

#: Read when no ``urls`` are given: comma-separated base URLs of ``agentloop serve-sandbox``.
URLS_ENV = "AGENTLOOP_SANDBOX_URLS"
#: Read when no ``token_env`` is given: the servers' bearer token (never put it in a config).
TOKEN_ENV = "AGENTLOOP_SANDBOX_TOKEN"
#: The server address when neither ``urls`` nor ``$AGENTLOOP_SANDBOX_URLS`` names one.
DEFAULT_URL = "http://127.0.0.1:8080"


def resolve_urls(urls: str | Sequence[str] | None, urls_env: str | None) -> tuple[str, ...]:
    source = "urls"
    if urls is None or (not isinstance(urls, str) and len(urls) == 0):
        env = urls_env or URLS_ENV
        value = os.environ.get(env, "").strip()
        if urls_env is not None and not value:
            raise ConfigError(
                f"remote sandbox urls_env={urls_env!r} but ${urls_env} is not set; set it to the "
                "servers' URLs, e.g. http://10.0.0.5:8080,http://10.0.0.6:8080"
            )
        urls, source = (value or DEFAULT_URL), f"${env}"
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    out = tuple(u.strip().rstrip("/") for u in items if isinstance(u, str) and u.strip())
    bad = [
        u
        for u in items
        if not isinstance(u, str) or not u.strip().startswith(("http://", "https://"))
    ]
    if not out or bad:
        raise ConfigError(
            f"remote sandbox {source} must be http(s) base URLs like 'http://10.0.0.5:8080', "
            f"got {urls!r}"
        )
    if len(set(out)) != len(out):
        raise ConfigError(f"remote sandbox {source} lists a server twice: {list(out)}")
    return out


def resolve_token(token: str | None, token_env: str | None) -> tuple[str | None, str]:
    """The token and where it came from (for messages; never the token itself)."""
    if token is not None:
        return token, "the token passed in"
    env = token_env or TOKEN_ENV
    value = os.environ.get(env) or None
    if token_env is not None and value is None:
        raise ConfigError(
            f"remote sandbox token_env={token_env!r} but ${token_env} is not set; export the "
            "servers' token in it"
        )
    return value, f"from ${env}" if value else f"none: ${env} is not set"
