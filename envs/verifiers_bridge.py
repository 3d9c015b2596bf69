"""What the verifiers adapter asks of verifiers: load an env, its rows, its messages, one rollout.

Everything here speaks verifiers' own API (``verifiers==0.3.1``, its classic environments:
``vf.SingleTurnEnv``, ``vf.MultiTurnEnv``, ``vf.ToolEnv`` and their subclasses):

- :func:`load` loads an environment as ``vf-eval`` does, ``verifiers.load_environment(env_id,
  **env_args)`` (the module named like the id, ``-`` as ``_``, and its ``load_environment``), once
  per process and arguments;
- :func:`rows` are its dataset rows (``get_dataset`` for ``train``, ``get_eval_dataset`` for
  ``test``/``eval``), formatted by verifiers (``prompt``, ``example_id``, ``answer``, ``info``);
- :class:`Rollout` plays one rollout step by step in the order ``MultiTurnEnv.rollout`` plays it
  (``init_state``, ``setup_state``, ``get_prompt_messages`` with the env's ``env_response``,
  ``add_model_response``, the env's stop conditions, ``cleanup``), except that the model's reply
  comes from agentloop's loop; then the env's rubric scores the state (``score_rollout``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from agentloop.errors import EnvError, did_you_mean
from agentloop.types import Message, Role, ToolCall

__all__ = ["Rollout", "Score", "load", "rows", "tool_schemas"]

#: agentloop's splits → the dataset verifiers keeps for them.
SPLITS = {"train": "dataset", "test": "eval_dataset", "eval": "eval_dataset"}
_ROLES: tuple[Role, ...] = ("system", "user", "assistant", "tool")
#: the model name the rollout's state records (no request is made with it)
MODEL = "agentloop"


@dataclass(frozen=True)
class Score:
    """The rubric's score of one rollout: ``reward`` (its weighted sum) and ``metrics`` (every
    function's own score, weight-0 metrics included, by function name)."""

    reward: float
    metrics: Mapping[str, float]


def load(env_id: str, env_args: Mapping[str, Any]) -> Any:
    """The verifiers environment ``env_id`` made with ``env_args``, loaded once per process."""
    return _load(env_id, json.dumps(dict(env_args), sort_keys=True))


@functools.cache
def _load(env_id: str, args_json: str) -> Any:
    import verifiers as vf
    from verifiers.legacy.envs.environment import Environment
    from verifiers.legacy.envs.multiturn_env import MultiTurnEnv

    env_args = json.loads(args_json)
    with _own_signal_handlers():
        try:
            env = vf.load_environment(env_id, **env_args)
        except (ValueError, RuntimeError) as exc:
            raise EnvError(_load_error(env_id, env_args, exc)) from exc
    if not isinstance(env, MultiTurnEnv):
        kind = "a classic Environment" if isinstance(env, Environment) else "not an Environment"
        raise EnvError(
            f"verifiers:{env_id}: load_environment() returned a {type(env).__name__} ({kind}); "
            "agentloop plays verifiers' multi-turn environments (vf.SingleTurnEnv, "
            "vf.MultiTurnEnv, vf.ToolEnv and their subclasses)"
        )
    if type(env).get_model_response is not Environment.get_model_response:
        raise EnvError(
            f"verifiers:{env_id}: {type(env).__name__} overrides get_model_response (it asks "
            "the model itself); agentloop's loop samples every reply, so it cannot play it"
        )
    if env.rubric.has_group_rewards:
        raise EnvError(
            f"verifiers:{env_id}: its rubric has group reward functions (they score a group of "
            "rollouts together); agentloop scores each rollout as it ends: use per-rollout "
            "reward functions (agentloop's advantages already compare a task's rollouts)"
        )
    return env


def _load_error(env_id: str, env_args: Mapping[str, Any], exc: Exception) -> str:
    module = env_id.replace("-", "_").split("/")[-1]
    cause = exc.__cause__
    if isinstance(cause, ImportError):
        return (
            f"verifiers:{env_id}: verifiers could not import its module {module!r} ({cause}); "
            "an environment is a module of that name with load_environment(), installed (pip "
            "install, vf-install) or on PYTHONPATH"
        )
    if isinstance(cause, TypeError):
        import importlib

        params = list(
            inspect.signature(importlib.import_module(module).load_environment).parameters
        )
        hints = "".join(did_you_mean(k, params) for k in env_args if k not in params)
        return (
            f"verifiers:{env_id}: load_environment() refused env_args {sorted(env_args)} "
            f"({cause}).{hints} Its parameters: {params}"
        )
    return f"verifiers:{env_id}: loading failed: {exc} ({type(cause).__name__}: {cause})"


