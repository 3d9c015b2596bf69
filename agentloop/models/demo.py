"""The tiny demos (``make demo``, ``agentloop demo --recipe NAME``): SFT cold start, GRPO with
real tools, eval, compare, plots.

One pipeline, a family per recipe (:mod:`agentloop.models.demo_recipes`: ReTool on Calc-v0 with
the sandboxed python tool, the default; DeepEyes; Search-R1). Top to bottom, on a laptop CPU:
the family's random-init tiny model → a scripted expert playing the family's real env into
SFT traces → a deliberately short cold-start SFT (the model learns the format and the tool,
imperfectly; with ``demo.cached_cold_start``, the cached one when it is there: no traces or
SFT) → GRPO on real rollouts with the tool, whose validation plays the held-out tasks
with the eval loop before the first step (the SFT checkpoint) and after the last (the RL
checkpoint) → the paired ``--compare`` of the two eval runs → a reward/accuracy curve (PNG), the
trajectory viewer (HTML) and a final report. Each family's three configs (``demo.yaml``,
``sft.yaml``, ``grpo.yaml``) ship with the package in ``trainers/configs/tiny_<family>/``
(``recipes/tiny_<family>/`` links to them); ``agentloop demo demo.x=… sft.x=… grpo.x=…``
overrides any key, and ``--config FILE`` layers a YAML file of ``demo:``/``sft:``/``grpo:``
sections over the recipe (``gpu.yaml`` beside the three: the same pipeline on one GPU).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from agentloop.models.demo_config import DemoConfig, DemoConfigs, overlay_overrides
from agentloop.models.demo_recipes import FAMILIES, load_demo_configs
from agentloop.trainers.config import TrainConfig

if TYPE_CHECKING:
    from agentloop.trainers.sft import SFTResult

__all__ = [
    "FAMILIES",
    "DemoConfig",
    "DemoConfigs",
    "DemoResult",
    "load_demo_configs",
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
    cold_start_cached: bool = False  # GRPO started from the cached cold start (no SFT this run)


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


def run_demo(configs: DemoConfigs[Any], *, console: Any = None) -> DemoResult:
    """Run the whole pipeline (see the module docstring); print progress and a final report."""
    import torch
    from rich.console import Console

    console = console or Console()
    out = Path(configs.demo.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # keep vLLM's start-up chatter out
    torch.set_num_threads(min(configs.demo.threads, len(os.sched_getaffinity(0))))
    torch.manual_seed(configs.demo.seed)
    with configs.family.services(configs) as served:
        return _pipeline(served, console)


def _pipeline(configs: DemoConfigs[Any], console: Any) -> DemoResult:
    from agentloop.models.cold_start import cached_cold_start
    from agentloop.models.demo_report import finish

    family, started = configs.family, time.perf_counter()
    seconds: dict[str, float] = {}
    base = _stage(console, seconds, "base model", "1/5 the base model (random weights)")(
        family.base_model, configs.demo
    )
    console.print(f"model: {base}")
    cached = cached_cold_start(configs) if configs.demo.cached_cold_start else None
    if cached is None:
        sft = _cold_start(configs, console, seconds)
    else:
        model, sft = cached
        loss = "?" if sft.eval_loss_after is None else f"{sft.eval_loss_after:.3f}"
        console.rule("[bold cyan]2-3/5 the cold start: cached, no traces or SFT this run")
        console.print(
            f"cold start: model.path={family.model_name}, {model} ({sft.steps} SFT steps, "
            f"held-out loss {loss}); demo.cached_cold_start=false trains it anew"
        )
        grpo = dataclasses.replace(
            configs.grpo, model=dataclasses.replace(configs.grpo.model, path=str(model))
        )
        configs = dataclasses.replace(configs, grpo=grpo)
    _stage(
        console,
        seconds,
        "grpo",
        f"4/5 GRPO: rollouts with the {family.tool} tool, "
        "eval of the SFT (step 0) and RL checkpoints",
    )(_grpo, configs.grpo)
    console.rule("[bold cyan]5/5 compare, plot, view, report")
    return finish(configs, sft, seconds, started, console, cold_start_cached=cached is not None)


def _cold_start(configs: DemoConfigs[Any], console: Any, seconds: dict[str, float]) -> SFTResult:
    """Stages 2 and 3: the scripted expert's traces, the cold-start SFT on them (published as
    the family's named model when the settings are the shipped ones)."""
    from agentloop.models.cold_start import publish_cold_start
    from agentloop.models.names import resolve_model
    from agentloop.trainers.sft import run_sft

    family = configs.family
    _stage(console, seconds, "traces", "2/5 synthetic SFT traces through the real env")(
        family.make_traces, configs.demo, Path(configs.sft.data.train)
    )
    sft: SFTResult = _stage(console, seconds, "sft", "3/5 cold-start SFT (deliberately short)")(
        run_sft, resolve_model(configs.sft)
    )
    console.print(
        f"SFT: {sft.steps} steps, held-out loss {sft.eval_loss_before:.3f} -> "
        f"{sft.eval_loss_after:.3f}; model in {sft.export_dir}"
    )
    if sft.export_dir is not None and (cached := publish_cold_start(configs, sft.export_dir, sft)):
        console.print(f"[dim]also cached as model.path={family.model_name}: {cached}[/]")
    return sft
