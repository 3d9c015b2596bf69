"""OpenAIEngine: token-in/token-out over an OpenAI-compatible ``/v1/completions`` server."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import aiohttp

from agentloop.engines.base import SamplingParams, prompt_token_ids, reject_images
from agentloop.errors import ConfigError, InferenceError
from agentloop.types import Completion, FinishReason

__all__ = ["OpenAIEngine", "parse_completion"]

log = logging.getLogger(__name__)

_FINISH: Mapping[str, FinishReason] = MappingProxyType(
    {"stop": "stop", "length": "length", "abort": "abort"}
)
_TOKEN_PREFIX = "token_id:"  # how vLLM spells tokens with return_tokens_as_token_ids


class OpenAIEngine:
    """A model served elsewhere (``vllm serve``), used through the completions endpoint.

    The prompt goes out as a list of token ids and the sampled ids come back as ids
    (vLLM's ``return_token_ids``, cross-checked with ``return_tokens_as_token_ids``), so
    nothing is decoded and re-encoded. ``logprobs=0`` returns the sampled tokens' logprobs; they
    follow this package's definition (the distribution actually sampled) only if the server runs
    with ``--logprobs-mode processed_logprobs`` (vLLM's default is ``raw_logprobs``: before
    temperature and top-k/top-p).

    ``base_url`` is the API root, as for the OpenAI SDK (``http://host:8000/v1``). Every request
    has a deadline (``timeout_s``); connection failures (refused, reset, dropped) are retried
    ``max_retries`` times with exponential backoff; HTTP errors and timeouts are not retried.
    Use ``async with OpenAIEngine(...) as engine:`` or call ``aclose()``.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_connections: int = 256,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"base_url={base_url!r} must start with http:// or https:// "
                "(e.g. http://127.0.0.1:8000/v1)"
            )
        if not model:
            raise ConfigError("model must name the served model (vllm serve --served-model-name)")
        if timeout_s <= 0 or connect_timeout_s <= 0:
            raise ConfigError(
                f"timeouts must be positive, got timeout_s={timeout_s}, "
                f"connect_timeout_s={connect_timeout_s}"
            )
        if max_retries < 0:
            raise ConfigError(f"max_retries must be >= 0, got {max_retries}")
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/completions"
        self.model = model
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=connect_timeout_s)
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_settings(
        cls, base_url: str, model: str, settings: Mapping[str, Any], api_key: str | None = None
    ) -> OpenAIEngine:
        """An engine from ``--engine-arg KEY=VALUE`` settings: ``served_model`` (the server's
        ``--served-model-name``; default ``model``) and the keyword arguments of ``__init__``;
        an unknown key names the ones there are."""
        known = ["served_model", *list(inspect.signature(cls.__init__).parameters)[4:]]
        unknown = sorted(set(settings) - set(known))
        if unknown:
            raise ConfigError(f"unknown OpenAIEngine setting(s) {unknown}; known: {known}")
        rest = {k: v for k, v in settings.items() if k != "served_model"}
        return cls(base_url, str(settings.get("served_model", model)), api_key, **rest)

    @property
    def supports_images(self) -> bool:
        """False: the completions endpoint takes token ids only."""
        return False

    async def __aenter__(self) -> OpenAIEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP connection pool. Idempotent."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    shutdown = aclose  # the name the other engines use

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=self._max_connections),
            )
        return self._session

    def request_body(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, session_id: str | None
    ) -> dict[str, Any]:
        """The JSON body sent to ``/v1/completions`` for one request."""
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt_token_ids(prompt_ids),
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "n": 1,
            "stream": False,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }
        if sampling.top_k != -1:
            body["top_k"] = sampling.top_k
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop_token_ids:
            body["stop_token_ids"] = list(sampling.stop_token_ids)
        if session_id is not None:
            body["session_id"] = session_id
        return body

    async def generate(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
        images: Sequence[Any] = (),
    ) -> Completion:
        """Sample a continuation of ``prompt_ids``; see :class:`agentloop.engines.base.Engine`."""
        reject_images(self, images)
        if not prompt_ids:
            raise InferenceError("prompt_ids is empty; a prompt needs at least one token")
        body = self.request_body(prompt_ids, sampling, session_id)
        data = await self._post(body)
        return parse_completion(data, self.url)

    async def _post(self, body: dict[str, Any]) -> Any:
        for attempt in range(self.max_retries + 1):
            try:
                async with self._client().post(self.url, json=body) as resp:
                    text = await resp.text()
                    if resp.status != 200:
                        raise InferenceError(_http_error(self.url, resp.status, text, self.model))
                    try:
                        return await resp.json(content_type=None)
                    except ValueError as e:
                        raise InferenceError(
                            f"{self.url} answered with invalid JSON: {text[:200]!r}"
                        ) from e
            except (aiohttp.ClientConnectionError, ConnectionError) as e:
                # A read timeout is a deadline, not a lost connection; a connect timeout is.
                if isinstance(e, aiohttp.ServerTimeoutError) and not isinstance(
                    e, aiohttp.ConnectionTimeoutError
                ):
                    raise self._timed_out() from e
                if attempt == self.max_retries:
                    raise InferenceError(
                        f"cannot reach {self.url} after {attempt + 1} attempt(s): "
                        f"{type(e).__name__}: {e}; is the server running?"
                    ) from e
                delay = self.backoff_s * 2**attempt
                log.warning("%s: %s; retrying in %.1f s", self.url, type(e).__name__, delay)
                await asyncio.sleep(delay)
            except TimeoutError as e:
                raise self._timed_out() from e
        raise AssertionError("unreachable")

    def _timed_out(self) -> InferenceError:
        return InferenceError(
            f"{self.url} did not answer within timeout_s={self.timeout_s} s; raise timeout_s "
            "or check the server's load"
        )


