"""agentloop/MathTool-v0: math problems from task files, a sandboxed code interpreter, a verifier.

The ReTool setting: competition math (DAPO-Math-17k for training, AIME for validation) solved
with a Python interpreter the model may call many times. Tasks come from files in the project's
task format (``recipes/retool/prepare_data.py`` converts the public datasets). Grading
(:func:`agentloop.envs.math_grader.grade_math`): plain numbers are compared exactly here, anything
else by math-verify in a worker process (``grader_timeout_s`` per check; a timeout scores wrong and
counts as ``grader_timeout``). ``answer_extraction`` picks what is graded:

- ``"boxed"`` (default): the last ``\\boxed{}`` of the final reply, or failing that a last line
  ``Answer: X`` (the DAPO-Math-17k prompt's convention); a reply with neither scores 0, so the
  policy keeps the format the prompt asks for.
- ``"verifier"``: math-verify's own extraction from the final reply as well (an unboxed
  ``The answer is 7.`` counts; math-verify reads the last number of a reply without markers).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence

from agentloop.envs.math_grader import (
    DEFAULT_GRADER_TIMEOUT_S,
    Extraction,
    check_extraction,
    grade_math,
    verdict_metrics,
)
from agentloop.envs.rewards import Reward, extract_boxed, last_assistant_text
from agentloop.envs.task_files import TaskFiles, TaskSchema
from agentloop.envs.tool_env import ToolEnv
from agentloop.errors import EnvError
from agentloop.sandboxes import SandboxConfig
from agentloop.tools.code_interpreter import code_interpreter_tool
from agentloop.types import Message, Task

__all__ = ["MATH_SCHEMA", "SYSTEM_PROMPT", "MathToolEnv", "extract_math_answer", "math_tool_reward"]

SYSTEM_PROMPT = (
    "Solve the math problem. You may run Python with the code_interpreter tool as often as it "
    "helps: variables persist between calls, and only what you print() comes back. Reason step "
    "by step, check your result with code, and put the final answer in \\boxed{}."
)
#: ``answer``: the reference answer (a string, as the datasets give it).
MATH_SCHEMA = TaskSchema(
    "math task", required={"prompt": (str,), "answer": (str,)}, optional={"source": (str,)}
)
_ANSWER_LINE = re.compile(r"^\s*Answer\s*:\s*(.+?)\s*$", re.I | re.M)
#: A final answer this long is not an answer (and would let a verifier be gamed by enumeration).
MAX_ANSWER_CHARS = 200


def extract_math_answer(text: str) -> str | None:
    """The last ``\\boxed{...}`` of ``text``, else its last ``Answer: ...`` line; None if neither
    or if it is empty or over ``MAX_ANSWER_CHARS`` characters."""
    answer = extract_boxed(text)
    if answer is None:
        lines = _ANSWER_LINE.findall(text)
        answer = lines[-1].strip().strip("$") if lines else None
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return None
    return answer


async def math_tool_reward(
    task: Task,
    messages: Sequence[Message],
    *,
    extraction: Extraction = "boxed",
    timeout_s: float = DEFAULT_GRADER_TIMEOUT_S,
) -> Reward:
    """1.0 for the right final answer, else 0.0 — nothing for calling tools or for format, so no
    degenerate policy (endless tool calls, an empty box, the question echoed back) scores. The
    verdict (answer read, check, why) rides on the reward."""
    reply = last_assistant_text(messages)
    answer = extract_math_answer(reply)
    verdict = await grade_math(
        answer,
        str(task.data["answer"]),
        reply=reply,
        extraction=extraction,
        timeout_s=timeout_s,
        max_answer_chars=MAX_ANSWER_CHARS,
    )
    calls = sum(len(m.tool_calls) for m in messages if m.role == "assistant")
    metrics = {
        "correct": float(verdict.correct),
        "has_answer": float(verdict.answer is not None),
        "tool_calls": float(calls),
        "used_tool": float(calls > 0),
        **verdict_metrics(verdict),
    }
    return Reward(float(verdict.correct), metrics, verdict)


class MathToolEnv(ToolEnv):
    """Math problems with a ``code_interpreter`` tool (Python in ``sandbox``: a setting whose
    per-event-loop shared sandbox is used; ``local`` is bubblewrap, ``remote`` or
    ``{backend: remote, urls: [...], token_env: ...}`` a pool of ``agentloop serve-sandbox``
    servers, see ``sandbox_spec``). ``files`` maps split names to task files, e.g.
    ``{"train": "data/retool/dapo_math_17k.jsonl", "aime2024": "data/retool/aime2024.jsonl"}``.
    ``tool_timeout_s`` bounds each call; ``tool_max_concurrency`` and ``tool_rate_limit_per_s``
    limit the calls across every episode of the process. ``answer_extraction`` (``boxed`` or
    ``verifier``) and ``grader_timeout_s`` set the grading (see the module docstring)."""

    def __init__(
        self,
        *,
        files: Mapping[str, str] | None = None,
        sandbox: SandboxConfig = "local",
        tool_timeout_s: float = 30.0,
        max_turns: int | None = None,
        system_prompt: str = SYSTEM_PROMPT,
        tool_max_concurrency: int | None = None,
        tool_rate_limit_per_s: float | None = None,
        answer_extraction: str = "boxed",
        grader_timeout_s: float = DEFAULT_GRADER_TIMEOUT_S,
    ) -> None:
        extraction = check_extraction(answer_extraction, "agentloop/MathTool-v0")
        if grader_timeout_s <= 0:
            raise EnvError(f"MathTool-v0 grader_timeout_s must be > 0, got {grader_timeout_s}")
        tool = code_interpreter_tool(
            sandbox,
            timeout_s=tool_timeout_s,
            max_concurrency=tool_max_concurrency,
            rate_limit_per_s=tool_rate_limit_per_s,
        )
        reward = functools.partial(
            math_tool_reward, extraction=extraction, timeout_s=grader_timeout_s
        )
        super().__init__([tool], reward, system_prompt=system_prompt, max_turns=max_turns)
        self.files = TaskFiles(files, MATH_SCHEMA, "agentloop/MathTool-v0")

    def tasks(self, split: str = "train", limit: int | None = None) -> list[Task]:
        return self.files.tasks(split, limit)
