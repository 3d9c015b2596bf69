"""Simulated users: an env wrapper whose observations include ``user`` turns (verl's interactions).

:class:`UserSimEnv` wraps a task env (tools, reward) with a :class:`UserSimulator`. The user
opens the conversation (or the task env's prompt does), and each time the policy replies
*without* tool calls — a message to the user — the simulator answers with a ``user`` message,
which the rollout loop appends like any observation (its tokens carry ``loss_mask`` 0), or
says it is done; then that reply goes to the task env, which scores it and ends the episode.
Tool calls go to the task env as usual. So the user can hold back what the task needs (the
policy must ask), push back, or insist on a format, for at most ``max_user_turns`` turns.

Three simulators: :class:`ScriptedUser` (templates filled from the task: exact and free, for
tests and curricula), :class:`EngineUser` (a second in-process engine plays the user from a
persona prompt, seeing the conversation from the other side) and
:class:`~agentloop.envs.chat_user.ChatUser` (the same, through any OpenAI-compatible server).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from agentloop.envs.base import AnswerHook, Env, StepResult
from agentloop.envs.calc import CalcEnv
from agentloop.envs.rewards import extract_boxed
from agentloop.envs.tool_env import ToolEnv
from agentloop.errors import ConfigError, EnvError, did_you_mean
from agentloop.sandboxes import Sandbox
from agentloop.types import Completion, Message, Task

if TYPE_CHECKING:
    from agentloop.envs.chat_user import ChatUserConfig

__all__ = [
    "EngineUser",
    "ScriptedUser",
    "UserSimEnv",
    "UserSimulator",
    "calc_user_env",
    "fill_template",
    "flipped_chat",
]


class UserSimulator(Protocol):
    """Plays the user of a :class:`UserSimEnv` episode. Shared by concurrent episodes: keep
    per-episode state out of it (everything it needs is in ``task`` and ``messages``)."""

    def opening(self, task: Task) -> str | None:
        """The user's first message, or None to keep the task env's own prompt."""
        ...

    async def reply(self, task: Task, messages: Sequence[Message]) -> str | None:
        """The user's answer to the conversation so far (its last message is the policy's reply
        to the user), or None when the user is done."""
        ...


@dataclass(frozen=True)
class ScriptedUser:
    """A user who says ``opening`` and then ``replies`` in order, each a ``str.format``
    template filled from ``task.data`` (``"{prompt}"``); done when the replies run out or
    ``done(task, messages)`` is true."""

    opening_text: str | None = None
    replies: tuple[str, ...] = ()
    done: Callable[[Task, Sequence[Message]], bool] | None = None

    def opening(self, task: Task) -> str | None:
        return None if self.opening_text is None else fill_template(self.opening_text, task)

    async def reply(self, task: Task, messages: Sequence[Message]) -> str | None:
        given = sum(m.role == "user" for m in messages) - 1  # user turns after the first
        if given >= len(self.replies) or (self.done is not None and self.done(task, messages)):
            return None
        return fill_template(self.replies[given], task)


class _Generates(Protocol):
    async def generate(
        self, prompt_ids: Sequence[int], sampling: Any, *, session_id: str | None = None
    ) -> Completion: ...


class EngineUser:
    """A second model plays the user: its system prompt is ``persona`` (a ``str.format``
    template filled from ``task.data``), and it sees the conversation from the other side (the
    policy's messages as ``user``, the user's own as ``assistant``; tool traffic is left out).
    A reply containing ``stop_phrase`` (or an empty one) ends the conversation.

    ``engine`` is any agentloop engine (``generate(prompt_ids, sampling)``), ``tokenizer`` the
    user model's HF tokenizer (its chat template builds the prompt), ``sampling`` the
    engine's :class:`~agentloop.engines.SamplingParams`. The user's text is not trained on.
    """

    def __init__(
        self,
        engine: _Generates,
        tokenizer: Any,
        persona: str,
        sampling: Any,
        *,
        opening_text: str | None = None,
        stop_phrase: str = "###STOP###",
    ) -> None:
        self.engine, self.tokenizer, self.persona = engine, tokenizer, persona
        self.sampling, self.opening_text, self.stop_phrase = sampling, opening_text, stop_phrase

    def opening(self, task: Task) -> str | None:
        return None if self.opening_text is None else fill_template(self.opening_text, task)

    async def reply(self, task: Task, messages: Sequence[Message]) -> str | None:
        chat = flipped_chat(self.persona, task, messages)
        ids = self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, Mapping):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        out = await self.engine.generate(list(ids), self.sampling, session_id=f"user-{task.id}")
        text = str(self.tokenizer.decode(out.token_ids, skip_special_tokens=True)).strip()
        return None if not text or self.stop_phrase in text else text


class UserSimEnv(Env):
    """``env`` (the task: tools, reward, tasks) with ``user`` playing the user, for at most
    ``max_user_turns`` user replies per episode (the module docstring has the protocol). The
    trajectory metrics gain ``user_turns``, also when a rollout limit (max_turns, max_tokens)
    ends the episode before the task env does."""

    def __init__(self, env: Env, user: UserSimulator, *, max_user_turns: int = 2) -> None:
        if max_user_turns < 0:
            raise EnvError(f"max_user_turns must be >= 0, got {max_user_turns}")
        self.env, self.user, self.max_user_turns = env, user, max_user_turns
        self._task: Task | None = None
        self._history: list[Message] = []
        self._user_turns = 0

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return self.env.tool_schemas

    def tasks(self, split: str = "train", limit: int | None = None) -> Sequence[Task]:
        return self.env.tasks(split, limit)

    def answer_hook(self) -> AnswerHook | None:
        return self.env.answer_hook()

    async def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        task = (options or {}).get("task") or self._sample_task(seed)
        messages, info = await self.env.reset(seed=seed, options={**(options or {}), "task": task})
        opening = self.user.opening(task)
        if opening is not None:
            if not messages or messages[-1].role != "user":
                raise EnvError(f"{type(self.env).__name__}.reset did not end with a user message")
            messages = [*messages[:-1], Message("user", opening)]
        self._task, self._history, self._user_turns = task, list(messages), 0
        return list(messages), info

    def _sample_task(self, seed: int | None) -> Task:
        """gymnasium-style ``reset(seed)``: the same seed, the same task."""
        if isinstance(self.env, ToolEnv):
            return self.env.sample_task(seed)
        tasks = self.env.tasks("train")
        if not tasks:
            raise EnvError(f"{type(self.env).__name__} has no train tasks to sample from")
        return tasks[(seed or 0) % len(tasks)]

    async def step(self, action: Message) -> StepResult:
        if self._task is None:
            raise EnvError("step() called before reset(); call reset() first")
        self._history.append(action)
        if not action.tool_calls and self._user_turns < self.max_user_turns:
            reply = await self.user.reply(self._task, self._history)
            if reply is not None:
                self._user_turns += 1
                message = Message("user", reply)
                self._history.append(message)
                metrics = {"user_turns": float(self._user_turns)}
                return StepResult([message], 0.0, False, False, metrics=metrics)
        result = await self.env.step(action)
        self._history.extend(result.observation)
        if not (result.terminated or result.truncated):
            return result
        metrics = {**result.metrics, "user_turns": float(self._user_turns)}
        return dataclasses.replace(result, metrics=metrics)

    async def close(self) -> None:
        await self.env.close()

    async def preflight(self) -> None:
        await self.env.preflight()  # the task env's services (its sandbox)


def fill_template(template: str, task: Task) -> str:
    """``template.format(**task.data)``; a field the task lacks is an :class:`EnvError`."""
    try:
        return template.format(**task.data)
    except (KeyError, IndexError) as exc:
        raise EnvError(
            f"user template {template!r} needs task field {exc}; task {task.id!r} has "
            f"{sorted(task.data)}"
        ) from None


def flipped_chat(persona: str, task: Task, messages: Sequence[Message]) -> list[dict[str, str]]:
    """The conversation as the user model sees it: ``persona`` (filled from the task) as the
    system prompt, the policy's messages as ``user``, the user's own as ``assistant``; tool
    messages are left out."""
    flip = {"user": "assistant", "assistant": "user"}
    chat = [{"role": "system", "content": fill_template(persona, task)}]
    return chat + [{"role": flip[m.role], "content": m.content} for m in messages if m.role in flip]


def _answered(task: Task, messages: Sequence[Message]) -> bool:
    return extract_boxed(messages[-1].content) is not None


#: The example's user: knows the question but opens vaguely, so the policy must ask for it.
CALC_USER = ScriptedUser(
    opening_text="Hi! I need help with some arithmetic.",
    replies=("Sure, here it is: {prompt}", "Please give the final answer as \\boxed{{number}}."),
    done=_answered,
)


#: The skeptical user: asks the question outright, then makes the policy check its answer.
CALC_DOUBLE_CHECK_USER = ScriptedUser(
    replies=("Are you sure? Check it once more, then answer as \\boxed{{number}}.",) * 4
)


#: The model-played user's system prompt when ``user={...}`` names no ``persona``.
CALC_PERSONA = (
    "You are a person chatting with an AI assistant; you want it to solve this problem for you: "
    "{prompt}\nReply as that person, in one or two short sentences. Once the assistant has given "
    "a final answer as \\boxed{{number}}, reply with exactly ###STOP###."
)

#: ``calc_user_env(user=NAME)``'s scripted users.
CALC_USERS: dict[str, ScriptedUser] = {
    "scripted": CALC_USER,
    "double_check": CALC_DOUBLE_CHECK_USER,
}


def calc_user_env(
    *,
    digits: int = 2,
    sandbox: Sandbox | str = "local",
    max_user_turns: int = 2,
    user: str | Mapping[str, Any] | ChatUserConfig = "scripted",
    double_check: bool = False,
) -> UserSimEnv:
    """``agentloop/CalcUser-v0``: Calc-v0 behind a simulated user, scored by Calc's reward.
    ``user`` picks who plays the user:

    - ``"scripted"`` (default): :data:`CALC_USER` holds the question back until the policy
      replies, and asks for a boxed answer if the reply has none;
    - ``"double_check"`` (or the older ``double_check=True``): :data:`CALC_DOUBLE_CHECK_USER`
      asks outright and answers every reply with "are you sure?";
    - a mapping of :class:`~agentloop.envs.chat_user.ChatUserConfig` settings (what YAML and
      ``--env-arg 'user={...}'`` give; at least ``base_url`` and ``model``, ``persona``
      defaults to :data:`CALC_PERSONA`), or a ChatUserConfig: a model behind an
      OpenAI-compatible server plays the user (:class:`~agentloop.envs.chat_user.ChatUser`).
    """
    simulator = _calc_user(user, double_check)
    env = CalcEnv(digits=digits, sandbox=sandbox)
    return UserSimEnv(env, simulator, max_user_turns=max_user_turns)


def _calc_user(user: object, double_check: bool) -> UserSimulator:
    from agentloop.envs.chat_user import ChatUser, ChatUserConfig  # it imports this module

    scripted = isinstance(user, str) and user in CALC_USERS
    if double_check:
        if not scripted:
            raise ConfigError(
                f"double_check=true picks the scripted skeptical user, but user={user!r} picks "
                "another; drop double_check (user='double_check' is the same user)"
            )
        return CALC_DOUBLE_CHECK_USER
    if isinstance(user, ChatUserConfig):
        return ChatUser(user)
    if isinstance(user, Mapping):
        return ChatUser(ChatUserConfig.from_mapping({"persona": CALC_PERSONA, **user}))
    if isinstance(user, str) and scripted:
        return CALC_USERS[user]
    hint = did_you_mean(user, CALC_USERS) if isinstance(user, str) else ""
    raise ConfigError(
        f"user={user!r} is not a CalcUser-v0 user.{hint} Give 'scripted' (the default), "
        "'double_check', or a model-played user's settings as a mapping, at least "
        '{"base_url": "http://HOST:PORT/v1", "model": "NAME"} (YAML: data.env_kwargs.user; '
        "CLI: --env-arg 'user={...}')"
    )
