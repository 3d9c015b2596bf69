"""Simulated users: ``user`` turns as observations, masked, through the one rollout loop."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from gymnasium.utils.env_checker import check_env

from agentloop import RolloutConfig, make_builder
from agentloop.collect import collect
from agentloop.engines.base import SamplingParams
from agentloop.engines.fake import FakeEngine
from agentloop.envs import ChatUser, ChatUserConfig, EngineUser, ScriptedUser, UserSimEnv, make
from agentloop.envs.user_sim import CALC_DOUBLE_CHECK_USER, CALC_PERSONA, CALC_USER
from agentloop.errors import ConfigError, EnvError
from agentloop.types import Message, StopReason, Trajectory

ENV = "agentloop/CalcUser-v0"
KW = {"sandbox": "fake"}
URL = "http://127.0.0.1:8000/v1"
KEY_VAR = "AGENTLOOP_TEST_USER_KEY"


def play(tokenizer: Any, script: list[str], max_turns: int = 4) -> tuple[Trajectory, FakeEngine]:
    task = make(ENV, **KW).tasks("test", 1)[0]
    engine = FakeEngine([s.format(**task.data) for s in script], tokenizer=tokenizer)
    builder = make_builder(tokenizer, ENV, **KW)
    config = RolloutConfig(max_turns=max_turns, max_response_len=256)
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


def test_user_turns_are_counted_when_a_rollout_limit_ends_the_episode(tokenizer: Any) -> None:
    traj, _ = play(tokenizer, ["What do you need?"], max_turns=1)
    assert traj.stop_reason is StopReason.MAX_TURNS and traj.metrics["user_turns"] == 1.0


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


# -- ChatUser: a model behind an OpenAI-compatible server plays the user ----------------------


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"base_url": "localhost:80"}, r"user\.base_url='localhost:80': must be the http\(s\) URL"),
        ({"model": ""}, r"user\.model='': must name the served model"),
        ({"persona": "Ask {prompt"}, r"user\.persona='Ask \{prompt' is not a str\.format template"),
        ({"opening_text": "}"}, r"user\.opening_text='\}' is not a str\.format template"),
        ({"api_key_env": ""}, r"user\.api_key_env='': must name an environment variable"),
        ({"max_tokens": 0}, r"user\.max_tokens=0: must be an int >= 1"),
        ({"max_tokens": "16"}, r"user\.max_tokens='16': must be an int >= 1"),
        ({"temperature": -0.5}, r"user\.temperature=-0\.5: must be a number >= 0"),
        ({"temperature": float("nan")}, r"user\.temperature=nan: must be a number >= 0"),
        ({"timeout_s": 0}, r"user\.timeout_s=0: must be a number > 0"),
        ({"stop_phrase": " "}, r"user\.stop_phrase=' ': must be a non-empty string"),
    ],
)  # fmt: skip
def test_chat_user_settings_are_checked_naming_the_value_and_the_fix(
    settings: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        ChatUserConfig.from_mapping({"base_url": URL, "model": "tiny", "persona": "p", **settings})


def test_chat_user_settings_from_a_mapping_name_unknown_and_missing_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigError, match=r"user\.max_token is not .* Did you mean 'max_tokens'"):
        ChatUserConfig.from_mapping({"base_url": URL, "model": "m", "persona": "p", "max_token": 9})
    with pytest.raises(ConfigError, match=r"lack \['model'\]; .* at least \{\"base_url\""):
        ChatUserConfig.from_mapping({"base_url": URL, "persona": "p"})
    config = ChatUserConfig(URL, "m", "p", api_key_env=KEY_VAR)
    monkeypatch.delenv(KEY_VAR, raising=False)
    with pytest.raises(ConfigError, match=r"variable AGENTLOOP_TEST_USER_KEY is not set; export"):
        ChatUser(config)


def test_calc_user_env_takes_a_named_user_or_a_model_played_users_settings() -> None:
    def user_of(**kwargs: Any) -> Any:
        env = make(ENV, **KW, **kwargs)
        assert isinstance(env, UserSimEnv)
        return env.user

    assert user_of() is CALC_USER and user_of(user="scripted") is CALC_USER
    assert user_of(user="double_check") is CALC_DOUBLE_CHECK_USER
    assert user_of(double_check=True) is CALC_DOUBLE_CHECK_USER  # the older spelling
    chat = user_of(user={"base_url": URL, "model": "tiny", "max_tokens": 32})
    assert isinstance(chat, ChatUser)  # what YAML and --env-arg 'user={...}' give
    assert chat.config == ChatUserConfig(URL, "tiny", CALC_PERSONA, max_tokens=32)
    config = ChatUserConfig(URL, "tiny", "You want {prompt}", opening_text="Hi")
    assert user_of(user=config).config is config


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"user": "scripted_user"}, r"user='scripted_user' is not a CalcUser-v0 user\. Did you "
         r"mean 'scripted'\? Give 'scripted' \(the default\), 'double_check', or .* mapping"),
        ({"user": 3}, r"user=3 is not a CalcUser-v0 user\. Give 'scripted'"),
        ({"user": {"model": "tiny"}}, r"lack \['base_url'\]"),
        ({"user": {"base_url": URL, "model": "tiny"}, "double_check": True},
         r"double_check=true picks the scripted skeptical user, but user=\{.*drop double_check"),
    ],
)  # fmt: skip
def test_a_bad_calc_user_is_named_with_the_valid_forms(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make(ENV, **KW, **kwargs)


def test_a_yaml_run_config_and_overrides_pick_a_model_played_user(tmp_path: Path) -> None:
    from agentloop.env_maker import env_factory
    from agentloop.trainers import TrainConfig, load_config

    path = tmp_path / "run.yaml"
    path.write_text(
        "data:\n  env: agentloop/CalcUser-v0\n  env_kwargs:\n    sandbox: fake\n    user:\n"
        f"      base_url: {URL}\n      model: tiny\n      max_tokens: 48\n"
    )
    overrides = ["data.env_kwargs.user.base_url=http://10.0.0.2:9000/v1",
                 "data.env_kwargs.user.temperature=0"]  # fmt: skip
    for cfg, base_url, extra in [
        (load_config(TrainConfig, path), URL, {}),
        (load_config(TrainConfig, path, overrides), "http://10.0.0.2:9000/v1", {"temperature": 0}),
    ]:
        # the env that training (trainers/grpo.py) and validation make from the config
        data = cfg.data
        env = env_factory(data.env, data.env_kwargs, data.tools, cfg.rollout.tool_io())()
        assert isinstance(env, UserSimEnv) and isinstance(env.user, ChatUser)
        assert env.user.config == ChatUserConfig(
            base_url, "tiny", CALC_PERSONA, max_tokens=48, **extra
        )


class ChatStub:
    """A /v1/chat/completions server: model ``tiny`` answers ``reply to <last message>`` (or
    ``###STOP###`` once the last message has a boxed answer), ``slow`` takes 2 s, and any other
    model gets vLLM's 404."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        if body["model"] == "slow":
            await asyncio.sleep(2)
        elif body["model"] != "tiny":
            error = {"message": f"The model `{body['model']}` does not exist.", "code": 404}
            return web.json_response({"error": {**error, "type": "NotFoundError"}}, status=404)
        last = body["messages"][-1]["content"]
        text = "###STOP###" if "boxed" in last else f"reply to {last}"
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "finish_reason": "stop"}  # fmt: skip
        return web.json_response(
            {"id": "chat-1", "object": "chat.completion", "created": 0, "model": body["model"],
             "choices": [choice]}
        )  # fmt: skip


