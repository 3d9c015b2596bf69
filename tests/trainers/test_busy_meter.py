"""BusyMeter: an explicit Engine wrapper that forwards generation (images included), measures
the time with a request in flight, and exposes nothing else of the engine it wraps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentloop.engines.base import Engine, SamplingParams
from agentloop.engines.fake import FakeEngine
from agentloop.trainers.rollouts import BusyMeter
from agentloop.types import Completion

SAMPLING = SamplingParams(max_tokens=4)


class Seeing:
    """A vision engine stand-in that records the images it is given."""

    supports_images = True

    def __init__(self) -> None:
        self.images: list[tuple[Any, ...]] = []

    async def generate(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        session_id: str | None = None,
        images: Sequence[Any] = (),
    ) -> Completion:
        self.images.append(tuple(images))
        return Completion(token_ids=(7,), logprobs=(0.0,), finish_reason="stop")


async def test_measures_the_time_with_a_request_in_flight() -> None:
    meter = BusyMeter(FakeEngine([[5]], latency_s=0.02))
    assert isinstance(meter, Engine) and meter.supports_images is False
    completion = await meter.generate([1, 2], SAMPLING, session_id="s")
    assert completion.token_ids == (5,)
    assert meter.busy_s() >= 0.02
    assert not hasattr(meter, "requests")  # the wrapped engine's attributes are not forwarded


async def test_forwards_images_to_an_engine_that_takes_them() -> None:
    engine = Seeing()
    meter = BusyMeter(engine)
    assert meter.supports_images
    await meter.generate([1], SAMPLING, images=("img",))
    await meter.generate([1], SAMPLING)
    assert engine.images == [("img",), ()]
