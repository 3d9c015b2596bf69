"""Environments: the async env contract, registry, gymnasium adapter, ToolEnv and reference envs."""

from agentloop.envs.base import Env, StepResult
from agentloop.envs.calc import CalcEnv, calc_reward, make_calc_task
from agentloop.envs.gym_adapter import GymnasiumEnv
from agentloop.envs.registry import EnvSpec, make, register, registered, spec
from agentloop.envs.rewards import Reward, RewardFn, extract_boxed, math_equal
from agentloop.envs.tool_env import ToolEnv

__all__ = [
    "CalcEnv",
    "Env",
    "EnvSpec",
    "GymnasiumEnv",
    "Reward",
    "RewardFn",
    "StepResult",
    "ToolEnv",
    "calc_reward",
    "extract_boxed",
    "make",
    "make_calc_task",
    "math_equal",
    "register",
    "registered",
    "spec",
]

register(
    "agentloop/Calc-v0",
    CalcEnv,
    description="Multi-digit arithmetic word problems; python tool; boxed-answer reward.",
)
