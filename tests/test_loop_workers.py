"""LoopWorkers: collect's episodes in worker processes, the engine in this one.

The workers play the groups one process plays (same seeds, same tokens); every worker takes
episodes; an engine's errors reach the episodes as they would in one process; a worker that dies
fails the batch, named, instead of hanging; an env the workers cannot import is a clear error.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import os
import signal
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from waits import eventually

from agentloop.chat import TokenBuilder
from agentloop.collect import collect
from agentloop.engines.base import SamplingParams
from agentloop.engines.fake import FakeEngine
from agentloop.envs import Env, ToolEnv, make
from agentloop.errors import AgentLoopError, ConfigError
from agentloop.loop_workers import LoopWorkers
from agentloop.rollout import RolloutConfig
from agentloop.tools import tool
from agentloop.types import Message, StopReason, Task, Trajectory, TrajectoryGroup

pytestmark = pytest.mark.asyncio(loop_scope="module")

ENV, FAKE = "agentloop/Calc-v0", {"sandbox": "fake"}
CONFIG = RolloutConfig(max_turns=4, max_response_len=256, max_prompt_len=1024)


@tool
def whoami() -> str:
    """The process id of the worker playing this episode."""
    return str(os.getpid())


def _reward(task: Task, messages: Sequence[Message]) -> float:
    return 0.0


def pid_env() -> Env:
    """An env whose tool tells which process played the episode (spawned workers import it)."""
    return ToolEnv([whoami], _reward)


def calc_script(tokenizer: Any) -> Any:
    """Two python calls, then an answer that depends on the request's seed: the same seeds
    give the same tokens, so a worker that seeded an episode differently would show."""
    response = tokenizer.convert_tokens_to_ids("<tool_response>")

    def respond(prompt_ids: Sequence[int], sampling: SamplingParams) -> str:
        if list(prompt_ids).count(response) < 2:
            call = {"name": "python", "arguments": {"code": f"print({sampling.seed} % 97)"}}
            return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        return f"The answer is \\boxed{{{sampling.seed}}}."

    return respond


def untimed(groups: list[TrajectoryGroup]) -> list[Any]:
    """The groups without the measured latencies (wall-clock, never equal twice)."""

    def strip(t: Trajectory) -> Trajectory:
        turns = tuple(dataclasses.replace(u, gen_latency_s=0, env_latency_s=0) for u in t.turns)
        metrics = {k: v for k, v in t.metrics.items() if not k.endswith("_time_s")}
        return dataclasses.replace(t, turns=turns, metrics=metrics)

    return [(g.task, [strip(t) for t in g.trajectories]) for g in groups]


@pytest.fixture(scope="module")
def builder(tokenizer: Any) -> TokenBuilder:
    return TokenBuilder(tokenizer, tools=make(ENV, **FAKE).tool_schemas)


@pytest.fixture(scope="module")
def engine(tokenizer: Any) -> FakeEngine:
    return FakeEngine(
        calc_script(tokenizer), tokenizer=tokenizer, eos_token_id=tokenizer.eos_token_id
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(engine: FakeEngine, builder: TokenBuilder) -> AsyncIterator[LoopWorkers]:
    async with LoopWorkers(engine, ENV, builder, CONFIG, workers=2, env_kwargs=FAKE) as workers:
        yield workers


async def test_the_workers_play_the_groups_one_process_plays(
    pool: LoopWorkers, engine: FakeEngine, builder: TokenBuilder
) -> None:
    tasks = make(ENV, **FAKE).tasks("test", 12)
    here: list[Trajectory] = []
    there: list[Trajectory] = []
    local = await collect(tasks, ENV, engine, builder, config=CONFIG, group_size=3, seed=5,
                          concurrency=8, env_kwargs=FAKE, on_trajectory=here.append)  # fmt: skip
    spread = await pool.collect(tasks, group_size=3, seed=5, concurrency=8,
                                on_trajectory=there.append)  # fmt: skip
    assert [g.task for g in spread] == tasks and all(len(g.trajectories) == 3 for g in spread)
    assert untimed(spread) == untimed(local)  # same tokens, masks, logprobs, rewards, messages
    assert len(there) == len(here) == 36
    turns = [len(t.turns) for g in spread for t in g.trajectories]
    assert set(turns) == {3}, turns  # two tool calls and the answer, in every episode
    # a later batch with another seed samples other tokens, the same way in both
    again = await pool.collect(tasks[:2], group_size=2, seed=6)
    local_again = await collect(tasks[:2], ENV, engine, builder, config=CONFIG, group_size=2,
                                seed=6, env_kwargs=FAKE)  # fmt: skip
    assert untimed(again) == untimed(local_again) != untimed(spread[:2])


async def test_every_worker_takes_episodes(
    engine: FakeEngine, builder: TokenBuilder, tokenizer: Any
) -> None:
    call = '<tool_call>\n{"name": "whoami", "arguments": {}}\n</tool_call>'
    pids = FakeEngine(
        lambda ids, s: call if len(ids) < 200 else "done",
        tokenizer=tokenizer,
        eos_token_id=tokenizer.eos_token_id,
        latency_s=0.01,  # episodes overlap, so the second worker is dealt some
    )
    pid_builder = TokenBuilder(tokenizer, tools=pid_env().tool_schemas)
    async with LoopWorkers(pids, pid_env, pid_builder, CONFIG, workers=2) as workers:
        tasks = [Task(f"t{i}", {"prompt": "Who plays this?"}) for i in range(8)]
        groups = await workers.collect(tasks, concurrency=8)
        played_by = {m.content for g in groups for t in g.trajectories for m in t.messages
                     if m.role == "tool"}  # fmt: skip
        assert played_by == {str(pid) for pid in workers.pids} and len(played_by) == 2
        assert os.getpid() not in workers.pids
    assert all(not t.failed for g in groups for t in g.trajectories)


async def test_engine_errors_reach_the_episodes_as_in_one_process(
    pool: LoopWorkers, builder: TokenBuilder, tokenizer: Any
) -> None:
    failing = FakeEngine(["x"], tokenizer=tokenizer, fail_after=0)
    tasks = make(ENV, **FAKE).tasks("test", 2)
    async with LoopWorkers(failing, ENV, builder, CONFIG, workers=1, env_kwargs=FAKE) as one:
        spread = await one.collect(tasks)
    local = await collect(tasks, ENV, failing, builder, config=CONFIG, env_kwargs=FAKE)
    assert untimed(spread) == untimed(local)
    trajectory = spread[0].trajectories[0]
    assert trajectory.stop_reason == StopReason.ENGINE_ERROR and "InferenceError" in str(
        trajectory.error
    )


@pytest.mark.slow  # a third worker process start (~5 s of one core)
async def test_a_worker_that_dies_fails_the_batch_naming_its_exit_code(
    builder: TokenBuilder, tokenizer: Any
) -> None:
    slow = FakeEngine(calc_script(tokenizer), tokenizer=tokenizer,
                      eos_token_id=tokenizer.eos_token_id, latency_s=0.2)  # fmt: skip
    tasks = make(ENV, **FAKE).tasks("test", 8)
    async with LoopWorkers(slow, ENV, builder, CONFIG, workers=2, env_kwargs=FAKE) as workers:
        batch = asyncio.create_task(workers.collect(tasks, group_size=2, concurrency=16))
        await eventually(lambda: len(slow.requests) > 0, timeout=60)
        os.kill(workers.pids[0], signal.SIGKILL)
        with pytest.raises(AgentLoopError, match=r"exited \(exit code -9\) with \d+ episodes"):
            await asyncio.wait_for(batch, timeout=60)  # failed, not hung
        with pytest.raises(AgentLoopError, match="exit code -9"):  # and so does a later batch
            await asyncio.wait_for(workers.collect(tasks[:1]), timeout=60)
    assert all(not _alive(pid) for pid in workers.pids)


@pytest.mark.slow  # a worker process start (~5 s of one core), then its deadline (10 s)
async def test_a_stopped_worker_is_killed_and_fails_the_batch_naming_it(
    builder: TokenBuilder, tokenizer: Any
) -> None:
    slow = FakeEngine(calc_script(tokenizer), tokenizer=tokenizer,
                      eos_token_id=tokenizer.eos_token_id, latency_s=0.2)  # fmt: skip
    config = dataclasses.replace(CONFIG, timeout_s=5.0)
    tasks = make(ENV, **FAKE).tasks("test", 8)
    async with LoopWorkers(slow, ENV, builder, config, workers=2, env_kwargs=FAKE,
                           grace_s=5.0) as workers:  # fmt: skip
        stopped = workers.pids[0]
        batch = asyncio.create_task(workers.collect(tasks, group_size=2, concurrency=16))
        await eventually(lambda: len(slow.requests) > 0, timeout=60)
        os.kill(stopped, signal.SIGSTOP)  # alive, but never answers again: a hung worker
        named = rf"loop worker {stopped} did not return episode '[\w-]+' \(sample \d\) within "
        deadline = r"rollout\.timeout_s=5 s \+ 5 s of grace.*killed with \d+ episodes unfinished"
        with pytest.raises(AgentLoopError, match=named + deadline):
            await asyncio.wait_for(batch, timeout=120)  # failed by the driver, not hung
        with pytest.raises(AgentLoopError, match=f"loop worker {stopped} did not return"):
            await asyncio.wait_for(workers.collect(tasks[:1]), timeout=60)
        await eventually(lambda: not _alive(stopped), timeout=60)  # killed (and reaped)
    assert all(not _alive(pid) for pid in workers.pids)


class _ExitsWhenUnpickled:
    """An env factory whose unpickling ends the process: a worker that dies while starting."""

    def __call__(self) -> Env:
        return pid_env()

    def __reduce__(self) -> tuple[Any, ...]:
        return (os._exit, (3,))


class _RaisesWhenUnpickled(_ExitsWhenUnpickled):
    """An env factory that the worker cannot unpickle (here: an import that fails there)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (importlib.import_module, ("a_module_only_the_driver_has",))


