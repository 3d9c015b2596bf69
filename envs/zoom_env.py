"""ZoomToolEnv: a ToolEnv whose ``image_zoom_in`` tool crops the image of the user's question."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentloop.envs.tool_env import ToolEnv
from agentloop.tools.zoom import set_current_image
from agentloop.types import Message

__all__ = ["ZoomToolEnv"]


class ZoomToolEnv(ToolEnv):
    """A :class:`ToolEnv` with the ``image_zoom_in`` tool (:func:`~agentloop.tools.zoom.zoom_tool`)
    among its tools. :meth:`prompt` ends with a user turn carrying the image; ``reset`` makes that
    image the one the tool crops in the episode."""

    async def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        messages, info = await super().reset(seed=seed, options=options)
        assert self._session is not None  # reset() opened it
        set_current_image(self._session.context, messages[-1].images[0])
        return messages, info
