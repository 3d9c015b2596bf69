"""Training: losses, batching, the policy worker, orchestration; user API exported lazily."""

from typing import TYPE_CHECKING

from agentloop._lazy import lazy_getattr

if TYPE_CHECKING:
    from agentloop.trainers.config import TrainConfig, load_config
    from agentloop.trainers.grpo import train
    from agentloop.trainers.sft import SFTConfig, run_sft

__getattr__ = lazy_getattr(
    __name__,
    {
        "SFTConfig": "agentloop.trainers.sft",
        "TrainConfig": "agentloop.trainers.config",
        "load_config": "agentloop.trainers.config",
        "run_sft": "agentloop.trainers.sft",
        "train": "agentloop.trainers.grpo",
    },
)

__all__ = ["SFTConfig", "TrainConfig", "load_config", "run_sft", "train"]
