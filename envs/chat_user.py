"""ChatUser: a model behind any OpenAI-compatible chat-completions server plays the simulated user.

:class:`ChatUserConfig` holds the settings (what a YAML ``env_kwargs`` mapping or an
``--env-arg user={...}`` JSON value gives); :class:`ChatUser` is the :class:`UserSimulator`
that sends the conversation, seen from the user's side, to ``base_url`` with the official
``openai`` SDK. Unlike :class:`~agentloop.envs.user_sim.EngineUser` it needs no second
in-process engine: any server will do (``vllm serve``, an OpenAI-compatible API).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib
import math
import os
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from agentloop.envs.user_sim import fill_template, flipped_chat
from agentloop.errors import ConfigError, EnvError, did_you_mean
from agentloop.types import Message, Task

if TYPE_CHECKING:
    import ssl

    from openai import AsyncOpenAI
    from openai.types.chat import ChatCompletionMessageParam

__all__ = ["ChatUser", "ChatUserConfig"]

#: The key sent when ``api_key_env`` is unset: local servers (``vllm serve``) take any key.
PLACEHOLDER_KEY = "EMPTY"


@dataclass(frozen=True)
class ChatUserConfig:
    """The settings of a :class:`ChatUser`, checked on construction."""

    base_url: str
    """The server's OpenAI API root, e.g. ``http://127.0.0.1:8000/v1``."""
    model: str
    """The model name the server serves (``vllm serve --served-model-name``)."""
    persona: str
    """The user model's system prompt: a ``str.format`` template filled from ``task.data``
    (``"You want to know {prompt}"``; literal braces doubled)."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key (the key itself never enters a
    config or a run's ``config.json``); None: a placeholder key, for local servers."""
    max_tokens: int = 128
    """Most tokens per user reply."""
    temperature: float = 0.7
    """The user model's sampling temperature (>= 0)."""
    timeout_s: float = 60.0
    """Deadline of one user reply, connection included; past it the episode fails (env_error)."""
    opening_text: str | None = None
    """The user's first message (a template like ``persona``); None: the task env's prompt."""
    stop_phrase: str = "###STOP###"
    """A reply containing it (or an empty reply) ends the conversation."""

    def __post_init__(self) -> None:
        rules = [
            ("base_url", _is_str(self.base_url) and self.base_url.startswith(("http://", "https://")),
             "must be the http(s) URL of an OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1"),
            ("model", _is_str(self.model), "must name the served model (a non-empty string)"),
            ("persona", _is_str(self.persona), "must be the user's system prompt (a non-empty "
             "str.format template over the task's fields)"),
            ("api_key_env", self.api_key_env is None or _is_str(self.api_key_env),
             "must name an environment variable holding the key, or be null for a local server"),
            ("max_tokens", _is_int(self.max_tokens) and self.max_tokens >= 1,
             "must be an int >= 1"),
            ("temperature", _is_num(self.temperature) and self.temperature >= 0,
             "must be a number >= 0"),
            ("timeout_s", _is_num(self.timeout_s) and self.timeout_s > 0, "must be a number > 0 "
             "(seconds)"),
            ("opening_text", self.opening_text is None or _is_str(self.opening_text),
             "must be a non-empty string, or null to keep the task env's prompt"),
            ("stop_phrase", _is_str(self.stop_phrase), "must be a non-empty string"),
        ]  # fmt: skip
        for name, ok, fix in rules:
            if not ok:
                raise ConfigError(f"user.{name}={getattr(self, name)!r}: {fix}")
        for name in ("persona", "opening_text"):
            template = getattr(self, name)
            try:
                list(string.Formatter().parse(template or ""))
            except ValueError as exc:
                raise ConfigError(
                    f"user.{name}={template!r} is not a str.format template ({exc}); write "
                    "task fields as {prompt} and literal braces as {{ and }}"
                ) from None

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any]) -> ChatUserConfig:
        """The config from a plain mapping (YAML, JSON); unknown or missing keys are named."""
        names = [f.name for f in dataclasses.fields(cls)]
        for key in settings:
            if key not in names:
                raise ConfigError(
                    f"user.{key} is not a ChatUser setting.{did_you_mean(key, names)} "
                    f"Settings: {names}"
                )
        required = [f.name for f in dataclasses.fields(cls) if _required(f)]
        missing = [name for name in required if name not in settings]
        if missing:
            raise ConfigError(
                f"user settings {dict(settings)!r} lack {missing}; a model-played user needs at "
                'least {"base_url": "http://HOST:PORT/v1", "model": "NAME"}'
            )
        return cls(**settings)


