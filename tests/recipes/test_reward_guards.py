"""Reward-hacking guards, one per recipe: degenerate policies earn no more than random guessing.

Each recipe's env and reward are played through the rollout loop with the recipe's own limits
(turns, lengths) by scripted policies: an oracle (the reward is reachable), a random guesser
(right format, the answer of a random task), and degenerate ones: calling the tool every turn and
never answering, echoing the question (boxed and plain), an empty answer. A reward that paid for
tool calls, for format alone, or for containing the answer somewhere would fail here.
"""

from __future__ import annotations

from pathlib import Path
from statistics import mean
from typing import Any

import pytest
from recipe_helpers import Case, math_expression, passages, play, policies, recipe_config

from agentloop.chat import TokenBuilder
from agentloop.models.demo import load_demo_configs

DEGENERATE = ("tool_spam", "echo_question", "echo_plain", "empty_answer")


def _cases(tiny: Path, vlm: Path, retool: Path, search: Path, deepeyes: Path) -> dict[str, Case]:
    from agentloop.tools.search import FakeRetriever

    demo = load_demo_configs([f"grpo.model.path={tiny}"]).grpo
    zoom_corner = {"bbox_2d": [590, 430, 640, 480]}
    return {
        "tiny_retool": Case("tiny_retool", demo, "boxed", "python",
                            lambda t: {"code": "print(1)"},
                            lambda t: {"code": f"print({math_expression(t)})"}, 1.0,
                            {"sandbox": "fake"}),
        "retool": Case("retool", recipe_config("retool", "dapo_7b", tiny, {
                           "train": retool / "dapo_math_17k.jsonl",
                           "aime2024": retool / "aime2024.jsonl"}),
                       "boxed", "code_interpreter", lambda t: {"code": "print(1)"},
                       lambda t: {"code": f"print({math_expression(t)})"}, 1.0,
                       {"sandbox": "fake"}),
        "search_r1": Case("search_r1", recipe_config("search_r1", "grpo_3b", tiny, {
                              "train": search / "train.jsonl", "test": search / "test.jsonl"}),
                          "tag", "search", lambda t: {"query": t.data["prompt"]},
                          lambda t: {"query": t.data["prompt"]}, 1.0,
                          {"retriever": FakeRetriever(passages())}),
        "deepeyes": Case("deepeyes", recipe_config("deepeyes", "grpo_7b", vlm, {
                             "train": deepeyes / "train.jsonl", "val": deepeyes / "val.jsonl"}),
                         "tag", "image_zoom_in", lambda t: zoom_corner, lambda t: zoom_corner,
                         2.0, vision=True),
    }  # fmt: skip


@pytest.fixture(scope="module")
def cases(
    tiny_model_dir: Path, retool_data: Path, search_r1_data: Path, deepeyes_data: Path
) -> dict[str, Case]:
    from agentloop.models.tiny_vlm import tiny_vlm_dir

    return _cases(tiny_model_dir, tiny_vlm_dir(), retool_data, search_r1_data, deepeyes_data)


def _builder(case: Case) -> TokenBuilder:
    from transformers import AutoTokenizer

    model = case.config.model.path
    tokenizer = AutoTokenizer.from_pretrained(model)
    vision: Any = None
    if case.vision:
        from agentloop.vision import VisionProcessor

        vision = VisionProcessor.from_pretrained(model, tokenizer=tokenizer)
    return TokenBuilder(tokenizer, tools=case.env().tool_schemas, vision=vision)


@pytest.mark.parametrize("name", ["tiny_retool", "retool", "search_r1", "deepeyes"])
def test_degenerate_policies_earn_no_more_than_random_guessing(
    name: str, cases: dict[str, Case]
) -> None:
    case = cases[name]
    split = case.config.data.train_split
    tasks = list(case.env().tasks(split, 12))
    builder = _builder(case)
    rewards: dict[str, float] = {}
    stops: dict[str, set[str]] = {}
    for policy_name, policy in policies(case, tasks).items():
        trajs = play(case, policy, tasks, builder)
        assert not [t.error for t in trajs if t.stop_reason.is_error], policy_name
        rewards[policy_name] = mean(t.reward for t in trajs)
        stops[policy_name] = {t.stop_reason.value for t in trajs}
    report = f"{name}: {rewards} stops {stops}"
    print(report)
    assert rewards["oracle"] == case.best_reward, report  # the reward can be earned
    assert rewards["random"] < rewards["oracle"], report
    for degenerate in DEGENERATE:
        assert rewards[degenerate] <= rewards["random"], f"{degenerate} beats random: {report}"
    # tool spam really ran the recipe's whole turn budget (or its token budget)
    assert stops["tool_spam"] <= {"max_turns", "truncated", "max_tokens"}, report


def test_deepeyes_tool_bonus_is_paid_only_with_a_right_answer(cases: dict[str, Case]) -> None:
    """The recipe's env scores an episode cut at its turn limit (a format error, -0.2), so
    zooming forever is worse than answering wrong with the right format (0.0)."""
    case = cases["deepeyes"]
    assert case.env_kwargs["max_turns"] == case.config.rollout.max_turns
    tasks = list(case.env().tasks("train"))
    builder = _builder(case)
    spam = play(case, policies(case, tasks)["tool_spam"], tasks, builder)
    assert {t.reward for t in spam} == {-0.2}
    assert all(t.metrics["zoom_calls"] == case.config.rollout.max_turns for t in spam)
    wrong = play(case, lambda q, after: "<answer>purple</answer>", tasks, builder)
    assert {t.reward for t in wrong} == {0.0}
