"""Convert DeepEyes-Datasets-47k (when you have it) into agentloop task files plus image files.

    python recipes/deepeyes/prepare_data.py --out data/deepeyes \
        DeepEyes-Datasets-47k/data_0.1.2_visual_toolbox_v2.parquet \
        DeepEyes-Datasets-47k/data_thinklite_reasoning_acc.parquet

Each row of the published parquet files holds ``prompt`` (chat messages; the user turn is the
question, with an ``<image>`` placeholder), ``images`` (encoded image bytes),
``reward_model.ground_truth`` and ``data_source``. This writes every image once to
``OUT/images/<id>.<ext>`` and the tasks {id, prompt, answer, image, source} to ``train.jsonl``
and ``val.jsonl`` (``--val-size`` rows, seeded; image paths are relative to OUT). Like verl's
DeepEyes recipe, leave ``data_v0.8_visual_toolbox_v2.parquet`` (charts) out on a single node:
its very large images exhaust memory. Rows that cannot be converted are named and stop the
script unless --skip-bad.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from pathlib import Path
from typing import Any

from agentloop.envs.deepeyes import DEEPEYES_SCHEMA
from agentloop.envs.task_files import BadRow, convert_rows, read_rows, write_tasks
from agentloop.errors import AgentLoopError

_INSTRUCTION = re.compile(r"\s*Think first, call \*\*image_zoom_in_tool\*\*.*$", re.S)
_MAGIC = {b"\xff\xd8\xff": "jpg", b"\x89PNG": "png", b"GIF8": "gif", b"RIFF": "webp"}


def _image_bytes(row: dict[str, Any]) -> bytes:
    images = row.get("images")
    if not isinstance(images, list) or len(images) != 1:
        count = len(images) if isinstance(images, list) else 0
        raise BadRow(f"'images' holds {count} images; DeepEyes-v0 tasks have exactly one")
    image = images[0]
    data = image.get("bytes") if isinstance(image, dict) else image
    if not isinstance(data, bytes | bytearray) or not data:
        raise BadRow("the image has no bytes (expected images[0].bytes)")
    return bytes(data)


def deepeyes_row(row: Any, index: int, image_dir: Path) -> dict[str, Any]:
    """One DeepEyes-47k row → a task; writes its image to ``image_dir``."""
    if not isinstance(row, dict):
        raise BadRow(f"row is a {type(row).__name__}, not an object")
    prompt = row.get("prompt") if isinstance(row.get("prompt"), list) else []
    users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    if not users:
        raise BadRow("'prompt' holds no user message")
    question = _INSTRUCTION.sub("", str(users[-1].get("content", "")).replace("<image>", ""))
    truth = (row.get("reward_model") or {}).get("ground_truth")
    if not question.strip() or truth is None or not str(truth).strip():
        raise BadRow("empty question, or no reward_model.ground_truth")
    data = _image_bytes(row)
    ext = next((e for magic, e in _MAGIC.items() if data.startswith(magic)), None)
    if ext is None:
        raise BadRow(f"the image bytes are not JPEG/PNG/GIF/WebP (they start {data[:4]!r})")
    source = str(row.get("data_source") or "deepeyes")
    ident = f"deepeyes-{index:06d}"
    (image_dir / f"{ident}.{ext}").write_bytes(data)
    return {"id": ident, "prompt": question.strip(), "answer": str(truth).strip(),
            "image": f"images/{ident}.{ext}", "source": source}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="DeepEyes-Datasets-47k parquet files")
    ap.add_argument("--out", required=True, help="output folder (e.g. data/deepeyes)")
    ap.add_argument("--val-size", type=int, default=1000, help="validation rows (default 1000)")
    ap.add_argument("--seed", type=int, default=42, help="train/val split seed")
    ap.add_argument("--skip-bad", action="store_true", help="leave unconvertible rows out")
    args = ap.parse_args(argv)
    out = Path(args.out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    try:
        source = [(w, r) for path in args.inputs for w, r in read_rows(path)]
        indexed = [(w, (i, r)) for i, (w, r) in enumerate(source)]
        rows, bad = convert_rows(indexed, lambda ir: deepeyes_row(ir[1], ir[0], out / "images"),
                                 skip_bad=args.skip_bad)  # fmt: skip
        random.Random(args.seed).shuffle(rows)
        val, train = rows[: args.val_size], rows[args.val_size :]
        write_tasks(train, out / "train.jsonl", DEEPEYES_SCHEMA)
        write_tasks(val, out / "val.jsonl", DEEPEYES_SCHEMA)
    except AgentLoopError as exc:
        print(f"prepare_data: error: {exc}", file=sys.stderr)
        return 2
    print(f"train.jsonl: {len(train)}, val.jsonl: {len(val)} tasks ({len(bad)} bad rows left out)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
