"""Tool I/O record/replay: a recorded run is served back without the tools; misses follow the
policy; the file is append-only, keyed per episode/turn/call, and survives a torn last line."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from agentloop.errors import ConfigError, ToolError, ToolFatalError
from agentloop.tools import ToolErrorKind, ToolOutput, Toolset, tool
from agentloop.tools.recording import (
    TAPE_FILE,
    ToolTapeConfig,
    episode_scope,
    read_tape,
    tool_tape,
)
from agentloop.tools.tape_file import seal
from agentloop.types import ToolCall

CALLS: list[str] = []


@tool
def shout(text: str) -> str:
    """Upper-case text, counting each real call.

    Args:
        text: The text.
    """
    CALLS.append(text)
    return text.upper()


@tool
def square(side: int) -> ToolOutput:
    """A red square.

    Args:
        side: Side in pixels.
    """
    from PIL import Image

    CALLS.append(f"square{side}")
    return ToolOutput(f"a {side}px square", (Image.new("RGB", (side, side), "red"),))


TOOLS = Toolset([shout, square])


async def _episode(task: str, sample: int, turns: list[list[ToolCall]]) -> list[list[str]]:
    with episode_scope(task, sample):
        async with TOOLS.session() as session:
            return [[r.content for r in await session.dispatch(calls)] for calls in turns]


TURNS = [
    [ToolCall("shout", {"text": "a"}), ToolCall("square", {"side": 3})],
    [ToolCall("shout", {"text": "b"})],
]


async def test_replay_serves_the_recording_without_running_tools(tmp_path: Path) -> None:
    CALLS.clear()
    with tool_tape(ToolTapeConfig(record=tmp_path / "rec")) as tape:
        live = await _episode("t1", 0, TURNS)
    assert tape is not None and tape.recorded == 3 and len(CALLS) == 3
    records = read_tape(tmp_path / "rec")
    assert sorted((r["turn"], r["call_index"], r["tool"]) for r in records) == [
        (0, 0, "shout"),
        (0, 1, "square"),
        (1, 0, "shout"),
    ]
    assert {r["task_id"] for r in records} == {"t1"} and records[0]["v"] == 2

    CALLS.clear()
    with tool_tape(ToolTapeConfig(replay=tmp_path / "rec")) as tape, episode_scope("t1", 0):
        async with TOOLS.session() as session:
            first = await session.dispatch(TURNS[0])
            second = await session.dispatch(TURNS[1])
    assert CALLS == [] and tape is not None and tape.replayed == 3 and tape.misses == 0
    assert [[r.content for r in first], [r.content for r in second]] == live
    assert first[1].images[0].size == (3, 3) and first[1].images[0].getpixel((0, 0)) == (255, 0, 0)


async def test_each_miss_policy(tmp_path: Path) -> None:
    with tool_tape(ToolTapeConfig(record=tmp_path / "rec")):
        await _episode("t1", 0, TURNS[:1])
    changed = [[ToolCall("shout", {"text": "changed"})]]
    CALLS.clear()

    replay = ToolTapeConfig.of(None, str(tmp_path / "rec"), "error", "zero")
    with tool_tape(replay) as tape, episode_scope("t1", 0):
        async with TOOLS.session() as session:
            (result,) = await session.dispatch(changed[0])
    assert result.error_kind is ToolErrorKind.REPLAY_MISS and CALLS == []
    assert "not in the recording" in result.content and "changed" in result.content
    assert tape is not None and tape.misses == 1

    # another sample of the same task is another episode: a miss too
    with tool_tape(ToolTapeConfig.of(None, str(tmp_path / "rec"), "error", "zero")):
        assert (await _episode("t1", 1, TURNS[:1]))[0][0].startswith("Error:")

    failing = tool_tape(ToolTapeConfig.of(None, str(tmp_path / "rec"), "fail", "zero"))
    with (
        pytest.raises(ToolError, match="1 tool calls were not in the recording"),
        failing,  # it raises ToolError at its exit, after the episode's ToolFatalError
        pytest.raises(ToolFatalError, match="not in the recording"),
    ):
        await _episode("t1", 0, changed)

    with tool_tape(ToolTapeConfig.of(str(tmp_path / "new"), str(tmp_path / "rec"), "live", "zero")):
        assert await _episode("t1", 0, changed) == [["CHANGED"]]
    assert CALLS == ["changed"]
    assert [r["arguments"] for r in read_tape(tmp_path / "new")] == [{"text": "changed"}]


async def test_recorded_latency_is_kept_when_asked(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    rec.mkdir()
    line = {"v": 1, "task_id": "t", "sample_index": 0, "turn": 0, "call_index": 0,
            "tool": "shout", "arguments": {"text": "x"}, "content": "X", "error_kind": None,
            "latency_s": 0.2, "images": []}  # fmt: skip
    (rec / TAPE_FILE).write_text(json.dumps(line) + "\n")
    with tool_tape(ToolTapeConfig.of(None, str(rec), "error", "recorded")), episode_scope("t", 0):
        async with TOOLS.session() as session:
            (result,) = await session.dispatch([ToolCall("shout", {"text": "x"})])
    assert result.content == "X" and result.latency_s >= 0.2  # it waited at least that long


async def test_a_key_recorded_twice_is_served_in_order(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    with tool_tape(ToolTapeConfig(record=rec)):
        await _episode("t", 0, [[ToolCall("shout", {"text": "one"})]])
    lines = (rec / TAPE_FILE).read_text().splitlines()
    second = {**json.loads(lines[1]), "content": "SECOND"}
    (rec / TAPE_FILE).write_text("\n".join([*lines, json.dumps(second)]) + "\n")
    seal(rec)  # edited on purpose: checksummed again
    call = [[ToolCall("shout", {"text": "one"})]]
    with tool_tape(ToolTapeConfig(replay=rec)):
        got = [await _episode("t", 0, call) for _ in range(3)]
    assert got == [[["ONE"]], [["SECOND"]], [["SECOND"]]]


async def test_a_torn_last_line_is_cut_and_skipped(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    with tool_tape(ToolTapeConfig(record=rec)):
        await _episode("t", 0, TURNS[1:])
    with (rec / TAPE_FILE).open("a") as f:
        f.write('{"v": 1, "task_id": "t", "sampl')  # a kill -9 mid-line
    assert len(read_tape(rec)) == 1  # read: skipped
    with tool_tape(ToolTapeConfig(record=rec)):  # appending again: cut first
        await _episode("t", 1, TURNS[1:])
    assert [r["sample_index"] for r in read_tape(rec)] == [0, 1]


async def test_a_tape_of_the_same_config_inside_is_the_outer_one(tmp_path: Path) -> None:
    """Validation inside a training run: its eval installs the run's settings again and goes
    on with the run's tape (one file handle); the outer run closes and checks it."""
    rec = ToolTapeConfig(record=tmp_path / "rec")
    with tool_tape(rec) as outer:
        await _episode("train", 0, TURNS[1:])
        with tool_tape(ToolTapeConfig(record=tmp_path / "rec")) as inner:
            assert inner is outer
            await _episode("val", 0, TURNS[1:])
        await _episode("train", 1, TURNS[1:])  # still open after the inner exit
        with tool_tape(ToolTapeConfig(record=tmp_path / "other")) as another:
            assert another is not outer  # other settings: a tape of its own
    assert outer is not None and outer.recorded == 3
    assert [r["task_id"] for r in read_tape(tmp_path / "rec")] == ["train", "val", "train"]


