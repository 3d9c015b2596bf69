"""The env of every episode: a registered env with extra tools and, optionally, your own reward."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentloop.envs import Env, ToolEnv, make
from agentloop.envs.custom_reward import load_reward
from agentloop.envs.rewards import RewardFn
from agentloop.errors import ConfigError
from agentloop.tools import Tool
from agentloop.tools.recording import ToolTapeConfig

__all__ = ["EnvMaker", "env_factory"]


@dataclass(frozen=True)
class EnvMaker:
    """Makes ``make(env, **env_kwargs)`` with the extra ``tools`` specs' tools added (``eval
    --tools``, training's ``data.tools``): listed at the first env made and shared by every env
    made after it, or rebuilt from ``tool_io``'s recording when it replays without live tools
    (:func:`agentloop.tools.tool_specs.spec_tools`). A tool named like an env tool replaces it
    only when its spec says ``replace=NAME``; otherwise making the env raises ``ConfigError``.
    Picklable: a loop worker process (:mod:`agentloop.loop_workers`) lists the tools again."""

    env: str
    env_kwargs: Mapping[str, Any]
    tools: tuple[str, ...] = ()
    tool_io: ToolTapeConfig | None = None
    reward: str | None = None
    """``FILE.py:NAME`` or ``MODULE:NAME``: replaces the env's reward (``eval --reward``,
    ``data.reward``; :func:`agentloop.envs.custom_reward.load_reward`)."""

    @functools.cached_property
    def _extra(self) -> list[Tool]:
        from agentloop.tools.tool_specs import spec_tools

        return spec_tools(self.tools, self.tool_io)

    @functools.cached_property
    def _replace(self) -> frozenset[str]:
        """The env tools the specs may take over (``mcp[replace=python]:…``)."""
        from agentloop.tools.mcp import parse_tool_spec

        return frozenset(name for spec in self.tools for name in parse_tool_spec(spec).replace)

    @functools.cached_property
    def _reward_fn(self) -> RewardFn | None:
        return None if self.reward is None else load_reward(self.reward)

    def __call__(self) -> Env:
        made = make(self.env, **self.env_kwargs)
        if self._reward_fn is not None:
            if not isinstance(made, ToolEnv):
                raise ConfigError(
                    f"reward {self.reward!r} replaces a ToolEnv's reward, but {self.env} is a "
                    f"{type(made).__name__}; give that env its own reward argument instead"
                )
            made.reward_fn = self._reward_fn
        if self._extra:
            if not isinstance(made, ToolEnv):
                raise ConfigError(
                    f"extra tools ({', '.join(self.tools)}) are added to a ToolEnv's tools, but "
                    f"{self.env} is a {type(made).__name__}; drop --tools/data.tools or play a "
                    "ToolEnv"
                )
            made.add_tools(self._extra, replace=self._replace)
        return made

    def __getstate__(self) -> dict[str, Any]:
        # tools and the loaded reward stay here: a worker process loads them again
        return {k: v for k, v in self.__dict__.items() if k not in ("_extra", "_reward_fn")}


def env_factory(
    env: str,
    env_kwargs: Mapping[str, Any],
    tools: Sequence[str] = (),
    tool_io: ToolTapeConfig | None = None,
    reward: str | None = None,
) -> EnvMaker:
    """The :class:`EnvMaker` of ``env`` with ``tools`` and ``reward``; the tools are listed and
    the reward loaded now (a server that is not up, a bad reward path fail here, named)."""
    maker = EnvMaker(env, dict(env_kwargs), tuple(tools), tool_io, reward)
    maker._extra  # noqa: B018  # listed now
    maker._reward_fn  # noqa: B018  # loaded now
    return maker
