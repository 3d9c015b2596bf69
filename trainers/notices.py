"""Run notices: unusual settings and degraded steps, warned about once and kept in the run dir.

Some settings are legitimate yet rarely meant (``actor.lr=0`` for a pipeline check), and some
steps quietly train differently than configured (filtering left too few sequences for every
mini-batch). Each such thing is a :class:`RunNotice` warning, raised once per run, and a line
of ``notices.jsonl`` in the run directory, so a reader of the run sees it after the fact too.
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

__all__ = ["NOTICES_FILE", "RunNotice", "RunNotices"]

NOTICES_FILE = "notices.jsonl"


class RunNotice(UserWarning):
    """A run's setting or step that is allowed but probably not what was meant."""


class RunNotices:
    """Warns once per ``key`` and appends ``{"key", "step", "time", "message"}`` to
    ``out_dir/notices.jsonl``."""

    def __init__(self, out_dir: Path) -> None:
        self.path = Path(out_dir) / NOTICES_FILE
        self._seen: set[str] = set()

    def note(self, key: str, message: str, *, step: int | None = None) -> None:
        """Record ``message`` under ``key`` unless this run already recorded that key."""
        if key in self._seen:
            return
        self._seen.add(key)
        warnings.warn(message, RunNotice, stacklevel=2)
        record = {"key": key, "step": step, "time": time.time(), "message": message}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
