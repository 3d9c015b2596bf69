"""The demo's configs (``demo.yaml``, ``sft.yaml``, ``grpo.yaml``) loaded and wired; its traces."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentloop.errors import ConfigError
from agentloop.models.tiny import TINY_SHAPE, tiny_model_path
from agentloop.trainers.config import TrainConfig, load_config
from agentloop.trainers.sft_config import SFTConfig

__all__ = [
    "RECIPE_DIR",
    "DemoConfig",
    "DemoConfigs",
    "load_demo_configs",
    "make_demo_traces",
    "overlay_overrides",
]

#: The shipped recipe: package data, so a wheel has it too.
RECIPE_DIR = Path(__file__).resolve().parent.parent / "trainers" / "configs" / "tiny_retool"
_SECTIONS = ("demo", "sft", "grpo")


@dataclass(frozen=True)
class DemoConfig:
    """The pipeline's own settings; the SFT and GRPO runs have theirs (``sft.yaml``,
    ``grpo.yaml``). Traces: ``num_traces`` rollout-format rows + ``num_compact`` compact rows
    (``envs/calc_traces.py`` says why), Calc-v0 tasks with ``digits``-digit first operands,
    ``typo_rate`` of them mistyped, the tool run in ``trace_sandbox``. ``min_gain``: the pass@1
    gain (absolute) the final report calls a pass, with the paired 95% CI above zero.
    ``hidden_size`` × ``num_layers``: the shape of the random-init model SFT starts from (the
    tiny model's tokenizer and head_dim; ``agentloop.models.tiny.make_tiny_model``); any shape
    but the tiny model's (256 × 4) sets ``sft.model.path`` to that model, built once and cached."""

    out_dir: str = "runs/demo"
    digits: int = 2
    num_traces: int = 400
    num_compact: int = 1600
    typo_rate: float = 0.0
    trace_sandbox: str = "local"
    seed: int = 0
    threads: int = 2
    min_gain: float = 0.10
    hidden_size: int = TINY_SHAPE[0]
    num_layers: int = TINY_SHAPE[1]

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_gain <= 1.0 or self.threads < 1:
            raise ConfigError(
                f"demo.min_gain={self.min_gain} must be in [0, 1] and demo.threads="
                f"{self.threads} >= 1"
            )
        if self.hidden_size < 128 or self.hidden_size % 128 or self.num_layers < 1:
            raise ConfigError(
                f"demo.hidden_size={self.hidden_size}, demo.num_layers={self.num_layers}: use a "
                "hidden_size that is a multiple of 128 (e.g. 768) and num_layers >= 1"
            )


@dataclass(frozen=True)
class DemoConfigs:
    """The three configs of one demo run, overrides applied and paths wired together."""

    demo: DemoConfig
    sft: SFTConfig
    grpo: TrainConfig


def _split_overrides(overrides: Sequence[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {s: [] for s in _SECTIONS}
    for item in overrides:
        section, dot, rest = item.partition(".")
        if section not in out or not dot:
            raise ConfigError(
                f"demo override {item!r} must start with one of {[s + '.' for s in _SECTIONS]}, "
                "e.g. grpo.trainer.total_steps=10 or sft.trainer.max_steps=200"
            )
        out[section].append(rest)
    return out


def _override(key: str, value: Any) -> str:
    """``key=value`` with the value written as JSON, which is YAML: the dotlist parses it back
    as it was (a path holding ``": "`` stays a string, not a mapping)."""
    return f"{key}={json.dumps(value)}"


def overlay_overrides(path: str | os.PathLike[str]) -> list[str]:
    """The ``section.key=value`` overrides a YAML overlay file stands for: its top-level keys
    are ``demo``, ``sft`` and ``grpo``, each a (nested) mapping of that config's keys."""
    from omegaconf import OmegaConf

    try:
        data = OmegaConf.to_container(OmegaConf.load(Path(path)))
    except Exception as exc:
        raise ConfigError(f"cannot read the demo config file {str(path)!r}: {exc}") from None
    if not isinstance(data, dict) or not set(data) <= set(_SECTIONS):
        keys = list(data) if isinstance(data, dict) else type(data).__name__
        raise ConfigError(
            f"the demo config file {str(path)!r} has top-level keys {keys}; use only "
            f"{list(_SECTIONS)}, each a mapping of that config's keys"
        )

    def flat(prefix: str, value: Any) -> list[str]:
        if isinstance(value, dict) and value:
            return [o for k, v in value.items() for o in flat(f"{prefix}.{k}", v)]
        return [_override(prefix, value)]

    return [o for section, body in data.items() for o in flat(str(section), body or {})]


def load_demo_configs(
    overrides: Sequence[str] = (),
    recipe_dir: str | os.PathLike[str] | None = None,
    config: str | os.PathLike[str] | None = None,
) -> DemoConfigs:
    """Load ``demo.yaml``, ``sft.yaml`` and ``grpo.yaml`` from ``recipe_dir``, then the overlay
    file ``config`` (:func:`overlay_overrides`), then ``section.key=value`` overrides; point SFT
    at the traces (and the base model of ``demo``'s shape) and GRPO at the SFT model (all under
    ``demo.out_dir``) and check the pieces fit together."""
    root = Path(recipe_dir) if recipe_dir is not None else RECIPE_DIR
    if not (root / "grpo.yaml").is_file():
        raise ConfigError(
            f"the demo recipe is not in {root} (demo.yaml, sft.yaml, grpo.yaml); pass --recipe "
            f"DIR with those three files (the shipped ones are in {RECIPE_DIR})"
        )
    layered = [*(overlay_overrides(config) if config is not None else []), *overrides]
    parts = _split_overrides(layered)
    demo = load_config(DemoConfig, root / "demo.yaml", parts["demo"])
    out = Path(demo.out_dir)
    shape = (demo.hidden_size, demo.num_layers)
    path = tiny_model_path(hidden_size=shape[0], num_layers=shape[1])
    base = [] if shape == TINY_SHAPE else [_override("model.path", str(path))]
    sft = load_config(
        SFTConfig,
        root / "sft.yaml",
        [
            *base,
            _override("data.train", str(out / "traces.jsonl")),
            _override("trainer.out_dir", str(out / "sft")),
            _override("trainer.seed", demo.seed),
            *parts["sft"],
        ],
    )
    grpo = load_config(
        TrainConfig,
        root / "grpo.yaml",
        [
            _override("model.path", str(out / "sft" / "model")),
            _override("trainer.out_dir", str(out / "rl")),
            _override("trainer.seed", demo.seed),
            *parts["grpo"],
        ],
    )
    if grpo.data.env_kwargs.get("digits") != demo.digits:
        raise ConfigError(
            f"grpo data.env_kwargs.digits={grpo.data.env_kwargs.get('digits')} but demo.digits="
            f"{demo.digits}: RL and the SFT traces must use the same tasks; set both"
        )
    if not (grpo.trainer.val_before_train and grpo.trainer.val_every > 0):
        raise ConfigError(
            "the demo compares the validation before the first step (the SFT checkpoint) with "
            "the one after the last (the RL checkpoint): set grpo.trainer.val_before_train=true "
            "and grpo.trainer.val_every > 0"
        )
    return DemoConfigs(demo, sft, grpo)


def make_demo_traces(cfg: DemoConfig, path: Path) -> Path:
    """Play the scripted expert through Calc-v0 into the SFT traces file ``path``."""
    from agentloop.envs.calc_traces import TraceConfig, make_calc_traces, write_traces

    traces = TraceConfig(
        num_traces=cfg.num_traces,
        num_compact=cfg.num_compact,
        digits=cfg.digits,
        typo_rate=cfg.typo_rate,
        seed=cfg.seed,
        sandbox=cfg.trace_sandbox,
    )
    print(
        f"playing {traces.num_episodes} scripted Calc-v0 episodes (tool: {cfg.trace_sandbox} "
        f"sandbox) into {cfg.num_traces} rollout-format + {cfg.num_compact} compact rows"
    )
    rows = asyncio.run(make_calc_traces(traces))
    return write_traces(rows, path)