@pytest.mark.slow  # two worker process starts (~5 s of one core each)
async def test_a_worker_that_cannot_start_fails_the_start_naming_why(
    engine: FakeEngine, tokenizer: Any
) -> None:
    pid_builder = TokenBuilder(tokenizer, tools=pid_env().tool_schemas)
    dies = LoopWorkers(engine, _ExitsWhenUnpickled(), pid_builder, CONFIG, workers=1)
    with pytest.raises(AgentLoopError, match=r"exited \(exit code 3\) while starting"):
        await asyncio.wait_for(dies.__aenter__(), timeout=120)  # at once, not a hang
    broken = LoopWorkers(engine, _RaisesWhenUnpickled(), pid_builder, CONFIG, workers=1)
    reason = r"could not start: ModuleNotFoundError: No module named 'a_module_only_the_driver_has'"
    with pytest.raises(ConfigError, match=reason + ".*must be importable"):
        await asyncio.wait_for(broken.__aenter__(), timeout=120)


@pytest.mark.slow  # a python process that imports transformers (~8 s)
async def test_a_script_fed_on_stdin_is_refused_at_once(tiny_model_dir: Path) -> None:
    import subprocess
    import sys

    script = f"""
import asyncio
from transformers import AutoTokenizer
from agentloop.chat import TokenBuilder
from agentloop.engines.fake import FakeEngine
from agentloop.envs import make
from agentloop.loop_workers import LoopWorkers
from agentloop.rollout import RolloutConfig

def env():
    return make("agentloop/Calc-v0", sandbox="fake")

tok = AutoTokenizer.from_pretrained({str(tiny_model_dir)!r})
builder = TokenBuilder(tok, tools=env().tool_schemas)

async def main():
    async with LoopWorkers(FakeEngine(["hi"], tokenizer=tok), env, builder, RolloutConfig(),
                           workers=2):
        pass

asyncio.run(main())
"""
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-"], input=script,
                                   capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 1
    assert "ConfigError: loop workers are spawned processes that start by re-running the main " \
        "script, and this one is not a file ('<stdin>'" in done.stderr  # fmt: skip
    assert "save it to a file and run that, or set loop_workers=1" in done.stderr


