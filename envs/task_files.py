"""Task files: the project's JSONL task format, checked row by row, naming bad rows.

A task file holds one JSON object per line: ``{"id": "...", "prompt": "...", "answer": ...}``
plus whatever else an env needs (an image path, a data source). ``id`` must be unique in the
file; every other field goes to ``Task.data``. Recipes' data preparation scripts convert public
datasets (parquet or JSONL) into this format with :func:`read_rows` and :func:`write_tasks`;
file-backed envs read it with :class:`TaskFiles`, which loads each file once per process.

verl's dataset rows are read as they are (:func:`from_verl`): ``prompt`` as chat messages,
``reward_model.ground_truth`` as ``answer``, ``data_source`` and ``extra_info`` kept, the id
from ``extra_info.index`` (else the row's number). SkyRL's rows likewise (:func:`from_skyrl`):
``reward_spec.ground_truth`` as ``answer``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from agentloop.errors import EnvError
from agentloop.types import Message, Role, Task

__all__ = [
    "MAX_REPORTED",
    "BadRow",
    "TaskFiles",
    "TaskSchema",
    "convert_rows",
    "from_skyrl",
    "from_verl",
    "load_tasks",
    "prompt_messages",
    "prompt_text",
    "read_rows",
    "write_tasks",
]

#: How many bad rows an error lists before it only counts the rest.
MAX_REPORTED = 5
_JSON_TYPES: dict[type, str] = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true/false",
    list: "a list",
    dict: "an object",
}


@dataclass(frozen=True)
class TaskSchema:
    """The fields a task row must (``required``) or may (``optional``) hold, each with the JSON
    types it accepts. ``list_of`` names list fields whose items must be of the given type (e.g.
    ``answer`` as a list of strings). ``paths`` are file paths; a relative one is relative to
    the task file's folder. ``id`` is always required (a non-empty string)."""

    name: str
    required: Mapping[str, tuple[type, ...]]
    optional: Mapping[str, tuple[type, ...]] = field(default_factory=dict)
    list_of: Mapping[str, type] = field(default_factory=dict)
    paths: tuple[str, ...] = ()

    def problems(self, row: Any) -> list[str]:
        """What is wrong with ``row`` (empty if nothing), one phrase per problem."""
        if not isinstance(row, dict):
            return [f"the row is {type(row).__name__}, not a JSON object"]
        out = []
        if not isinstance(row.get("id"), str) or not row["id"]:
            out.append(f"'id' is {row.get('id')!r}; give a non-empty string")
        for name, types in {**self.required, **self.optional}.items():
            if name not in row or row[name] is None:
                if name in self.required:
                    out.append(f"'{name}' is missing; give {_describe(types)}")
                continue
            value = row[name]
            if name == "prompt" and isinstance(value, list) and str in types:
                out.extend(_chat_problems(value))
            elif not _is(value, types):
                out.append(f"'{name}' is {_short(value)}; give {_describe(types)}")
            elif isinstance(value, str) and not value.strip() and name in self.required:
                out.append(f"'{name}' is an empty string")
            elif isinstance(value, list) and name in self.list_of:
                item = self.list_of[name]
                if not value or not all(_is(v, (item,)) for v in value):
                    out.append(
                        f"'{name}' is {_short(value)}; give a non-empty list of "
                        f"{_JSON_TYPES.get(item, item.__name__)}s"
                    )
        return out


_ROLES = ("system", "user", "assistant")


def _chat_problems(messages: list[Any]) -> list[str]:
    """What is wrong with a ``prompt`` given as chat messages (verl's format), if anything."""
    if not messages:
        return ["'prompt' is an empty list; give a string or chat messages"]
    for i, m in enumerate(messages):
        ok = isinstance(m, dict) and m.get("role") in _ROLES and isinstance(m.get("content"), str)
        if not ok:
            return [
                f"'prompt' message {i} is {_short(m)}; give {{\"role\": system/user/assistant, "
                '"content": a string}'
            ]
    if not any(m["role"] == "user" for m in messages):
        return ["'prompt' has no user message; add one"]
    return []