def test_bad_settings_name_the_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"holds no tool_calls\.jsonl"):
        ToolTapeConfig(replay=tmp_path)
    with pytest.raises(ConfigError, match="'sometimes' is unknown"):
        ToolTapeConfig.of(None, None, "sometimes", "zero")
    (tmp_path / TAPE_FILE).write_text("")
    with pytest.raises(ConfigError, match="same directory"):
        ToolTapeConfig(record=tmp_path, replay=tmp_path)


@pytest.mark.slow  # imports the eval CLI's and the trainer config's dependencies (transformers)
def test_cli_and_training_config_name_bad_tool_io_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_model_dir: Path
) -> None:
    from agentloop.cli import main
    from agentloop.trainers.config import TrainRolloutConfig

    base = ["eval", "--env", "agentloop/Calc-v0", "--model", str(tiny_model_dir), "--quiet"]
    assert main([*base, "--out", str(tmp_path / "a"), "--replay", str(tmp_path / "none")]) == 2
    assert "holds no tool_calls.jsonl" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "b"), "--tools", "python server.py"]) == 2
    assert "'mcp:COMMAND ARGS'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="'never' is unknown"):
        TrainRolloutConfig(tools_replay_miss="never")
    rollout = TrainRolloutConfig(tools_record=str(tmp_path / "t"), tools_replay_latency="recorded")
    assert rollout.tool_io().record == tmp_path / "t" and rollout.tool_io().active