class ChatUser:
    """A :class:`~agentloop.envs.user_sim.UserSimulator` played by ``config.model`` at
    ``config.base_url``: it sees ``config.persona`` as its system prompt and the conversation
    from the other side (the policy's messages as ``user``, its own as ``assistant``; tool
    traffic left out), like :class:`~agentloop.envs.user_sim.EngineUser`.

    Each reply opens its own short-lived client (under a millisecond, with the process-wide TLS
    context made here), so one ChatUser can serve concurrent episodes and event loops and has
    nothing to close. A server error or a reply past ``timeout_s`` is an :class:`EnvError`
    naming the URL (the episode ends as ``env_error``), never an empty reply."""

    def __init__(self, config: ChatUserConfig) -> None:
        self.config = config
        self._api_key = _api_key(config.api_key_env)
        # Paid once per process, when the first env is made, not on the loop mid-episode:
        importlib.import_module("openai")  # ~1 s
        self._tls = _tls_context()  # ~50 ms

    def opening(self, task: Task) -> str | None:
        text = self.config.opening_text
        return None if text is None else fill_template(text, task)

    async def reply(self, task: Task, messages: Sequence[Message]) -> str | None:
        import openai

        c = self.config
        chat = cast("list[ChatCompletionMessageParam]", flipped_chat(c.persona, task, messages))
        where = f"the user model {c.model!r} at {c.base_url}"
        try:
            async with asyncio.timeout(c.timeout_s), self._client() as client:
                response = await client.chat.completions.create(
                    model=c.model, messages=chat, max_tokens=c.max_tokens, temperature=c.temperature
                )
        except (TimeoutError, openai.APITimeoutError):
            raise EnvError(
                f"{where} did not reply within user.timeout_s={c.timeout_s:g}; is the server "
                "overloaded? raise user.timeout_s or lower user.max_tokens"
            ) from None
        except openai.APIStatusError as exc:
            raise EnvError(
                f"{where} answered HTTP {exc.status_code}: {exc.message}; check user.model and "
                "user.base_url (and user.api_key_env for a hosted API)"
            ) from exc
        except openai.APIError as exc:
            raise EnvError(
                f"{where} failed ({type(exc).__name__}: {exc}); is the server running and "
                "user.base_url its /v1 root?"
            ) from exc
        if not response.choices:
            raise EnvError(f"{where} returned no choices: {response.model_dump_json()[:300]}")
        choice = response.choices[0]
        text = (choice.message.content or "").strip()
        if not text and choice.finish_reason == "length":
            raise EnvError(
                f"{where} spent user.max_tokens={c.max_tokens} without any reply text; raise "
                "user.max_tokens"
            )
        return None if not text or c.stop_phrase in text else text

    def _client(self) -> AsyncOpenAI:
        import openai

        c = self.config
        return openai.AsyncOpenAI(
            base_url=c.base_url,
            api_key=self._api_key,
            timeout=c.timeout_s,
            max_retries=0,  # one deadline per reply: a retry would quietly multiply it
            http_client=openai.DefaultAsyncHttpxClient(verify=self._tls, timeout=c.timeout_s),
        )


def _api_key(env_var: str | None) -> str:
    if env_var is None:
        return PLACEHOLDER_KEY
    key = os.environ.get(env_var)
    if not key:
        raise ConfigError(
            f"user.api_key_env={env_var!r}: the environment variable {env_var} is not set; "
            "export it with the API key (or set api_key_env to null for a local server)"
        )
    return key


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One verifying TLS context for every client (making one loads the CA bundle, ~50 ms)."""
    import ssl

    import certifi

    return ssl.create_default_context(cafile=certifi.where())


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _is_str(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
