"""The race's env for agentloop (``data.env: race_env:race/Race-v0``): the shared prompts, a
random reward, and in the multi-turn variant a fixed 64-token user message (the tool result's
stand-in) after each turn but the last, whatever the model wrote: a random-init model writes no
tool calls, and the peers' stand-ins (TRL's ``rollout_func``, verl's agent loop) answer the same."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from workload import prompt_text, tool_result_text  # bench/peers is on sys.path

from agentloop.envs import Env, StepResult, register
from agentloop.types import Message, Task


class RaceEnv(Env):
    """``turns`` assistant turns per episode; the reward is uniform in [0, 1)."""

    def __init__(self, turns: int = 1, prompts: int = 64) -> None:
        self.turns, self.prompts = turns, prompts
        self._turn = 0

    async def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        task = (options or {}).get("task") or self.tasks(limit=1)[0]
        self._turn = 0
        return [Message(role="user", content=task.data["prompt"])], {}

    async def step(self, action: Message) -> StepResult:
        self._turn += 1
        if self._turn >= self.turns:
            return StepResult([], random.random(), terminated=True, truncated=False)
        return StepResult([Message(role="user", content=tool_result_text())], 0.0, False, False)

    def tasks(self, split: str = "train", limit: int | None = None) -> Sequence[Task]:
        n = self.prompts if limit is None else min(limit, self.prompts)
        return [Task(id=f"race-{i}", data={"prompt": prompt_text(i)}) for i in range(n)]


register("race/Race-v0", RaceEnv, description="The peer race's prompts (bench/peers).")
