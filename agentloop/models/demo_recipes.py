"""The demo families by name (``agentloop demo --recipe NAME``), and a recipe's configs loaded."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentloop.errors import ConfigError
from agentloop.models.demo_config import DemoConfigs, DemoFamily, load_family_configs
from agentloop.models.demo_deepeyes import DEEPEYES
from agentloop.models.demo_retool import RETOOL
from agentloop.models.demo_search_r1 import SEARCH_R1

__all__ = ["DEFAULT_FAMILY", "FAMILIES", "family_named", "load_demo_configs"]

#: Every demo family; each one's shipped recipe is ``agentloop/trainers/configs/tiny_<name>/``.
FAMILIES: dict[str, DemoFamily[Any]] = {f.name: f for f in (RETOOL, DEEPEYES, SEARCH_R1)}
DEFAULT_FAMILY = RETOOL.name


def family_named(name: str) -> DemoFamily[Any]:
    if (family := FAMILIES.get(name)) is None:
        raise ConfigError(
            f"there is no demo family {name!r}; pass --recipe one of {', '.join(FAMILIES)} "
            "or a recipe dir (demo.yaml, sft.yaml, grpo.yaml)"
        )
    return family


def _declared_family(root: Path) -> str:
    """The ``family:`` a recipe dir's ``demo.yaml`` declares (the default's if none)."""
    from omegaconf import OmegaConf

    try:
        data = OmegaConf.to_container(OmegaConf.load(root / "demo.yaml"))
    except Exception as exc:
        raise ConfigError(f"cannot read {str(root / 'demo.yaml')!r}: {exc}") from None
    family = data.get("family", DEFAULT_FAMILY) if isinstance(data, dict) else DEFAULT_FAMILY
    return str(family)


def load_demo_configs(
    overrides: Sequence[str] = (),
    recipe: str | os.PathLike[str] | None = None,
    config: str | os.PathLike[str] | None = None,
) -> DemoConfigs[Any]:
    """A demo's configs: ``recipe`` names a family (its shipped recipe; default ``retool``) or
    a recipe dir of ``demo.yaml``, ``sft.yaml`` and ``grpo.yaml`` (its ``demo.family`` says
    which family's pipeline plays it), loaded by
    :func:`~agentloop.models.demo_config.load_family_configs`."""
    name = str(recipe) if recipe is not None else DEFAULT_FAMILY
    if name in FAMILIES:
        family = FAMILIES[name]
        return load_family_configs(family, family.recipe_dir, overrides, config)
    root = Path(name)
    if not (root / "grpo.yaml").is_file():
        raise ConfigError(
            f"--recipe {name!r} is neither a demo family ({', '.join(FAMILIES)}) nor a recipe "
            f"dir with demo.yaml, sft.yaml and grpo.yaml (the shipped ones are in "
            f"{RETOOL.recipe_dir.parent}/tiny_<family>)"
        )
    return load_family_configs(family_named(_declared_family(root)), root, overrides, config)
