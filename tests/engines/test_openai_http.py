"""OpenAIEngine against a stub /v1/completions server on 127.0.0.1 (speaks vLLM's protocol)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from agentloop.engines.base import Engine, SamplingParams
from agentloop.engines.openai_http import OpenAIEngine, parse_completion
from agentloop.errors import ConfigError, InferenceError

pytestmark = pytest.mark.integration  # a real aiohttp server on loopback

BAD, SLOW, TEXT_ONLY, ERROR_FINISH = 900, 901, 902, 903


class Stub:
    """Answers ``prompt[-1] + 1, + 2, …`` (at most 3 tokens) with logprobs ``-0.1 * (i + 1)``.

    The first prompt id selects a failure mode (BAD, SLOW, TEXT_ONLY, ERROR_FINISH);
    ``drop`` drops that many connections before answering.
    """

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.drop = 0

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        if self.drop > 0:
            self.drop -= 1
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        prompt = body["prompt"]
        if body["model"] != "tiny":  # vLLM's answer for a name it does not serve
            error = {"message": f"The model `{body['model']}` does not exist.", "code": 404}
            return web.json_response({"error": {**error, "type": "NotFoundError"}}, status=404)
        if prompt[0] == BAD:
            error = {"message": "prompt too long: 900 > 512", "type": "BadRequestError"}
            return web.json_response({"error": {**error, "code": 400}}, status=400)
        if prompt[0] == SLOW:
            await asyncio.sleep(1.5)
        ids: list[int] = []
        finish = "length"
        for i in range(min(body["max_tokens"], 3)):
            ids.append(prompt[-1] + 1 + i)
            if ids[-1] in body.get("stop_token_ids", []):
                finish = "stop"
                break
        if len(ids) < body["max_tokens"] and finish == "length":
            finish = "stop"
        spelled = body.get("return_tokens_as_token_ids")
        tokens = [f"token_id:{t}" if spelled else f"<{t}>" for t in ids]
        if prompt[0] == TEXT_ONLY:
            tokens = [f"<{t}>" for t in ids]
        choice: dict[str, Any] = {
            "index": 0,
            "text": "".join(tokens),
            "logprobs": {
                "text_offset": list(range(len(ids))),
                "token_logprobs": [-0.1 * (i + 1) for i in range(len(ids))],
                "tokens": tokens,
                "top_logprobs": [{tok: -0.1 * (i + 1)} for i, tok in enumerate(tokens)],
            },
            "finish_reason": "error" if prompt[0] == ERROR_FINISH else finish,
            "stop_reason": None,
        }
        if body.get("return_token_ids") and prompt[0] != TEXT_ONLY:
            choice["token_ids"] = ids
            choice["prompt_token_ids"] = prompt
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(ids)}
        return web.json_response(
            {"id": "cmpl-1", "object": "text_completion", "model": body["model"],
             "choices": [choice], "usage": usage}
        )  # fmt: skip


@pytest_asyncio.fixture
async def stub() -> AsyncIterator[tuple[Stub, str]]:
    handler = Stub()
    app = web.Application()
    app.router.add_post("/v1/completions", handler.completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield handler, f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_token_in_token_out(stub: tuple[Stub, str]) -> None:
    server, url = stub
    async with OpenAIEngine(url, "tiny", api_key="sk-test") as engine:
        assert isinstance(engine, Engine)
        sampling = SamplingParams(max_tokens=8, temperature=0.7, top_p=0.9, seed=5)
        out = await engine.generate([10, 11, 12], sampling, session_id="traj-1")
    assert out.token_ids == (13, 14, 15)
    assert out.logprobs == pytest.approx((-0.1, -0.2, -0.3))
    assert out.finish_reason == "stop"
    body = server.bodies[0]
    assert body["prompt"] == [10, 11, 12] and body["model"] == "tiny"
    assert body["logprobs"] == 0 and body["return_token_ids"] is True
    assert body["return_tokens_as_token_ids"] is True
    assert (body["seed"], body["temperature"], body["top_p"]) == (5, 0.7, 0.9)
    assert "top_k" not in body and "stop_token_ids" not in body
    assert body["session_id"] == "traj-1"
    assert server.headers[0]["Authorization"] == "Bearer sk-test"


async def test_length_and_stop_tokens(stub: tuple[Stub, str]) -> None:
    _, url = stub
    async with OpenAIEngine(url, "tiny") as engine:
        out = await engine.generate([1], SamplingParams(max_tokens=2, top_k=5))
        assert (out.token_ids, out.finish_reason) == ((2, 3), "length")
        out = await engine.generate([1], SamplingParams(max_tokens=8, stop_token_ids=(3,)))
        assert (out.token_ids, out.finish_reason) == ((2, 3), "stop")


async def test_http_error_is_reported_with_the_server_message(stub: tuple[Stub, str]) -> None:
    server, url = stub
    async with OpenAIEngine(url, "tiny") as engine:
        with pytest.raises(InferenceError, match=r"HTTP 400: prompt too long: 900 > 512"):
            await engine.generate([BAD, 1], SamplingParams())
    assert len(server.bodies) == 1  # HTTP errors are not retried


async def test_wrong_path_hints_at_v1(stub: tuple[Stub, str]) -> None:
    _, url = stub
    async with OpenAIEngine(url.removesuffix("/v1"), "tiny") as engine:
        with pytest.raises(InferenceError, match=r"HTTP 404 \(does base_url end with /v1\?\)"):
            await engine.generate([1], SamplingParams())


async def test_an_unknown_model_name_hints_at_served_model(stub: tuple[Stub, str]) -> None:
    """base_url ends with /v1 here: the hint must be about the model name, not the path."""
    _, url = stub
    async with OpenAIEngine.from_settings(url, "/models/tiny-dir", {}) as engine:
        with pytest.raises(
            InferenceError,
            match=r"HTTP 404 \(the server serves no model named '/models/tiny-dir': .*"
            r"--engine-arg served_model=NAME; GET http://127\.0\.0\.1:\d+/v1/models lists",
        ):
            await engine.generate([1], SamplingParams())
    async with OpenAIEngine.from_settings(url, "/models/tiny-dir", {"served_model": "tiny"}) as e:
        assert len((await e.generate([1], SamplingParams(max_tokens=2))).token_ids) == 2


def test_unknown_engine_settings_name_the_known_ones() -> None:
    with pytest.raises(
        ConfigError,
        match=r"unknown OpenAIEngine setting\(s\) \['enforce_eager'\]; known: "
        r"\['served_model', 'timeout_s', 'connect_timeout_s', 'max_retries'",
    ):
        OpenAIEngine.from_settings("http://127.0.0.1:1/v1", "m", {"enforce_eager": True})


async def test_timeout_is_a_clear_error_and_not_retried(stub: tuple[Stub, str]) -> None:
    server, url = stub
    async with OpenAIEngine(url, "tiny", timeout_s=0.3) as engine:
        with pytest.raises(InferenceError, match=r"did not answer within timeout_s=0.3"):
            await engine.generate([SLOW, 1], SamplingParams())
    assert len(server.bodies) == 1


async def test_dropped_connection_is_retried(stub: tuple[Stub, str]) -> None:
    server, url = stub
    server.drop = 2
    async with OpenAIEngine(url, "tiny", backoff_s=0.01) as engine:
        out = await engine.generate([1], SamplingParams(max_tokens=1))
    assert out.token_ids == (2,)
    assert len(server.bodies) == 3


async def test_refused_connection_gives_up_after_retries() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    async with OpenAIEngine(url, "tiny", max_retries=2, backoff_s=0.01) as engine:
        with pytest.raises(InferenceError, match=r"cannot reach .* after 3 attempt\(s\)"):
            await engine.generate([1], SamplingParams())


async def test_server_without_token_ids_is_rejected(stub: tuple[Stub, str]) -> None:
    _, url = stub
    async with OpenAIEngine(url, "tiny") as engine:
        with pytest.raises(InferenceError, match="return_tokens_as_token_ids"):
            await engine.generate([TEXT_ONLY, 1], SamplingParams())
        with pytest.raises(InferenceError, match="finish_reason 'error'"):
            await engine.generate([ERROR_FINISH, 1], SamplingParams())
        with pytest.raises(InferenceError, match="empty"):
            await engine.generate([], SamplingParams())


def test_parse_completion_falls_back_to_spelled_token_ids() -> None:
    data = {
        "choices": [
            {
                "logprobs": {
                    "token_logprobs": [-1.0, -2.0],
                    "tokens": ["token_id:7", "token_id:9"],
                },
                "finish_reason": "length",
            }
        ]
    }
    out = parse_completion(data)
    assert out.token_ids == (7, 9) and out.logprobs == (-1.0, -2.0)
    data["choices"][0]["token_ids"] = [7, 8]
    with pytest.raises(InferenceError, match="disagree"):
        parse_completion(data)
    with pytest.raises(InferenceError, match="no completion choice"):
        parse_completion({"choices": []})


def test_config_errors() -> None:
    with pytest.raises(ConfigError, match="http://"):
        OpenAIEngine("127.0.0.1:8000", "m")
    with pytest.raises(ConfigError, match="timeouts"):
        OpenAIEngine("http://h/v1", "m", timeout_s=0)
    with pytest.raises(ConfigError, match="max_retries"):
        OpenAIEngine("http://h/v1", "m", max_retries=-1)
