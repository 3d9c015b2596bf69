"""The public API, pinned: each public package's ``__all__`` is exactly this set, and every name
resolves (lazy exports included) without importing torch, vLLM or Ray for the light packages.

Adding or removing a public name is a deliberate change: update the set here in the same commit."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types

import pytest

PUBLIC = {
    "agentloop": {
        "AgentLoopError", "Completion", "ConfigError", "EnvError", "InferenceError", "Message",
        "RewardError", "RolloutConfig", "SamplingParams", "SandboxError", "StopReason", "Task",
        "TemplateError", "TokenBuilder", "ToolCall", "ToolError", "ToolFatalError", "Trajectory",
        "TrajectoryError", "TrajectoryGroup", "Turn", "Verdict", "__version__", "make_builder",
    },
    "agentloop.engines": {
        "Engine", "FakeEngine", "HFEngine", "OpenAIEngine", "ReplicatedEngine", "SamplingParams",
        "VLLMConfig", "VLLMEngine",
    },
    "agentloop.tools": {
        "HermesParser", "Tool", "ToolCallParser", "ToolContext", "ToolErrorKind", "ToolOutput",
        "ToolResult", "ToolSchemas", "ToolSession", "Toolset", "available_parsers", "detect_parser",
        "get_parser", "register_parser", "resolve_parser", "tool", "truncate_to_tokens",
    },
    "agentloop.envs": {
        "AgentProgram", "AnswerHook", "CalcEnv", "ChatUser", "ChatUserConfig", "EngineUser",
        "Env", "EnvSpec", "GymnasiumEnv", "Reward", "RewardFn", "ScriptedUser", "StepResult",
        "ToolEnv", "UserSimEnv", "UserSimulator", "calc_reward", "exact_match", "extract_boxed",
        "f1_score", "grade_math", "make", "make_calc_task", "math_equal", "normalize_answer",
        "register",
        "registered", "spec",
    },
    "agentloop.sandboxes": {
        "ExecResult", "FakeSandbox", "LANGUAGES", "Sandbox", "SandboxFactory", "SandboxLimits",
        "SandboxSession", "available_sandboxes", "make_sandbox", "register_sandbox",
        "shared_sandbox", "SandboxConfig", "SandboxSpec", "sandbox_spec",
    },
    "agentloop.trainers": {"SFTConfig", "TrainConfig", "load_config", "run_sft", "train"},
}  # fmt: skip


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_exported_members(package: str) -> None:
    module = importlib.import_module(package)
    assert set(module.__all__) == PUBLIC[package], (
        f"{package}.__all__ changed: added {sorted(set(module.__all__) - PUBLIC[package])}, "
        f"removed {sorted(PUBLIC[package] - set(module.__all__))}; update PUBLIC if deliberate"
    )
    for name in module.__all__:
        # A lazy name must not share its name with a submodule: once that submodule is
        # imported, the package attribute is the module, not the exported object.
        value = getattr(module, name)
        assert not isinstance(value, types.ModuleType), f"{package}.{name} is a module"


def test_a_name_not_exported_is_an_attribute_error() -> None:
    import agentloop

    with pytest.raises(AttributeError, match="no attribute 'colect'"):
        agentloop.colect  # noqa: B018


def test_the_light_packages_stay_light_until_a_lazy_name_is_read() -> None:
    code = (
        "import sys, agentloop, agentloop.engines, agentloop.trainers, agentloop.tools,"
        " agentloop.envs, agentloop.sandboxes, agentloop.rollout;"
        "print(sorted({'torch', 'vllm', 'ray', 'transformers'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"importing the packages pulled in {out.stdout.strip()}"