@pytest_asyncio.fixture
async def chat_stub() -> AsyncIterator[tuple[ChatStub, str]]:
    handler = ChatStub()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler.chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield handler, f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    finally:
        await runner.cleanup()


@pytest.mark.integration  # a real aiohttp server on loopback
async def test_a_chat_server_plays_the_user_from_the_other_side(
    chat_stub: tuple[ChatStub, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, url = chat_stub
    monkeypatch.setenv(KEY_VAR, "sk-test")
    config = ChatUserConfig(url, "tiny", "You want {prompt}", api_key_env=KEY_VAR, max_tokens=20,
                            temperature=0.5, opening_text="Hi! {answer}?")  # fmt: skip
    env = UserSimEnv(make("agentloop/Calc-v0", sandbox="fake"), ChatUser(config))
    task = env.tasks("test", 1)[0]
    messages, _ = await env.reset(options={"task": task})
    assert messages[-1] == Message("user", f"Hi! {task.data['answer']}?")
    first = await env.step(Message("assistant", "How can I help?"))
    assert first.observation == [Message("user", "reply to How can I help?")]
    last = await env.step(Message("assistant", f"\\boxed{{{task.data['answer']}}}"))
    assert last.terminated and last.reward == 1.0 and last.metrics["user_turns"] == 1.0
    body = server.bodies[0]
    assert (body["model"], body["max_tokens"], body["temperature"]) == ("tiny", 20, 0.5)
    assert body["messages"] == [  # the system prompt is the persona; Calc's own is left out
        {"role": "system", "content": f"You want {task.data['prompt']}"},
        {"role": "assistant", "content": f"Hi! {task.data['answer']}?"},
        {"role": "user", "content": "How can I help?"},
    ]
    assert server.headers[0]["Authorization"] == "Bearer sk-test"
    assert len(server.bodies) == 2  # the stop phrase ended it: the boxed reply was scored


@pytest.mark.integration
@pytest.mark.parametrize(
    ("model", "match"),
    [
        ("missing", r"the user model 'missing' at http://127\.0\.0\.1:\d+/v1 answered HTTP 404: "
                    r".*does not exist.*; check user\.model"),
        ("slow", r"the user model 'slow' at http://127\.0\.0\.1:\d+/v1 did not reply within "
                 r"user\.timeout_s=0\.5"),
    ],
)  # fmt: skip
async def test_a_server_error_or_timeout_is_an_env_error_naming_the_url(
    chat_stub: tuple[ChatStub, str], model: str, match: str
) -> None:
    _, url = chat_stub
    user = ChatUser(ChatUserConfig(url, model, "p", timeout_s=0.5))
    task = make("agentloop/Calc-v0", sandbox="fake").tasks("test", 1)[0]
    start = time.monotonic()
    with pytest.raises(EnvError, match=match):
        await user.reply(task, [Message("user", "hi"), Message("assistant", "What is it?")])
    assert time.monotonic() - start < 3  # the deadline held: no retries, no hang


def test_an_unreachable_user_server_fails_the_episode_naming_the_url(tokenizer: Any) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"  # nothing listens once closed
    kw = {**KW, "user": {"base_url": dead, "model": "tiny", "timeout_s": 5}}
    task = make(ENV, **kw).tasks("test", 1)[0]
    engine = FakeEngine(["What do you need?"], tokenizer=tokenizer)
    builder = make_builder(tokenizer, ENV, **kw)
    config = RolloutConfig(max_turns=3, max_response_len=128)
    [group] = asyncio.run(collect([task], ENV, engine, builder, config=config, env_kwargs=kw))
    traj = group.trajectories[0]
    assert traj.stop_reason is StopReason.ENV_ERROR, traj.error
    assert f"the user model 'tiny' at {dead} failed (APIConnectionError" in str(traj.error)
