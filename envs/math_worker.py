"""The math grader's worker process: math-verify's ``parse`` and ``verify`` on JSON lines.

Run as a script (``python -I math_worker.py``) by :mod:`agentloop.envs.math_grader`, which kills
and replaces it when a check overruns its deadline. It imports nothing from agentloop, so it
starts with math-verify alone. math-verify's own timeouts (``signal.alarm``) are turned off:
the parent enforces the deadline. Protocol: one JSON request per stdin line
``{"gold", "pred", "max_chars"}``, one JSON reply per line on the original stdout
``{"correct", "gold", "pred"}`` or ``{"error"}``; the first line written is ``{"ready": true}``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import sys
from typing import Any

__all__ = ["MEMORY_LIMIT_BYTES", "grade", "main"]

#: An address-space ceiling: a runaway expansion fails with MemoryError instead of taking the
#: machine's memory while the parent's deadline runs.
MEMORY_LIMIT_BYTES = 4 << 30
_SHOWN_CHARS = 200


def _die_with_parent() -> None:
    """Linux: get SIGKILL when the parent dies, so a worker spinning on a check never outlives
    it (a closed stdin alone is seen only between checks)."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _shown(parsed: list[Any]) -> str | None:
    """math-verify's extracted string (its second item), else the expression; None if empty."""
    if not parsed:
        return None
    text = str(parsed[-1] if isinstance(parsed[-1], str) else parsed[0])
    return text[:_SHOWN_CHARS]


def grade(request: dict[str, Any]) -> dict[str, Any]:
    """One check: ``verify(parse(gold), parse(pred))`` with math-verify's timeouts off."""
    from math_verify import parse, verify

    gold = parse(request["gold"], parsing_timeout=None)
    pred = parse(request["pred"], parsing_timeout=None)
    shown = _shown(pred)
    max_chars = int(request.get("max_chars") or 0)
    if max_chars and shown is not None and len(str(pred[-1])) > max_chars:
        return {"correct": False, "gold": _shown(gold), "pred": shown, "too_long": True}
    correct = bool(gold and pred and verify(gold, pred, timeout_seconds=None))
    return {"correct": correct, "gold": _shown(gold), "pred": shown}


def main() -> None:
    _die_with_parent()
    with contextlib.suppress(OSError):
        os.nice(5)  # background work: a check spinning to its deadline yields to the rollouts
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    sys.stdout = sys.stderr  # nothing a library prints can corrupt the replies
    logging.disable(logging.WARNING)  # math-verify warns that its timeouts are off
    import math_verify  # noqa: F401  # the import is the start-up cost; pay it before "ready"

    out.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        try:
            reply = grade(json.loads(line))
        except Exception as exc:  # any failure is this check's verdict
            reply = {"error": f"{type(exc).__name__}: {exc}"[:_SHOWN_CHARS]}
        out.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
