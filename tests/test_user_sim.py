"""Simulated users: ``user`` turns as observations, masked, through the one rollout loop."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from gymnasium.utils.env_checker import check_env

from agentloop import RolloutConfig, make_builder
from agentloop.collect import collect
from agentloop.engines.base import SamplingParams
from agentloop.engines.fake import FakeEngine
from agentloop.envs import EngineUser, ScriptedUser, UserSimEnv, make
from agentloop.errors import EnvError
from agentloop.types import Message, StopReason, Trajectory

ENV = "agentloop/CalcUser-v0"
KW = {"sandbox": "fake"}


def play(tokenizer: Any, script: list[str]) -> tuple[Trajectory, FakeEngine]:
    task = make(ENV, **KW).tasks("test", 1)[0]
    engine = FakeEngine([s.format(**task.data) for s in script], tokenizer=tokenizer)
    builder = make_builder(tokenizer, ENV, **KW)
    config = RolloutConfig(max_turns=4, max_response_len=256)
    [group] = asyncio.run(collect([task], ENV, engine, builder, config=config, env_kwargs=KW))
    return group.trajectories[0], engine


def test_the_simulated_user_holds_the_question_back_until_asked(tokenizer: Any) -> None:
    traj, engine = play(tokenizer, ["What do you need?", "It is 7.", "\\boxed{{{answer}}}"])
    assert traj.stop_reason is StopReason.DONE and traj.reward == 1.0
    roles = [m.role for m in traj.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    opening, question, nudge = (m.content for m in traj.messages if m.role == "user")
    assert opening == "Hi! I need help with some arithmetic."
    assert question.startswith("Sure, here it is: ") and "\\boxed" in nudge
    assert traj.metrics["user_turns"] == 2.0
    # token-exact and masked: the trained tokens are exactly the sampled ones, in order; the
    # user's turns (and every other observation) carry mask 0
    sampled = [i for r in engine.requests for i in r.completion.token_ids]
    assert [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m] == sampled
    assert len(engine.requests) == len(traj.turns) == 3
    for request in engine.requests:  # each turn's prompt is a prefix of the trajectory
        assert list(traj.token_ids[: len(request.prompt_ids)]) == list(request.prompt_ids)
    user_ids = tokenizer.encode(question, add_special_tokens=False)
    start = _find(traj.token_ids, user_ids)
    assert start >= 0 and not any(traj.loss_mask[start : start + len(user_ids)])


def test_a_boxed_first_reply_ends_the_conversation(tokenizer: Any) -> None:
    traj, _ = play(tokenizer, ["\\boxed{{0}}"])
    assert [m.role for m in traj.messages] == ["system", "user", "assistant"]
    assert traj.metrics["user_turns"] == 0.0 and traj.stop_reason is StopReason.DONE


def test_a_persona_engine_plays_the_user_from_the_other_side(tokenizer: Any) -> None:
    user_engine = FakeEngine(["Add 2 and 3, please.", "###STOP###"], tokenizer=tokenizer)
    user = EngineUser(user_engine, tokenizer, "You are a user asking: {prompt}", SamplingParams())
    env = UserSimEnv(make("agentloop/Calc-v0", sandbox="fake"), user)
    task = env.tasks("test", 1)[0]

    async def episode() -> list[str | None]:
        await env.reset(options={"task": task})
        first = await env.step(Message("assistant", "How can I help?"))
        second = await env.step(Message("assistant", "\\boxed{5}"))
        return [m.content for m in first.observation] + [str(second.terminated)]

    assert asyncio.run(episode()) == ["Add 2 and 3, please.", "True"]
    seen = tokenizer.decode(user_engine.requests[0].prompt_ids)
    assert f"You are a user asking: {task.data['prompt']}" in seen  # the persona, filled
    # the policy's words reach the user model as *user* turns
    assert "<|im_start|>user\nHow can I help?<|im_end|>" in seen


def test_the_example_env_passes_gymnasiums_checker() -> None:
    import gymnasium

    check_env(gymnasium.make(ENV, **KW).unwrapped)


def test_a_template_naming_a_missing_task_field_is_named() -> None:
    env = UserSimEnv(make("agentloop/Calc-v0", sandbox="fake"), ScriptedUser("{question}"))
    task = env.tasks("test", 1)[0]
    with pytest.raises(EnvError, match=r"needs task field 'question'; task .* has \['answer', "):
        asyncio.run(env.reset(options={"task": task}))


def _find(seq: tuple[int, ...], sub: list[int]) -> int:
    return next(
        (i for i in range(len(seq) - len(sub) + 1) if list(seq[i : i + len(sub)]) == sub), -1
    )


@pytest.mark.slow
def test_agentloop_eval_plays_the_simulated_user(
    calc_caller_dir: Any, tmp_path: Any, tokenizer: Any
) -> None:
    """Through the CLI, with the env's settings as --env-arg: the skeptical user's turns are in
    the written trajectories, masked."""
    from agentloop.cli import main
    from agentloop.io import read_trajectories

    out = tmp_path / "run"
    args = ["eval", "--env", ENV, "--env-arg", "sandbox=fake", "--env-arg", "double_check=true",
            "--env-arg", "max_user_turns=1", "--model", str(calc_caller_dir), "--engine", "hf",
            "--out", str(out), "--num-tasks", "3", "--n", "2", "--max-turns", "5",
            "--max-response-len", "160", "--max-prompt-len", "512", "--quiet"]  # fmt: skip
    assert main(args) == 0
    trajs = read_trajectories(out / "trajectories.jsonl")
    asked = [m for t in trajs for m in t.messages[2:] if m.role == "user"]
    assert len(trajs) == 6 and asked, [[m.role for m in t.messages] for t in trajs]
    assert all(m.content.startswith("Are you sure?") for m in asked)
    for t in trajs:
        assert sum(t.loss_mask) == sum(turn.completion_tokens for turn in t.turns)  # policy only
