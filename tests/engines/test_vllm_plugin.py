"""agentloop's vLLM plugin: registered where vLLM looks for it, and it skips the final GC pass
only in the processes of engines agentloop started (its environment variable set)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

from agentloop.engines.vllm_plugin import FAST_EXIT_ENV

_EXIT = """
import atexit, gc
from agentloop.engines.vllm_plugin import register
register()
atexit._run_exitfuncs()
print(gc.get_freeze_count() > 0)
"""


def test_the_plugin_is_an_entry_point_vllm_loads() -> None:
    found = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert found.get("agentloop_fast_exit") == "agentloop.engines.vllm_plugin:register", found


def test_only_agentloops_engines_skip_the_final_gc_pass() -> None:
    def frozen_at_exit(env: dict[str, str]) -> str:
        out = subprocess.run([sys.executable, "-c", _EXIT], env=env, capture_output=True,
                             text=True, check=True)  # fmt: skip
        return out.stdout.strip()

    assert frozen_at_exit({FAST_EXIT_ENV: "1"}) == "True"
    assert frozen_at_exit({}) == "False"
