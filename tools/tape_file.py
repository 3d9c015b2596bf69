"""The tool-tape file: its header, each record checked field by field, and the checksum chain.

Format ``v`` 2 (:mod:`agentloop.tools.recording` writes it): line 1 is a header naming the env
the calls were recorded with (``null`` when the recorder was not told), every later line one
call; each record carries the SHA-256 of its tool's schema (``schema``) and every line ends with
``"sum"``, the SHA-256 of the previous line's sum and this line's own text, so an edited, moved
or dropped line (any but a torn last one) is refused at load naming file:line, as an edited
eval run or checkpoint is. A sum guards against damage and hand edits, not against someone who
recomputes it: :func:`seal` does exactly that for a tape edited on purpose. Format 1 (no header,
no sums: an older agentloop's) is read with a warning, unverified.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentloop.errors import ConfigError

__all__ = [
    "VERSION",
    "TapeHeader",
    "TapeRecord",
    "encode_line",
    "parse_tape",
    "schema_sha256",
    "seal",
    "sealed_lines",
]

log = logging.getLogger(__name__)

VERSION = 2
_SUM = re.compile(rb',"sum":"([0-9a-f]{64})"\}$')
_ERROR_KINDS = frozenset(
    {
        "invalid_json",
        "unknown_tool",
        "invalid_arguments",
        "tool_exception",
        "timeout",
        "replay_miss",
    }
)  # ToolErrorKind's values (the toolset imports this layer, not the other way round)


def schema_sha256(schema: Mapping[str, Any]) -> str:
    """The SHA-256 of a tool's schema as canonical JSON (sorted keys), hex."""
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def encode_line(record: Mapping[str, Any], previous_sum: str) -> tuple[str, str]:
    """``record`` as one tape line (no newline) ending with its chained sum, and that sum."""
    body = json.dumps(dict(record), ensure_ascii=False, separators=(",", ":"))
    digest = hashlib.sha256(previous_sum.encode() + body.encode()).hexdigest()
    return f'{body[:-1]},"sum":"{digest}"}}', digest


@dataclass(frozen=True, slots=True)
class TapeHeader:
    """What line 1 of a format-2 tape says."""

    env: str | None
    last_sum: str  # the chain's end: appending goes on from it


@dataclass(frozen=True, slots=True)
class TapeRecord:
    """One recorded call, every field checked. ``schema`` is None in a format-1 tape."""

    task_id: str
    sample_index: int
    turn: int
    call_index: int
    tool: str
    arguments: Mapping[str, Any]
    content: str
    error_kind: str | None
    latency_s: float
    images: tuple[Any, ...]
    schema: str | None


def parse_tape(path: Path) -> tuple[TapeHeader | None, list[TapeRecord]]:
    """The header (None for an empty or format-1 tape) and the records of ``path``, every line
    checked; a torn last line is skipped; anything else wrong is a ``ConfigError`` naming
    file:line and the fix."""
    lines = path.read_bytes().split(b"\n")
    header: TapeHeader | None = None
    records: list[TapeRecord] = []
    previous = ""
    legacy: bool | None = None  # decided by the first line: format 1 has no header
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        where = f"{path}:{number}"
        try:
            data = json.loads(raw)
        except ValueError as exc:
            if number == len(lines):  # no newline after it: the writer was killed mid-line
                log.warning("%s: skipping a torn last line %d", path, number)
                break
            raise ConfigError(
                f"{where} is not valid JSON ({exc}); remove that line and run again"
            ) from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{where} is a JSON {type(data).__name__}, not a tape record")
        if legacy is None:
            legacy = data.get("v") == 1 and "header" not in data
            if not legacy:
                previous = _verified(raw, previous, where)
                header = _header(data, where, previous)
                continue
        if not legacy:
            previous = _verified(raw, previous, where)
        records.append(_record(data, where, legacy=legacy))
    if legacy:
        log.warning("%s has no header or checksums (an older agentloop's tape): not verified", path)
    if header is not None:
        header = TapeHeader(header.env, previous)
    return header, records


def _verified(raw: bytes, previous: str, where: str) -> str:
    match = _SUM.search(raw.rstrip(b"\r"))
    if match is None:
        raise ConfigError(
            f"{where} has no checksum at its end: the tape was edited or damaged. Record again; "
            "to replay a tape edited on purpose, seal it first with "
            "agentloop.tools.tape_file.seal(PATH)"
        )
    body = raw[: match.start()] + b"}"
    digest = hashlib.sha256(previous.encode() + body).hexdigest()
    if digest != match.group(1).decode():
        raise ConfigError(
            f"{where} does not match its checksum (the line, or one before it, was edited, "
            "moved or dropped). Record again; to replay a tape edited on purpose, seal it "
            "first with agentloop.tools.tape_file.seal(PATH)"
        )
    return digest