#: A recording shipped with the tests (three Calc-v0 episodes' python calls, made with
#: ``--record``): an env's regression test replays it instead of running a sandbox.
ENV = "agentloop/Calc-v0"
SHIPPED_TAPE = Path(__file__).parent.parent / "data" / "calc_tape"


async def test_a_shipped_recording_stands_in_for_the_sandbox(
    tokenizer: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The scripted policy calls python as when the tape was recorded, then boxes whatever the
    tool printed: a reward of 1 means the tape served the output, since the sandbox is a remote
    one that no server answers (and a call not on the tape fails the episode)."""
    from agentloop.engines.fake import FakeEngine
    from agentloop.envs import make
    from agentloop.eval import EvalConfig, eval_async
    from agentloop.rollout import RolloutConfig

    tasks = make(ENV, sandbox="fake").tasks("test", 3)
    answers = {t.data["prompt"]: t.data["answer"] for t in tasks}
    question = re.compile(r"user\n(.*?)<\|im_end\|>")
    printed = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)

    def respond(prompt_ids: Any, sampling: Any) -> str:
        text = tokenizer.decode(prompt_ids)
        if outputs := printed.findall(text):
            return "\\boxed{" + outputs[-1].strip() + "}"
        code = f"print({answers[question.findall(text)[0]]})"
        call = {"name": "python", "arguments": {"code": code}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"

    engine = FakeEngine(respond, tokenizer=tokenizer, eos_token_id=tokenizer.eos_token_id)
    dead = {"backend": "remote", "urls": ["http://127.0.0.1:9"], "retries": 0}
    tape = ToolTapeConfig.of(None, str(SHIPPED_TAPE), "fail", "zero")
    rollout = RolloutConfig(max_turns=2, max_response_len=128)
    config = EvalConfig(ENV, str(tiny_model_dir), tmp_path / "run", n=1, num_tasks=3, engine="hf",
                        env_kwargs={"sandbox": dead}, rollout=rollout, tool_io=tape)  # fmt: skip
    summary = await eval_async(config, engine=engine, progress=False)
    assert summary.stop_reasons == {"done": 3} and summary.reward.mean == 1.0


async def _recorded(tmp_path: Path) -> Path:
    """A one-call recording of ``shout`` made with env id ``shouting``."""
    rec = tmp_path / "src"
    with tool_tape(ToolTapeConfig(record=rec), env="shouting"):
        await _episode("t", 0, [[ToolCall("shout", {"text": "x"})]])
    return rec


def _edited(rec: Path, out: Path, edit: Any, *, sealed: bool = True) -> Path:
    """A copy of ``rec`` whose call record ``edit`` changed (a dict, or the line's new text),
    checksummed again (so the field checks, not the checksum, meet it) unless told not to."""
    out.mkdir()
    header, call = (rec / TAPE_FILE).read_text().splitlines()
    changed = edit(json.loads(call))
    compact = (",", ":")  # as written: a changed value, not a changed layout
    line = changed if isinstance(changed, str) else json.dumps(changed, separators=compact)
    (out / TAPE_FILE).write_text(f"{header}\n{line}\n")
    if sealed:
        seal(out)
    return out


def _bomb() -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("1", (4000, 4000)).save(buf, format="PNG")  # 16 Mpx > the limit set below
    return base64.b64encode(buf.getvalue()).decode()


MALFORMED: dict[str, tuple[Any, str]] = {
    "empty object": (lambda r: "{}", r"lacks task_id, sample_index"),
    "a word for a number": (
        lambda r: {**r, "sample_index": "zero"}, r"sample_index='zero' is not an integer"),
    "null turn": (lambda r: {**r, "turn": None}, r"turn=None is not an integer"),
    "a boolean for a number": (
        lambda r: {**r, "call_index": True}, r"call_index=True is not an integer"),
    "unknown error kind": (
        lambda r: {**r, "error_kind": "bogus"}, r"error_kind='bogus' is unknown; use null or"),
    "infinite latency": (
        lambda r: {**r, "latency_s": float("inf")}, r"latency_s=inf must be a finite number"),
    "bad base64": (
        lambda r: {**r, "images": [{"png": "!!!notbase64"}]}, r"image 0 cannot be read \(Error"),
    "image bomb": (
        lambda r: {**r, "images": [{"png": _bomb()}]}, r"image 0 is refused \(DecompressionBomb"),
    "images not a list": (lambda r: {**r, "images": "x"}, r"images='x' is not a list"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(MALFORMED))
async def test_every_malformed_record_is_a_config_error_naming_file_and_line(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PIL import Image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 4_000_000)  # a small bomb: 2x of it is refused
    edit, message = MALFORMED[case]
    tape = _edited(await _recorded(tmp_path), tmp_path / "bad", edit)
    with pytest.raises(ConfigError, match=rf"{re.escape(str(tape / TAPE_FILE))}:2(:| ).*{message}"):
        tool_tape(ToolTapeConfig(replay=tape)).__enter__()


async def test_an_edited_tape_is_refused_and_a_sealed_one_is_served(tmp_path: Path) -> None:
    rec = await _recorded(tmp_path)
    edit = lambda r: {**r, "content": "99 (edited)"}  # noqa: E731
    unsealed = _edited(rec, tmp_path / "edited", edit, sealed=False)
    with pytest.raises(ConfigError, match=r"tool_calls\.jsonl:2 does not match its checksum.*seal"):
        tool_tape(ToolTapeConfig(replay=unsealed)).__enter__()
    spaced = lambda r: json.dumps(r)  # noqa: E731 -- the same values, saved with spaces
    resaved = _edited(rec, tmp_path / "resaved", spaced, sealed=False)
    with pytest.raises(ConfigError, match=r"tool_calls\.jsonl:2 has no checksum at its end"):
        tool_tape(ToolTapeConfig(replay=resaved)).__enter__()
    dropped = tmp_path / "dropped"  # the header's line removed: line 1 is no header any more
    dropped.mkdir()
    (dropped / TAPE_FILE).write_text((rec / TAPE_FILE).read_text().split("\n", 1)[1])
    with pytest.raises(ConfigError, match=r"tool_calls\.jsonl:1 (is not a tape header|does not)"):
        tool_tape(ToolTapeConfig(replay=dropped)).__enter__()
    with tool_tape(ToolTapeConfig(replay=_edited(rec, tmp_path / "sealed", edit))):
        assert await _episode("t", 0, [[ToolCall("shout", {"text": "x"})]]) == [["99 (edited)"]]


async def test_a_tape_of_another_env_or_tool_schema_is_not_served(tmp_path: Path) -> None:
    rec = await _recorded(tmp_path)
    assert json.loads((rec / TAPE_FILE).read_text().splitlines()[0])["header"] == {
        "env": "shouting"
    }
    with pytest.raises(ConfigError, match=r"recorded with env 'shouting'; this run plays 'other'"):
        tool_tape(ToolTapeConfig(replay=rec), env="other").__enter__()
    with pytest.raises(ConfigError, match=r"recorded with env 'shouting'; this run plays 'other'"):
        tool_tape(ToolTapeConfig(record=rec), env="other").__enter__()  # appending to it
    changed = _edited(rec, tmp_path / "changed", lambda r: {**r, "schema": "0" * 64})
    with tool_tape(ToolTapeConfig(replay=changed), env="shouting") as tape, episode_scope("t", 0):
        async with TOOLS.session() as session:
            (result,) = await session.dispatch([ToolCall("shout", {"text": "x"})])
    assert result.error_kind is ToolErrorKind.REPLAY_MISS and tape is not None and tape.misses == 1
    assert "recorded with another schema of tool 'shout'" in result.content


async def test_a_replayed_wait_is_bounded_by_the_tools_own_timeout(tmp_path: Path) -> None:
    """A recorded latency of 1e9 s, replayed with ``latency=recorded``: the call waits the
    tool's ``timeout_s`` (0.3 s here) and is a timeout error, as the live tool would be."""
    quick = dataclasses.replace(shout, timeout_s=0.3)
    rec = await _recorded(tmp_path)
    slow = _edited(rec, tmp_path / "slow", lambda r: {**r, "latency_s": 1e9})
    replay = ToolTapeConfig.of(None, str(slow), "error", "recorded")
    with tool_tape(replay), episode_scope("t", 0):
        async with Toolset([quick]).session() as session:
            dispatch = session.dispatch([ToolCall("shout", {"text": "x"})])
            (result,) = await asyncio.wait_for(dispatch, 30)  # (a hang fails, not blocks)
    assert result.error_kind is ToolErrorKind.TIMEOUT
    assert "timed out after 0.3s (recorded: 1e+09s)" in result.content
