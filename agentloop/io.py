"""Trajectories to and from JSON, and crash-tolerant JSONL files (append as you go, read back)."""

from __future__ import annotations

import base64
import io
import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from agentloop.errors import ConfigError, TrajectoryError
from agentloop.types import Message, StopReason, ToolCall, Trajectory, Turn, Verdict

__all__ = [
    "FORMAT_VERSION",
    "JsonlWriter",
    "image_to_data_uri",
    "iter_jsonl",
    "read_json_object",
    "read_jsonl",
    "read_trajectories",
    "repair_jsonl",
    "trajectory_from_dict",
    "trajectory_to_dict",
]

log = logging.getLogger(__name__)

#: Bumped when the layout of a trajectory dict changes incompatibly.
FORMAT_VERSION = 1
_TURN_FIELDS = (
    "index",
    "start",
    "completion_tokens",
    "observation_tokens",
    "finish_reason",
    "tool_calls",
    "tool_errors",
    "gen_latency_s",
    "env_latency_s",
    "reward",
)
_IMAGE_MAGIC = (
    (b"\x89PNG", "image/png"),
    (b"\xff\xd8", "image/jpeg"),
    (b"GIF8", "image/gif"),
    (b"RIFF", "image/webp"),
)


def trajectory_to_dict(t: Trajectory) -> dict[str, Any]:
    """A JSON-ready dict holding everything in ``t``; :func:`trajectory_from_dict` inverts it.

    Images are stored as ``{"kind": "str" | "bytes" | "png", ...}`` (PIL images as PNG), so the
    round trip gives back a str, bytes or PIL image like the original.
    """
    return {
        "v": FORMAT_VERSION,
        "task_id": t.task_id,
        "sample_index": t.sample_index,
        "reward": t.reward,
        "stop_reason": t.stop_reason.value,
        "error": t.error,
        "prompt_len": t.prompt_len,
        "token_ids": list(t.token_ids),
        "loss_mask": list(t.loss_mask),
        "logprobs": list(t.logprobs),
        "turns": [{f: getattr(turn, f) for f in _TURN_FIELDS} for turn in t.turns],
        "messages": [_message_to_dict(m) for m in t.messages],
        "metrics": dict(t.metrics),
        "images": [_image_to_dict(im) for im in t.images],
        "image_grids": [list(g) for g in t.image_grids],
        **({"versions": list(t.versions)} if t.versions else {}),
        **({"verdict": t.verdict.to_dict()} if t.verdict is not None else {}),
    }


