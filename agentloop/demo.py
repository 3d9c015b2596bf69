"""`agentloop demo`: play a few Calc episodes with the tiny model through the rollout loop."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from agentloop.collect import collect, make_builder
from agentloop.rollout import RolloutConfig
from agentloop.types import Trajectory, TrajectoryGroup

__all__ = ["run_demo"]

ENV_ID = "agentloop/Calc-v0"


def run_demo(
    model_dir: Path | None = None, *, tasks: int = 3, group_size: int = 2, seed: int = 0
) -> list[TrajectoryGroup]:
    """Play ``tasks`` x ``group_size`` episodes on held-out Calc tasks and print what happened."""
    from transformers import AutoTokenizer

    from agentloop.engines.hf import HFEngine
    from agentloop.envs import make
    from agentloop.testing.tiny import tiny_model_dir

    console = Console()
    model_dir = model_dir or tiny_model_dir()
    console.print(f"[bold]model[/] {model_dir} (random weights: expect gibberish, not answers)")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engine = HFEngine.from_pretrained(model_dir)
    builder = make_builder(tokenizer, ENV_ID)
    config = RolloutConfig(max_turns=3, max_response_len=96, temperature=1.0, check_template=True)
    test_tasks = make(ENV_ID).tasks("test", tasks)
    console.rule("[bold]1. a scripted oracle policy (FakeEngine): what a good episode looks like")
    oracle = asyncio.run(
        collect(test_tasks[:1], ENV_ID, _oracle(tokenizer), builder, config=config)
    )
    _print_transcript(console, oracle[0].trajectories[0], tokenizer)
    console.rule("[bold]2. the tiny model (HFEngine, random weights) on held-out tasks")
    started = time.perf_counter()
    groups = asyncio.run(
        collect(
            test_tasks, ENV_ID, engine, builder,
            config=config, group_size=group_size, concurrency=4, seed=seed,
        )
    )  # fmt: skip
    elapsed = time.perf_counter() - started
    _print_transcript(console, groups[0].trajectories[0], tokenizer)
    _print_summary(console, [t for g in groups for t in g.trajectories], elapsed)
    return groups


def _oracle(tokenizer: Any) -> Any:
    """A FakeEngine that writes the right python call, then boxes the tool's answer."""
    import json
    import re

    from agentloop.engines.fake import FakeEngine

    def policy(prompt_ids: Any, sampling: Any) -> str:
        text = tokenizer.decode(prompt_ids)
        if "<tool_response>" in text:
            result = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text)[-1]
            return f"The result is \\boxed{{{result}}}."
        question = re.findall(r"user\n(.*?)<\|im_end\|>", text)[-1]
        a, b, c = re.findall(r"\d+", question)
        code = f"print({a} * {b} + {c})" if "(" not in question else f"print(({a} + {c}) * {b})"
        if "-" in question:
            code = f"print({a} * {b} - {c})"
        call = {"name": "python", "arguments": {"code": code}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"

    return FakeEngine(policy, tokenizer=tokenizer, eos_token_id=tokenizer.eos_token_id)


def _print_transcript(console: Console, traj: Trajectory, tokenizer: Any) -> None:
    console.rule(f"episode {traj.task_id} #{traj.sample_index}: {traj.stop_reason.value}")
    for message in traj.messages:
        style = {"assistant": "green", "tool": "yellow", "user": "cyan"}.get(message.role, "dim")
        console.print(Text(f"[{message.role}] ", style=f"bold {style}"), end="")
        console.print(Text(message.content[:400], style=style))
    console.rule("tokens: [green]trained (loss mask 1)[/] / [dim]masked (prompt, tool output)[/]")
    strip = Text()
    response = range(traj.prompt_len, len(traj.token_ids))
    for i in response:
        piece = tokenizer.decode([traj.token_ids[i]])
        strip.append(piece, style="green" if traj.loss_mask[i] else "dim")
    console.print(strip)


def _print_summary(console: Console, trajs: list[Trajectory], elapsed: float) -> None:
    table = Table(title="summary")
    for col in ("episodes", "mean reward", "mean turns", "trained tokens", "stop reasons", "time"):
        table.add_column(col)
    stops = Counter(t.stop_reason.value for t in trajs)
    table.add_row(
        str(len(trajs)),
        f"{sum(t.reward for t in trajs) / len(trajs):.2f}",
        f"{sum(len(t.turns) for t in trajs) / len(trajs):.1f}",
        str(sum(t.num_trained_tokens for t in trajs)),
        ", ".join(f"{k}: {v}" for k, v in stops.items()),
        f"{elapsed:.1f}s",
    )
    console.print(table)
