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
from agentloop.types import Task, TrajectoryGroup

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
    """Every engine call's prompt is a prefix of one segment and its sample follows it, mask 1;
    every mask-1 token of every segment was sampled in exactly one call."""
    trajs = [t for g in groups for t in g.trajectories]
    for req in engine.requests:
        hits = [t for t in trajs if tuple(t.token_ids[: len(req.prompt_ids)]) == req.prompt_ids
                and t.token_ids[len(req.prompt_ids):][: len(req.completion.token_ids)]
                == req.completion.token_ids]  # fmt: skip
        assert hits, "an engine call is not part of any trajectory"
        t, k = hits[0], len(req.prompt_ids)
        assert t.loss_mask[k : k + len(req.completion.token_ids)] == (1,) * len(
            req.completion.token_ids
        )
        assert t.logprobs[k : k + len(req.completion.token_ids)] == req.completion.logprobs
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


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"model": "gpt-4o"}, openai.NotFoundError, "model 'gpt-4o' does not exist"),
        ({"messages": [{"role": "robot", "content": "x"}]}, openai.BadRequestError,
         r"messages\[0\].role"),
        ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None,
          "tool_calls": [{"id": "c", "type": "function", "function": {"name": "python",
          "arguments": "{not json"}}]}, {"role": "tool", "tool_call_id": "c", "content": "1"}]},
         openai.BadRequestError, "cannot render this tool call"),
        ({"messages": [{"role": "user", "content": "word " * 400}]}, openai.BadRequestError,
         "more than this episode's limit of 64"),
        ({"messages": [{"role": "tool", "content": "x"}]}, openai.BadRequestError, "tool_call_id"),
    ],
)  # fmt: skip
async def test_bad_requests_get_openai_errors_naming_the_problem(
    tokenizer: Any, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    limits = EpisodeLimits(max_turns=4, max_prompt_len=64, max_response_len=64)
    async with AgentProxy(_engine(tokenizer), TokenBuilder(tokenizer), open_episodes=True,
                          limits=limits) as proxy:  # fmt: skip
        client = openai.AsyncOpenAI(base_url=proxy.url, api_key="ep", max_retries=0)
        request = {"model": "agentloop", "messages": [{"role": "user", "content": "hi"}], **kwargs}
        with pytest.raises(error, match=match):
            await client.chat.completions.create(**request)
        await client.close()


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