def trajectory_from_dict(data: Mapping[str, Any]) -> Trajectory:
    """Rebuild a Trajectory from :func:`trajectory_to_dict`'s output. Keys it does not know are
    ignored (writers may add metadata such as the env id); missing required keys are an error."""
    version = data.get("v", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise TrajectoryError(
            f"trajectory format v{version} is not supported (this agentloop reads "
            f"v{FORMAT_VERSION}); read it with the agentloop version that wrote it"
        )
    try:
        images = tuple(_image_from_dict(im) for im in data.get("images", ()))
        return Trajectory(
            task_id=data["task_id"],
            token_ids=tuple(data["token_ids"]),
            loss_mask=tuple(data["loss_mask"]),
            logprobs=tuple(float(x) for x in data["logprobs"]),
            prompt_len=data["prompt_len"],
            reward=float(data["reward"]),
            stop_reason=StopReason(data["stop_reason"]),
            turns=tuple(Turn(**turn) for turn in data.get("turns", ())),
            messages=_messages_from_dicts(data.get("messages", ()), images),
            metrics={k: float(v) for k, v in data.get("metrics", {}).items()},
            error=data.get("error"),
            sample_index=data.get("sample_index", 0),
            images=images,
            image_grids=tuple(tuple(g) for g in data.get("image_grids", ())),
            versions=tuple(int(v) for v in data.get("versions", ())),
            verdict=Verdict.from_dict(data["verdict"]) if data.get("verdict") else None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        task = data.get("task_id", "?") if isinstance(data, Mapping) else "?"
        raise TrajectoryError(
            f"cannot read trajectory of task {task!r}: {type(exc).__name__}: {exc}; expected a "
            "dict written by agentloop.io.trajectory_to_dict"
        ) from exc


def _message_to_dict(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [_call_to_dict(c) for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    if m.images:  # the pixels are stored once, in the trajectory's "images", in message order
        out["images"] = len(m.images)
    return out


def _messages_from_dicts(
    dicts: Iterable[Mapping[str, Any]], images: tuple[Any, ...]
) -> tuple[Message, ...]:
    """Messages with their images given back from the trajectory's image list, in order."""
    out, at = [], 0
    for d in dicts:
        m = _message_from_dict(d)
        n = int(d.get("images", 0))
        if n:
            m = Message(
                m.role, m.content, m.tool_calls, m.tool_call_id, m.name, images[at : at + n]
            )
            at += n
        out.append(m)
    return tuple(out)


def _call_to_dict(c: ToolCall) -> dict[str, Any]:
    out: dict[str, Any] = {"id": c.id, "name": c.name, "arguments": dict(c.arguments)}
    if c.raw:
        out["raw"] = c.raw
    if c.parse_error is not None:
        out["parse_error"] = c.parse_error
    return out


def _message_from_dict(d: Mapping[str, Any]) -> Message:
    calls = tuple(
        ToolCall(
            name=c["name"],
            arguments=c.get("arguments") or {},
            id=c.get("id", ""),
            raw=c.get("raw", ""),
            parse_error=c.get("parse_error"),
        )
        for c in d.get("tool_calls", ())
    )
    return Message(d["role"], d["content"], calls, d.get("tool_call_id"), d.get("name"))


def _image_to_dict(image: Any) -> dict[str, str]:
    if isinstance(image, str):
        return {"kind": "str", "data": image}
    if isinstance(image, bytes | bytearray):
        return {"kind": "bytes", "b64": base64.b64encode(image).decode()}
    if hasattr(image, "save") and hasattr(image, "mode"):  # a PIL image, without importing PIL
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        return {"kind": "png", "b64": base64.b64encode(buf.getvalue()).decode()}
    raise TrajectoryError(
        f"cannot serialize a trajectory image of type {type(image).__name__}; "
        "use a PIL image, encoded bytes (PNG/JPEG) or a data URI string"
    )


def _image_from_dict(d: object) -> Any:
    """One stored image back; anything else than :func:`_image_to_dict`'s output is a TypeError
    or ValueError (named by :func:`trajectory_from_dict`), a PNG that does not decode too."""
    if not isinstance(d, Mapping):
        raise TypeError(f"an image entry is {type(d).__name__} {d!r:.60}, not a dict")
    kind = d.get("kind")
    if kind == "str":
        return str(d["data"])
    if kind == "bytes":
        return base64.b64decode(d["b64"], validate=True)
    if kind == "png":
        from PIL import Image

        try:
            image = Image.open(io.BytesIO(base64.b64decode(d["b64"], validate=True)))
            image.load()
        except (OSError, Image.DecompressionBombError) as exc:
            raise ValueError(f"an image entry is not a readable PNG ({exc})") from exc
        return image
    raise ValueError(f"unknown image kind {kind!r}; expected 'str', 'bytes' or 'png'")


def image_to_data_uri(image: Any) -> str | None:
    """A ``data:image/...;base64,`` URI for a trajectory image (str, bytes or PIL image), or None
    when it is not something a browser can show safely (a path, an unknown format)."""
    if isinstance(image, str):
        return image if image.startswith("data:image/") and "base64," in image else None
    entry = _image_to_dict(image)
    raw = base64.b64decode(entry["b64"])
    mime = next((m for magic, m in _IMAGE_MAGIC if raw.startswith(magic)), None)
    return f"data:{mime};base64,{entry['b64']}" if mime else None


# ---------------------------------------------------------------------- JSONL
class JsonlWriter:
    """Appends one JSON object per line, flushed per line so a killed run loses at most the line
    being written. Opening it first repairs a torn last line (see :func:`repair_jsonl`)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        repair_jsonl(self.path)
        self._file = self.path.open("a", encoding="utf-8")

    def write(self, record: Mapping[str, Any]) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def repair_jsonl(path: str | os.PathLike[str]) -> int:
    """Make ``path`` end with a complete line before appending: a torn last line (from a killed
    writer) is cut off, a complete one missing its newline gets it. Returns the bytes dropped."""
    path = Path(path)
    if not path.exists():
        return 0
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return 0
    cut = data.rfind(b"\n") + 1
    if _parses(data[cut:]):
        with path.open("ab") as f:
            f.write(b"\n")
        return 0
    with path.open("r+b") as f:
        f.truncate(cut)
    log.warning("%s: dropped a torn last line of %d bytes", path, len(data) - cut)
    return len(data) - cut


def _parses(line: bytes) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def iter_jsonl(
    path: str | os.PathLike[str], *, require: tuple[str, ...] = ()
) -> Iterator[dict[str, Any]]:
    """The objects of a JSONL file. A torn last line is skipped with a warning; a bad line
    anywhere else (not JSON, not an object, or missing a key of ``require``) is a
    :class:`TrajectoryError` naming the file and line."""
    path = Path(path)
    with path.open("rb") as f:
        lines = f.read().split(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as exc:
            if number == len(lines):  # no newline after it: the writer was killed mid-line
                log.warning("%s: skipping a torn last line %d (%d bytes)", path, number, len(line))
                return
            raise TrajectoryError(
                f"{path}:{number} is not valid JSON ({exc}); the file is corrupt — remove that "
                "line (or restore the file) and run again"
            ) from exc
        missing = [k for k in require if k not in record] if isinstance(record, dict) else None
        if missing is None or missing:
            what = f"lacks {missing}" if missing else f"is a JSON {type(record).__name__}"
            raise TrajectoryError(
                f"{path}:{number} {what}, not a record; the file is corrupt or not written by "
                "agentloop — remove that line (or restore the file) and run again"
            )
        yield record


def read_json_object(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object in file ``path`` (a run's ``config.json``); anything else is a
    :class:`ConfigError` naming the file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ConfigError(
            f"{path} is not valid JSON ({exc}); restore it, or start a new run with another --out"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds a JSON {type(data).__name__}, not an object; restore it")
    return data


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All objects of a JSONL file (see :func:`iter_jsonl` for torn lines)."""
    return list(iter_jsonl(path))


def read_trajectories(
    records: str | os.PathLike[str] | Iterable[Mapping[str, Any]],
) -> list[Trajectory]:
    """Trajectories from a JSONL path or from already-read records."""
    if isinstance(records, str | os.PathLike):
        records = iter_jsonl(records)
    return [trajectory_from_dict(r) for r in records]
