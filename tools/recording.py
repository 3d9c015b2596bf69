"""Tool I/O record/replay: every tool call of a run to an append-only JSONL file, served back.

A run installs one :class:`ToolTape` (``with tool_tape(ToolTapeConfig(...)):`` around the
episodes; ``agentloop eval --record/--replay``, ``rollout.tools_record/tools_replay`` in
training). Each episode's :class:`~agentloop.tools.ToolSession` picks it up when it opens, with
the episode's identity that :func:`episode_scope` set (the rollout loop sets it), and routes
every call that reaches a tool through it. Nothing else changes: the env, its tools and the
rollout loop are the same with or without a tape.

The file, ``DIR/tool_calls.jsonl``, opens with a header line naming the env, then has one
JSON object per call (format ``v`` 2; :mod:`agentloop.tools.tape_file` checks it)::

    {"v": 2, "header": {"env": "agentloop/Calc-v0"}, "sum": "…"}
    {"v": 2, "task_id": "calc-test-000003", "sample_index": 0, "turn": 0, "call_index": 0,
     "tool": "python", "schema": "<sha256 of the tool's schema>", "arguments": {"code": "…"},
     "content": "4", "error_kind": null, "latency_s": 0.21, "images": [{"png": "<base64>"}],
     "sum": "<sha256 of the previous sum and this line>"}

A replay refuses, at load and naming file:line, a malformed record or one whose checksum does
not match (an edited tape), and a tape whose header names another env; a call recorded with
another schema of its tool is a miss. A replayed wait (``latency=recorded``) lasts at most the
tool's own ``timeout_s``; a recorded call slower than that replays as a ``timeout`` error.

The key is (task_id, sample_index, turn, call_index, tool, canonical arguments); ``turn`` counts
the episode's tool-calling turns from 0 and the arguments are compared as canonical JSON (sorted
keys). Lines are appended and flushed one by one, so a killed run loses at most the line being
written; a torn last line is cut when the file is next opened for recording and skipped when it
is read. Images are stored inline as base64 PNG. A key recorded several times (a task played
again in a later training step) is served in recorded order, the last one repeating. A run
with MCP tools also keeps their schemas beside the calls (``agentloop.tools.tool_specs``).
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import enum
import io
import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from agentloop.errors import ConfigError, ToolError
from agentloop.tools.tape_file import VERSION, TapeHeader, encode_line, parse_tape, sealed_lines

__all__ = [
    "TAPE_FILE",
    "CallKey",
    "RecordedCall",
    "ReplayLatency",
    "ReplayMiss",
    "ToolTape",
    "ToolTapeConfig",
    "current_episode",
    "current_tape",
    "episode_scope",
    "read_tape",
    "tool_tape",
]

log = logging.getLogger(__name__)

TAPE_FILE = "tool_calls.jsonl"


class ReplayMiss(enum.StrEnum):
    """What a replayed run does with a call that is not in the recording."""

    ERROR = "error"  # an error observation for the model (error kind ``replay_miss``)
    FAIL = "fail"  # the episode stops (``tool_fatal``) and the run fails at the end
    LIVE = "live"  # the live tool runs (and, with a recording on, is recorded)


class ReplayLatency(enum.StrEnum):
    """How long a replayed call takes."""

    ZERO = "zero"  # at once
    RECORDED = "recorded"  # as long as the recorded call took


@dataclass(frozen=True)
class ToolTapeConfig:
    """Where to record tool calls and where to replay them from (both may be set: replayed and
    live calls alike are written to ``record``)."""

    record: Path | None = None
    """Directory whose ``tool_calls.jsonl`` receives every call (appended; created if missing)."""
    replay: Path | None = None
    """Directory holding a ``tool_calls.jsonl`` to serve tool outputs from."""
    miss: ReplayMiss = ReplayMiss.ERROR
    """A replayed call not in the recording: ``error``, ``fail`` or ``live``."""
    latency: ReplayLatency = ReplayLatency.ZERO
    """Replayed calls take no time (``zero``) or their recorded time (``recorded``)."""

    def __post_init__(self) -> None:
        for name in ("record", "replay"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Path(value))
        object.__setattr__(self, "miss", _enum(ReplayMiss, self.miss, "replay miss policy"))
        object.__setattr__(self, "latency", _enum(ReplayLatency, self.latency, "replay latency"))
        if self.replay is not None and not (self.replay / TAPE_FILE).is_file():
            raise ConfigError(
                f"replay directory {str(self.replay)!r} holds no {TAPE_FILE}; pass the directory "
                "a run recorded into (eval --record DIR, rollout.tools_record=DIR)"
            )
        if self.record is not None and self.record == self.replay:
            raise ConfigError(
                f"record and replay are the same directory {str(self.record)!r}; record into "
                "another one"
            )

    @classmethod
    def of(cls, record: str | None, replay: str | None, miss: str, latency: str) -> ToolTapeConfig:
        """From the string forms of flags and YAML (paths, policy names), checked."""
        return cls(
            Path(record) if record else None,
            Path(replay) if replay else None,
            _enum(ReplayMiss, miss, "replay miss policy"),
            _enum(ReplayLatency, latency, "replay latency"),
        )

    def check_loop_workers(self, workers: int, key: str) -> None:
        """A ConfigError naming ``key`` unless ``workers`` >= 1, and 1 when calls are recorded
        or replayed: the tape is this process's (:mod:`agentloop.loop_workers`)."""
        if workers < 1:
            raise ConfigError(f"{key} must be >= 1, got {workers}")
        if workers > 1 and self.active:
            raise ConfigError(
                f"{key}={workers} with tool calls recorded or replayed: the tape is this "
                f"process's, and the loop workers would run their tools without it; set {key}=1"
            )

    @property
    def active(self) -> bool:
        return self.record is not None or self.replay is not None

    @property
    def uses_live_tools(self) -> bool:
        """False for a replay that never runs a tool (misses are not passed through): its
        tools' services (a sandbox, a search server) need not be up, nor checked at start."""
        return self.replay is None or self.miss is ReplayMiss.LIVE


