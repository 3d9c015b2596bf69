"""Shared fixtures: the tiny local model (built once per cache) and its tokenizer."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


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
    from agentloop.testing.tiny import tiny_model_dir as build

    return build()


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)
