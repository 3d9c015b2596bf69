"""Math grading as the field does it: an exact numeric check, then math-verify off the loop.

Checks run in worker processes with a deadline that kills a runaway one, never on the loop.

:func:`grade_math` decides plain numbers itself (``1,234`` = ``1234.0``, ``\\frac{1}{2}`` =
``0.5``; two different integers are wrong without asking anyone: Calc's answers never reach the
verifier). Everything else goes to Hugging Face's ``math-verify`` (what open-r1 and verl's math
reward use): ``verify(parse(gold), parse(pred))`` with the gold answer read as ``\\boxed{gold}``
(verl's convention; a bare ``2\\sqrt{3}`` would parse as 2). ``extraction`` picks ``pred``:

- ``"boxed"``: the env's own answer (the last ``\\boxed{}``, MathTool's ``Answer:`` line) as
  ``\\boxed{answer}``; a reply without one is wrong.
- ``"verifier"``: the final reply itself, so math-verify's extraction also reads an unboxed
  ``The answer is 7.`` (with several ``\\boxed{}`` it reads them all as a set, where agentloop's
  numeric check reads the last).

math-verify's own timeouts use ``signal.alarm`` (main thread only), so they are off; each check
runs in a worker process (``math_worker.py``, started lazily, ``workers`` of them) and a check
past ``timeout_s`` kills its worker (a new one starts for the next check) and scores wrong, with
``by="timeout"`` and the reward metric ``grader_timeout`` (``reward/grader_timeouts`` in the
trainer's metrics). The event loop only awaits a thread that waits on the worker's pipe.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib.util
import json
import os
import select
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agentloop.envs.rewards import to_number
from agentloop.errors import EnvError, RewardError
from agentloop.types import Verdict

__all__ = [
    "DEFAULT_GRADER_TIMEOUT_S",
    "EXTRACTIONS",
    "Extraction",
    "MathGrader",
    "check_extraction",
    "default_grader",
    "fast_verdict",
    "grade_math",
    "verdict_metrics",
]

Extraction = Literal["boxed", "verifier"]
EXTRACTIONS: tuple[Extraction, ...] = ("boxed", "verifier")
#: math-verify's own default per parse and per verify.
DEFAULT_GRADER_TIMEOUT_S = 5.0
#: The tail of a final reply the verifier reads (the answer is at the end of a long derivation).
MAX_REPLY_CHARS = 8000
_WORKER = Path(__file__).with_name("math_worker.py")
_START_TIMEOUT_S = 120.0  # importing sympy on a busy machine; not part of any check's deadline


def check_extraction(value: str, env_id: str) -> Extraction:
    """``value`` if it is one of :data:`EXTRACTIONS`, else an :class:`EnvError` naming it."""
    if value not in EXTRACTIONS:
        raise EnvError(
            f"{env_id} answer_extraction={value!r} is unknown; use 'boxed' (the env's own "
            "\\boxed{} answer) or 'verifier' (math-verify's extraction from the whole reply)"
        )
    return value


@dataclass(frozen=True, slots=True)
class Check:
    """One math-verify check: its decision and what it parsed, or why it has none."""

    correct: bool
    gold: str | None = None
    pred: str | None = None
    timed_out: bool = False
    error: str | None = None
    too_long: bool = False


class MathGrader:
    """A lazily started pool of ``workers`` math-verify processes shared by every event loop of
    the process; :meth:`shutdown` (also run at exit) kills them. One thread per worker waits on
    its pipe, so no event loop ever blocks and a stuck check costs a kill, not a core."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or min(4, os.cpu_count() or 1)
        self.timeouts = 0  # checks killed at their deadline, since the process started
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._procs: set[subprocess.Popen[bytes]] = set()
        self._atexit = False

    async def check(self, gold: str, pred: str, *, timeout_s: float, max_chars: int = 0) -> Check:
        """``verify(parse(gold), parse(pred))`` in a worker; wrong with ``timed_out`` when it
        takes longer than ``timeout_s`` seconds (worker start-up not counted)."""
        if timeout_s <= 0:
            raise RewardError(f"grader timeout_s must be > 0, got {timeout_s}")
        loop = asyncio.get_running_loop()
        request = json.dumps({"gold": gold, "pred": pred, "max_chars": max_chars}).encode()
        return await loop.run_in_executor(self._pool(), self._run, request + b"\n", timeout_s)

    def shutdown(self) -> None:
        """Kill every worker and stop the threads; the next check starts them again."""
        with self._lock:
            executor, self._executor = self._executor, None
            procs, self._procs = list(self._procs), set()
            self._local = threading.local()
        for proc in procs:
            _kill(proc)
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)

    def live_pids(self) -> list[int]:
        """The worker processes now running."""
        with self._lock:
            return [p.pid for p in self._procs if p.poll() is None]

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                if importlib.util.find_spec("math_verify") is None:
                    raise RewardError(
                        "math grading needs math-verify; install it: pip install 'math-verify"
                        "[antlr4_13_2]' (agentloop's dependencies include it)"
                    )
                self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="math-grader")
                if not self._atexit:
                    atexit.register(self.shutdown)
                    self._atexit = True
            return self._executor

    def _run(self, request: bytes, timeout_s: float) -> Check:
        """In a pool thread: this thread's worker (started if needed) grades ``request``."""
        local = self._local
        proc: subprocess.Popen[bytes] | None = getattr(local, "proc", None)
        if proc is None or proc.poll() is not None:
            proc, local.buffer = self._start(), b""
            if proc is None:
                return Check(False, error="the math-verify worker did not start")
            local.proc = proc
        assert proc.stdin is not None
        try:
            proc.stdin.write(request)
            proc.stdin.flush()
            line, local.buffer = _read_line(proc, local.buffer, timeout_s)
        except OSError:
            line = None
        if line is None:  # the deadline passed (or the worker died): no reply is coming
            timed_out = proc.poll() is None
            self._forget(proc)
            local.proc = None
            if timed_out:
                with self._lock:
                    self.timeouts += 1
                return Check(False, timed_out=True)
            return Check(False, error=f"the math-verify worker died (exit {proc.returncode})")
        reply = json.loads(line)
        if "error" in reply:
            return Check(False, error=str(reply["error"]))
        gold, pred = reply.get("gold"), reply.get("pred")
        return Check(bool(reply["correct"]), gold, pred, too_long=bool(reply.get("too_long")))

    def _start(self) -> subprocess.Popen[bytes] | None:
        proc = subprocess.Popen(
            [sys.executable, "-I", str(_WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        with self._lock:
            self._procs.add(proc)
        line, _ = _read_line(proc, b"", _START_TIMEOUT_S)
        if line is None or not json.loads(line).get("ready"):
            self._forget(proc)
            return None
        return proc

    def _forget(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._procs.discard(proc)
        _kill(proc)


def _read_line(
    proc: subprocess.Popen[bytes], buffer: bytes, timeout_s: float
) -> tuple[bytes | None, bytes]:
    """The next line ``proc`` writes within ``timeout_s`` (None: none came), and the rest."""
    assert proc.stdout is not None
    fd, deadline = proc.stdout.fileno(), time.monotonic() + timeout_s
    while b"\n" not in buffer:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None, buffer
        chunk = os.read(fd, 65536)
        if not chunk:
            return None, buffer
        buffer += chunk
    line, _, rest = buffer.partition(b"\n")
    return line, rest


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


_DEFAULT = MathGrader()


def default_grader() -> MathGrader:
    """The process's shared grader (its workers start on the first check)."""
    return _DEFAULT


def fast_verdict(answer: str, gold: str) -> Verdict | None:
    """agentloop's own check, on the loop: equal numbers are right, two different integers are
    wrong, the same text is right; None when math-verify has to decide."""
    p, g = to_number(answer), to_number(gold)
    if p is not None and g is not None:
        if p == g:
            return Verdict(answer, gold, True, "numeric", f"{answer} = {gold} as numbers")
        if p.denominator == 1 and g.denominator == 1:
            return Verdict(answer, gold, False, "numeric", f"{answer} ≠ {gold} (integers)")
        return None
    if " ".join(answer.split()) == " ".join(gold.split()):
        return Verdict(answer, gold, True, "exact", "the same text as the gold answer")
    return None


def _as_latex(text: str) -> str:
    return text if "\\boxed" in text or "$" in text else f"\\boxed{{{text}}}"


async def grade_math(
    answer: str | None,
    gold: str,
    *,
    reply: str | None = None,
    extraction: Extraction = "boxed",
    timeout_s: float = DEFAULT_GRADER_TIMEOUT_S,
    max_answer_chars: int = 0,
    grader: MathGrader | None = None,
) -> Verdict:
    """Grade the env's extracted ``answer`` (None: it found none) against ``gold``: the numeric
    check, then math-verify on ``\\boxed{answer}`` (``extraction="boxed"``) or on the final
    ``reply`` (``"verifier"``). ``max_answer_chars``: a longer answer math-verify extracts is
    wrong (no scoring by enumeration)."""
    if answer is not None:
        fast = fast_verdict(answer, gold)
        if fast is not None:
            return fast
    if extraction == "verifier" and reply:
        pred = reply[-MAX_REPLY_CHARS:]
    elif answer is not None:
        pred = f"\\boxed{{{answer}}}"
    else:
        what = "answer" if extraction == "verifier" else "\\boxed{} answer"
        return Verdict(None, gold, False, "no answer", f"no {what} in the final reply")
    check = await (grader or _DEFAULT).check(
        _as_latex(gold), pred, timeout_s=timeout_s, max_chars=max_answer_chars
    )
    shown = check.pred if check.pred is not None else answer
    if check.timed_out:
        detail = f"math-verify ran past its {timeout_s:g} s deadline: scored wrong"
        return Verdict(shown, gold, False, "timeout", detail)
    if check.error is not None:
        return Verdict(shown, gold, False, "grader error", check.error)
    if check.pred is None:
        return Verdict(None, gold, False, "no answer", "math-verify found no answer in the reply")
    if check.too_long:
        detail = f"the answer math-verify read is over {max_answer_chars} characters"
        return Verdict(shown, gold, False, "too long", detail)
    sign = "=" if check.correct else "≠"
    detail = f"math-verify: {check.pred} {sign} {check.gold or gold}"
    return Verdict(shown, gold, check.correct, "math-verify", detail)


def verdict_metrics(verdict: Verdict) -> dict[str, float]:
    """The grader's reward metrics: ``grader_timeout`` and ``grader_error`` (0 or 1)."""
    return {
        "grader_timeout": float(verdict.by == "timeout"),
        "grader_error": float(verdict.by == "grader error"),
    }