def _enum(kind: type[enum.StrEnum], value: object, what: str) -> Any:
    try:
        return kind(str(value))
    except ValueError:
        raise ConfigError(
            f"{what} {value!r} is unknown; use one of {[k.value for k in kind]}"
        ) from None


@dataclass(frozen=True, slots=True)
class CallKey:
    """What finds a recorded call: the episode, the turn, the call's place and the call."""

    task_id: str
    sample_index: int
    turn: int
    call_index: int
    tool: str
    arguments: str  # canonical JSON

    @staticmethod
    def canonical(arguments: Mapping[str, Any]) -> str:
        return json.dumps(_thaw(arguments), sort_keys=True, ensure_ascii=False, default=str)


def _thaw(value: Any) -> Any:
    """Frozen ToolCall arguments (MappingProxy, tuples) as plain JSON values."""
    if isinstance(value, Mapping):
        return {str(k): _thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """A call's outcome as recorded: text, error kind (a ``ToolErrorKind`` value), latency,
    images (PIL, decoded when read), and the SHA-256 of the tool's schema (None or empty: an
    older tape's, served to any schema)."""

    content: str
    error_kind: str | None
    latency_s: float
    images: tuple[Any, ...] = ()
    schema: str | None = None


def _encode_image(image: Any) -> dict[str, str]:
    if isinstance(image, bytes | bytearray):
        return {"bytes": base64.b64encode(image).decode()}
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return {"png": base64.b64encode(buf.getvalue()).decode()}


def read_tape(directory: str | Path) -> list[dict[str, Any]]:
    """The call records of ``directory/tool_calls.jsonl`` as JSON objects, after the whole tape
    is checked as a replay checks it (a torn last line is skipped; the header is left out)."""
    path = Path(directory) / TAPE_FILE
    header, records = parse_tape(path)
    lines = [line for line in path.read_bytes().split(b"\n") if line.strip()]
    lines = lines[1:] if header is not None else lines
    rows = [json.loads(line) for line in lines[: len(records)]]  # (a torn last line: left out)
    return [{k: v for k, v in row.items() if k != "sum"} for row in rows]


def _repair(path: Path) -> None:
    """Cut a torn last line (a killed writer) so appending starts on a fresh line."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        with path.open("r+b") as f:
            f.truncate(cut)
        log.warning("%s: dropped a torn last line of %d bytes", path, len(data) - cut)


@dataclass
class _Served:
    calls: list[RecordedCall]
    next: int = 0

    def take(self) -> RecordedCall:
        call = self.calls[min(self.next, len(self.calls) - 1)]
        self.next += 1
        return call


def _check_env(path: Path, header: TapeHeader | None, env: str | None, doing: str) -> None:
    if env is not None and header is not None and header.env not in (None, env):
        raise ConfigError(
            f"{path} was recorded with env {header.env!r}; this run plays {env!r}, so {doing}: "
            "replay a tape of this env, or record into another directory"
        )


class ToolTape:
    """A run's recording and/or replay source (see the module docstring). Counters
    ``recorded``, ``replayed`` and ``misses`` say what happened. ``env`` (the env id the run
    plays) goes into a new tape's header and is checked against a replayed one's."""

    def __init__(self, config: ToolTapeConfig, env: str | None = None) -> None:
        self.config = config
        self.recorded = self.replayed = self.misses = 0
        self._index: dict[CallKey, _Served] = {}
        self._stale: set[CallKey] = set()  # missed: recorded with another schema of the tool
        if config.replay is not None:
            header, records = parse_tape(config.replay / TAPE_FILE)
            _check_env(config.replay / TAPE_FILE, header, env, "its calls would not match")
            for r in records:
                key = CallKey(r.task_id, r.sample_index, r.turn, r.call_index, r.tool,
                              CallKey.canonical(r.arguments))  # fmt: skip
                call = RecordedCall(r.content, r.error_kind, r.latency_s, r.images, r.schema)
                self._index.setdefault(key, _Served([])).calls.append(call)
        self._file = None
        self._sum = ""
        if config.record is not None:
            config.record.mkdir(parents=True, exist_ok=True)
            path = config.record / TAPE_FILE
            _repair(path)
            self._sum = self._chain_end(path, env)
            self._file = path.open("a", encoding="utf-8")
            if not self._sum:  # a new tape: its header first
                first = sealed_lines(env, [])[0]
                self._sum = json.loads(first)["sum"]
                self._file.write(first + "\n")
                self._file.flush()

    @staticmethod
    def _chain_end(path: Path, env: str | None) -> str:
        """The last checksum of the tape at ``path`` that recording appends to ("": new)."""
        if not path.exists() or not path.read_bytes().strip():
            return ""
        header, _ = parse_tape(path)
        if header is None:
            raise ConfigError(
                f"{path} holds a tape of an older format (no header or checksums); record into "
                "another directory"
            )
        _check_env(path, header, env, "its calls would not be told apart")
        return header.last_sum

    @property
    def replaying(self) -> bool:
        return self.config.replay is not None

    def lookup(self, key: CallKey, schema: str = "") -> RecordedCall | None:
        """The recorded outcome of ``key`` (the next one, if it was recorded several times);
        None, a miss, when there is none or it was recorded with another ``schema`` of the tool."""
        served = self._index.get(key)
        if served is not None:
            call = served.take()
            if not call.schema or not schema or call.schema == schema:
                self.replayed += 1
                return call
            self._stale.add(key)
        self.misses += 1
        return None

    async def wait(self, call: RecordedCall, timeout_s: float) -> bool:
        """Wait as the recorded call took (``latency=recorded``), at most ``timeout_s`` (the
        tool's own deadline); False when the recorded call took longer than that."""
        if self.config.latency is ReplayLatency.RECORDED and call.latency_s > 0:
            await asyncio.sleep(min(call.latency_s, timeout_s))
        return call.latency_s <= timeout_s or self.config.latency is ReplayLatency.ZERO

    def write(self, key: CallKey, outcome: RecordedCall, schema: str = "") -> None:
        if self._file is None:
            return
        record = {
            "v": VERSION,
            "task_id": key.task_id,
            "sample_index": key.sample_index,
            "turn": key.turn,
            "call_index": key.call_index,
            "tool": key.tool,
            "schema": schema,
            "arguments": json.loads(key.arguments),
            "content": outcome.content,
            "error_kind": outcome.error_kind,
            "latency_s": outcome.latency_s,
            "images": [_encode_image(im) for im in outcome.images],
        }
        line, self._sum = encode_line(record, self._sum)
        self._file.write(line + "\n")
        self._file.flush()
        self.recorded += 1

    def miss_error(self, key: CallKey) -> str:
        why = (
            f"; it was recorded with another schema of tool {key.tool!r} (the tool changed)"
            if key in self._stale
            else ""
        )
        return (
            f"tool call {key.tool}({key.arguments}) of task {key.task_id!r} sample "
            f"{key.sample_index} turn {key.turn} call {key.call_index} is not in the recording "
            f"{str(self.config.replay)!r} (replay miss policy {self.config.miss.value!r}){why}"
        )

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def check(self) -> None:
        """Raise ``ToolError`` when the ``fail`` policy met calls missing from the recording."""
        if self.config.miss is ReplayMiss.FAIL and self.misses:
            raise ToolError(
                f"{self.misses} tool calls were not in the recording {str(self.config.replay)!r} "
                "(--replay-miss=fail); the episodes diverged from the recorded run: replay with "
                "the same model, seeds and settings, or use --replay-miss=live"
            )


# ---------------------------------------------------------------------- scopes
@dataclass(frozen=True, slots=True)
class _Episode:
    task_id: str
    sample_index: int


_TAPE: contextvars.ContextVar[ToolTape | None] = contextvars.ContextVar("tool_tape", default=None)
_EPISODE: contextvars.ContextVar[_Episode | None] = contextvars.ContextVar(
    "tool_episode", default=None
)


def current_tape() -> ToolTape | None:
    """The tape installed by :func:`tool_tape` around this code, if any."""
    return _TAPE.get()


def current_episode() -> tuple[str, int] | None:
    """(task_id, sample_index) set by :func:`episode_scope` around this code, if any."""
    episode = _EPISODE.get()
    return None if episode is None else (episode.task_id, episode.sample_index)


@contextmanager
def episode_scope(task_id: str, sample_index: int) -> Iterator[None]:
    """Name the episode whose tool sessions open inside (the rollout loop does this)."""
    token = _EPISODE.set(_Episode(task_id, sample_index))
    try:
        yield
    finally:
        _EPISODE.reset(token)


@dataclass
class tool_tape:
    """Install a :class:`ToolTape` for the episodes run inside (``with`` or ``async with``);
    ``None`` or an inactive config installs nothing. The tape is closed on exit, and with the
    ``fail`` miss policy a run that met missing calls raises ``ToolError`` there. ``env`` (the
    env id) is written into a new tape's header and checked against a replayed tape's. Inside a tape
    of the same config (validation inside a training run) that tape goes on serving: the file
    is opened once and the outer run owns, closes and checks it."""

    config: ToolTapeConfig | None
    env: str | None = None
    tape: ToolTape | None = field(default=None, init=False)
    _token: contextvars.Token[ToolTape | None] | None = field(default=None, init=False)
    _owned: bool = field(default=False, init=False)

    def __enter__(self) -> ToolTape | None:
        if self.config is None or not self.config.active:
            return None
        outer = _TAPE.get()
        if outer is not None and outer.config == self.config:
            self.tape = outer
            return outer
        self.tape, self._owned = ToolTape(self.config, self.env), True
        self._token = _TAPE.set(self.tape)
        return self.tape

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.tape is None or not self._owned:
            return
        if self._token is not None:
            _TAPE.reset(self._token)
        self.tape.close()
        if exc_type is None:
            self.tape.check()

    async def __aenter__(self) -> ToolTape | None:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)
