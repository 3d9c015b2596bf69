"""A probe for the type checker, never imported: each line marked ``# E: code`` crosses a layer
boundary with a wrong type, and tests/test_typecheck.py asserts that mypy reports exactly those."""

# ruff: noqa: F841
from typing import reveal_type

from agentloop.chat import TokenBuilder
from agentloop.envs import Env, StepResult
from agentloop.sandboxes import ExecResult, SandboxLimits
from agentloop.tools import Toolset, get_parser
from agentloop.trainers.config import TrainConfig
from agentloop.trainers.worker import WorkerConfig

reveal_type(Toolset)  # R: agentloop.tools.toolset.Toolset
reveal_type(Env)  # R: agentloop.envs.base.Env
reveal_type(TrainConfig)  # R: agentloop.trainers.config.TrainConfig


def sandboxes_to_tools(limits: SandboxLimits, result: ExecResult) -> None:
    timeout: str = limits.timeout_s  # E: assignment
    code: bytes = result.exit_code  # E: assignment


def tools_to_envs(tools: Toolset) -> None:
    parser: int = get_parser("hermes")  # E: assignment
    tools.no_such_method()  # E: attr-defined


def envs_to_core(result: StepResult, builder: TokenBuilder) -> None:
    reward: str = result.reward  # E: assignment
    builder.prompt_ids(42)  # E: arg-type


def trainers_siblings(cfg: TrainConfig) -> None:
    actor: TrainConfig = cfg.actor  # E: assignment
    WorkerConfig(lr="fast")  # E: arg-type