def _is(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:  # JSON true is not a number
        return False
    return isinstance(value, types)


def _describe(types: tuple[type, ...]) -> str:
    return " or ".join(_JSON_TYPES.get(t, t.__name__) for t in types)


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def read_rows(path: str | os.PathLike[str]) -> Iterator[tuple[str, Any]]:
    """``(where, row)`` for every row of a ``.jsonl``, ``.json`` (a list) or ``.parquet`` file;
    ``where`` is ``file:line`` (JSONL) or ``file[row N]``. Parquet needs ``pyarrow``."""
    p = Path(path)
    if not p.is_file():
        raise EnvError(f"data file {str(p)!r} does not exist; pass the path of a downloaded file")
    if p.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise EnvError(
                f"reading {p} needs pyarrow: pip install pyarrow (or pip install -e '.[recipes]')"
            ) from None
        for i, row in enumerate(pq.read_table(p).to_pylist()):
            yield f"{p}[row {i}]", row
        return
    if p.suffix == ".json":
        rows = json.loads(p.read_text(encoding="utf-8"))
        if not isinstance(rows, list):
            raise EnvError(f"{p} holds a JSON {type(rows).__name__}; expected a list of rows")
        for i, row in enumerate(rows):
            yield f"{p}[row {i}]", row
        return
    with p.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield f"{p}:{number}", json.loads(line)
            except ValueError as exc:
                raise EnvError(
                    f"{p}:{number} is not valid JSON ({exc}); fix or remove the line"
                ) from None


def from_verl(row: Any, number: int) -> Any:
    """A verl dataset row (``reward_model`` present) in the project's format: ``answer`` from
    ``reward_model.ground_truth`` (its ``target`` when that is a mapping, as Search-R1's),
    ``id`` from ``extra_info.index`` or ``number``; ``prompt`` (chat messages), ``data_source``
    and ``extra_info`` stay. Other rows come back as they are."""
    if not isinstance(row, dict) or not isinstance(row.get("reward_model"), dict):
        return row
    out = {k: v for k, v in row.items() if k != "reward_model"}
    truth = row["reward_model"].get("ground_truth")
    if isinstance(truth, dict) and "target" in truth:
        truth = truth["target"]
    if "answer" not in out:
        out["answer"] = list(truth) if isinstance(truth, tuple) else truth
    extra = row.get("extra_info")
    if "id" not in out:
        index = extra.get("index") if isinstance(extra, dict) else None
        source = row.get("data_source") or "row"
        out["id"] = f"{source}-{index if index is not None else number}"
    return out


def from_skyrl(row: Any, number: int) -> Any:
    """A SkyRL dataset row (``reward_spec`` present: ``prompt``, ``env_class``, ``reward_spec``,
    ``extra_info``) in the project's format: ``answer`` from ``reward_spec.ground_truth``, ``id``
    as :func:`from_verl` gives it; every field stays (a ``skyrl_gym:`` env reads them as SkyRL
    does). Other rows come back as they are."""
    if not isinstance(row, dict) or not isinstance(row.get("reward_spec"), dict):
        return row
    out = dict(row)
    truth = row["reward_spec"].get("ground_truth")
    if "answer" not in out and truth is not None:
        out["answer"] = list(truth) if isinstance(truth, tuple) else truth
    if "id" not in out:
        extra = row.get("extra_info")
        index = extra.get("index") if isinstance(extra, dict) else None
        source = row.get("data_source") or row.get("env_class") or "row"
        out["id"] = f"{source}-{index if index is not None else number}"
    return out


def prompt_messages(task: Task, system_prompt: str | None) -> list[Message]:
    """The initial messages of ``task``: ``system_prompt`` (when given and the task brings no
    system message of its own) and ``task.data["prompt"]``, a string or chat messages."""
    prompt = task.data["prompt"]
    if isinstance(prompt, str):
        given = [Message("user", prompt)]
    else:
        # roles were checked by the task schema (_chat_problems)
        given = [Message(cast(Role, m["role"]), str(m["content"])) for m in prompt]
    if system_prompt and not any(m.role == "system" for m in given):
        return [Message("system", system_prompt), *given]
    return given


def prompt_text(task: Task) -> str:
    """``task.data["prompt"]`` as text: the string, or the last user message's content."""
    prompt = task.data["prompt"]
    if isinstance(prompt, str):
        return prompt
    return next(str(m["content"]) for m in reversed(prompt) if m.get("role") == "user")


def _bad_rows(head: str, bad: Sequence[str], fix: str) -> EnvError:
    """One error for all bad rows: ``head``, the first ``MAX_REPORTED`` rows' problems (one an
    indented line), how many more there are, and ``fix``."""
    listed = "".join(f"\n  {row}" for row in bad[:MAX_REPORTED])
    more = f"\n  ... and {len(bad) - MAX_REPORTED} more" if len(bad) > MAX_REPORTED else ""
    return EnvError(f"{head}:{listed}{more}\n{fix}")


def _check(rows: Iterable[tuple[str, Any]], schema: TaskSchema, what: str) -> list[dict[str, Any]]:
    """All rows if every one is valid and ids are unique, else an EnvError listing bad rows."""
    good: list[dict[str, Any]] = []
    bad: list[str] = []
    seen: dict[str, str] = {}
    for where, row in rows:
        problems = schema.problems(row)
        if not problems and row["id"] in seen:
            problems = [f"id {row['id']!r} repeats {seen[row['id']]}; ids must be unique"]
        if problems:
            bad.append(f"{where}: " + "; ".join(problems))
            continue
        seen[row["id"]] = where
        good.append(row)
    if bad:
        raise _bad_rows(
            f"{what}: {len(bad)} bad {schema.name} row(s) (of {len(bad) + len(good)})",
            bad,
            "fix those rows in the source data, or drop them when converting",
        )
    if not good:
        raise EnvError(f"{what} holds no {schema.name} rows")
    return good


def load_tasks(path: str | os.PathLike[str], schema: TaskSchema) -> list[Task]:
    """Every task of a task file, checked against ``schema`` (all bad rows are named); the
    schema's ``paths`` fields come back absolute."""
    rows = _check(
        (
            (where, from_skyrl(from_verl(row, i), i))
            for i, (where, row) in enumerate(read_rows(path))
        ),
        schema,
        str(path),
    )
    base = Path(path).resolve().parent
    for row in rows:
        for name in schema.paths:
            if isinstance(row.get(name), str):
                row[name] = str(base / Path(row[name]).expanduser())
    return [Task(id=r["id"], data={k: v for k, v in r.items() if k != "id"}) for r in rows]


def write_tasks(
    rows: Sequence[Mapping[str, Any]], path: str | os.PathLike[str], schema: TaskSchema
) -> Path:
    """Check ``rows`` against ``schema`` (naming bad ones by index), then write them as JSONL."""
    good = _check(((f"row {i}", dict(r)) for i, r in enumerate(rows)), schema, str(path))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for row in good:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(out)  # a reader never sees half a file
    return out


class BadRow(ValueError):
    """Raised by a row converter for a source row it cannot convert; the message says why."""


def convert_rows(
    rows: Iterable[tuple[str, Any]],
    fn: Callable[[Any], dict[str, Any] | None],
    *,
    skip_bad: bool = False,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Apply ``fn`` to every ``(where, row)`` of a public dataset: ``(converted, bad)``.

    ``fn`` returns the converted row, None to leave a row out on purpose (a duplicate), or raises
    :class:`BadRow`. Bad rows are listed as ``where: reason``; unless ``skip_bad``, any bad row
    raises :class:`EnvError` naming the first few (a wrong file or column names fail loudly).
    """
    out: list[dict[str, Any]] = []
    bad: list[str] = []
    total = 0
    for where, row in rows:
        total += 1
        try:
            converted = fn(row)
        except BadRow as exc:
            bad.append(f"{where}: {exc}")
            continue
        if converted is not None:
            out.append(converted)
    if bad and not skip_bad:
        raise _bad_rows(
            f"{len(bad)} of {total} rows cannot be converted",
            bad,
            "check that the file is the dataset named in the recipe's README, or pass "
            "--skip-bad to leave those rows out",
        )
    return out, bad


_CACHE: dict[tuple[str, str], tuple[tuple[float, int], list[Task]]] = {}


class TaskFiles:
    """Named splits backed by task files, e.g. ``{"train": "data/dapo.jsonl", "aime2024": ...}``.

    Cheap to build (envs are made once per episode); a file is read and checked on first use
    and then cached per process until it changes on disk.
    """

    def __init__(self, files: Mapping[str, str] | None, schema: TaskSchema, env: str) -> None:
        if files is None or not isinstance(files, Mapping) or not files:
            raise EnvError(
                f"{env} reads its tasks from files: pass files={{'train': 'PATH.jsonl', "
                f"'test': ...}} (data.env_kwargs.files in a run config), got {files!r}"
            )
        bad = [k for k, v in files.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise EnvError(f"{env}: files must map split names to paths, got {dict(files)!r}")
        self.files, self.schema, self.env = dict(files), schema, env

    def tasks(self, split: str, limit: int | None = None) -> list[Task]:
        if split not in self.files:
            raise EnvError(
                f"{self.env} has no split {split!r}; its files are {sorted(self.files)} "
                "(add the split to files=...)"
            )
        path = Path(self.files[split]).expanduser().resolve()
        if not path.is_file():
            raise EnvError(
                f"{self.env} split {split!r}: {str(path)!r} does not exist; run the recipe's "
                "prepare_data.py first, or fix the path"
            )
        stat = path.stat()
        key = (str(path), self.schema.name)
        cached = _CACHE.get(key)
        if cached is None or cached[0] != (stat.st_mtime, stat.st_size):
            cached = _CACHE[key] = ((stat.st_mtime, stat.st_size), load_tasks(path, self.schema))
        tasks = cached[1]
        return list(tasks if limit is None else tasks[:limit])
