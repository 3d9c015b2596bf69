"""The exception tree: one error type per boundary, picklable so errors cross Ray and processes."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "AgentLoopError",
    "ConfigError",
    "EnvError",
    "InferenceError",
    "RewardError",
    "SandboxError",
    "TemplateError",
    "ToolError",
    "ToolFatalError",
    "TrajectoryError",
    "did_you_mean",
]


class AgentLoopError(Exception):
    """Root of every error agentloop raises on purpose.

    Subclasses take a single message argument, so ``pickle`` (and therefore Ray) can rebuild them.
    Messages state the offending value and what to do about it.
    """


class ConfigError(AgentLoopError):
    """A configuration value is missing, malformed or inconsistent with another one."""


class EnvError(AgentLoopError):
    """An environment was misused, could not be found, or failed while stepping."""


class ToolError(AgentLoopError):
    """A tool definition is invalid, or a tool call failed; the message is shown to the model."""


class ToolFatalError(ToolError):
    """A tool failure that must end the episode (stop reason ``tool_fatal``) instead of becoming
    an error observation."""


class SandboxError(AgentLoopError):
    """A sandbox backend could not run code (not: the code itself failed)."""


class InferenceError(AgentLoopError):
    """An inference engine failed or returned something unusable."""


class RewardError(AgentLoopError):
    """A reward function or verifier failed."""


class TemplateError(AgentLoopError):
    """A chat template cannot be used token-exactly (for example it is not prefix-stable)."""


class TrajectoryError(AgentLoopError):
    """A trajectory violates an invariant (lengths, mask values, images)."""


def did_you_mean(name: object, choices: Iterable[str]) -> str:
    """`` Did you mean 'x'?`` for the choice closest to ``name``, else ``""``: the hint that every
    unknown-name error (envs, tools, parsers, sandbox backends) appends after its first sentence."""
    close = difflib.get_close_matches(str(name), list(choices), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""
