"""agentloop/Calc-v0 end to end on the real local sandbox: rollout, collect and gymnasium paths."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import gymnasium
import pytest
from sbx_helpers import needs_bwrap

from agentloop.collect import collect, make_builder
from agentloop.engines.fake import FakeEngine
from agentloop.envs import make
from agentloop.rollout import RolloutConfig
from agentloop.types import StopReason

pytestmark = [pytest.mark.integration, needs_bwrap, pytest.mark.timeout(180)]
ENV = "agentloop/Calc-v0"


def sandbox_pids() -> set[int]:
    """Live local-sandbox processes started by this test process (other jobs on the machine may
    run sandboxes too): its descendants that are bwrap or run under the fresh uids (>= 1e6) the
    local backend gives its sandboxes."""
    procs: dict[int, tuple[int, bool]] = {}  # pid -> (parent, is a sandbox process)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            status = Path(f"/proc/{name}/status").read_text()
            cmd = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if "Z" in fields["State"]:
            continue
        sandboxed = int(fields["Uid"].split()[0]) >= 1_000_000 or cmd.startswith(b"bwrap\0")
        procs[int(name)] = (int(fields["PPid"]), sandboxed)

    def ours(pid: int) -> bool:
        for _ in range(64):
            if pid == os.getpid():
                return True
            if pid not in procs:
                return False
            pid = procs[pid][0]
        return False

    return {pid for pid, (_, sandboxed) in procs.items() if sandboxed and ours(pid)}


def wait_no_new(before: set[int], timeout_s: float = 15.0) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while (left := sandbox_pids() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def expression(question: str) -> str:
    """The arithmetic of a Calc question (the numbers appear in the templates' order)."""
    x, y, z = re.findall(r"\d+", question)
    if "(" in question:
        return f"({x} + {y}) * {z}"
    return f"{x} * {y} {'-' if ' - ' in question else '+'} {z}"


def oracle(tokenizer: Any) -> FakeEngine:
    """Stores the result in a variable, prints it in a second call, then boxes the printed value:
    right answers need both the sandbox's arithmetic and its state across calls."""

    def respond(prompt_ids: Any, sampling: Any) -> str:
        text = tokenizer.decode(prompt_ids)
        outputs = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, re.S)
        if len(outputs) == 2:
            return f"The answer is \\boxed{{{outputs[-1]}}}."
        question = re.findall(r"user\n(.*?)<\|im_end\|>", text)[-1]
        code = f"result = {expression(question)}" if not outputs else "print(result)"
        call = {"name": "python", "arguments": {"code": code}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"

    return FakeEngine(respond, tokenizer=tokenizer, eos_token_id=tokenizer.eos_token_id)


def test_calc_episodes_on_the_local_sandbox(tokenizer: Any) -> None:
    before = sandbox_pids()
    tasks = make(ENV).tasks("test", 4)
    builder = make_builder(tokenizer, ENV)
    config = RolloutConfig(max_turns=4, max_response_len=256, check_template=True)
    groups = asyncio.run(
        collect(tasks, ENV, oracle(tokenizer), builder, config=config, group_size=2)
    )
    trajs = [t for g in groups for t in g.trajectories]
    assert [t.stop_reason for t in trajs] == [StopReason.DONE] * 8, [t.error for t in trajs]
    assert [t.reward for t in trajs] == [1.0] * 8
    for group in groups:
        for t in group.trajectories:
            tools = [m.content for m in t.messages if m.role == "tool"]
            assert tools == ["(no output; use print() to see values)", group.task.data["answer"]]
    # the shared sandbox closed with the event loop: nothing of it is left running
    assert wait_no_new(before) == set()


def test_calc_gymnasium_episode_on_the_local_sandbox() -> None:
    before = sandbox_pids()
    env = gymnasium.make(ENV)
    obs, _ = env.reset(seed=3)
    call = {"name": "python", "arguments": {"code": "import os\nprint(os.getcwd(), 6 * 7)"}}
    obs, reward, terminated, _, _ = env.step(f"<tool_call>\n{json.dumps(call)}\n</tool_call>")
    assert "/sandbox 42" in obs and not terminated and reward == 0.0
    assert sandbox_pids() - before  # the episode's interpreter runs under bubblewrap
    env.close()
    assert wait_no_new(before) == set()