@contextlib.contextmanager
def _own_signal_handlers() -> Iterator[None]:
    """verifiers' Environment takes SIGINT and SIGTERM for its teardown (and can only do so on
    the main thread); the process keeps its own handlers, and the env's teardown runs at exit."""
    import verifiers.legacy.envs.environment as vf_environment

    if threading.current_thread() is not threading.main_thread():
        real = vf_environment.signal
        vf_environment.signal = _NoSignals()
        try:
            yield
        finally:
            vf_environment.signal = real
        return
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


class _NoSignals:
    """The ``signal`` module as a verifiers env made off the main thread sees it."""

    SIGINT, SIGTERM = signal.SIGINT, signal.SIGTERM
    default_int_handler = staticmethod(signal.default_int_handler)

    @staticmethod
    def signal(signum: int, handler: Any) -> Any:
        return None


def rows(env: Any, env_id: str, split: str, limit: int | None) -> list[dict[str, Any]]:
    """The first ``limit`` rows (None: all) of the env's dataset for agentloop's ``split``."""
    if split not in SPLITS:
        raise EnvError(
            f"verifiers:{env_id} has no split {split!r}.{did_you_mean(split, SPLITS)} Its splits: "
            f"'train' (its dataset) and 'test'/'eval' (its eval_dataset, else its dataset)"
        )
    n = -1 if limit is None else limit
    try:
        dataset = env.get_dataset(n) if split == "train" else env.get_eval_dataset(n)
    except ValueError as exc:
        raise EnvError(
            f"verifiers:{env_id} has no {SPLITS[split]} for split {split!r} ({exc})"
        ) from None
    return [dict(row) for row in dataset]


def tool_schemas(env: Any) -> list[dict[str, Any]]:
    """The env's tools (``tool_defs``) as the OpenAI function schemas a chat template shows."""
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": dict(t.parameters),
            },
        }
        for t in env.tool_defs or []
    ]


