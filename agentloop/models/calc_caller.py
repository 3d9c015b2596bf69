"""The tiny model taught to call Calc-v0's python tool: real multi-turn episodes for tests, benches.

The random tiny model never emits ``<tool_call>``, so every Calc episode it plays ends after one
turn. Tests of the rollout loop on a real engine (token-exactness turn by turn, logprobs on
multi-turn trajectories) and the rollout-throughput benchmark need episodes that call the tool and
then answer. :func:`calc_caller_model_dir` fine-tunes the tiny model briefly on scripted Calc
episodes (played through the real rollout loop and env, so the tool outputs are real) until it
writes well-formed tool calls; its arithmetic stays poor, so rewards are mostly 0. The result is
cached like the tiny model itself, keyed by the Calc prompt it was taught on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentloop.cache import cached_build
from agentloop.chat import TokenBuilder
from agentloop.errors import ConfigError
from agentloop.models.tiny import tiny_model_dir
from agentloop.types import Trajectory

__all__ = ["CALC_ENV", "TeachConfig", "calc_caller_model_dir", "calc_demonstrations", "teach"]

CALC_ENV = "agentloop/Calc-v0"
_VERSION = 1  # bump when the demonstrations or the training change
_QUESTION = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)
_TOOL_OUTPUT = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)


@dataclass(frozen=True)
class TeachConfig:
    """How the tiny model is taught: ``num_demos`` scripted train-split episodes, ``steps`` AdamW
    steps of ``batch_size`` episodes at peak ``lr`` (linear warm-up over ``warmup_steps``, then
    linear decay). Defaults take about a minute on two CPU cores."""

    num_demos: int = 64
    steps: int = 60
    batch_size: int = 8
    lr: float = 3e-3
    warmup_steps: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_demos", "steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"TeachConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0 or self.warmup_steps < 0:
            raise ConfigError(
                f"TeachConfig needs lr > 0 and warmup_steps >= 0, got {self.lr}, "
                f"{self.warmup_steps}"
            )


def calc_caller_model_dir(
    config: TeachConfig = TeachConfig(), *, base: str | Path | None = None
) -> Path:
    """A model directory (weights + the tiny tokenizer) that calls Calc's ``python`` tool, built
    once next to ``base`` (default: the tiny model) and cached. The cache key covers the Calc
    prompt the model is taught on, so a change to the env's system prompt or tool schema builds
    a new one instead of reusing a model taught on another prompt."""
    from transformers import AutoTokenizer

    from agentloop.envs import ToolEnv, make

    base_dir = Path(base) if base is not None else tiny_model_dir()
    env = make(CALC_ENV)
    assert isinstance(env, ToolEnv), f"{CALC_ENV} is a ToolEnv"
    builder = TokenBuilder(AutoTokenizer.from_pretrained(base_dir), tools=env.tool_schemas)
    first = env.tasks("train", 1)[0]
    key = json.dumps([_VERSION, dataclasses.asdict(config), builder.prompt_ids(env.prompt(first))])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    target = base_dir.parent / f"{base_dir.name}-calc-caller-{digest}"
    return cached_build(target, lambda out: teach(base_dir, out, config))


def calc_demonstrations(
    builder: TokenBuilder, num: int, *, split: str = "train"
) -> list[Trajectory]:
    """``num`` scripted Calc episodes through the real rollout loop: call ``python`` on the
    question's expression, then box the tool's printed output."""
    from agentloop.collect import collect
    from agentloop.engines.fake import FakeEngine
    from agentloop.envs import make
    from agentloop.rollout import RolloutConfig

    tokenizer = builder.tokenizer
    tasks = make(CALC_ENV).tasks(split, num)
    engine = FakeEngine(
        lambda ids, _: _demonstrate(builder.decode(ids)),
        tokenizer=tokenizer,
        eos_token_id=tokenizer.eos_token_id,
    )
    config = RolloutConfig(max_turns=3, max_prompt_len=2048, max_response_len=256)
    groups = asyncio.run(collect(tasks, CALC_ENV, engine, builder, config=config))
    episodes = [g.trajectories[0] for g in groups]
    bad = [t for t in episodes if t.failed or len(t.turns) != 2]
    if bad:
        raise RuntimeError(
            f"{len(bad)} scripted Calc demonstrations did not play as call-then-answer; first: "
            f"{bad[0].task_id} stopped with {bad[0].stop_reason} ({bad[0].error})"
        )
    return episodes


def _demonstrate(context: str) -> str:
    """The scripted policy's next reply, given the decoded context so far."""
    question = _QUESTION.findall(context)[-1].strip()
    outputs = _TOOL_OUTPUT.findall(context)
    if outputs:
        numbers = re.findall(r"-?\d+", outputs[-1])
        return f"The answer is \\boxed{{{numbers[-1] if numbers else 0}}}."
    if question.startswith("What is "):
        expression = question.removeprefix("What is ").rstrip("?")
    else:  # the word problems are all a * b + c, numbers in question order
        a, b, c = re.findall(r"\d+", question)[:3]
        expression = f"{a} * {b} + {c}"
    call = {"name": "python", "arguments": {"code": f"print({expression})"}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def teach(base: str | Path, out: str | Path, config: TeachConfig = TeachConfig()) -> Path:
    """Fine-tune the model in ``base`` on :func:`calc_demonstrations` (loss on sampled tokens
    only) and save it with its tokenizer to ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentloop.envs import make

    base, out = Path(base), Path(out)
    tokenizer = AutoTokenizer.from_pretrained(base)
    builder = TokenBuilder(tokenizer, tools=make(CALC_ENV).tool_schemas)
    demos = calc_demonstrations(builder, config.num_demos)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        losses = _fit(model, demos, config)
    out.mkdir(parents=True, exist_ok=True)
    for f in base.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy2(f, out / f.name)
    model.save_pretrained(str(out), safe_serialization=True)
    info = {"base": str(base), "teach": dataclasses.asdict(config), "losses": losses}
    (out / "calc_caller.json").write_text(json.dumps(info, indent=2) + "\n")
    return out


def _fit(model: Any, demos: Sequence[Trajectory], config: TeachConfig) -> list[float]:
    """AdamW on the demos' sampled tokens. The system prompt and tool list, shared by every demo,
    are run once per step without gradients and reused as a KV prefix: the step then costs the
    ~100 tokens after it instead of ~350 per episode."""
    import torch
    import torch.nn.functional as F

    shared = _common_prefix([d.token_ids for d in demos])
    ids, labels = _suffix_batch(demos, shared)
    prefix = torch.tensor([demos[0].token_ids[:shared]])
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    warm, steps = max(config.warmup_steps, 1), config.steps

    def factor(step: int) -> float:
        return min(1.0, (step + 1) / warm) * max(0.0, 1.0 - step / steps)

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    model.train()
    losses = []
    for _ in range(steps):
        pick = torch.randperm(len(demos))[: config.batch_size]
        with torch.no_grad():
            cache = model(prefix, use_cache=True).past_key_values
        cache.batch_repeat_interleave(len(pick))
        logits = model(input_ids=ids[pick], past_key_values=cache, use_cache=True).logits
        # Position i predicts token i + 1; the first suffix token (the question's start) is
        # never a sampled token, so dropping its prediction loses nothing.
        loss = F.cross_entropy(
            logits[:, :-1].flatten(0, 1), labels[pick][:, 1:].flatten(), ignore_index=-100
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(round(loss.item(), 4))
    model.eval()
    return losses


def _common_prefix(sequences: Sequence[Sequence[int]]) -> int:
    first, n = sequences[0], min(map(len, sequences))
    shared = next((i for i in range(n) if any(s[i] != first[i] for s in sequences)), n)
    if shared == 0:
        raise RuntimeError("the Calc demonstrations share no prompt prefix; cannot reuse one KV")
    return shared


def _suffix_batch(demos: Sequence[Trajectory], shared: int) -> tuple[Any, Any]:
    """``[N, T]`` token ids after the shared prefix (right-padded: causal attention never looks
    at the padding) and labels: the id where the loss mask is 1, else -100."""
    import torch

    width = max(len(d.token_ids) for d in demos) - shared
    ids = torch.zeros(len(demos), width, dtype=torch.long)
    labels = torch.full((len(demos), width), -100, dtype=torch.long)
    for row, d in enumerate(demos):
        tokens = torch.tensor(d.token_ids[shared:])
        ids[row, : len(tokens)] = tokens
        trained = torch.tensor(d.loss_mask[shared:], dtype=torch.bool)
        labels[row, : len(tokens)] = torch.where(trained, tokens, -100)
    return ids, labels
