"""agentloop: agentic multi-turn RL for LLMs. Importing it stays light (no torch/vllm/ray)."""

from typing import TYPE_CHECKING

from agentloop._lazy import lazy_getattr
from agentloop.errors import (
    AgentLoopError,
    ConfigError,
    EnvError,
    InferenceError,
    RewardError,
    SandboxError,
    TemplateError,
    ToolError,
    ToolFatalError,
    TrajectoryError,
)
from agentloop.types import (
    Completion,
    Message,
    StopReason,
    Task,
    ToolCall,
    Trajectory,
    TrajectoryGroup,
    Turn,
    Verdict,
)

if TYPE_CHECKING:
    from agentloop.chat import TokenBuilder
    from agentloop.collect import make_builder
    from agentloop.engines.base import SamplingParams
    from agentloop.rollout import RolloutConfig

__getattr__ = lazy_getattr(
    __name__,
    {
        "RolloutConfig": "agentloop.rollout",
        "SamplingParams": "agentloop.engines.base",
        "TokenBuilder": "agentloop.chat",
        "make_builder": "agentloop.collect",
    },
)

__version__ = "0.1.0"

__all__ = [
    "AgentLoopError",
    "Completion",
    "ConfigError",
    "EnvError",
    "InferenceError",
    "Message",
    "RewardError",
    "RolloutConfig",
    "SamplingParams",
    "SandboxError",
    "StopReason",
    "Task",
    "TemplateError",
    "TokenBuilder",
    "ToolCall",
    "ToolError",
    "ToolFatalError",
    "Trajectory",
    "TrajectoryError",
    "TrajectoryGroup",
    "Turn",
    "Verdict",
    "__version__",
    "make_builder",
]
