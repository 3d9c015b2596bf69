"""Core records: invariants are checked on construction and records survive pickling."""

from __future__ import annotations

import pickle

import pytest

from agentloop import errors
from agentloop.types import Completion, Message, StopReason, Task, ToolCall, Trajectory


def test_trajectory_lengths_must_agree() -> None:
    with pytest.raises(errors.TrajectoryError, match="same length"):
        Trajectory("t", (1, 2, 3), (0, 1), (0.0, 0.0, 0.0), 1, 0.0, StopReason.DONE)


def test_prompt_tokens_are_never_trained() -> None:
    with pytest.raises(errors.TrajectoryError, match="prompt tokens"):
        Trajectory("t", (1, 2, 3), (1, 1, 1), (0.0, 0.0, 0.0), 1, 0.0, StopReason.DONE)


def test_mask_is_binary() -> None:
    with pytest.raises(errors.TrajectoryError, match="0 or 1"):
        Trajectory("t", (1, 2), (0, 2), (0.0, 0.0), 1, 0.0, StopReason.DONE)


def test_completion_needs_one_logprob_per_token() -> None:
    with pytest.raises(errors.TrajectoryError, match="one logprob per sampled token"):
        Completion((1, 2), (0.0,), "stop")


def test_message_validates_role_and_content() -> None:
    with pytest.raises(errors.TrajectoryError, match="role 'bot'"):
        Message("bot", "hi")  # type: ignore[arg-type]
    with pytest.raises(errors.TrajectoryError, match="content must be str"):
        Message("user", None)  # type: ignore[arg-type]


def test_message_dict_round_trip() -> None:
    m = Message("assistant", "x", (ToolCall("f", {"a": 1}, id="call_0"),))
    assert Message.from_dict(m.to_dict()) == m
    assert "tool_calls" not in m.to_template_dict()  # already in the content as written


def test_records_pickle() -> None:
    traj = Trajectory(
        "t", (1, 2, 3), (0, 1, 1), (0.0, -0.5, -0.1), 1, 1.0, StopReason.DONE,
        messages=(Message("user", "q"),), metrics={"turns": 1.0},
    )  # fmt: skip
    assert pickle.loads(pickle.dumps(traj)) == traj
    assert pickle.loads(pickle.dumps(Task("a", {"x": [1]}))).data["x"] == [1]


def test_errors_pickle_and_share_a_root() -> None:
    classes = [getattr(errors, name) for name in errors.__all__]
    for cls in (c for c in classes if isinstance(c, type)):
        err = pickle.loads(pickle.dumps(cls("value 3 is bad; use 4")))
        assert isinstance(err, errors.AgentLoopError)
        assert str(err) == "value 3 is bad; use 4"


def test_stop_reason_error_flags() -> None:
    assert StopReason.ENGINE_ERROR.is_error and StopReason.TIMEOUT.is_error
    assert not StopReason.DONE.is_error and not StopReason.MAX_TOKENS.is_error
