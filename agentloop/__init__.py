"""agentloop: agentic multi-turn RL for LLMs. Importing it stays light (no torch/vllm/ray)."""

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
    "SandboxError",
    "StopReason",
    "Task",
    "TemplateError",
    "ToolCall",
    "ToolError",
    "ToolFatalError",
    "Trajectory",
    "TrajectoryError",
    "TrajectoryGroup",
    "Turn",
    "__version__",
]
