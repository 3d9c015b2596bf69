"""The tiers are derived, and right: every test known to start vLLM, Ray, a browser or a whole
run carries that marker (so the quick tier cannot run it), and the quick ones carry none.

The markers come from fixtures (tests/tiers.py); a test that starts vLLM without going through
one of them, or a fixture renamed without updating ``STARTS``, fails here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tiers as tiers_module
from tiers import COLLECTED, STARTS

ROOT = Path(__file__).resolve().parents[1]
HEAVY = {"slow", "vllm", "ray", "e2e", "browser", "gpu"}  # what the quick tier leaves out

#: test module → the markers every one of its tests must carry (what each test starts).
KNOWN: dict[str, set[str]] = {
    "tests/engines/test_vllm_engine.py": {"vllm"},
    "tests/engines/test_vllm_partial.py": {"vllm"},
    "tests/engines/test_vllm_rollout.py": {"vllm"},
    "tests/engines/test_vllm_serve.py": {"vllm"},
    "tests/trainers/test_train_vllm.py": {"vllm", "e2e"},
    "tests/trainers/test_async_vllm.py": {"vllm", "e2e"},
    "tests/trainers/test_train_ray.py": {"vllm", "ray", "e2e"},
    "tests/trainers/test_disagg_ray.py": {"vllm", "ray", "e2e"},
    "tests/trainers/test_sft_calc.py": {"vllm", "e2e"},
    "tests/recipes/test_demo.py": {"vllm", "e2e"},
    "tests/trainers/test_example_config.py": {"vllm", "e2e"},
    "tests/trainers/test_train_verl_export.py": {"vllm", "e2e"},
    "tests/sandboxes/test_sandbox_docker.py": {"slow"},
}
#: single tests of otherwise quick modules.
KNOWN_TESTS: dict[str, set[str]] = {
    "tests/test_viewer.py::test_viewer_in_headless_chromium": {"browser"},
}
#: modules that must stay wholly in the quick tier (they used to inherit a heavy tier).
QUICK_MODULES = ["tests/engines/test_openai_http.py", "tests/recipes/test_demo_config.py"]
#: where each fixture of STARTS is used (so a renamed fixture is noticed).
USERS = {
    "tests/search/test_search_index.py",
    "tests/trainers/test_async_vllm.py",
    "tests/trainers/test_sft_calc.py",
    "tests/trainers/test_trainer_worker.py",
    "tests/test_viewer.py",
}

Tiers = dict[str, tuple[frozenset[str], frozenset[str]]]


def _module(nodeid: str) -> str:
    return nodeid.split("::")[0]


def _tiers(config: pytest.Config, tmp_path: Path) -> Tiers:
    """Markers and fixtures of the tests of every module named above: from this session's
    collection when it collected them (make test, make test-fast), else a collect-only run."""
    named = {*KNOWN, *QUICK_MODULES, *USERS, *tiers_module.LANE_B, *tiers_module.FLOATING_MODULES,
             *map(_module, KNOWN_TESTS)}  # fmt: skip
    modules = sorted(named)
    collected = config.stash.get(COLLECTED, {})
    if {_module(n) for n in collected} >= set(modules):
        return collected
    out = tmp_path / "tiers.json"
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    env = {**os.environ, "AGENTLOOP_TIERS_OUT": str(out)}
    run = subprocess.run([*cmd, *modules], cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    data = json.loads(out.read_text())
    return {n: (frozenset(m), frozenset(f)) for n, (m, f) in data.items()}


@pytest.fixture(scope="module")
def tiers(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Tiers:
    return _tiers(request.config, tmp_path_factory.mktemp("tiers"))


def test_tests_that_start_vllm_ray_a_browser_or_a_run_carry_its_marker(tiers: Tiers) -> None:
    by_module: dict[str, list[str]] = {}
    for nodeid in tiers:
        by_module.setdefault(_module(nodeid), []).append(nodeid)
    untagged = []
    for module, markers in KNOWN.items():
        assert by_module.get(module), f"{module} has no tests: update KNOWN"
        untagged += [(n, markers - tiers[n][0]) for n in by_module[module] if markers - tiers[n][0]]
    for nodeid, markers in KNOWN_TESTS.items():
        assert nodeid in tiers, f"{nodeid} is gone: update KNOWN_TESTS"
        if markers - tiers[nodeid][0]:
            untagged.append((nodeid, markers - tiers[nodeid][0]))
    assert not untagged, f"tests without the marker of what they start: {untagged}"


def test_quick_modules_carry_no_heavy_marker(tiers: Tiers) -> None:
    for module in QUICK_MODULES:
        heavy = {n: tiers[n][0] & HEAVY for n in tiers if _module(n) == module}
        assert heavy, f"{module} has no tests"
        assert not any(heavy.values()), heavy


def test_lane_b_names_modules_that_exist_and_make_test_runs_the_lanes(tiers: Tiers) -> None:
    modules = {_module(n) for n in tiers}
    assert modules >= tiers_module.LANE_B, tiers_module.LANE_B - modules
    assert "-n 2 --dist loadscope" in (ROOT / "Makefile").read_text()


def test_floating_groups_start_no_ray_and_read_no_lanes_session_fixtures(tiers: Tiers) -> None:
    """A floating group runs beside either lane: beside lane a's Ray cluster it must start no Ray
    of its own, and a lane's costly session fixtures would be built a second time for it."""
    lane_fixtures = {"vllm_engine", "demo_run", "ray_cluster", "local_ray"}
    modules = tiers_module.FLOATING_MODULES
    assert sum(map(len, tiers_module.FLOATING.values())) == len(modules)  # no module twice
    assert not modules & tiers_module.LANE_B
    for module in sorted(modules):
        tests = {n: v for n, v in tiers.items() if _module(n) == module}
        assert tests, f"{module} has no tests: update FLOATING"
        for nodeid, (markers, fixtures) in tests.items():
            assert "ray" not in markers and not fixtures & lane_fixtures, (nodeid, fixtures)
    assert tiers_module.SCOPE_ORDER[:2] == ("a", "b")
    assert all(tiers_module.scope(m + "::t") in tiers_module.FLOATING for m in modules)


