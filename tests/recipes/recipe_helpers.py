"""Shared by the recipe tests: each recipe's run config wired to test data, scripted policies."""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conftest import MATH_PROBLEMS, PASSAGES, RECIPES

from agentloop.chat import TokenBuilder
from agentloop.collect import collect
from agentloop.engines.fake import FakeEngine
from agentloop.envs import make
from agentloop.trainers.config import TrainConfig, load_config
from agentloop.types import Task, Trajectory

_USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)
_VISION = re.compile(r"<\|vision_start\|>.*?<\|vision_end\|>", re.S)
Policy = Callable[[str, bool], str]  # (question, a tool response came back) -> reply text


@dataclass(frozen=True)
class Case:
    """One recipe as the tests see it: its run config (model and data files pointed at the test
    stand-ins), the env kwargs, the answer format, its tool, the oracle's tool call, the top
    reward."""

    name: str
    config: TrainConfig
    answer_format: str  # "boxed" or "tag"
    tool: str
    spam_args: Callable[[Task], dict[str, Any]]
    oracle_args: Callable[[Task], dict[str, Any]]
    best_reward: float
    extra_env_kwargs: dict[str, Any] = field(default_factory=dict)
    vision: bool = False

    @property
    def env_kwargs(self) -> dict[str, Any]:
        return {**self.config.data.env_kwargs, **self.extra_env_kwargs}

    def env(self) -> Any:
        return make(self.config.data.env, **self.env_kwargs)


def recipe_config(recipe: str, name: str, model: Path, files: dict[str, Path],
                  extra: Sequence[str] = ()) -> TrainConfig:  # fmt: skip
    """``recipes/<recipe>/<name>.yaml`` with the model and the data files replaced."""
    overrides = [f"model.path={model}", *extra]
    overrides += [f"data.env_kwargs.files.{k}={v}" for k, v in files.items()]
    return load_config(TrainConfig, RECIPES / recipe / f"{name}.yaml", overrides)


def answer_text(fmt: str, answer: str) -> str:
    return f"\\boxed{{{answer}}}" if fmt == "boxed" else f"<answer>{answer}</answer>"


def _first(answer: Any) -> str:
    return str(answer[0]) if isinstance(answer, list) else str(answer)


def math_expression(task: Task) -> str:
    """The Python expression that answers a math test task or a Calc-v0 task."""
    expr = next((e for p, _, e in MATH_PROBLEMS if p == task.data["prompt"]), None)
    if expr is not None:
        return expr
    from agentloop.envs.calc_traces import expert_expression

    return expert_expression(task)


def policies(case: Case, tasks: Sequence[Task]) -> dict[str, Policy]:
    """The oracle, a random guesser and the degenerate policies. ``random`` answers, in the right
    format, with the answer of a task drawn at random (so it is sometimes right)."""
    by_question = {str(t.data["prompt"]): t for t in tasks}
    pool = [_first(t.data["answer"]) for t in tasks]
    rng = random.Random(0)
    fmt = case.answer_format

    def call(args: dict[str, Any]) -> str:
        return f"<tool_call>\n{json.dumps({'name': case.tool, 'arguments': args})}\n</tool_call>"

    def oracle(question: str, after_tool: bool) -> str:
        task = by_question[question]
        if not after_tool:
            return call(case.oracle_args(task))
        return f"<think>checked</think>{answer_text(fmt, _first(task.data['answer']))}"

    return {
        "oracle": oracle,
        "random": lambda q, t: answer_text(fmt, rng.choice(pool)),
        "tool_spam": lambda q, t: call(case.spam_args(by_question[q])),
        "echo_question": lambda q, t: answer_text(fmt, q),
        "echo_plain": lambda q, t: q,
        "empty_answer": lambda q, t: answer_text(fmt, ""),
    }


class _ImageFakeEngine(FakeEngine):
    """The scripted engine for VLM episodes: it is given the images and ignores them."""

    supports_images = True

    async def generate(self, prompt_ids: Any, sampling: Any, *, session_id: Any = None,
                       images: Any = ()) -> Any:  # fmt: skip
        return await super().generate(prompt_ids, sampling, session_id=session_id)


def scripted_engine(tokenizer: Any, policy: Policy, *, vision: bool = False) -> FakeEngine:
    """A FakeEngine playing ``policy`` on the question of each rendered prompt."""

    def script(prompt_ids: Sequence[int], _sampling: Any) -> str:
        text = tokenizer.decode(list(prompt_ids))
        question = _VISION.sub("", _USER.findall(text)[0]).strip()
        return policy(question, "<tool_response>" in text)

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return (_ImageFakeEngine if vision else FakeEngine)(script, tokenizer=tokenizer,
                                                        eos_token_id=eos)  # fmt: skip


def play(case: Case, policy: Policy, tasks: Sequence[Task], builder: TokenBuilder) -> list[
        Trajectory]:  # fmt: skip
    """One episode per task with the recipe's own rollout limits (turns, lengths)."""
    engine = scripted_engine(builder.tokenizer, policy, vision=case.vision)
    groups = asyncio.run(collect(
        tasks, case.config.data.env, engine, builder, config=case.config.rollout.base(),
        env_kwargs=case.env_kwargs,
    ))  # fmt: skip
    return [t for g in groups for t in g.trajectories]


def passages() -> list[Any]:
    from agentloop.tools.search import Passage

    return [Passage(f"doc-{i}", t, x) for i, (t, x) in enumerate(PASSAGES)]
