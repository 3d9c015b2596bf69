"""What vLLM was given and returned, recorded at ``AsyncLLM.generate`` (below ``VLLMEngine``), and
the token-exactness check of a trajectory against it: shared by the vLLM rollout tests."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentloop.types import Trajectory

__all__ = ["VLLMCall", "assert_matches_vllm", "by_session", "load_weights", "recording"]


@dataclass(frozen=True)
class VLLMCall:
    """One request as vLLM saw it: the ids it was given, the prompt ids it reports having
    processed, and the ids and logprobs it returned."""

    request_id: str
    given: tuple[int, ...]
    processed: tuple[int, ...]
    returned: tuple[int, ...]
    logprobs: tuple[float, ...]

    @property
    def session(self) -> str:
        return self.request_id.rsplit("-", 1)[0]  # VLLMEngine names requests f"{session}-{uuid}"


def load_weights(model_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


@contextmanager
def recording(engine: Any) -> Iterator[list[VLLMCall]]:
    """Record every request of ``engine`` (a ``VLLMEngine``) while the block runs."""
    llm = engine.llm
    real_generate = llm.generate
    calls: list[VLLMCall] = []

    async def recording_generate(
        prompt: Any, params: Any, request_id: str, *a: Any, **kw: Any
    ) -> AsyncIterator[Any]:
        final = None
        async for out in real_generate(prompt, params, request_id, *a, **kw):
            final = out
            yield out
        assert final is not None
        sample = final.outputs[0]
        ids = tuple(sample.token_ids)
        calls.append(
            VLLMCall(
                request_id,
                given=tuple(prompt["prompt_token_ids"]),
                processed=tuple(final.prompt_token_ids),
                returned=ids,
                logprobs=tuple(e[t].logprob for e, t in zip(sample.logprobs, ids, strict=True)),
            )
        )

    llm.generate = recording_generate  # an instance attribute shadows the method
    try:
        yield calls
    finally:
        del llm.generate


def by_session(calls: Sequence[VLLMCall]) -> dict[str, list[VLLMCall]]:
    """The calls of each episode (``task_id#sample_index``), in order."""
    out: dict[str, list[VLLMCall]] = defaultdict(list)
    for call in calls:
        out[call.session].append(call)
    return dict(out)


def assert_matches_vllm(traj: Trajectory, calls: Sequence[VLLMCall]) -> None:
    """Turn by turn: vLLM was given exactly the trajectory so far, and the trajectory continues
    with exactly the ids vLLM returned (mask 1, vLLM's logprobs); everything between two turns
    is an observation (mask 0, logprob 0)."""
    assert len(calls) == len(traj.turns), f"{len(calls)} vLLM calls for {len(traj.turns)} turns"
    assert calls[0].given == traj.token_ids[: traj.prompt_len]
    end = traj.prompt_len
    for turn, call in zip(traj.turns, calls, strict=True):
        start = turn.start
        assert call.given == call.processed, "vLLM processed other prompt ids than it was given"
        assert call.given == traj.token_ids[:start]
        if turn.index > 0:
            assert start > end, "no observation tokens between two turns"
        assert set(traj.loss_mask[end:start]) <= {0}
        assert set(traj.logprobs[end:start]) <= {0.0}
        stop = start + len(call.returned)
        assert turn.completion_tokens == len(call.returned)
        assert traj.token_ids[start:stop] == call.returned
        assert traj.loss_mask[start:stop] == (1,) * len(call.returned)
        assert traj.logprobs[start:stop] == call.logprobs  # bit-identical floats
        end = stop
    assert len(traj.token_ids) == end, "tokens after the last sampled turn"


@contextmanager
def recording_started_engines(monkeypatch: Any) -> Iterator[list[list[VLLMCall]]]:
    """Record every :class:`~agentloop.engines.vllm.VLLMEngine` started inside the block (an
    ``agentloop eval`` run in this process starts its own) at its ``AsyncLLM.generate``, from
    start to shutdown: one list of calls per engine."""
    import contextlib

    from agentloop.engines.vllm import VLLMEngine

    recorded: list[list[VLLMCall]] = []
    stack = contextlib.ExitStack()
    real_start, real_shutdown = VLLMEngine.start, VLLMEngine.shutdown

    async def start(self: VLLMEngine) -> None:
        started = self.started
        await real_start(self)
        if not started:
            recorded.append(stack.enter_context(recording(self)))

    async def shutdown(self: VLLMEngine) -> None:
        stack.close()  # let go of the AsyncLLM before it shuts down
        await real_shutdown(self)

    monkeypatch.setattr(VLLMEngine, "start", start)
    monkeypatch.setattr(VLLMEngine, "shutdown", shutdown)
    with stack:
        yield recorded
