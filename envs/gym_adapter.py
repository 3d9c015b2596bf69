"""GymnasiumEnv: any agentloop env as a plain synchronous ``gymnasium.Env`` with Text spaces."""

from __future__ import annotations

import asyncio
import string
from collections.abc import Sequence
from typing import Any

import gymnasium
from gymnasium import spaces

from agentloop.envs.base import Env
from agentloop.tools import ToolSchemas
from agentloop.types import Message

__all__ = ["GymnasiumEnv", "messages_to_text"]

# Text spaces need an explicit charset; printable ASCII plus the punctuation tools commonly emit.
CHARSET = string.printable + "…—–’‘“”×÷·•°"
MAX_TEXT = 1 << 16


def messages_to_text(messages: Sequence[Message]) -> str:
    """Observation text: one ``role: content`` block per message; images as ``[image WxH]``."""
    return "\n".join(f"{m.role}: {_image_marks(m)}{m.content}" for m in messages)


def _image_marks(m: Message) -> str:
    return "".join(f"[image {im.size[0]}x{im.size[1]}] " for im in m.images)


class GymnasiumEnv(gymnasium.Env[str, str]):
    """Runs an async :class:`Env` on a private event loop so plain gymnasium code can use it.

    Observations are the new messages rendered by :func:`messages_to_text`; an action is the
    assistant's raw text, parsed for tool calls with the ``parser`` (default ``hermes``).
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium's class attribute

    def __init__(self, env: Env, *, parser: str = "hermes") -> None:
        from agentloop.tools import get_parser

        self.env = env
        self.parser = get_parser(parser)
        self.observation_space = spaces.Text(max_length=MAX_TEXT, min_length=0, charset=CHARSET)
        self.action_space = spaces.Text(max_length=MAX_TEXT, min_length=0, charset=CHARSET)
        self._loop = asyncio.new_event_loop()

    @classmethod
    def from_id(cls, env_id: str, *, parser: str = "hermes", **kwargs: Any) -> GymnasiumEnv:
        """Entry point used for ``gymnasium.make(env_id, **kwargs)``."""
        from agentloop.envs.registry import make

        return cls(make(env_id, **kwargs), parser=parser)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self._loop.run_until_complete(self.env.close())  # end a previous episode, if any
        messages, info = self._loop.run_until_complete(self.env.reset(seed=seed, options=options))
        return messages_to_text(messages), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        schemas = ToolSchemas.of(self.env.tool_schemas)  # types GLM/Qwen3-Coder values
        message = Message("assistant", action, self.parser.parse(action, schemas))
        result = self._loop.run_until_complete(self.env.step(message))
        obs = messages_to_text(result.observation)
        # gymnasium's info is a plain dict: the typed fields go in it under their own names
        info = {**result.info, "tool_results": result.tool_results, "metrics": dict(result.metrics)}
        return obs, float(result.reward), result.terminated, result.truncated, info

    def close(self) -> None:
        if not self._loop.is_closed():
            self._loop.run_until_complete(self.env.close())
            # as asyncio.run does: loop-scoped resources (shared sandboxes) close here
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()
