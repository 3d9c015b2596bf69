"""Thinking-history policies: a template that drops earlier <think> blocks fails at start-up
unless declared; ``keep`` gives one token-exact trajectory, ``strip`` one token-exact sample per
turn whose prompt is exactly what the engine was given."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agentloop.chat import TokenBuilder
from agentloop.collect import collect
from agentloop.engines.fake import FakeEngine
from agentloop.envs import ToolEnv
from agentloop.errors import ConfigError, TemplateError
from agentloop.models.tiny import CHAT_TEMPLATE
from agentloop.rollout import RolloutConfig, rollout
from agentloop.tools import tool
from agentloop.types import StopReason, Task, Trajectory, TrajectoryGroup, Turn

THOUGHTS = ("I should echo the word first.", "The tool said hi, so that is it.")


@tool
def echo(text: str) -> str:
    """Echo the text back.

    Args:
        text: What to echo.
    """
    return text


def make_env() -> ToolEnv:
    def reward(task: Task, messages: Any) -> float:
        return float("\\boxed{hi}" in messages[-1].content)

    return ToolEnv([echo], reward, system_prompt="Use tools.")


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


SCRIPT = [
    f"<think>\n{THOUGHTS[0]}\n</think>\n\n{call('echo', text='hi')}",
    f"<think>\n{THOUGHTS[1]}\n</think>\n\nThe answer is \\boxed{{hi}}.",
]


@pytest.fixture(scope="module")
def reasoning_tokenizer(reasoning_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(reasoning_model_dir)


def builder_for(tokenizer: Any, thinking: str) -> TokenBuilder:
    return TokenBuilder(tokenizer, tools=make_env().tool_schemas, thinking=thinking)


def play(builder: TokenBuilder, tokenizer: Any, thinking: str) -> tuple[list[Trajectory], Any]:
    engine = FakeEngine(SCRIPT, tokenizer=tokenizer, eos_token_id=tokenizer.eos_token_id)
    config = RolloutConfig(max_turns=4, thinking=thinking)
    (group,) = asyncio.run(
        collect([Task("t0", {"prompt": "Echo hi."})], make_env, engine, builder, config=config)
    )
    return list(group.trajectories), engine


# -- start-up: detection and the error -------------------------------------------------------


def test_undeclared_stripping_template_fails_at_start_up_naming_template_and_policies(
    reasoning_tokenizer: Any, reasoning_model_dir: Path
) -> None:
    with pytest.raises(TemplateError) as info:
        builder_for(reasoning_tokenizer, "auto")
    message = str(info.value)
    assert str(reasoning_model_dir) in message  # the template is named: where it comes from
    assert "sha256 " in message  # ... and a short hash of its text
    assert "<think>" in message
    assert "rollout.thinking=keep" in message and "rollout.thinking=strip" in message


@pytest.mark.parametrize("thinking", ["keep", "strip"])
def test_declared_policy_accepts_the_stripping_template_and_says_so_once(
    reasoning_tokenizer: Any,
    thinking: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import agentloop.thinking

    monkeypatch.setattr(agentloop.thinking, "_LOGGED", set())
    caplog.set_level("INFO", logger="agentloop.thinking")
    for _ in range(2):
        builder = TokenBuilder(reasoning_tokenizer, thinking=thinking)
    assert builder.rewrites_history == "thinking"
    assert builder.splits_turns is (thinking == "strip")
    assert builder.thinking == thinking
    (record,) = [r for r in caplog.records if "rollout.thinking" in r.getMessage()]
    assert f"rollout.thinking={thinking}" in record.getMessage()


def test_prefix_stable_templates_need_no_policy(tokenizer: Any) -> None:
    from agentloop.formats import FAMILIES

    for template in [CHAT_TEMPLATE, *(f.chat_template for f in FAMILIES.values())]:
        for thinking in ("auto", "keep", "strip"):
            builder = TokenBuilder(tokenizer, chat_template=template, thinking=thinking)
            assert builder.rewrites_history is None and not builder.splits_turns


def test_a_template_rewriting_more_than_thinking_takes_strip_only(tokenizer: Any) -> None:
    # marks assistant turns that are not the last message: appending anything rewrites them
    moving = CHAT_TEMPLATE.replace(
        "{{- '<|im_start|>assistant\\n' + content -}}",
        "{{- '<|im_start|>assistant\\n' + ('' if loop.last else '[earlier] ') + content -}}",
    )
    assert moving != CHAT_TEMPLATE
    for thinking in ("auto", "keep"):
        with pytest.raises(TemplateError, match="rewrites earlier turns") as info:
            TokenBuilder(tokenizer, chat_template=moving, thinking=thinking)
        fixes = str(info.value).split("To train with it")[1]
        assert "rollout.thinking=strip" in fixes and "keep" not in fixes
    assert TokenBuilder(tokenizer, chat_template=moving, thinking="strip").splits_turns


def test_bad_policy_values_name_the_value_and_the_valid_ones(tokenizer: Any) -> None:
    with pytest.raises(ConfigError, match=r"rollout.thinking='drop'.*auto, keep, strip"):
        RolloutConfig(thinking="drop")
    with pytest.raises(ConfigError, match="'drop'"):
        TokenBuilder(tokenizer, thinking="drop")


def test_builder_and_config_must_agree(reasoning_tokenizer: Any) -> None:
    builder = builder_for(reasoning_tokenizer, "keep")
    engine = FakeEngine(SCRIPT, tokenizer=reasoning_tokenizer)
    with pytest.raises(ConfigError, match=r"thinking='strip'"):
        asyncio.run(
            collect([Task("t0")], make_env, engine, builder, config=RolloutConfig(thinking="strip"))
        )
    strip = builder_for(reasoning_tokenizer, "strip")
    task = Task("t0", {"prompt": "Echo hi."})
    config = RolloutConfig(thinking="strip")
    with pytest.raises(ConfigError, match="rollout_episode"):
        asyncio.run(rollout(make_env(), engine, strip, task, config))


# -- keep: one token-exact trajectory that keeps the reasoning --------------------------------


def test_keep_is_one_token_exact_trajectory_with_earlier_reasoning(
    reasoning_tokenizer: Any,
) -> None:
    builder = builder_for(reasoning_tokenizer, "keep")
    (traj,), engine = play(builder, reasoning_tokenizer, "keep")
    assert traj.stop_reason == StopReason.DONE and traj.reward == 1.0, traj.error
    first, second = engine.requests
    assert list(first.prompt_ids) == list(traj.token_ids[: traj.prompt_len])
    # the second prompt extends the first sample verbatim: the reasoning stays in the history
    sampled_1 = first.completion.token_ids
    assert (
        second.prompt_ids[: len(first.prompt_ids) + len(sampled_1)] == first.prompt_ids + sampled_1
    )
    assert THOUGHTS[0] in reasoning_tokenizer.decode(second.prompt_ids)
    end = len(second.prompt_ids) + len(second.completion.token_ids)
    assert (
        traj.token_ids == second.prompt_ids + second.completion.token_ids
        and len(traj.token_ids) == end
    )
    mask = [0] * len(traj.token_ids)
    logprobs = [0.0] * len(traj.token_ids)
    for req in engine.requests:
        n = len(req.prompt_ids)
        mask[n : n + len(req.completion.token_ids)] = [1] * len(req.completion.token_ids)
        logprobs[n : n + len(req.completion.token_ids)] = req.completion.logprobs
    assert list(traj.loss_mask) == mask and list(traj.logprobs) == logprobs
    assert "segments" not in traj.metrics


# -- strip: one token-exact sample per turn --------------------------------------------------


def test_strip_gives_one_token_exact_sample_per_turn(reasoning_tokenizer: Any) -> None:
    builder = builder_for(reasoning_tokenizer, "strip")
    samples, engine = play(builder, reasoning_tokenizer, "strip")
    requests = engine.requests
    assert len(samples) == len(requests) == 2
    for k, (sample, req) in enumerate(zip(samples, requests, strict=True)):
        assert sample.sample_index == 0 and sample.stop_reason == StopReason.DONE, sample.error
        # the prompt is exactly what the engine was given, and the template's own rendering
        assert sample.token_ids[: sample.prompt_len] == req.prompt_ids
        history = [m for m in sample.messages[:-1]]  # the sample's messages end with its turn
        text = builder.render(history, add_generation_prompt=True)
        assert list(req.prompt_ids) == builder.encode(text)
        # the response is the sampled ids and the engine's logprobs, all trained
        assert sample.token_ids[sample.prompt_len :] == req.completion.token_ids
        assert sample.logprobs[sample.prompt_len :] == req.completion.logprobs
        assert sample.loss_mask == (0,) * sample.prompt_len + (1,) * len(req.completion.token_ids)
        assert all(lp == 0.0 for lp in sample.logprobs[: sample.prompt_len])
        (turn,) = sample.turns
        assert turn.index == k and turn.start == sample.prompt_len
        assert sample.metrics["segments"] == 2.0 and sample.metrics["segment_index"] == k
        assert sample.reward == 1.0  # every sample carries the episode's reward
    # the second prompt is what the template shows at inference: the first turn's reasoning
    # is gone, its tool call is not
    second = reasoning_tokenizer.decode(requests[1].prompt_ids)
    assert THOUGHTS[0] not in second and '"name": "echo"' in second
    # no sampled token is lost or trained twice
    sampled = [i for r in requests for i in r.completion.token_ids]
    trained = [i for s in samples for i, m in zip(s.token_ids, s.loss_mask, strict=True) if m]
    assert sum(sum(s.loss_mask) for s in samples) == len(sampled)
    assert Counter(trained) == Counter(sampled) and trained == sampled
    # the last sample holds the whole conversation (eval shows it for the episode)
    assert samples[-1].messages[-1].content.endswith("\\boxed{hi}.")
    assert [m.role for m in samples[-1].messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]


def test_strip_budget_counts_the_context_after_the_first_prompt(reasoning_tokenizer: Any) -> None:
    builder = builder_for(reasoning_tokenizer, "strip")
    engine = FakeEngine(SCRIPT, tokenizer=reasoning_tokenizer)
    config = RolloutConfig(max_turns=4, thinking="strip", max_response_len=60)
    (group,) = asyncio.run(
        collect([Task("t0", {"prompt": "Echo hi."})], make_env, engine, builder, config=config)
    )
    first = engine.requests[0]
    for req in engine.requests:
        used = len(req.prompt_ids) - len(first.prompt_ids)
        assert req.sampling.max_tokens == 60 - used
    assert all(
        len(t.token_ids) - group.trajectories[0].prompt_len <= 60 for t in group.trajectories
    )


def test_turn_rloo_gives_each_strip_sample_its_own_turns_advantage() -> None:
    from agentloop.trainers.advantages import trajectory_advantages

    def episode(i: int, rewards: list[float], split: bool) -> list[Trajectory]:
        if split:  # one sample per turn: 2 prompt tokens, then the turn's 2 sampled tokens
            return [
                Trajectory(
                    "t",
                    (9, 9, 5, 6),
                    (0, 0, 1, 1),
                    (0.0,) * 4,
                    2,
                    sum(rewards),
                    StopReason.DONE,
                    turns=(Turn(k, 2, 2, 0, "stop", reward=r),),
                    sample_index=i,
                )
                for k, r in enumerate(rewards)
            ]
        n = 2 + 3 * len(rewards)  # per turn: 2 sampled tokens, 1 observation token
        turns = [Turn(k, 2 + 3 * k, 2, 1, "stop", reward=r) for k, r in enumerate(rewards)]
        mask = (0, 0, *[1, 1, 0] * len(rewards))
        return [
            Trajectory(
                "t",
                tuple(range(n)),
                mask,
                (0.0,) * n,
                2,
                sum(rewards),
                StopReason.DONE,
                turns=tuple(turns),
                sample_index=i,
            )
        ]

    rewards = [[0.0, 1.0], [0.5, 0.0, 0.0], [1.0]]
    whole = trajectory_advantages(
        [
            TrajectoryGroup(
                Task("t"), tuple(t for i, r in enumerate(rewards) for t in episode(i, r, False))
            )
        ],
        "turn_rloo",
    )
    split = trajectory_advantages(
        [
            TrajectoryGroup(
                Task("t"), tuple(t for i, r in enumerate(rewards) for t in episode(i, r, True))
            )
        ],
        "turn_rloo",
    )
    per_turn_whole = [
        [float(a[2 + 3 * k]) for k in range(len(r))] for a, r in zip(whole, rewards, strict=True)
    ]
    flat_split = [float(a[2]) for a in split]
    assert flat_split == [a for turns in per_turn_whole for a in turns]
    assert any(flat_split)


# -- agentloop eval: the --thinking flag, on the HF engine -----------------------------------


@pytest.mark.parametrize("thinking", ["keep", "strip"])
def test_eval_cli_plays_the_reasoning_caller_under_each_policy(
    reasoning_caller_dir: Path, tmp_path: Path, thinking: str
) -> None:
    from agentloop.cli import main
    from agentloop.io import read_trajectories

    out = tmp_path / "run"
    args = ["eval", "--env", "agentloop/Calc-v0", "--model", str(reasoning_caller_dir),
            "--out", str(out), "--engine", "hf", "--n", "2", "--num-tasks", "2",
            "--max-turns", "3", "--max-response-len", "96", "--quiet",
            "--thinking", thinking]  # fmt: skip
    assert main(args) == 0
    assert json.loads((out / "config.json").read_text())["rollout"]["thinking"] == thinking
    trajs = read_trajectories(out / "trajectories.jsonl")
    episodes = Counter((t.task_id, t.sample_index) for t in trajs)
    assert len(episodes) == 4
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 4
    for t in trajs:
        assert not t.failed, t.error
    if thinking == "keep":
        assert set(episodes.values()) == {1}
    else:  # one sample per turn, each with one turn; the caller calls a tool, then answers
        assert max(episodes.values()) > 1
        assert all(len(t.turns) == 1 for t in trajs)
        for key, n in episodes.items():
            samples = [t for t in trajs if (t.task_id, t.sample_index) == key]
            assert [t.turns[0].index for t in samples] == list(range(n))


def test_eval_cli_names_the_policies_for_an_undeclared_stripping_template(
    reasoning_caller_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agentloop.cli import main

    args = ["eval", "--env", "agentloop/Calc-v0", "--model", str(reasoning_caller_dir),
            "--out", str(tmp_path / "run"), "--engine", "hf",
            "--n", "1", "--num-tasks", "1"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "rollout.thinking=keep" in err and "rollout.thinking=strip" in err
    assert not (tmp_path / "run" / "trajectories.jsonl").exists()  # failed before any episode
    assert main([*args, "--thinking", "sometimes"]) == 2
    assert "'sometimes'" in capsys.readouterr().err


def test_rollout_metrics_count_a_strip_episode_once(reasoning_tokenizer: Any) -> None:
    from agentloop.trainers.metrics import rollout_metrics

    builder = builder_for(reasoning_tokenizer, "strip")
    samples, _ = play(builder, reasoning_tokenizer, "strip")
    keep, _ = play(builder_for(reasoning_tokenizer, "keep"), reasoning_tokenizer, "keep")
    for trajs in (samples, keep):
        m = rollout_metrics([TrajectoryGroup(Task("t0"), tuple(trajs))])
        assert m["rollout/episodes"] == 1.0 and m["rollout/turns_mean"] == 2.0
        assert m["rollout/turn_reward/0"] == 0.0 and m["rollout/turn_reward/1"] == 1.0
