"""Shared fixtures (the tiny model, the one vLLM engine) and the tiers: markers from fixtures.

A test is tiered by what it starts, and what it starts is a fixture: ``tiers.STARTS`` maps each
fixture that starts something heavy to the markers it brings, and
:func:`pytest_collection_modifyitems` gives every test the markers of every fixture in its
closure (``item.fixturenames``: the fixtures it asks for and the ones those ask for).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio
from tiers import COLLECTED, SCOPE_ORDER, STARTS, pin_lane, scope

if TYPE_CHECKING:
    from short_demo import DemoRun

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # before anything imports vllm

# Settings of the one shared vLLM engine: small, fp32 (exact comparison with HF), eager (no
# torch.compile at start-up on a CPU).
VLLM_SETTINGS: dict[str, Any] = {
    "dtype": "float32",
    "max_model_len": 512,
    "max_num_seqs": 32,
    "kv_cache_memory_bytes": 128 << 20,
    "enforce_eager": True,
    "seed": 0,
}


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Each xdist worker leads its own process group: the vLLM leak checks below look for
        # leftovers in "our" group, which must not include the other lane's engines.
        os.setpgid(0, 0)
        pin_lane()


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent without pytest-xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadscope`` a test's scope is its lane or floating group (tests/tiers.py):
    each of the two workers starts on a lane of its own, so a lane's session fixtures are built
    once, and the floating groups go to whichever worker runs out of work first."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LaneScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            for name in reversed(SCOPE_ORDER):  # xdist queued the scopes by size
                if name in self.workqueue:
                    self.workqueue.move_to_end(name, last=False)
            super()._assign_work_unit(node)

        def _reschedule(self, node: Any) -> None:
            # xdist gives a worker its next scope while two of its tests are still to run; a
            # lane takes one only when down to its last (the worker holds that one back until it
            # knows the next). A floating group is minutes long, so taking it a test earlier can
            # leave the other lane idle at the end while this one still has a group to run.
            if (
                not node.shutting_down
                and self.workqueue
                and self._pending_of(self.assigned_work.get(node, {})) > 1
            ):
                return
            super()._reschedule(node)

    return LaneScheduling(config, log)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the derived markers take part
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in item.fixturenames:
            for marker in STARTS.get(fixture, ()):
                if item.get_closest_marker(marker) is None:
                    item.add_marker(marker)
    collected = {
        item.nodeid: (
            frozenset(m.name for m in item.iter_markers()),
            frozenset(item.fixturenames),
        )
        for item in items
    }
    config.stash[COLLECTED] = collected
    if out := os.environ.get("AGENTLOOP_TIERS_OUT"):  # tests/test_tiers.py, run on its own
        Path(out).write_text(
            json.dumps({n: [sorted(m), sorted(f)] for n, (m, f) in collected.items()})
        )


@pytest.fixture(scope="session", autouse=True)
def no_vllm_left_behind() -> Iterator[None]:
    """Fail the session if a vLLM process it started outlives it (orphans included)."""
    import psutil

    from agentloop.testing.processes import vllm_processes

    started = time.time()
    yield
    _, alive = psutil.wait_procs(vllm_processes(since=started), timeout=15)
    assert not alive, f"the test session left vLLM processes running: {alive}"


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny Qwen2 model + tokenizer, generated locally (cached across runs)."""
    from agentloop.models.tiny import tiny_model_dir as build

    return build()


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def reasoning_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model wearing the reasoning template (drops earlier turns' <think> blocks)."""
    from agentloop.testing.tiny_reasoning import wear_reasoning_template

    return wear_reasoning_template(tiny_model_dir, tmp_path_factory.mktemp("reasoning") / "model")


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def vllm_engine(tiny_model_dir: Path) -> AsyncIterator[Any]:
    """The shared VLLMEngine on the tiny model (tests that change its weights put them back).
    Teardown checks that vLLM left no process."""
    pytest.importorskip("vllm")
    import psutil

    from agentloop.engines.vllm import VLLMEngine
    from agentloop.testing.processes import vllm_processes

    started = time.time()
    engine = VLLMEngine.create(tiny_model_dir, **VLLM_SETTINGS)
    async with engine:
        pids = engine.pids
        assert pids, "VLLMEngine found no engine processes to track"
        yield engine
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert not alive, f"vLLM processes {alive} survived shutdown"
    left = vllm_processes(since=started)
    assert not left, f"vLLM processes left: {left}"


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """The shortened demo (tests/short_demo.py), run once: the demo test reads all of it, the
    SFT test its SFT stage."""
    pytest.importorskip("vllm")
    from short_demo import run_short_demo

    return run_short_demo(tmp_path_factory.mktemp("demo") / "demo")


@pytest.fixture(scope="session")
def calc_caller_dir(tiny_model_dir: Path) -> Path:
    """The tiny model taught to call Calc's python tool (built once, cached on disk)."""
    from agentloop.models.calc_caller import calc_caller_model_dir

    return calc_caller_model_dir(base=tiny_model_dir)


@pytest.fixture(scope="session")
def reasoning_caller_dir(calc_caller_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Calc tool caller wearing the reasoning template: multi-turn episodes, a template
    that drops earlier <think> blocks (tests of rollout.thinking on real engines)."""
    from agentloop.testing.tiny_reasoning import wear_reasoning_template

    out = tmp_path_factory.mktemp("reasoning-caller") / "model"
    return wear_reasoning_template(calc_caller_dir, out)