async def test_an_env_the_workers_cannot_import_is_a_config_error(
    engine: FakeEngine, builder: TokenBuilder
) -> None:
    with pytest.raises(ConfigError, match=r"could not be sent to them.*loop_workers=1"):
        async with LoopWorkers(engine, lambda: make(ENV, **FAKE), builder, CONFIG, workers=2):
            pass


@pytest.mark.slow  # imports the eval CLI's and the trainer config's dependencies (transformers)
async def test_loop_workers_are_checked_where_they_are_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_model_dir: Path
) -> None:
    from agentloop.cli import main
    from agentloop.trainers.config import TrainRolloutConfig

    base = ["eval", "--env", ENV, "--model", str(tiny_model_dir), "--quiet"]
    assert main([*base, "--out", str(tmp_path / "a"), "--loop-workers", "0"]) == 2
    assert "--loop-workers must be >= 1, got 0" in capsys.readouterr().err
    record = ["--record", str(tmp_path / "tape"), "--loop-workers", "2"]
    assert main([*base, "--out", str(tmp_path / "b"), *record]) == 2
    assert "set --loop-workers=1" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"rollout\.loop_workers=2 with tool calls recorded"):
        TrainRolloutConfig(loop_workers=2, tools_record=str(tmp_path / "t"))
    assert TrainRolloutConfig(loop_workers=4).loop_workers == 4


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow  # the bench's processes start (each imports transformers): ~20 s
async def test_the_bench_prints_ours_next_to_independent_processes(tmp_path: Path) -> None:
    import subprocess
    import sys

    bench = Path(__file__).parents[1] / "bench" / "loop_workers_bench.py"
    out = tmp_path / "result.json"
    args = ["--episodes", "16", "--workers", "1", "--repeat", "1", "--out", str(out)]
    done = subprocess.run([sys.executable, str(bench), *args], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert row["workers"] == 1 and row["loop_workers_turns_per_s"] > 0
    assert row["independent_turns_per_s"] > 0 and result["one_process_turns_per_s"] > 0
    assert "independent (ceiling)" in done.stdout
