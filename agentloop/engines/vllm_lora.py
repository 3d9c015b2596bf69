"""LoRA on vLLM: the engine arguments of one adapter slot, and the adapter written for vLLM's
in-place reload (``LoRARequest(load_inplace=True)``) under one fixed adapter id.

vLLM loads an adapter only from a PEFT directory; the directory sits in shared memory
(``shm_dir``, as the ``file`` weight transport's file does), so an update is megabytes written to
and read from RAM. vLLM's reload replaces the adapter of the same id in its slot: requests keep
the one ``LoRARequest`` they are served with, and the prefix cache is reset after each update.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from agentloop.engines.base import AdapterWeights
from agentloop.errors import ConfigError

__all__ = ["ADAPTER_ID", "AdapterDir", "lora_engine_args"]

ADAPTER_ID = 1
"""vLLM's adapter id of the policy's adapter (ids start at 1)."""
_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's max_lora_rank choices


def lora_engine_args(rank: int) -> dict[str, Any]:
    """``AsyncEngineArgs`` of one LoRA slot of at least ``rank``."""
    slot = next((r for r in _RANKS if r >= rank), None)
    if slot is None:
        raise ConfigError(f"lora_rank={rank}: vLLM serves LoRA ranks up to {_RANKS[-1]}")
    return {"enable_lora": True, "max_lora_rank": slot, "max_loras": 1, "max_cpu_loras": 1}


class AdapterDir:
    """One engine's adapter directory in ``shm_dir``: rewritten by each update, removed at
    shutdown."""

    def __init__(self, shm_dir: str) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="agentloop-lora-", dir=shm_dir))

    def write(self, adapter: AdapterWeights) -> None:
        """Write ``adapter`` as PEFT's two files (each replaced atomically)."""
        from safetensors.torch import save_file

        tensors = {k: v.detach().cpu().contiguous() for k, v in adapter.tensors.items()}
        if not tensors:
            raise ConfigError("update_adapter got an adapter without tensors")
        tmp = self.path / "adapter_model.safetensors.tmp"
        save_file(tensors, tmp, {"format": "pt"})
        os.replace(tmp, self.path / "adapter_model.safetensors")
        tmp = self.path / "adapter_config.json.tmp"
        tmp.write_text(json.dumps(dict(adapter.config), default=_jsonable))
        os.replace(tmp, self.path / "adapter_config.json")

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _jsonable(value: Any) -> Any:
    if isinstance(value, set | frozenset | tuple):
        return sorted(value) if isinstance(value, set | frozenset) else list(value)
    return str(value)
