"""verl's GRPO step on the race workload, through its own entry point
(``python -m verl.trainer.main_ppo``: Ray, FSDP actor, vLLM async rollout, one GPU).

    python bench/peers/verl_grpo.py --model /root/models/race-0.5B --out DIR [--steps 5]

Writes the dataset (``DIR/train.parquet``: ``data_source``, ``prompt`` chat messages,
``reward_model``, ``extra_info``) and the reward function file (random scores, as the others
get), then runs verl with Hydra overrides; its console logger's ``step:N - timing_s/gen:...``
lines go to stdout and are what ``results.parse_verl`` reads. ``--print`` shows the command.
flash-attn is not staged: the actor runs SDPA on padded batches (``use_remove_padding=false``).

The multi variant adds ``DIR/race_agent_loops.yaml`` (verl's ``agent_loop_config_path``) naming
``verl_race_loop.RaceAgentLoop`` as the default agent loop, and this folder to the PYTHONPATH its
Ray workers inherit (they import the loop).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from workload import Workload, prompt_text, step_parser, workload_of  # noqa: E402  (bench/peers is not a package)

REWARD = '''"""Random scores in [0, 1): nonzero advantages in every group, as the others get."""
import random


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return random.random()
'''


def write_data(w: Workload, out: Path) -> tuple[Path, Path]:
    import pandas as pd

    rows = [{"data_source": "race", "prompt": [{"role": "user", "content": prompt_text(i)}],
             "ability": "race", "reward_model": {"style": "rule", "ground_truth": ""},
             "extra_info": {"index": i, "split": "train"}} for i in range(w.prompts)]  # fmt: skip
    data = out / "train.parquet"
    pd.DataFrame(rows).to_parquet(data)
    reward = out / "race_reward.py"
    reward.write_text(REWARD)
    return data, reward


AGENT_LOOPS = """# rollout.agent.agent_loop_config_path: bench/peers/verl_race_loop.py
- name: race_turns
  _target_: verl_race_loop.RaceAgentLoop
  turns: {turns}
  turn_tokens: {turn_tokens}
  tool_tokens: {tool_tokens}
"""


def agent_loops(w: Workload, out: Path) -> list[str]:
    """The multi variant's agent-loop overrides (none for single): the loop's YAML, written."""
    if w.turns == 1:
        return []
    path = out / "race_agent_loops.yaml"
    path.write_text(AGENT_LOOPS.format(turns=w.turns, turn_tokens=w.turn_tokens,
                                       tool_tokens=w.tool_tokens))  # fmt: skip
    r = "actor_rollout_ref.rollout"
    return [f"{r}.agent.agent_loop_config_path={path}", f"{r}.agent.default_agent_loop=race_turns"]


def overrides(w: Workload, model: Path, data: Path, reward: Path, out: Path) -> list[str]:
    """Hydra overrides of verl 0.9.1's ``ppo_trainer.yaml`` (every key checked against it)."""
    a, r = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    return [*agent_loops(w, out),
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=false",
        f"data.train_files={data}", f"data.val_files={data}",
        f"data.train_batch_size={w.prompts}", "data.max_prompt_length=256",
        f"data.max_response_length={w.max_response}", "data.dataloader_num_workers=0",
        "data.filter_overlong_prompts=false", "data.truncation=error",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        f"{a}.optim.lr={w.lr}", f"{a}.ppo_mini_batch_size={w.prompts}", f"{a}.ppo_epochs=1",
        f"{a}.use_dynamic_bsz=true", f"{a}.ppo_max_token_len_per_gpu=16384",
        f"{a}.use_kl_loss=false", f"{a}.entropy_coeff=0",
        f"{a}.fsdp_config.param_offload=false", f"{a}.fsdp_config.optimizer_offload=false",
        f"{r}.name=vllm", f"{r}.mode=async", f"{r}.n={w.samples}",
        f"{r}.tensor_model_parallel_size=1", f"{r}.gpu_memory_utilization=0.2",
        f"{r}.ignore_eos=true", f"{r}.temperature=1.0", f"{r}.top_p=1", f"{r}.top_k=-1",
        f"{r}.max_num_seqs={w.sequences}", f"{r}.enforce_eager=false",
        f"{r}.log_prob_use_dynamic_bsz=true", f"{r}.log_prob_max_token_len_per_gpu=16384",
        f"reward.custom_reward_function.path={reward}",
        "reward.custom_reward_function.name=compute_score",
        "trainer.critic_warmup=0", "trainer.logger=[console]", "trainer.project_name=race",
        "trainer.experiment_name=grpo", "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
        "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.val_before_train=false",
        f"trainer.total_training_steps={w.steps}", "trainer.total_epochs=1000",
        "trainer.resume_mode=disable", f"trainer.default_local_dir={out / 'ckpt'}",
    ]  # fmt: skip


def main() -> None:
    parser = step_parser(__doc__)
    parser.add_argument("--print", action="store_true", help="print the command and stop")
    args = parser.parse_args()
    w = workload_of(args)
    args.out.mkdir(parents=True, exist_ok=True)
    data, reward = write_data(w, args.out)
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo",
           *overrides(w, args.model, data, reward, args.out)]  # fmt: skip
    if args.print:
        print(" ".join(cmd))
        return
    # verl's Ray workers inherit this environment: no network, no usage reports
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", WANDB_MODE="disabled",
               TOKENIZERS_PARALLELISM="false", RAY_DEDUP_LOGS="0")  # fmt: skip
    if w.turns > 1:  # the workers import verl_race_loop (and its workload) from this folder
        env["PYTHONPATH"] = ":".join(p for p in (env.get("PYTHONPATH"), str(HERE)) if p)
    sys.exit(subprocess.run(cmd, env=env, cwd=args.out).returncode)


if __name__ == "__main__":
    main()
