"""agentloop's vLLM plugin (entry point ``vllm.general_plugins``), which vLLM loads in each of its
processes: the front end, the engine core and every worker.

For the engines agentloop starts (``AGENTLOOP_VLLM_FAST_EXIT=1`` in their environment, set by
:meth:`agentloop.engines.vllm.VLLMEngine.start`) it skips the cyclic-GC pass of interpreter
shutdown, as vLLM itself does on ROCm: after an engine's teardown, its core and worker processes
spent 5+ s each in that pass over the heap vLLM and torch build (measured on the 2-core CPU
machine: a shutdown took 10.9 s, with the worker and then the core busy in ``gc_collect_main``
until the core was killed at the shutdown timeout; 4.1 s with this). Process exit reclaims the
memory either way. Other vLLM processes on the machine are left as they are.
"""

from __future__ import annotations

import atexit
import gc
import os

__all__ = ["FAST_EXIT_ENV", "register"]

FAST_EXIT_ENV = "AGENTLOOP_VLLM_FAST_EXIT"


def register() -> None:
    """Called by vLLM in each of its processes at start-up."""
    if os.environ.get(FAST_EXIT_ENV) == "1":
        atexit.register(gc.freeze)  # atexit runs before the final collection, which then skips
