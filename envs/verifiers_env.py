"""verifiers' environments, unchanged, as agentloop envs: ``verifiers:<env_id>`` (``verifiers``).

verifiers (Prime Intellect) evaluates an environment with ``vf-eval <env_id> -a '{...}'``:
``env = verifiers.load_environment(env_id, **env_args)`` imports the environment's module (its
id, ``-`` as ``_``; installed, or on ``PYTHONPATH``) and calls its ``load_environment``, which
returns a ``vf.SingleTurnEnv``, ``vf.MultiTurnEnv`` or ``vf.ToolEnv`` holding a dataset, a
rubric and, for tool use, tools. This adapter loads it the same way, and its rows are the tasks.

The rollouts play through agentloop's own loop, not verifiers' generate loop nor agentloop's
OpenAI-compatible proxy: ``MultiTurnEnv.rollout`` is final in verifiers, so an environment
changes its rollouts only through the hooks it calls (``setup_state``, ``env_response`` inside
``get_prompt_messages``, ``add_trajectory_step``, the ``@vf.stop`` conditions, the ``@vf.cleanup``
handlers). :class:`~agentloop.envs.verifiers_bridge.Rollout` calls those hooks in that order,
turn by turn, and only the model's reply comes from the loop: sampled token-exactly from the
ids the loop built (no messages re-rendered through a server, no detokenize/retokenize), the
env's responses appended as masked observation turns, as every agentloop env's are. When a stop
condition holds, the env's rubric scores the rollout (``score_rollout``, after its cleanup
rendered the completion): its reward is the episode's reward and each reward function's score a
metric, ``verifiers/<function>``. The tools the model is shown are the env's ``tool_defs``.

An episode that agentloop's own limits cut (``rollout.max_turns``, ``max_response_len``) before
one of the env's stop conditions held is not scored (reward 0): give the env's ``max_turns``
(usually an ``env_args`` key) no more turns than ``rollout.max_turns``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentloop.envs import verifiers_bridge as bridge
from agentloop.envs.base import Env, StepResult
from agentloop.envs.foreign import task_to_play
from agentloop.errors import EnvError
from agentloop.types import Message, Task

__all__ = ["VerifiersEnv", "verifiers_env"]


def verifiers_env(name: str, *, env_args: Mapping[str, Any] | None = None) -> VerifiersEnv:
    """The adapter's entry point (``agentloop.envs.make("verifiers:<env_id>", env_args=...)``):
    ``env_args`` are ``load_environment``'s keyword arguments (``vf-eval``'s ``--env-args``)."""
    return VerifiersEnv(name, env_args=env_args)


class VerifiersEnv(Env):
    """verifiers' environment ``env_id``, loaded once per process and arguments; each episode
    is one rollout of one of its dataset rows."""

    def __init__(self, env_id: str, *, env_args: Mapping[str, Any] | None = None) -> None:
        self.vf_env_id = env_id
        self.env_args = dict(env_args or {})
        self.vf_env = bridge.load(env_id, self.env_args)
        self._rollout: bridge.Rollout | None = None

    @property
    def _id(self) -> str:
        return f"verifiers:{self.vf_env_id}"

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return bridge.tool_schemas(self.vf_env)

    def tasks(self, split: str = "train", limit: int | None = None) -> Sequence[Task]:
        rows = bridge.rows(self.vf_env, self.vf_env_id, split, limit)
        return [Task(f"{self.vf_env_id}-{row['example_id']}", row) for row in rows]

    async def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        await self.close()
        task = task_to_play(self, seed, options)
        if "prompt" not in task.data:
            raise EnvError(
                f"{self._id}: task {task.id!r} has no 'prompt'; its tasks are the env's own "
                "dataset rows (env.tasks(split))"
            )
        self._rollout = bridge.Rollout(self.vf_env, self.vf_env_id, task.data)
        return await self._rollout.start(), {"task_id": task.id}

    async def step(self, action: Message) -> StepResult:
        rollout = self._rollout
        if rollout is None:
            raise EnvError("step() called before reset(); call reset() first")
        observation = await rollout.turn(action)
        if observation is not None:
            return StepResult(observation, 0.0, False, False)
        score = await rollout.score()
        metrics = {f"verifiers/{k}": v for k, v in score.metrics.items()}
        info = {"stop_condition": rollout.state.get("stop_condition")}
        return StepResult([], score.reward, True, False, info=info, metrics=metrics)

    async def close(self) -> None:
        rollout, self._rollout = self._rollout, None
        if rollout is not None:
            await rollout.cleanup()
