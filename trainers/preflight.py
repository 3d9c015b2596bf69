"""What ``agentloop train`` checks before its first episode (``--print-config`` runs it too)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agentloop.chat import TokenBuilder
from agentloop.env_maker import EnvMaker, env_factory
from agentloop.envs import Env
from agentloop.trainers.config import TrainConfig, check_engine_serves, local_model_dir
from agentloop.types import Task
from agentloop.vision import vision_of

__all__ = ["StartChecks", "check_start"]


@dataclass(frozen=True)
class StartChecks:
    """What the checks made, for the run to use: the env factory and one env, the train
    split's tasks, the model directory and the TokenBuilder (None: not checked,
    ``check_model=False``)."""

    env_of: EnvMaker
    env: Env
    tasks: Sequence[Task]
    model_dir: Path | None
    builder: TokenBuilder | None


async def check_start(cfg: TrainConfig, *, check_model: bool = True) -> StartChecks:
    """Every check of ``cfg`` that does not train: the metric sinks' packages, the env id, its
    kwargs and tools (a tool server that is not up fails here, named), its services (a sandbox
    URL or token), its train split's tasks, the model directory, whether the engine serves it,
    the chat template's thinking policy and tool-call parser. Each failure is a
    ``ConfigError`` naming the value and the fix. ``check_model`` false skips the model's
    checks: ``--print-config`` of a named model (``tiny-calc``) that the entry point has not
    built (``agentloop.models.resolve_model`` builds it, minutes of CPU work)."""
    cfg.logging.check_available()
    tool_io = cfg.rollout.tool_io()
    env_of = env_factory(
        cfg.data.env, cfg.data.env_args(), cfg.data.tools, tool_io, cfg.data.reward
    )  # a bad data.reward file or function fails here, named
    env = env_of()
    if tool_io.uses_live_tools:  # a replay needs no tool service
        await env.preflight()  # a wrong sandbox URL or token fails here, named, before any step
    tasks = env.tasks(cfg.data.train_split, cfg.data.num_train_tasks)
    if not check_model:
        return StartChecks(env_of, env, tasks, None, None)
    from transformers import AutoTokenizer

    model_dir = local_model_dir(cfg.model.path)  # a named model was resolved by the entry point
    check_engine_serves(cfg, model_dir)
    builder = TokenBuilder(
        AutoTokenizer.from_pretrained(model_dir),
        tools=env.tool_schemas,
        thinking=cfg.rollout.thinking,  # a template that rewrites history fails here, named
        vision=vision_of(model_dir),  # a vision-language model's images expand to its tokens
    )
    builder.parser_for(cfg.rollout.parser)  # "auto" with an unknown template fails here
    return StartChecks(env_of, env, tasks, model_dir, builder)