@pytest.mark.slow  # a pytest session of its own on two xdist workers (~30 s)
def test_each_lane_runs_on_one_worker(tmp_path: Path) -> None:
    """Two xdist workers, three modules in two lanes: the lanes are the scopes (not modules), and
    each lane ran on one worker of its own."""
    picked = ["tests/test_types.py", "tests/test_stats.py", "tests/recipes/test_demo_config.py"]
    env = {**os.environ, "AGENTLOOP_EXTRA_LANE_B": "tests/recipes/test_demo_config.py"}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2",
           "--dist", "loadscope", "-v", *picked]  # fmt: skip
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "scheduling tests via LaneScheduling" in run.stdout, run.stdout[:2000]
    workers: dict[str, set[str]] = {}
    for line in run.stdout.splitlines():
        found = re.match(r"\[(gw\d)\] .*PASSED (\S+?)::", line)
        if found:
            workers.setdefault(found.group(2), set()).add(found.group(1))
    assert set(workers) == set(picked), run.stdout[-2000:]
    assert all(len(w) == 1 for w in workers.values()), workers
    assert workers[picked[0]] == workers[picked[1]] != workers[picked[2]], workers


def test_every_fixture_that_starts_something_is_in_use(tiers: Tiers) -> None:
    used = set().union(*(fixtures for _, fixtures in tiers.values()))
    assert set(STARTS) - used == set(), "STARTS names fixtures no test uses: renamed?"


def _selects(expression: str, markers: frozenset[str]) -> bool:
    from _pytest.mark.expression import Expression  # what `pytest -m` evaluates

    return bool(Expression.compile(expression).evaluate(lambda name, **_: name in markers))


def test_every_test_is_in_exactly_one_tier_or_needs_a_gpu(tiers: Tiers) -> None:
    tier_of = {name: getattr(tiers_module, name) for name in ("QUICK", "INTEGRATION", "E2E")}
    for nodeid, (markers, _) in tiers.items():
        chosen = [name for name, expr in tier_of.items() if _selects(expr, markers)]
        assert len(chosen) == 1 or (not chosen and "gpu" in markers), (nodeid, markers, chosen)


def test_the_makefile_tiers_are_these() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for name in ("QUICK", "INTEGRATION", "E2E"):
        found = re.search(rf"^{name} := (.+)$", makefile, re.MULTILINE)
        assert found is not None and found.group(1) == getattr(tiers_module, name), name
        assert f'-m "$({name})"' in makefile, name


@pytest.mark.slow  # three Python processes that import torch (~12 s); `make test` pins lanes
def test_each_lane_gets_a_core_of_its_own_and_one_thread() -> None:
    """``pin_lane``: under two xdist workers, worker gwN runs (with all it starts) on the N-th
    core with one thread and binds vLLM's OpenMP threads there; outside xdist it changes nothing."""
    code = (
        "import os, sys; os.sched_setaffinity(0, range(os.cpu_count()))\n"
        "import tiers, torch; tiers.pin_lane()\n"
        "print(sorted(os.sched_getaffinity(0)), os.environ.get('VLLM_CPU_OMP_THREADS_BIND'),"
        " os.environ.get('OMP_NUM_THREADS'), torch.get_num_threads())"
    )
    cores = list(range(os.cpu_count() or 1))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("PYTEST_XDIST_", "VLLM_CPU_OMP", "OMP_NUM"))}  # fmt: skip

    def pinned(worker: str | None) -> str:
        env = {**clean, **({"PYTEST_XDIST_WORKER": worker, "PYTEST_XDIST_WORKER_COUNT": "2"}
                           if worker else {})}  # fmt: skip
        run = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "tests", env=env,
                             capture_output=True, text=True, check=True)  # fmt: skip
        return run.stdout.strip()

    assert pinned("gw0") == f"[{cores[0]}] {cores[0]} 1 1"
    assert pinned("gw1") == f"[{cores[1]}] {cores[1]} 1 1"
    assert pinned(None).startswith(f"{cores} None None")
