"""The public surface of agentloop.tools: __all__ is complete and importing it stays light."""

from __future__ import annotations

import subprocess
import sys

import agentloop.tools as tools


def test_all_names_exist_and_are_sorted() -> None:
    assert tools.__all__ == sorted(set(tools.__all__))
    for name in tools.__all__:
        assert hasattr(tools, name), name


def test_import_is_light() -> None:
    code = "import sys, agentloop.tools; print(sorted({'torch', 'vllm', 'ray'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