def _http_error(url: str, status: int, text: str, model: str) -> str:
    message = text[:500]
    try:
        payload = json.loads(text)
        err = payload.get("error", payload) if isinstance(payload, dict) else payload
        message = err.get("message", message) if isinstance(err, dict) else str(err)
    except ValueError:
        pass
    hint = _hint_404(url, model, message) if status == 404 else ""
    return f"{url} answered HTTP {status}{hint}: {message}"


def _hint_404(url: str, model: str, message: str) -> str:
    """What a 404 most likely means: an unknown model name (vLLM answers "The model `X` does
    not exist"), or a base_url without the API root."""
    if "model" in message.lower() and model in message:
        return (
            f" (the server serves no model named {model!r}: pass the name it serves, its "
            "--served-model-name, as the engine's model; agentloop eval: --engine-arg "
            f"served_model=NAME; GET {url.rsplit('/', 1)[0]}/models lists them)"
        )
    if not url.rsplit("/", 1)[0].endswith("/v1"):
        return " (does base_url end with /v1?)"
    return " (is this an OpenAI-compatible completions server?)"


def parse_completion(data: Any, url: str = "the server") -> Completion:
    """A :class:`Completion` from a ``/v1/completions`` response body (one choice, logprobs)."""
    try:
        choice = data["choices"][0]
        logprobs = choice.get("logprobs") or {}
        values = logprobs.get("token_logprobs")
        tokens = logprobs.get("tokens")
        ids = choice.get("token_ids")
        reason = choice.get("finish_reason")
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        raise InferenceError(f"{url} returned no completion choice: {str(data)[:200]!r}") from e
    if ids is None and tokens is not None:
        ids = [_token_id(t, url) for t in tokens]
    if ids is None or values is None:
        raise InferenceError(
            f"{url} returned no token ids or no logprobs; token-in/token-out needs a vLLM "
            "server (return_token_ids / return_tokens_as_token_ids and logprobs support)"
        )
    tokens = tokens or []
    spelled = bool(tokens) and all(str(t).startswith(_TOKEN_PREFIX) for t in tokens)
    if spelled and [_token_id(t, url) for t in tokens] != list(ids):
        raise InferenceError(f"{url} returned token_ids that disagree with its logprob tokens")
    if len(values) != len(ids):
        raise InferenceError(f"{url} returned {len(ids)} token ids but {len(values)} logprobs")
    if any(v is None or not math.isfinite(v) for v in values):
        raise InferenceError(f"{url} returned a missing or non-finite logprob: {values}")
    finish = _FINISH.get(reason or "")
    if finish is None:
        raise InferenceError(
            f"{url} returned finish_reason {reason!r}; expected stop, length or abort"
        )
    return Completion(
        token_ids=tuple(int(t) for t in ids),
        logprobs=tuple(float(v) for v in values),
        finish_reason=finish,
    )


def _token_id(token: str, url: str) -> int:
    if not token.startswith(_TOKEN_PREFIX):
        raise InferenceError(
            f"{url} returned token {token!r} as text, not 'token_id:N'; "
            "the server must support return_tokens_as_token_ids (vLLM)"
        )
    return int(token[len(_TOKEN_PREFIX) :])
