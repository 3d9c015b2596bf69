"""`agentloop view`: one self-contained HTML page to browse the trajectories of an eval run."""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from agentloop.errors import ConfigError
from agentloop.eval_report import CONFIG_FILE, SUMMARY_FILE, TRAJECTORIES_FILE
from agentloop.io import image_to_data_uri, iter_jsonl, trajectory_from_dict

__all__ = ["build_html", "view_data", "write_view"]

log = logging.getLogger(__name__)

_PLACEHOLDER = "__AGENTLOOP_VIEW_DATA__"
# Escapes that keep embedded JSON inert inside <script>: no "</script>", no "<!--", no HTML.
_SCRIPT_SAFE = {
    ord("<"): "\\u003c",
    ord(">"): "\\u003e",
    ord("&"): "\\u0026",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


def write_view(
    run: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    model: str | os.PathLike[str] | None = None,
    limit: int | None = None,
) -> Path:
    """Write the viewer for ``run`` (an eval run directory or a trajectories ``.jsonl``) to
    ``output`` (default ``<run>/view.html``). Tokens are shown as text when a tokenizer is found
    (``model``, else the model the run recorded); otherwise as ids."""
    run = Path(run)
    path = run if run.is_file() else run / TRAJECTORIES_FILE
    if not path.exists():
        raise ConfigError(f"{run} is not an eval run or a .jsonl file: {path} does not exist")
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {limit}")
    records = []
    for record in iter_jsonl(path):
        records.append(record)
        if limit is not None and len(records) >= limit:
            break
    folder = path.parent
    summary = _read_json(folder / SUMMARY_FILE)
    model = model or _read_json(folder / CONFIG_FILE).get("model")
    html = build_html(records, tokenizer=_load_tokenizer(model), summary=summary, title=str(run))
    out = Path(output) if output is not None else folder / "view.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    return out


def build_html(
    records: Sequence[Mapping[str, Any]],
    *,
    tokenizer: Any = None,
    summary: Mapping[str, Any] | None = None,
    title: str = "agentloop trajectories",
) -> str:
    """The viewer page for trajectory ``records`` (dicts as written by ``agentloop eval``)."""
    data = view_data(records, tokenizer=tokenizer, summary=summary, title=title)
    payload = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    template = resources.files("agentloop").joinpath("viewer.html").read_text(encoding="utf-8")
    if template.count(_PLACEHOLDER) != 1:
        raise ConfigError(f"viewer.html must contain {_PLACEHOLDER} exactly once")
    return template.replace(_PLACEHOLDER, payload.translate(_SCRIPT_SAFE))


def view_data(
    records: Sequence[Mapping[str, Any]],
    *,
    tokenizer: Any = None,
    summary: Mapping[str, Any] | None = None,
    title: str = "",
) -> dict[str, Any]:
    """The JSON the page renders: trajectories, a token-id → text table, the run summary."""
    trajectories = [_trajectory_view(r) for r in records]
    ids = sorted({i for t in trajectories for i in t["ids"]})
    return {
        "title": title,
        "summary": _finite(dict(summary or {})),
        "vocab": _vocab(ids, tokenizer),
        "trajectories": trajectories,
    }


def _trajectory_view(record: Mapping[str, Any]) -> dict[str, Any]:
    t = trajectory_from_dict(record)
    in_messages = sum(len(m.images) for m in t.messages)
    return {
        "task_id": t.task_id,
        "sample_index": t.sample_index,
        "env": str(record.get("env", "")),
        "reward": _finite(t.reward),
        "stop_reason": t.stop_reason.value,
        "error": t.error,
        "answer": record.get("answer"),
        "answer_correct": record.get("answer_correct"),
        "verdict": t.verdict.to_dict() if t.verdict is not None else None,
        "turns": len(t.turns),
        "metrics": _finite(dict(t.metrics)),
        "messages": [_message_view(m) for m in t.messages],
        "images": _image_uris(t.images[in_messages:]),  # images no message shows
        "prompt_len": t.prompt_len,
        "ids": list(t.token_ids),
        "mask": "".join(map(str, t.loss_mask)),
        "logprobs": [_finite(round(x, 4)) for x in t.logprobs],
    }


def _message_view(message: Any) -> dict[str, Any]:
    return {
        "role": message.role,
        "content": message.content,
        "images": _image_uris(message.images),  # shown in the turn that produced them
        "name": message.name,
        "tool_call_id": message.tool_call_id,
        "tool_calls": [
            {
                "name": c.name,
                "id": c.id,
                "arguments": json.dumps(dict(c.arguments), indent=2, ensure_ascii=False),
                "parse_error": c.parse_error,
            }
            for c in message.tool_calls
        ],
    }


def _image_uris(images: Sequence[Any]) -> list[str]:
    """Data URIs of the images that have one (PNG); others (unsafe strings) are dropped."""
    return [uri for uri in (image_to_data_uri(im) for im in images) if uri is not None]


def _vocab(ids: Sequence[int], tokenizer: Any) -> dict[str, str]:
    """Token id → text, decoding each token alone; empty without a tokenizer (ids are shown)."""
    if tokenizer is None:
        return {}
    return {str(i): tokenizer.decode([i], skip_special_tokens=False) for i in ids}


def _load_tokenizer(model: str | os.PathLike[str] | None) -> Any:
    if model is None or not Path(model).is_dir():
        if model is not None:
            log.warning("tokenizer dir %s not found; the viewer shows token ids", model)
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model)
    except (OSError, ValueError) as exc:
        log.warning("cannot load a tokenizer from %s (%s); the viewer shows token ids", model, exc)
        return None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError:
        log.warning("%s is not valid JSON; ignoring it", path)
        return {}
    return data if isinstance(data, dict) else {}


def _finite(value: Any) -> Any:
    """JSON for the browser: NaN and ±inf (which ``JSON.parse`` rejects) become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
