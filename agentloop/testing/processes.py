"""Find vLLM processes this process started, orphans included: the test suite's leak check."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["vllm_processes"]


def vllm_processes(*, since: float = 0.0) -> list[Any]:
    """Live (non-zombie) vLLM processes created at or after ``since`` (a ``time.time()``) that
    are descendants of this process or share its process group, as ``psutil.Process`` handles.

    The process group catches orphans: a vLLM worker whose parent died is re-parented away from
    us but keeps our group. vLLM names its processes ``VLLM::EngineCore`` / ``VLLM::Worker``; a
    ``vllm serve`` server runs the ``vllm`` script or a ``vllm.…`` module.
    """
    import psutil

    me = psutil.Process()
    candidates = {p.pid: p for p in me.children(recursive=True)}
    group = os.getpgid(0)
    for proc in psutil.process_iter():
        try:
            if proc.pid != me.pid and os.getpgid(proc.pid) == group:
                candidates.setdefault(proc.pid, proc)
        except (ProcessLookupError, psutil.Error):
            continue
    found = []
    for proc in candidates.values():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE or proc.create_time() < since - 1.0:
                continue
            if proc.name().startswith("VLLM") or any(_is_vllm_arg(a) for a in proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _is_vllm_arg(arg: str) -> bool:
    return os.path.basename(arg) == "vllm" or arg.startswith("vllm.")
