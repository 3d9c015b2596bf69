"""The ReTool demo family (``agentloop demo``): Calc-v0 with the sandboxed python tool."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agentloop.errors import ConfigError
from agentloop.models.demo_config import DemoConfig, DemoConfigs, DemoFamily, override
from agentloop.models.tiny import TINY_SHAPE, tiny_model_dir, tiny_model_path

__all__ = ["RETOOL", "CalcDemoConfig", "make_demo_traces"]


@dataclass(frozen=True)
class CalcDemoConfig(DemoConfig):
    """The ReTool demo's ``demo:`` section. Traces: ``num_traces`` rollout-format rows +
    ``num_compact`` compact rows (``envs/calc_traces.py`` says why), Calc-v0 tasks with
    ``digits``-digit first operands, ``typo_rate`` of them mistyped, the tool run in
    ``trace_sandbox``. ``hidden_size`` × ``num_layers``: the shape of the random-init model
    SFT starts from (the tiny model's tokenizer and head_dim;
    ``agentloop.models.tiny.make_tiny_model``); any shape but the tiny model's (256 × 4) sets
    ``sft.model.path`` to that model, built once and cached."""

    digits: int = 2
    num_traces: int = 400
    num_compact: int = 1600
    typo_rate: float = 0.0
    trace_sandbox: str = "local"
    hidden_size: int = TINY_SHAPE[0]
    num_layers: int = TINY_SHAPE[1]

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.hidden_size < 128 or self.hidden_size % 128 or self.num_layers < 1:
            raise ConfigError(
                f"demo.hidden_size={self.hidden_size}, demo.num_layers={self.num_layers}: use a "
                "hidden_size that is a multiple of 128 (e.g. 768) and num_layers >= 1"
            )


def _base_model(demo: CalcDemoConfig) -> Path:
    return tiny_model_dir(hidden_size=demo.hidden_size, num_layers=demo.num_layers)


def _sft_overrides(demo: CalcDemoConfig) -> Sequence[str]:
    shape = (demo.hidden_size, demo.num_layers)
    if shape == TINY_SHAPE:
        return ()
    return (
        override("model.path", str(tiny_model_path(hidden_size=shape[0], num_layers=shape[1]))),
    )


def _check(configs: DemoConfigs[CalcDemoConfig]) -> None:
    digits = configs.grpo.data.env_kwargs.get("digits")
    if digits != configs.demo.digits:
        raise ConfigError(
            f"grpo data.env_kwargs.digits={digits} but demo.digits={configs.demo.digits}: RL "
            "and the SFT traces must use the same tasks; set both"
        )


def make_demo_traces(cfg: CalcDemoConfig, path: Path) -> Path:
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


RETOOL = DemoFamily(
    name="retool",
    title="tiny ReTool on Calc-v0",
    tool="python",
    settings=CalcDemoConfig,
    base_model=_base_model,
    make_traces=make_demo_traces,
    model_name="tiny-calc",
    sft_overrides=_sft_overrides,
    check=_check,
    # how the traces' tool runs does not change the model (the fake and bubblewrap sandboxes
    # give the same rows: tests/trainers/test_sft.py), so a cache build takes the fast one; the
    # base model's shape is in the SFT config's model.path already
    cache_ignored=("trace_sandbox", "hidden_size", "num_layers"),
    cache_build_overrides=("demo.trace_sandbox=fake",),
)