def _header(data: Mapping[str, Any], where: str, last_sum: str) -> TapeHeader:
    head = data.get("header")
    if data.get("v") != VERSION or not isinstance(head, dict):
        raise ConfigError(
            f"{where} is not a tape header (format {VERSION}: "
            '{"v": 2, "header": {"env": ...}, "sum": ...}); record again'
        )
    env = head.get("env")
    if env is not None and not isinstance(env, str):
        raise ConfigError(f"{where}: the header's env is {env!r}, not a string or null")
    return TapeHeader(env, last_sum)


def _record(data: Mapping[str, Any], where: str, *, legacy: bool) -> TapeRecord:
    """A record with every field of the right type, or a ConfigError naming file:line."""
    if not legacy and data.get("v") != VERSION:
        raise ConfigError(f"{where}: format v={data.get('v')!r} after a v{VERSION} header")
    missing = [k for k in _FIELDS if k not in data]
    if missing:
        raise ConfigError(
            f"{where} is not a tool-call record: it lacks {', '.join(missing)}; record again"
        )
    for name, kind in _FIELDS.items():
        value = data[name]
        if isinstance(value, bool) or not isinstance(value, kind):
            raise ConfigError(f"{where}: {name}={value!r} is not {_KIND_NAMES[kind]}; record again")
    numbers = [(k, data[k]) for k in ("sample_index", "turn", "call_index") if data[k] < 0]
    latency = float(data["latency_s"])
    if numbers or not (math.isfinite(latency) and latency >= 0):
        bad = numbers[0] if numbers else ("latency_s", data["latency_s"])
        raise ConfigError(f"{where}: {bad[0]}={bad[1]!r} must be a finite number >= 0")
    kind_ = data.get("error_kind")
    if kind_ is not None and kind_ not in _ERROR_KINDS:
        raise ConfigError(
            f"{where}: error_kind={kind_!r} is unknown; use null or one of {sorted(_ERROR_KINDS)}"
        )
    schema = None if legacy else data.get("schema")
    if not legacy and not isinstance(schema, str):
        raise ConfigError(f"{where}: schema={schema!r} is not a tool-schema SHA-256")
    return TapeRecord(
        data["task_id"], data["sample_index"], data["turn"], data["call_index"], data["tool"],
        data["arguments"], data["content"], kind_, latency, _images(data, where), schema,
    )  # fmt: skip


_FIELDS: dict[str, type | tuple[type, ...]] = {
    "task_id": str, "sample_index": int, "turn": int, "call_index": int, "tool": str,
    "arguments": dict, "content": str, "latency_s": (int, float),
}  # fmt: skip
_KIND_NAMES = {str: "a string", int: "an integer", dict: "a JSON object", (int, float): "a number"}


def _images(data: Mapping[str, Any], where: str) -> tuple[Any, ...]:
    entries = data.get("images", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: images={entries!r} is not a list")
    out = []
    for i, entry in enumerate(entries):
        try:
            out.append(_decode_image(entry))
        except (ValueError, TypeError, KeyError, AttributeError, OSError, binascii.Error) as exc:
            raise ConfigError(
                f"{where}: image {i} cannot be read ({type(exc).__name__}: {exc}); record again"
            ) from None
        except Exception as exc:  # PIL's DecompressionBombError and kin
            raise ConfigError(
                f"{where}: image {i} is refused ({type(exc).__name__}: {exc})"
            ) from None
    return tuple(out)


def _decode_image(entry: Mapping[str, str]) -> Any:
    if "bytes" in entry:
        return base64.b64decode(entry["bytes"], validate=True)
    from PIL import Image

    image = Image.open(io.BytesIO(base64.b64decode(entry["png"], validate=True)))
    image.load()
    return image


def seal(path: str | Path, env: str | None = None) -> None:
    """Rewrite the tape at ``path`` (a file, or a directory holding ``tool_calls.jsonl``) in
    format 2 with fresh checksums: for a tape edited by hand on purpose. Each record's fields
    are checked as at load; a record without a ``schema`` gets an empty one (served to any
    schema)."""
    file = Path(path)
    if file.is_dir():
        file = file / "tool_calls.jsonl"
    rows: list[dict[str, Any]] = []
    for raw in file.read_bytes().split(b"\n"):
        if raw.strip():
            data = json.loads(raw)
            if "header" in data:
                env = env if env is not None else data["header"].get("env")
                continue
            data.pop("sum", None)
            rows.append({**data, "v": VERSION, "schema": data.get("schema", "")})
    file.write_text("".join(line + "\n" for line in sealed_lines(env, rows)), encoding="utf-8")


def sealed_lines(env: str | None, rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """A header naming ``env`` and ``rows``, each line chained to the one before."""
    line, digest = encode_line({"v": VERSION, "header": {"env": env}}, "")
    lines = [line]
    for row in rows:
        line, digest = encode_line(row, digest)
        lines.append(line)
    return lines
