"""collect keeps the collector off the pre-existing heap and spaces young collections during a
batch, and only then."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Sequence

from agentloop.collect import collect
from agentloop.engines.fake import FakeEngine
from agentloop.envs import ToolEnv
from agentloop.rollout import RolloutConfig
from agentloop.tools import tool
from agentloop.types import Message, StopReason, Task

seen: list[int] = []
young_thresholds: list[int] = []


@tool
def probe(x: int) -> str:
    """Report the GC freeze count while the batch runs.

    Args:
        x: Anything.
    """
    seen.append(gc.get_freeze_count())
    young_thresholds.append(gc.get_threshold()[0])
    return "ok"


def reward(task: Task, messages: Sequence[Message]) -> float:
    return 1.0


def run(builder_tokenizer: object) -> None:
    from agentloop.chat import TokenBuilder

    builder = TokenBuilder(builder_tokenizer, tools=[probe.schema])
    call = builder.encode('<tool_call>\n{"name": "probe", "arguments": {"x": 1}}\n</tool_call>')
    eos = builder.stop_token_ids[0]

    def script(prompt_ids: Sequence[int], sampling: object) -> list[int]:
        return [*(call if len(seen) < 3 else builder.encode("done")), eos]

    engine = FakeEngine(script, eos_token_id=eos)
    tasks = [Task(f"t{i}", {"prompt": "go"}) for i in range(3)]
    groups = asyncio.run(
        collect(tasks, lambda: ToolEnv([probe], reward), engine, builder, config=RolloutConfig())
    )
    assert all(t.stop_reason == StopReason.DONE for g in groups for t in g.trajectories)


def test_old_heap_is_frozen_during_the_batch_only(tokenizer: object) -> None:
    seen.clear()
    assert gc.get_freeze_count() == 0
    run(tokenizer)
    assert seen and min(seen) > 0  # frozen while episodes ran
    assert gc.get_freeze_count() == 0  # handed back afterwards


def test_a_freeze_made_by_the_user_is_left_alone(tokenizer: object) -> None:
    seen.clear()
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        run(tokenizer)
        # still frozen (a few frozen objects may have been freed meanwhile, nothing more)
        assert gc.get_freeze_count() > before * 0.9 > 0
    finally:
        gc.unfreeze()


def test_young_collections_are_spaced_during_the_batch_only(tokenizer: object) -> None:
    seen.clear()
    young_thresholds.clear()
    before = gc.get_threshold()
    run(tokenizer)
    assert young_thresholds and set(young_thresholds) == {10_000}
    assert gc.get_threshold() == before  # handed back afterwards


def test_a_higher_threshold_set_by_the_user_is_kept(tokenizer: object) -> None:
    seen.clear()
    young_thresholds.clear()
    before = gc.get_threshold()
    gc.set_threshold(50_000, *before[1:])
    try:
        run(tokenizer)
        assert set(young_thresholds) == {50_000}
        assert gc.get_threshold()[0] == 50_000
    finally:
        gc.set_threshold(*before)


def test_spacing_grows_with_the_number_of_running_episodes(tokenizer: object) -> None:
    from agentloop.chat import TokenBuilder
    from agentloop.collect import YOUNG_GC_PER_EPISODE

    young_thresholds.clear()
    before = gc.get_threshold()
    builder = TokenBuilder(tokenizer, tools=[probe.schema])
    call = builder.encode('<tool_call>\n{"name": "probe", "arguments": {"x": 1}}\n</tool_call>')
    eos = builder.stop_token_ids[0]
    engine = FakeEngine([[*call, eos], [*builder.encode("done"), eos]], eos_token_id=eos)
    tasks = [Task(f"t{i}", {"prompt": "go"}) for i in range(80)]
    groups = asyncio.run(
        collect(
            tasks, lambda: ToolEnv([probe], reward), engine, builder,
            config=RolloutConfig(), concurrency=60,
        )
    )  # fmt: skip
    assert all(t.stop_reason == StopReason.DONE for g in groups for t in g.trajectories)
    # 60 episodes run at once (not 80: the slots bound them), above the fixed 10,000 floor
    assert 60 * YOUNG_GC_PER_EPISODE > 10_000
    assert set(young_thresholds) == {60 * YOUNG_GC_PER_EPISODE}
    assert gc.get_threshold() == before
