"""The proxy's ``/v1/responses`` with a scripted engine: an OpenAI Agents SDK agent on its default
(Responses) model and a LangChain agent play token-exactly; the ``openai`` SDK's own types and
stream accumulator read every response and event; bad requests get 4xx errors naming the field."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter
from test_proxy import _assert_openai_error, _check_engine_boundary, _engine

from agentloop.chat import TokenBuilder
from agentloop.collect import collect
from agentloop.envs.calc import SYSTEM_PROMPT
from agentloop.proxy import AgentProxy, ProxyRequestError
from agentloop.proxy.responses import parse_responses_request
from agentloop.rollout import RolloutConfig
from agentloop.testing.calc_agent import CALC_TOOLS
from agentloop.types import Message, StopReason, Task

AGENTS = "agentloop.testing.framework_agents"
#: Calc's tool in the Responses shape, as the Agents SDK sends it.
RESPONSES_TOOLS = [{"type": "function", "strict": False, **CALC_TOOLS[0]["function"]}]


@pytest.mark.parametrize(
    "agent", ["agents_sdk_calc_agent", "agents_sdk_streamed_calc_agent", "langchain_calc_agent"]
)
async def test_framework_agents_play_token_exactly(tokenizer: Any, agent: str) -> None:
    """A tool call, then the answer: two engine requests per episode, one segment, reward 1,
    every sampled id trained once (mask 1). The first prompt is the one ``calc_agent`` sends
    (the Calc tool caller's), whatever the framework's wire format."""
    engine = _engine(tokenizer)
    tasks = [Task("t0", {"prompt": "What is 2 * 3 + 1?", "answer": "7"}),
             Task("t1", {"prompt": "What is 2 * 3 + 1 again?", "answer": "7"})]  # fmt: skip
    groups = await collect(tasks, "agentloop/Agent-v0", engine, TokenBuilder(tokenizer),
                           config=RolloutConfig(max_turns=4), group_size=2,
                           env_kwargs={"agent": f"{AGENTS}:{agent}"})  # fmt: skip
    trajs = [t for g in groups for t in g.trajectories]
    assert len(trajs) == 4 and len(engine.requests) == 8
    for t in trajs:
        assert t.reward == 1.0 and not t.failed, t.error
        assert len(t.turns) == 2 and t.metrics["segments"] == 1.0
        assert [m.role for m in t.messages] == ["system", "user", "assistant", "tool", "assistant"]
    _check_engine_boundary(groups, engine)
    builder = TokenBuilder(tokenizer, tools=CALC_TOOLS)
    first = builder.prompt_ids(
        [Message("system", SYSTEM_PROMPT), Message("user", "What is 2 * 3 + 1?")]
    )
    assert tuple(first) in {r.prompt_ids for r in engine.requests}


async def test_responses_chain_stream_and_parse_with_the_sdk_types(tokenizer: Any) -> None:
    """``previous_response_id`` continues the episode's segment token-exactly; the streamed
    answer is the SDK accumulator's final response; every body and event validates against the
    SDK's pydantic types."""
    from openai.types.responses import Response, ResponseStreamEvent

    engine = _engine(tokenizer)
    async with AgentProxy(engine, TokenBuilder(tokenizer), open_episodes=True) as proxy:
        async with openai.AsyncOpenAI(base_url=proxy.url, api_key="ep", max_retries=0) as c:
            first = await c.responses.create(model="agentloop", instructions=SYSTEM_PROMPT,
                                             input="What is 2 * 3 + 1?", tools=RESPONSES_TOOLS)  # type: ignore[arg-type]  # fmt: skip
            [call] = first.output
            assert call.type == "function_call" and call.name == "python"
            assert first.status == "completed" and first.usage and first.usage.output_tokens > 0
            async with c.responses.stream(
                model="agentloop", instructions=SYSTEM_PROMPT, previous_response_id=first.id,
                input=[{"type": "function_call_output", "call_id": call.call_id, "output": "7\n"}],
                tools=RESPONSES_TOOLS,  # type: ignore[arg-type]
            ) as stream:  # fmt: skip
                events = [e async for e in stream]
                second = await stream.get_final_response()
        assert second.output_text == "The answer is \\boxed{7}."
        assert [e.type for e in events][:2] == ["response.created", "response.in_progress"]
        assert events[-1].type == "response.completed"
        assert [e.sequence_number for e in events] == list(range(len(events)))
        episode = proxy.episodes["ep"]
        [segment] = episode.segments  # the chain extended the first segment
        assert len(segment.turns) == 2 and segment.messages[-2].role == "tool"
        body = {"model": "agentloop", "input": "hi", "tools": RESPONSES_TOOLS}
        raw = await _post(proxy, body)
        Response.model_validate(raw)
        events_raw = await _post(proxy, {**body, "stream": True})
        adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
        for event in events_raw:
            adapter.validate_python(event)
        Response.model_validate(events_raw[-1]["response"])
    trajs = episode.trajectories("t", reward=1.0, stop_reason=StopReason.DONE)
    assert sum(t.num_trained_tokens for t in trajs) == sum(
        len(r.completion.token_ids) for r in engine.requests if r.session_id == "ep"
    )


async def _post(proxy: AgentProxy, body: dict[str, Any]) -> Any:
    """The raw JSON (or the list of SSE events' JSON) of one request of episode ``raw``."""
    import json

    headers = {"Authorization": "Bearer raw"}
    url = proxy.url + "/responses"
    async with aiohttp.ClientSession() as s, s.post(url, json=body, headers=headers) as r:
        assert r.status == 200, await r.text()
        if not body.get("stream"):
            return await r.json()
        text = await r.text()
    lines = [line for line in text.splitlines() if line.startswith("data: ")]
    return [json.loads(line.removeprefix("data: ")) for line in lines]


@pytest.mark.parametrize(
    ("kwargs", "match", "param"),
    [
        ({"input": [{"type": "web_search_call", "id": "x"}]}, "'web_search_call' item",
         "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "'input_image' part", "input[0].content[0]"),
        ({"input": [{"type": "function_call", "name": "python", "arguments": "{}"}]},
         "needs 'call_id'", "input[0].call_id"),
        ({"input": [{"type": "function_call_output", "output": "1"}]}, "needs 'call_id'",
         "input[0].call_id"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "python",
                     "arguments": "{not json"}]}, "not JSON", "input[0].tool_calls[0]"
         ".function.arguments"),
        ({"input": []}, "non-empty list", "input"),
        ({"tools": [{"type": "web_search"}]}, "only function tools", "tools[0].type"),
        ({"tools": RESPONSES_TOOLS, "tool_choice": {"type": "function", "name": "shell"}},
         "not among the tools", "tool_choice.name"),
        ({"tool_choice": "sometimes"}, "tool_choice must be", "tool_choice"),
        ({"previous_response_id": "resp_nope"}, "not found in this episode",
         "previous_response_id"),
        ({"conversation": "conv_1"}, "conversations are not stored", "conversation"),
        ({"max_output_tokens": 0}, "max_output_tokens must be", "max_output_tokens"),
    ],
)  # fmt: skip
async def test_bad_responses_requests_get_openai_errors_naming_the_field(
    tokenizer: Any, kwargs: dict[str, Any], match: str, param: str
) -> None:
    async with AgentProxy(_engine(tokenizer), TokenBuilder(tokenizer), open_episodes=True) as p:
        async with openai.AsyncOpenAI(base_url=p.url, api_key="ep", max_retries=0) as client:
            request = {"model": "agentloop", "input": "hi", **kwargs}
            with pytest.raises(openai.BadRequestError, match=match) as caught:
                await client.responses.create(**request)
        assert p.requests_failed == 1 and p.requests_served == 0
    code = "previous_response_not_found" if param == "previous_response_id" else None
    _assert_openai_error(caught.value, "invalid_request_error", code, param)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