@functools.cache
def _loop_client_type() -> type:
    from verifiers.legacy.clients.client import Client

    def refuse(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise EnvError(
            "a verifiers env asked its model client for a reply itself; agentloop's loop "
            "samples every reply, so such an env cannot be played"
        )

    methods: dict[str, Any] = {name: refuse for name in Client.__abstractmethods__}
    methods["__init__"] = lambda self: None
    return type("AgentloopLoop", (Client,), methods)


def _loop_client() -> Any:
    """The model client in the rollout's state: agentloop's loop samples every reply, so a call
    through it (an env asking the model itself) is an error, named."""
    return _loop_client_type()()


class Rollout:
    """One rollout of the verifiers env ``env`` on dataset row ``row``, played turn by turn.

    ``await start()`` gives the first prompt; ``await turn(action)`` takes agentloop's assistant
    message and gives the env's response (masked observations), or None once one of the env's
    stop conditions holds; ``await score()`` then renders and scores the rollout. ``close()``
    runs the env's cleanup of a rollout that ended before ``score``."""

    def __init__(self, env: Any, env_id: str, row: Mapping[str, Any]) -> None:
        self.env, self.env_id, self.row = env, env_id, row
        self.state: Any = None
        self._prompt: list[Any] = []
        self._calls: dict[str, str] = {}  # tool call id -> tool name, for tool messages
        self._cleaned = False

    async def start(self) -> list[Message]:
        import copy

        import verifiers as vf

        self.state = state = await self.env.init_state(
            copy.deepcopy(dict(self.row)), _loop_client(), MODEL, None
        )
        state["timing"].generation.start = time.time()
        try:
            setup = await self.env.setup_state(state)
            if setup is not None:
                self.state = state = setup
        except vf.Error as exc:
            state["error"] = exc
        shown = sorted(t.name for t in self.env.tool_defs or [])
        if sorted(t.name for t in state["tool_defs"]) != shown:
            raise EnvError(
                f"verifiers:{self.env_id}: row {self.row.get('example_id')!r} has the tools "
                f"{sorted(t.name for t in state['tool_defs'])} (info['tool_defs']), but the model "
                f"is shown the env's {shown}; one run plays one tool set"
            )
        if await self.env.is_completed(state):
            self._raise_error()
            raise EnvError(
                f"verifiers:{self.env_id} stopped row {self.row.get('example_id')!r} before its "
                f"first turn (stop condition {state.get('stop_condition')!r})"
            )
        self._prompt = await self._prompt_messages()
        return self._messages(self._prompt)

    async def turn(self, action: Message) -> list[Message] | None:
        """The env's response to ``action``; None when the rollout is over."""
        import verifiers as vf

        state = self.state
        response = _response(action, len(state["trajectory"]))
        for call in response.message.tool_calls or []:
            self._calls[call.id] = call.name
        await self.env.add_model_response(state, self._prompt, response)
        if not await self.env.is_completed(state):
            try:
                messages = await self._prompt_messages()
            except vf.Error as exc:  # vf's loop records it; its has_error condition stops
                state["error"] = exc
            else:
                if state.get("final_env_response") is None:
                    return self._grown(messages)
            await self.env.is_completed(state)
        self._raise_error()
        return None

    def _grown(self, messages: list[Any]) -> list[Message]:
        """The messages ``messages`` adds after the last prompt and the model's reply."""
        step = self.state["trajectory"][-1]
        before = [*step["prompt"], *step["completion"]]
        if [_dump(m) for m in messages[: len(before)]] != [_dump(m) for m in before]:
            raise EnvError(
                f"verifiers:{self.env_id}: the env's next prompt rewrites the conversation "
                "(get_prompt_messages does not extend the last prompt and reply); agentloop "
                "plays conversations that only grow"
            )
        self._prompt = messages
        return self._messages(messages[len(before) :])

    async def _prompt_messages(self) -> list[Any]:
        from verifiers.legacy.utils.message_utils import maybe_normalize_messages

        messages = await self.env.get_prompt_messages(self.state)
        return list(maybe_normalize_messages(messages, field_name="prompt_messages"))

    def _raise_error(self) -> None:
        error = self.state.get("error")
        if error is not None:
            cause = error.__cause__ or error.__context__
            detail = f"{type(error).__name__}: {error}"
            if cause is not None:
                detail += f" (caused by {type(cause).__name__}: {cause})"
            raise EnvError(f"verifiers:{self.env_id} failed the rollout: {detail}")

    async def score(self) -> Score:
        """The rubric's score, after the env's cleanup rendered the completion (as vf does)."""
        await self.cleanup()
        rubric = self.env.rubric
        if self.env.score_rollouts:
            await rubric.score_rollout(self.state)
        else:
            await rubric.dummy_score_rollout(self.state)
        await rubric.cleanup(self.state)
        metrics = self.state.get("metrics") or {}
        return Score(
            float(self.state["reward"]),
            {str(k): float(v) for k, v in metrics.items() if _is_number(v)},
        )

    async def cleanup(self) -> None:
        """The env's cleanup handlers (they render the completion and free the rollout's
        resources), once."""
        if self.state is None or self._cleaned:
            return
        self._cleaned = True
        await self.env.cleanup(self.state)

    def _messages(self, messages: Sequence[Any]) -> list[Message]:
        return [_message(m, self.env_id, self._calls) for m in messages]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _dump(message: Any) -> Any:
    return message.model_dump() if hasattr(message, "model_dump") else dict(message)


def _response(action: Message, turn: int) -> Any:
    """agentloop's assistant message (turn ``turn``) as the ``vf.Response`` an OpenAI-compatible
    server would give: the parsed calls as tool calls (ids made where the format has none), the
    text around them as content (as agentloop's proxy shows an agent; a malformed call stays in
    the text)."""
    from verifiers.legacy.types import Response, ResponseMessage
    from verifiers.legacy.types import ToolCall as VfToolCall

    calls = [c for c in action.tool_calls if c.parse_error is None]
    content = action.content
    for c in calls:
        if c.raw:
            content = content.replace(c.raw, "", 1)
    tool_calls = [
        VfToolCall(
            id=c.id or f"call_{turn}_{k}", name=c.name, arguments=json.dumps(dict(c.arguments))
        )
        for k, c in enumerate(calls)
    ]
    message = ResponseMessage(
        content=content.strip() or None,
        tool_calls=tool_calls or None,
        finish_reason="tool_calls" if tool_calls else "stop",
        is_truncated=False,
    )
    return Response(id=f"agentloop-{time.time_ns()}", created=int(time.time()), model=MODEL,
                    message=message)  # fmt: skip


def _message(m: Any, env_id: str, calls: Mapping[str, str]) -> Message:
    """A verifiers message as agentloop's (a tool message keeps its call's id and tool name)."""
    role = getattr(m, "role", None)
    if role not in _ROLES:
        raise EnvError(
            f"verifiers:{env_id} gave the message {m!r:.120} with role {role!r}; agentloop plays "
            "chat messages (system, user, assistant, tool), not completion-format text"
        )
    content = _text(m.content, env_id)
    if role == "tool":
        return Message("tool", content, tool_call_id=m.tool_call_id, name=calls.get(m.tool_call_id))
    if role == "assistant":  # a few-shot example in the prompt
        tool_calls = tuple(
            ToolCall(c.name, json.loads(c.arguments), id=c.id) for c in m.tool_calls or []
        )
        return Message("assistant", content, tool_calls)
    return Message(cast(Role, role), content)


def _text(content: Any, env_id: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        kind = part.get("type")
        if kind != "text":
            raise EnvError(
                f"verifiers:{env_id} gave a {kind!r} content part; agentloop's verifiers "
                "adapter plays text content only"
            )
        parts.append(str(part.get("text") or ""))
    return "".join(parts)
