"""Trajectory JSON round trip (lossless) and JSONL files that survive a killed writer."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentloop.errors import TrajectoryError
from agentloop.io import (
    JsonlWriter,
    image_to_data_uri,
    read_jsonl,
    read_trajectories,
    repair_jsonl,
    trajectory_from_dict,
    trajectory_to_dict,
)
from agentloop.types import Message, StopReason, ToolCall, Trajectory, Turn

PNG_1PX = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
    "0000000d49444154789c6300010000050001a5f645400000000049454e44ae426082"
)

_text = st.text(max_size=30)
_json_scalar = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | _text
_args = st.dictionaries(
    st.text(min_size=1, max_size=8), _json_scalar | st.lists(_json_scalar, max_size=3), max_size=3
)
_calls = st.builds(
    ToolCall, name=_text, arguments=_args, id=_text, raw=_text, parse_error=st.none() | _text
)
_messages = st.one_of(
    st.builds(Message, role=st.sampled_from(["system", "user"]), content=_text),
    st.builds(Message, role=st.just("assistant"), content=_text,
              tool_calls=st.lists(_calls, max_size=2)),
    st.builds(Message, role=st.just("tool"), content=_text, tool_call_id=st.none() | _text,
              name=st.none() | _text),
)  # fmt: skip
_turns = st.builds(
    Turn,
    index=st.integers(0, 20), start=st.integers(0, 100), completion_tokens=st.integers(0, 50),
    observation_tokens=st.integers(0, 50),
    finish_reason=st.sampled_from(["stop", "length", "abort"]),
    tool_calls=st.integers(0, 3), tool_errors=st.integers(0, 3),
    gen_latency_s=st.floats(0, 10), env_latency_s=st.floats(0, 10),
)  # fmt: skip
_floats = st.floats(allow_nan=False, width=64)


@st.composite
def trajectories(draw: st.DrawFn) -> Trajectory:
    prompt_len = draw(st.integers(0, 6))
    response = draw(st.lists(st.tuples(st.integers(0, 150_000), st.sampled_from([0, 1]),
                                       _floats), max_size=12))  # fmt: skip
    ids = draw(st.lists(st.integers(0, 150_000), min_size=prompt_len, max_size=prompt_len))
    return Trajectory(
        task_id=draw(st.text(min_size=1, max_size=12)),
        token_ids=(*ids, *(r[0] for r in response)),
        loss_mask=(0,) * prompt_len + tuple(r[1] for r in response),
        logprobs=(0.0,) * prompt_len + tuple(r[2] if r[1] else 0.0 for r in response),
        prompt_len=prompt_len,
        reward=draw(_floats),
        stop_reason=draw(st.sampled_from(list(StopReason))),
        turns=tuple(draw(st.lists(_turns, max_size=3))),
        messages=tuple(draw(st.lists(_messages, max_size=5))),
        metrics=draw(st.dictionaries(st.text(min_size=1, max_size=12), _floats, max_size=4)),
        error=draw(st.none() | _text),
        sample_index=draw(st.integers(0, 64)),
        images=tuple(draw(st.lists(st.binary(max_size=20) | _text, max_size=2))),
    )


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(trajectories())
def test_round_trip_through_json_is_lossless(t: Trajectory) -> None:
    line = json.dumps(trajectory_to_dict(t))
    back = trajectory_from_dict(json.loads(line))
    assert back == t
    assert [m.tool_calls for m in back.messages] == [m.tool_calls for m in t.messages]


def test_round_trip_keeps_infinite_logprobs_and_pil_images() -> None:
    from PIL import Image

    image = Image.new("RGB", (3, 2), (10, 200, 30))
    t = Trajectory("t", (1, 2), (0, 1), (0.0, float("-inf")), 1, 1.0, StopReason.DONE,
                   images=(image, PNG_1PX, "data:image/png;base64,AAAA"))  # fmt: skip
    back = trajectory_from_dict(json.loads(json.dumps(trajectory_to_dict(t))))
    assert back.logprobs == (0.0, float("-inf"))
    assert back.images[0].size == (3, 2) and back.images[0].tobytes() == image.tobytes()
    assert back.images[1:] == (PNG_1PX, "data:image/png;base64,AAAA")


def test_unknown_keys_are_ignored_and_bad_records_are_named() -> None:
    t = Trajectory("task-7", (5,), (0,), (0.0,), 1, 0.5, StopReason.MAX_TURNS)
    record = {**trajectory_to_dict(t), "env": "agentloop/Calc-v0", "answer": "42"}
    assert trajectory_from_dict(record) == t
    broken = dict(record)
    del broken["token_ids"]
    with pytest.raises(TrajectoryError, match="task-7"):
        trajectory_from_dict(broken)
    with pytest.raises(TrajectoryError, match="format v99"):
        trajectory_from_dict({**record, "v": 99})
    with pytest.raises(TrajectoryError):
        trajectory_from_dict({**record, "stop_reason": "exploded"})


@pytest.mark.parametrize(
    ("images", "match"),
    [
        (["data:image/png;base64,AAAA"], "image entry is str"),
        ([{"kind": "png", "b64": "not base64!"}], "task-7"),
        ([{"kind": "png", "b64": "AAAA"}], "not a readable PNG"),
        ([{"kind": "gif", "b64": ""}], "unknown image kind 'gif'"),
    ],
)
def test_a_bad_image_entry_is_a_named_error(images: list[object], match: str) -> None:
    record = {
        **trajectory_to_dict(
            Trajectory("task-7", (5,), (0,), (0.0,), 1, 0.5, StopReason.MAX_TURNS)
        ),
        "images": images,
    }
    with pytest.raises(TrajectoryError, match=match):
        trajectory_from_dict(record)


def test_image_to_data_uri() -> None:
    from PIL import Image

    assert image_to_data_uri(PNG_1PX).startswith("data:image/png;base64,iVBOR")
    assert image_to_data_uri(Image.new("L", (2, 2))).startswith("data:image/png;base64,")
    assert image_to_data_uri("data:image/jpeg;base64,/9j/") == "data:image/jpeg;base64,/9j/"
    assert image_to_data_uri("javascript:alert(1)") is None
    assert image_to_data_uri("/etc/passwd") is None
    assert image_to_data_uri(b"not an image") is None
    with pytest.raises(TrajectoryError, match="int"):
        image_to_data_uri(3)


def _records(n: int) -> list[dict[str, object]]:
    return [{"task_id": f"t{i}", "sample_index": 0, "text": "é\n</script>"} for i in range(n)]


def test_jsonl_writer_appends_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "a.jsonl"
    with JsonlWriter(path) as w:
        for r in _records(2):
            w.write(r)
    with JsonlWriter(path) as w:
        w.write(_records(3)[2])
    assert read_jsonl(path) == _records(3)


def test_a_torn_last_line_is_skipped_then_repaired(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "a.jsonl"
    with JsonlWriter(path) as w:
        for r in _records(3):
            w.write(r)
    with path.open("ab") as f:
        f.write(b'{"task_id": "t3", "sampl')  # the writer was killed mid-line
    with caplog.at_level(logging.WARNING):
        assert read_jsonl(path) == _records(3)
    assert "torn" in caplog.text
    with JsonlWriter(path) as w:  # reopening cuts the torn tail before appending
        w.write({"task_id": "t9"})
    assert read_jsonl(path) == [*_records(3), {"task_id": "t9"}]
    assert path.read_bytes().endswith(b'{"task_id":"t9"}\n')


def test_a_complete_last_line_without_newline_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}')
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
    assert repair_jsonl(path) == 0
    assert path.read_text() == '{"a": 1}\n{"a": 2}\n'
    assert repair_jsonl(tmp_path / "missing.jsonl") == 0


def test_a_bad_line_in_the_middle_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(TrajectoryError, match=r"a\.jsonl:2"):
        read_jsonl(path)


def test_read_trajectories_from_a_file(tmp_path: Path) -> None:
    ts = [Trajectory(f"t{i}", (1, 2), (0, 1), (0.0, -0.5), 1, float(i), StopReason.DONE)
          for i in range(3)]  # fmt: skip
    path = tmp_path / "t.jsonl"
    with JsonlWriter(path) as w:
        for t in ts:
            w.write(trajectory_to_dict(t))
    assert read_trajectories(path) == ts
    assert read_trajectories(read_jsonl(path)) == ts
