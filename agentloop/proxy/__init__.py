"""The OpenAI-compatible proxy: train and evaluate any agent program, token-exactly.

:class:`AgentProxy` serves an engine on ``/v1/chat/completions``, ``/v1/responses`` and
``/v1/completions`` and records each episode's prompts, sampled ids and logprobs;
:func:`agent_rollout` plays an :class:`~agentloop.envs.base.AgentProgram` episode through it
(what ``collect`` calls for an env whose ``agent_program()`` is one, as
:class:`~agentloop.envs.agent_env.AgentEnv`'s is).
"""

from agentloop.proxy.agent import agent_rollout, shared_proxy
from agentloop.proxy.episode import Episode, EpisodeLimits, EpisodeSampling
from agentloop.proxy.openai_api import ProxyRequestError
from agentloop.proxy.server import AgentProxy

__all__ = [
    "AgentProxy",
    "Episode",
    "EpisodeLimits",
    "EpisodeSampling",
    "ProxyRequestError",
    "agent_rollout",
    "shared_proxy",
]
