"""Vision fixtures: the tiny Qwen2.5-VL (built locally once), its tokenizer and processor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_vlm_dir() -> Path:
    from agentloop.models.tiny_vlm import tiny_vlm_dir as build

    return build()


@pytest.fixture(scope="session")
def vlm_tokenizer(tiny_vlm_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_vlm_dir)


@pytest.fixture(scope="session")
def vision(tiny_vlm_dir: Path, vlm_tokenizer: Any) -> Any:
    from agentloop.vision import VisionProcessor

    return VisionProcessor.from_pretrained(tiny_vlm_dir, tokenizer=vlm_tokenizer)