_ITEM = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning"]),
        "role": st.sampled_from(["user", "assistant", "system", "developer", "tool"]) | _JSON,
        "content": _JSON | st.lists(st.fixed_dictionaries({"type": st.sampled_from(
            ["input_text", "output_text", "input_image"]), "text": _JSON})),
        "call_id": _JSON, "name": _JSON, "arguments": _JSON | st.just('{"code": "x"}'),
        "output": _JSON,
    },
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    body=st.fixed_dictionaries(
        {"model": st.just("agentloop")},
        optional={"input": _JSON | st.lists(_ITEM, max_size=4), "tools": _JSON,
                  "tool_choice": _JSON, "instructions": _JSON, "max_output_tokens": _JSON,
                  "temperature": _JSON, "previous_response_id": _JSON},
    )
)  # fmt: skip
def test_any_malformed_request_is_a_400_naming_a_field(body: dict[str, Any]) -> None:
    """Whatever JSON a client sends, parsing gives a request or a 400 naming the field; never
    another exception (which the server would answer with a 500)."""
    try:
        parse_responses_request(body)
    except ProxyRequestError as exc:
        assert exc.status == 400 and exc.param and str(exc)


CHOICES = [("none", False), ("required", True), ({"type": "function", "name": "python"}, True)]


@pytest.mark.parametrize(("choice", "shown"), CHOICES)
async def test_tool_choice_none_shows_the_model_no_tools(
    tokenizer: Any, choice: Any, shown: bool
) -> None:
    """``none``: the prompt is rendered without the tools; otherwise with them (sampling is
    not constrained); the response echoes the choice."""
    engine = _engine(tokenizer)
    async with (
        AgentProxy(engine, TokenBuilder(tokenizer), open_episodes=True) as proxy,
        openai.AsyncOpenAI(base_url=proxy.url, api_key="ep", max_retries=0) as client,
    ):
        reply = await client.responses.create(
            model="agentloop",
            input="hi",
            tools=RESPONSES_TOOLS,
            tool_choice=choice,  # type: ignore[arg-type]
        )
    [request] = engine.requests
    assert ("Run Python code" in tokenizer.decode(list(request.prompt_ids))) == shown
    echoed = (
        reply.tool_choice if isinstance(reply.tool_choice, str) else reply.tool_choice.model_dump()
    )
    assert echoed == choice
