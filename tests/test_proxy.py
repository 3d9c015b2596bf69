"""The OpenAI-compatible proxy with a scripted engine: the openai SDK as the client, episodes
assembled token-exactly, history rewrites as segments, and OpenAI-shaped errors."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from agentloop.chat import TokenBuilder
from agentloop.collect import collect
from agentloop.engines.base import SamplingParams
from agentloop.engines.fake import FakeEngine
from agentloop.proxy import AgentProxy, EpisodeLimits
from agentloop.rollout import RolloutConfig
from agentloop.testing.calc_agent import CALC_TOOLS
from agentloop.types import Message, StopReason, Task, TrajectoryGroup

AGENT_ENV = "agentloop/Agent-v0"
CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "print(2 * 3 + 1)"}}\n</tool_call>'


def _calc_script(tokenizer: Any) -> Any:
    """Call the tool until a tool result is in the context, then answer with it."""

    def script(prompt_ids: list[int], sampling: SamplingParams) -> str:
        text = tokenizer.decode(prompt_ids)
        return (
            "The answer is \\boxed{7}."
            if "The tool printed" in text or ("<tool_response>" in text)
            else CALL
        )

    return script


def _engine(tokenizer: Any) -> FakeEngine:
    return FakeEngine(_calc_script(tokenizer), tokenizer=tokenizer,
                      eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"))  # fmt: skip


async def _collect(
    tokenizer: Any, engine: FakeEngine, agent: str, n: int = 2
) -> list[TrajectoryGroup]:
    tasks = [Task("t0", {"prompt": "What is 2 * 3 + 1?", "answer": "7"}),
             Task("t1", {"prompt": "What is 2 * 3 + 1 again?", "answer": "7"})]  # fmt: skip
    return await collect(
        tasks, AGENT_ENV, engine, TokenBuilder(tokenizer), config=RolloutConfig(max_turns=4),
        group_size=n, env_kwargs={"agent": f"agentloop.testing.calc_agent:{agent}"},
    )  # fmt: skip


def _check_engine_boundary(groups: list[TrajectoryGroup], engine: FakeEngine) -> None:
    """Every engine call is trained in exactly one segment: the segment starts with the call's
    prompt and continues with its sample (mask 1, the engine's logprobs); no other segment
    trains it, and every mask-1 token of every segment was sampled in exactly one call."""
    trajs = [t for g in groups for t in g.trajectories]
    for req in engine.requests:  # the episode's segments: session ids are "task#sample-..."
        assert req.session_id is not None
        episode = [t for t in trajs if req.session_id.startswith(f"{t.task_id}#{t.sample_index}-")]
        k, n = len(req.prompt_ids), len(req.completion.token_ids)
        hits = [t for t in episode if tuple(t.token_ids[:k]) == req.prompt_ids
                and t.token_ids[k : k + n] == req.completion.token_ids
                and t.loss_mask[k : k + n] == (1,) * n]  # fmt: skip
        assert len(hits) == 1, f"an engine call is trained in {len(hits)} segments"
        assert hits[0].logprobs[k : k + n] == req.completion.logprobs
    trained = sum(t.num_trained_tokens for t in trajs)
    assert trained == sum(len(r.completion.token_ids) for r in engine.requests)


async def test_an_openai_sdk_agent_gives_token_exact_trajectories(tokenizer: Any) -> None:
    engine = _engine(tokenizer)
    groups = await _collect(tokenizer, engine, "calc_agent")
    trajs = [t for g in groups for t in g.trajectories]
    assert len(trajs) == 4 and all(t.reward == 1.0 and not t.failed for t in trajs), trajs[0].error
    for t in trajs:
        assert t.metrics["segments"] == 1.0 and len(t.turns) == 2
        # the tool's output (7) is in the trajectory, masked
        obs = t.token_ids[t.turns[0].start + t.turns[0].completion_tokens : t.turns[1].start]
        assert "<tool_response>\n7\n" in tokenizer.decode(list(obs))
        assert set(
            t.loss_mask[t.turns[0].start + t.turns[0].completion_tokens : t.turns[1].start]
        ) == {0}
    _check_engine_boundary(groups, engine)


async def test_a_history_rewrite_starts_a_segment_and_trains_each_token_once(
    tokenizer: Any,
) -> None:
    engine = _engine(tokenizer)
    groups = await _collect(tokenizer, engine, "rewriting_calc_agent")
    for g in groups:
        assert len(g.trajectories) == 4  # two episodes, two segments each
        assert [t.sample_index for t in g.trajectories] == [0, 0, 1, 1]
        for t in g.trajectories:
            assert t.metrics["segments"] == 2.0 and t.reward == 1.0
    _check_engine_boundary(groups, engine)  # nothing lost, nothing trained twice
    first, second = groups[0].trajectories[:2]
    # the rewritten prompt shows the first reply as context (mask 0), not as a trained sample
    assert second.prompt_len > first.prompt_len and not any(second.loss_mask[: second.prompt_len])


async def test_an_edited_message_starts_a_segment_where_earlier_replies_are_context(
    tokenizer: Any,
) -> None:
    """The agent edits its first user message but keeps its replies and the tool results: the
    next request is a new segment whose prompt holds the first reply's sampled ids as context
    (mask 0); each sampled token is trained in exactly one segment, none is lost."""
    from agentloop.trainers.metrics import rollout_metrics

    engine = _engine(tokenizer)
    groups = await _collect(tokenizer, engine, "editing_calc_agent")
    for g in groups:
        assert [t.sample_index for t in g.trajectories] == [0, 0, 1, 1]
        for first, second in zip(g.trajectories[::2], g.trajectories[1::2], strict=True):
            assert first.metrics["segments"] == second.metrics["segments"] == 2.0
            assert (first.metrics["segment_index"], second.metrics["segment_index"]) == (0, 1)
            assert second.reward == 1.0 and not second.failed
            [turn] = first.turns
            sampled = first.token_ids[turn.start : turn.start + turn.completion_tokens]
            assert first.loss_mask[turn.start :] == (1,) * len(sampled)
            # the call the model sampled is context of the second segment, not trained again
            at = _find(second.token_ids[: second.prompt_len], sampled)
            assert at >= 0 and not any(second.loss_mask[: second.prompt_len])
            assert "<tool_response>\n7\n" in tokenizer.decode(
                list(second.token_ids[at + len(sampled) : second.prompt_len])
            )
    _check_engine_boundary(groups, engine)  # nothing lost, nothing trained twice
    metrics = rollout_metrics(groups)
    assert metrics["rollout/episodes"] == 4.0  # episodes, not their 8 segments
    assert metrics["rollout/segments_mean"] == 2.0


def _find(haystack: tuple[int, ...], needle: tuple[int, ...]) -> int:
    n = len(needle)
    return next((i for i in range(len(haystack) - n + 1) if haystack[i : i + n] == needle), -1)


#: ChatML that drops ``<think>...</think>`` from assistant turns in the history, as reasoning
#: models' templates do: not prefix-stable once a reply had a think block.
THINK_STRIPPING = (
    "{%- for m in messages -%}"
    "{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{%- if m['role'] == 'assistant' -%}{{ m['content'].split('</think>')[-1].lstrip() }}"
    "{%- else -%}{{ m['content'] }}{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
KEEPING = THINK_STRIPPING.replace(".split('</think>')[-1].lstrip()", "")


@pytest.mark.parametrize(("template", "segments"), [(THINK_STRIPPING, 2), (KEEPING, 1)])
async def test_a_template_that_strips_earlier_reasoning_starts_a_new_segment(
    tokenizer: Any, template: str, segments: int
) -> None:
    """The agent sends its history back unchanged, but the template renders the earlier reply
    without its think block: that is not what the model saw, so a new segment starts (with a
    fresh render); with a template that keeps it the episode stays one segment."""
    engine = FakeEngine(["<think>2 * 3 is 6</think>It is 6.", "<think>plus 1</think>Now 7."],
                        tokenizer=tokenizer,
                        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"))  # fmt: skip
    # a stripping template needs a declared policy; the proxy's is strip (a new segment)
    builder = TokenBuilder(tokenizer, chat_template=template, thinking="strip")
    async with AgentProxy(engine, builder) as proxy:
        episode = proxy.open_episode(builder=builder)
        client = proxy.client(episode)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2 * 3?"}]
        reply = await client.chat.completions.create(model="agentloop", messages=messages)
        assert reply.choices[0].message.content == "<think>2 * 3 is 6</think>It is 6."
        messages += [reply.choices[0].message.model_dump(exclude_none=True),
                     {"role": "user", "content": "Add 1."}]  # fmt: skip
        await client.chat.completions.create(model="agentloop", messages=messages)
    trajs = episode.trajectories("t", reward=1.0, stop_reason=StopReason.DONE)
    assert len(trajs) == segments == len(episode.segments)
    last = trajs[-1]
    second = engine.requests[1]
    assert tuple(last.token_ids[: len(second.prompt_ids)]) == second.prompt_ids
    # whatever the segmentation, the engine got what the template renders for the request
    expected = builder.render([Message(**m) for m in _plain(messages)], add_generation_prompt=True)
    assert tokenizer.decode(list(second.prompt_ids)) == expected
    assert ("2 * 3 is 6" in expected) == (segments == 1)
    assert sum(t.num_trained_tokens for t in trajs) == sum(
        len(r.completion.token_ids) for r in engine.requests
    )


def _plain(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"role": m["role"], "content": m["content"]} for m in messages]


async def test_streaming_and_completions_through_the_sdk(tokenizer: Any) -> None:
    engine = _engine(tokenizer)
    async with AgentProxy(engine, TokenBuilder(tokenizer), open_episodes=True) as proxy:
        client = openai.AsyncOpenAI(base_url=proxy.url, api_key="ep-stream", max_retries=0)
        stream = await client.chat.completions.create(
            model="agentloop", messages=[{"role": "user", "content": "hi"}], tools=CALC_TOOLS,
            stream=True, stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = [c async for c in stream]
        calls = [tc for c in chunks for ch in c.choices for tc in ch.delta.tool_calls or []]
        assert calls[0].function.name == "python" and "print" in calls[0].function.arguments
        assert chunks[-2].choices[0].finish_reason == "tool_calls" and chunks[-1].usage
        text = await client.completions.create(
            model="agentloop", prompt="2 * 3 + 1 =", max_tokens=8
        )
        assert text.choices[0].text and text.usage.prompt_tokens > 0
        path_client = openai.AsyncOpenAI(
            base_url=f"{proxy.url[:-3]}/episodes/ep-path/v1", api_key="x"
        )
        await path_client.chat.completions.create(
            model="agentloop", messages=[{"role": "user", "content": "hi"}]
        )
        assert set(proxy.episodes) == {"ep-stream", "ep-path"}
        await client.close()
        await path_client.close()


async def test_streamed_text_and_streamed_completions_through_the_sdk(tokenizer: Any) -> None:
    """A text-only streamed chat answer and a streamed ``/v1/completions`` answer: the SDK
    joins the chunks to the same text the non-streamed request gives, finish reason and usage
    included."""
    engine = FakeEngine(["Seven.", "Seven."], tokenizer=tokenizer,  # each episode's two calls
                        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"))  # fmt: skip
    async with AgentProxy(engine, TokenBuilder(tokenizer), open_episodes=True) as proxy:
        msgs = [{"role": "user", "content": "What is 2 * 3 + 1?"}]
        async with openai.AsyncOpenAI(base_url=proxy.url, api_key="a", max_retries=0) as a:
            whole = await a.chat.completions.create(model="agentloop", messages=msgs)
            stream = await a.chat.completions.create(
                model="agentloop", messages=msgs, stream=True,
                stream_options={"include_usage": True},
            )  # fmt: skip
            chunks = [c async for c in stream]
        assert whole.choices[0].message.content == "Seven."
        text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
        assert text == "Seven." and chunks[0].choices[0].delta.role == "assistant"
        assert not any(ch.delta.tool_calls for c in chunks for ch in c.choices)
        assert [ch.finish_reason for c in chunks for ch in c.choices][-1] == "stop"
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
        async with openai.AsyncOpenAI(base_url=proxy.url, api_key="b", max_retries=0) as b:
            plain = await b.completions.create(model="agentloop", prompt="2 * 3 + 1 =")
            streamed = await b.completions.create(
                model="agentloop", prompt="2 * 3 + 1 =", stream=True,
                stream_options={"include_usage": True},
            )  # fmt: skip
            parts = [c async for c in streamed]
        assert plain.choices[0].text == "".join(ch.text for c in parts for ch in c.choices)
        assert plain.choices[0].text == "Seven."
        assert [ch.finish_reason for c in parts for ch in c.choices] == ["stop"]
        assert parts[-1].usage is not None and parts[-1].usage.prompt_tokens > 0
        # every request is recorded, streamed or not: two text segments of episode "b"
        assert len(proxy.episodes["b"].segments) == 2 and proxy.requests_served == 4


#: Prepended to the tiny ChatML template: reads every tool's argument names (renders nothing).
LISTS_ARGUMENTS = (
    "{%- for t in tools or [] -%}{%- for name in t.function.parameters.properties -%}"
    "{%- endfor -%}{%- endfor -%}"
)


@pytest.mark.parametrize(
    ("kwargs", "error", "match", "code", "param"),
    [
        ({"model": "gpt-4o"}, openai.NotFoundError, "model 'gpt-4o' does not exist",
         "model_not_found", "model"),
        ({"messages": [{"role": "robot", "content": "x"}]}, openai.BadRequestError,
         r"messages\[0\].role", None, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None,
          "tool_calls": [{"id": "c", "type": "function", "function": {"name": "python",
          "arguments": "{not json"}}]}, {"role": "tool", "tool_call_id": "c", "content": "1"}]},
         openai.BadRequestError, "cannot render this tool call", None,
         "messages[1].tool_calls[0].function.arguments"),
        ({"messages": [{"role": "user", "content": "word " * 400}]}, openai.BadRequestError,
         "more than this episode's limit of 64", "context_length_exceeded", "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, openai.BadRequestError, "tool_call_id",
         None, "messages[0].tool_call_id"),
        ({"tools": [{"type": "function", "function": {"name": "now"}}]}, openai.BadRequestError,
         "chat template cannot render tools.*'parameters'", None, "tools"),
    ],
)  # fmt: skip
async def test_bad_requests_get_openai_errors_naming_the_problem(
    tokenizer: Any,
    kwargs: dict[str, Any],
    error: type[Exception],
    match: str,
    code: str | None,
    param: str,
) -> None:
    """OpenAI's error shape, as the SDK reads it: ``{"error": {message, type, param, code}}``.
    The template lists each tool's arguments, as some families' templates do, so a tool without
    ``parameters`` (valid for OpenAI) is one it cannot render."""
    limits = EpisodeLimits(max_turns=4, max_prompt_len=64, max_response_len=64)
    builder = TokenBuilder(tokenizer, chat_template=LISTS_ARGUMENTS + tokenizer.chat_template)
    async with AgentProxy(_engine(tokenizer), builder, open_episodes=True,
                          limits=limits) as proxy:  # fmt: skip
        client = openai.AsyncOpenAI(base_url=proxy.url, api_key="ep", max_retries=0)
        request = {"model": "agentloop", "messages": [{"role": "user", "content": "hi"}], **kwargs}
        with pytest.raises(error, match=match) as caught:
            await client.chat.completions.create(**request)
        await client.close()
    _assert_openai_error(caught.value, "invalid_request_error", code, param)


def _assert_openai_error(exc: Any, kind: str, code: str | None, param: str | None) -> None:
    assert isinstance(exc, openai.APIStatusError)
    assert set(exc.body) == {"message", "type", "param", "code"}, exc.body
    assert (exc.type, exc.code, exc.param) == (kind, code, param)
    assert exc.body["message"] and exc.body["type"] == kind and exc.body["code"] == code


async def test_a_request_without_an_episode_id_is_a_401(tokenizer: Any) -> None:
    async with AgentProxy(_engine(tokenizer), TokenBuilder(tokenizer), open_episodes=True) as p:
        # the SDK needs a key; a non-Bearer Authorization header carries no episode id
        client = openai.AsyncOpenAI(base_url=p.url, api_key="x", max_retries=0,
                                    default_headers={"Authorization": "Basic eA=="})  # fmt: skip
        with pytest.raises(openai.AuthenticationError, match="no episode id") as caught:
            await client.chat.completions.create(
                model="agentloop", messages=[{"role": "user", "content": "x"}]
            )
        await client.close()
        assert not p.episodes
    _assert_openai_error(caught.value, "authentication_error", None, None)


async def test_a_context_that_leaves_nothing_to_generate_is_context_length_exceeded(
    tokenizer: Any,
) -> None:
    """The reply used the episode's response budget: the next request gets a 400 naming it,
    and the episode records MAX_TOKENS."""
    limits = EpisodeLimits(max_turns=4, max_prompt_len=256, max_response_len=8)
    async with AgentProxy(_engine(tokenizer), TokenBuilder(tokenizer), limits=limits) as proxy:
        episode = proxy.open_episode()
        client = proxy.client(episode)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2 * 3 + 1?"}]
        reply = await client.chat.completions.create(model="agentloop", messages=messages)
        assert reply.usage is not None and reply.usage.completion_tokens == 8
        assert reply.choices[0].finish_reason == "length"
        messages += [reply.choices[0].message.model_dump(exclude_none=True),
                     {"role": "user", "content": "go on"}]  # fmt: skip
        with pytest.raises(openai.BadRequestError, match="none are left to generate") as caught:
            await client.chat.completions.create(model="agentloop", messages=messages)
    _assert_openai_error(caught.value, "invalid_request_error", "context_length_exceeded",
                         "messages")  # fmt: skip
    assert episode.limit_hit is StopReason.MAX_TOKENS
    [traj] = episode.trajectories("t", reward=0.0, stop_reason=StopReason.MAX_TOKENS)
    assert traj.num_trained_tokens == 8


async def test_an_agent_written_tool_call_in_another_format_is_refused(tokenizer: Any) -> None:
    """The proxy writes an agent's own assistant tool call only in the Hermes markup; for a
    model with another format it refuses rather than train on a made-up rendering."""
    async with AgentProxy(_engine(tokenizer), TokenBuilder(tokenizer), open_episodes=True,
                          parser="mistral") as proxy:  # fmt: skip
        client = openai.AsyncOpenAI(base_url=proxy.url, api_key="ep", max_retries=0)
        call = {"id": "mine", "type": "function",
                "function": {"name": "python", "arguments": '{"code": "print(1)"}'}}  # fmt: skip
        messages = [{"role": "user", "content": "x"},
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "mine", "content": "1"}]  # fmt: skip
        with pytest.raises(openai.BadRequestError, match="only for the hermes format") as caught:
            await client.chat.completions.create(
                model="agentloop", messages=messages, tools=CALC_TOOLS
            )
        await client.close()
    _assert_openai_error(caught.value, "invalid_request_error", None, "messages[1].tool_calls")


async def test_unknown_episodes_and_the_turn_limit_are_refused(tokenizer: Any) -> None:
    limits = EpisodeLimits(max_turns=1)
    async with AgentProxy(_engine(tokenizer), TokenBuilder(tokenizer), limits=limits) as proxy:
        stranger = openai.AsyncOpenAI(base_url=proxy.url, api_key="nobody", max_retries=0)
        with pytest.raises(openai.AuthenticationError, match="unknown episode id 'nobody'"):
            await stranger.models.list()  # models are open; completions need an episode
            await stranger.chat.completions.create(
                model="agentloop", messages=[{"role": "user", "content": "x"}]
            )
        episode = proxy.open_episode()
        client = proxy.client(episode)
        msgs = [{"role": "user", "content": "x"}]
        await client.chat.completions.create(model="agentloop", messages=msgs)
        with pytest.raises(openai.BadRequestError, match="limit of 1 model requests"):
            await client.chat.completions.create(model="agentloop", messages=msgs)
        await client.close()
        await stranger.close()


async def test_the_proxy_closes_half_open_connections_and_refuses_nested_json(
    tokenizer: Any,
) -> None:
    """The proxy listens through the servers' shared transport (header timeout, cap) and a
    deeply nested body is a JSON 400, not a plain-text 500."""
    import asyncio

    import aiohttp

    from agentloop.sandboxes.http_limits import HttpLimits

    quick = HttpLimits(header_timeout_s=0.5)
    async with AgentProxy(_engine(tokenizer), TokenBuilder(tokenizer), open_episodes=True,
                          http=quick) as proxy:  # fmt: skip
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        assert await asyncio.wait_for(reader.read(), timeout=20) == b""  # closed by the proxy
        writer.close()
        nested = "[" * 100_000 + "]" * 100_000
        headers = {"Content-Type": "application/json", "Authorization": "Bearer ep"}
        url = proxy.url + "/chat/completions"
        async with aiohttp.ClientSession() as s, s.post(url, data=nested, headers=headers) as r:
            assert r.status == 400 and r.content_type == "application/json"
            assert "nested too deeply" in (await r.json())["error"]["message"]


async def test_eval_writes_every_segment_and_counts_each_episode_once(
    tokenizer: Any, tiny_model_dir: Any, tmp_path: Any
) -> None:
    from agentloop.eval import EvalConfig, eval_async
    from agentloop.io import read_jsonl

    agent = {"agent": "agentloop.testing.calc_agent:rewriting_calc_agent"}
    config = EvalConfig(AGENT_ENV, str(tiny_model_dir), tmp_path / "run", n=2, num_tasks=2,
                        rollout=RolloutConfig(max_turns=4), env_kwargs=agent)  # fmt: skip
    summary = await eval_async(config, engine=_engine(tokenizer), progress=False)
    records = read_jsonl(tmp_path / "run" / "trajectories.jsonl")
    assert len(records) == 8  # 2 tasks x 2 samples x 2 segments: none dropped
    assert summary.episodes == 4 and sum(summary.stop_reasons.values()) == 4


async def test_max_turn_tokens_caps_what_a_request_may_sample(tokenizer: Any) -> None:
    from agentloop.errors import ConfigError

    with pytest.raises(ConfigError, match="max_turn_tokens must be >= 1, got 0"):
        EpisodeLimits(max_turn_tokens=0)
    engine = _engine(tokenizer)
    limits = EpisodeLimits(max_turn_tokens=5)
    async with AgentProxy(engine, TokenBuilder(tokenizer), limits=limits) as proxy:
        client = proxy.client(proxy.open_episode())
        await client.completions.create(model="agentloop", prompt="2 * 3 + 1 =", max_tokens=50)
        await client.close()
    assert engine.requests[-1].sampling.max_tokens == 5
