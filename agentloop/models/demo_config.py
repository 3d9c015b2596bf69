"""A demo's configs (``demo.yaml``, ``sft.yaml``, ``grpo.yaml``) loaded and wired, per family.

A demo family (:class:`DemoFamily`: ReTool, DeepEyes, Search-R1) is one recipe of the same
pipeline: a scripted expert's traces through the family's env, a cold-start SFT on them, GRPO
with the env's tool, the paired comparison of the SFT and RL checkpoints. Its ``demo:`` section
is a :class:`DemoConfig` subclass of its own; ``agentloop.models.demo_recipes`` lists them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from agentloop.errors import ConfigError
from agentloop.trainers.config import TrainConfig, load_config
from agentloop.trainers.sft_config import SFTConfig

__all__ = [
    "CONFIGS_DIR",
    "DemoConfig",
    "DemoConfigs",
    "DemoFamily",
    "load_family_configs",
    "overlay_overrides",
    "override",
]

#: The shipped recipes, ``tiny_<family>/``: package data, so a wheel has them too.
CONFIGS_DIR = Path(__file__).resolve().parent.parent / "trainers" / "configs"
_SECTIONS = ("demo", "sft", "grpo")


@dataclass(frozen=True)
class DemoConfig:
    """The settings every family's ``demo:`` section has; the SFT and GRPO runs have theirs
    (``sft.yaml``, ``grpo.yaml``). ``family``: which recipe this is (``retool``, ``deepeyes``,
    ``search_r1``). ``min_gain``: the pass@1 gain (absolute) the final report calls a pass, with
    the paired 95% CI above zero. ``cached_cold_start``: when the cold start these settings
    train is cached (its named model, :mod:`agentloop.models.cold_start`), GRPO starts from it
    and the traces and SFT stages are skipped; false trains it whether or not it is cached."""

    family: str = "retool"
    out_dir: str = "runs/demo"
    seed: int = 0
    threads: int = 2
    min_gain: float = 0.10
    cached_cold_start: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_gain <= 1.0 or self.threads < 1:
            raise ConfigError(
                f"demo.min_gain={self.min_gain} must be in [0, 1] and demo.threads="
                f"{self.threads} >= 1"
            )


S = TypeVar("S", bound=DemoConfig)


@dataclass(frozen=True)
class DemoConfigs(Generic[S]):
    """The three configs of one demo run, overrides applied and paths wired together."""

    demo: S
    sft: SFTConfig
    grpo: TrainConfig
    family: DemoFamily[S]


def _no_overrides(demo: Any) -> Sequence[str]:
    return ()


def _no_check(configs: DemoConfigs[Any]) -> None:
    return None


@contextmanager
def _as_is(configs: DemoConfigs[Any]) -> Iterator[DemoConfigs[Any]]:
    yield configs


@dataclass(frozen=True)
class DemoFamily(Generic[S]):
    """One demo recipe. ``settings``: its ``demo:`` section; ``base_model(demo)``: builds (or
    finds, cached) the random-init model SFT starts from; ``make_traces(demo, path)``: the
    scripted expert's SFT rows through the family's real env, written to ``path``;
    ``model_name``: the ``model.path`` name of its cold-start SFT model, cached
    (:mod:`agentloop.models.cold_start`); ``title`` and ``tool`` label the report.
    ``sft_overrides(demo)``: SFT overrides the settings imply (a base model of another shape);
    ``check(configs)``: the family's consistency checks; ``services(configs)``: what must run
    around the whole pipeline (a search server), yielding the configs that point at it;
    ``cache_ignored``: settings that do not shape the cold-start model;
    ``cache_build_overrides``: the ``demo.`` overrides a cache build uses (of those settings)."""

    name: str
    title: str
    tool: str
    settings: type[S]
    base_model: Callable[[S], Path]
    make_traces: Callable[[S, Path], Path]
    model_name: str
    sft_overrides: Callable[[S], Sequence[str]] = _no_overrides
    check: Callable[[DemoConfigs[S]], None] = _no_check
    services: Callable[[DemoConfigs[S]], AbstractContextManager[DemoConfigs[S]]] = _as_is
    cache_ignored: tuple[str, ...] = ()
    cache_build_overrides: tuple[str, ...] = ()

    @property
    def recipe_dir(self) -> Path:
        return CONFIGS_DIR / f"tiny_{self.name}"


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


def override(key: str, value: Any) -> str:
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
        return [override(prefix, value)]

    return [o for section, body in data.items() for o in flat(str(section), body or {})]


def load_family_configs(
    family: DemoFamily[S],
    root: Path,
    overrides: Sequence[str] = (),
    config: str | os.PathLike[str] | None = None,
) -> DemoConfigs[S]:
    """Load ``demo.yaml``, ``sft.yaml`` and ``grpo.yaml`` from ``root``, then the overlay file
    ``config`` (:func:`overlay_overrides`), then ``section.key=value`` overrides; point SFT at
    the traces and GRPO at the SFT model (all under ``demo.out_dir``) and check the pieces fit."""
    layered = [*(overlay_overrides(config) if config is not None else []), *overrides]
    parts = _split_overrides(layered)
    demo = load_config(family.settings, root / "demo.yaml", parts["demo"])
    if demo.family != family.name:
        raise ConfigError(
            f"demo.family={demo.family!r} but the recipe in {root} is the {family.name!r} "
            f"demo; leave demo.family as the recipe's, or pass --recipe {demo.family}"
        )
    out = Path(demo.out_dir)
    sft = load_config(
        SFTConfig,
        root / "sft.yaml",
        [
            *family.sft_overrides(demo),
            override("data.train", str(out / "traces.jsonl")),
            override("trainer.out_dir", str(out / "sft")),
            override("trainer.seed", demo.seed),
            *parts["sft"],
        ],
    )
    grpo = load_config(
        TrainConfig,
        root / "grpo.yaml",
        [
            override("model.path", str(out / "sft" / "model")),
            override("trainer.out_dir", str(out / "rl")),
            override("trainer.seed", demo.seed),
            *parts["grpo"],
        ],
    )
    if not (grpo.trainer.val_before_train and grpo.trainer.val_every > 0):
        raise ConfigError(
            "the demo compares the validation before the first step (the SFT checkpoint) with "
            "the one after the last (the RL checkpoint): set grpo.trainer.val_before_train=true "
            "and grpo.trainer.val_every > 0"
        )
    configs = DemoConfigs(demo, sft, grpo, family)
    family.check(configs)
    return configs
