"""FakeEngine: a scripted engine for unit tests, no model needed."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentloop.engines.base import SamplingParams, reject_images
from agentloop.errors import InferenceError
from agentloop.types import Completion, FinishReason

__all__ = ["FakeEngine", "FakeRequest"]

Response = Sequence[int] | str
Script = Sequence[Response] | Callable[[Sequence[int], SamplingParams], Response]


@dataclass(frozen=True, slots=True)
class FakeRequest:
    """One recorded call: what the engine was given and what it returned."""

    session_id: str | None
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    completion: Completion


class FakeEngine:
    """Plays a script instead of running a model.

    ``script`` is either a list of responses — the i-th call *of each session* gets the i-th
    response, so concurrent episodes each see the script in order — or a function
    ``(prompt_ids, sampling) -> response``. A response is token ids or text (text needs
    ``tokenizer``; ``eos_token_id`` is appended to text responses). Like a real engine, a
    response ends at its first stop token; one longer than ``sampling.max_tokens`` is cut and
    finishes with ``"length"``. ``latency_s`` is awaited per call;
    ``fail_after`` raises :class:`InferenceError` from that call on (engine-error tests).
    ``version`` (an int) tags every sampled token with that policy version, as an engine whose
    weights are updated during training does; change it to simulate a weight update.
    Every call is recorded in ``requests``.
    """

    def __init__(
        self,
        script: Script,
        *,
        tokenizer: Any = None,
        eos_token_id: int | None = None,
        latency_s: float = 0.0,
        fail_after: int | None = None,
        version: int | None = None,
    ) -> None:
        self.script = script
        self.tokenizer = tokenizer
        self.eos_token_id = eos_token_id
        self.latency_s = latency_s
        self.fail_after = fail_after
        self.version = version
        self.requests: list[FakeRequest] = []
        self._turns: defaultdict[str | None, int] = defaultdict(int)

    @property
    def supports_images(self) -> bool:
        return False

    async def generate(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
        images: Sequence[Any] = (),
    ) -> Completion:
        reject_images(self, images)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if self.fail_after is not None and len(self.requests) >= self.fail_after:
            raise InferenceError(f"FakeEngine: scripted failure after {self.fail_after} calls")
        ids = self._response_ids(prompt_ids, sampling, session_id)
        del ids[_stop_end(ids, (*sampling.stop_token_ids, self.eos_token_id)) :]  # like an engine
        finish: FinishReason = "stop"
        if len(ids) > sampling.max_tokens:
            del ids[sampling.max_tokens :]
            finish = "length"
        versions = () if self.version is None else (self.version,) * len(ids)
        completion = Completion(tuple(ids), _fake_logprobs(ids), finish, versions)
        self.requests.append(FakeRequest(session_id, tuple(prompt_ids), sampling, completion))
        return completion

    def _response_ids(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, session_id: str | None
    ) -> list[int]:
        if callable(self.script):
            response = self.script(prompt_ids, sampling)
        else:
            turn = self._turns[session_id]
            self._turns[session_id] += 1
            if turn >= len(self.script):
                raise InferenceError(
                    f"FakeEngine: script has {len(self.script)} responses, session "
                    f"{session_id!r} asked for response {turn + 1}"
                )
            response = self.script[turn]
        if isinstance(response, str):
            if self.tokenizer is None:
                raise InferenceError("FakeEngine: text responses need tokenizer=...")
            ids = list(self.tokenizer.encode(response, add_special_tokens=False))
            return ids + ([self.eos_token_id] if self.eos_token_id is not None else [])
        return list(map(int, response))


def _stop_end(ids: list[int], stops: tuple[int | None, ...]) -> int:
    """Length of ``ids`` up to and including the first stop token (all of it if none)."""
    end = len(ids)
    for stop in stops:
        if stop is not None and stop in ids:  # a scan in C, not a raised ValueError
            end = min(end, ids.index(stop) + 1)
    return end


# The fake's CPU counts in bench/collect_bench.py's loop time: a table lookup, no float math.
_LOGPROB_OF_RESIDUE = tuple(-0.01 * (1 + k) for k in range(97))


def _fake_logprobs(token_ids: list[int]) -> tuple[float, ...]:
    """Deterministic, plausible logprobs so tests can check alignment."""
    return tuple([_LOGPROB_OF_RESIDUE[i % 97] for i in token_ids])
