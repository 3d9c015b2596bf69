"""Check verl's side of the race on a CPU, without Ray or a GPU: compose verl 0.9.1's own
``ppo_trainer.yaml`` with ``verl_grpo.py``'s overrides through Hydra, run its ``validate_config``
and its rollout-config dataclass checks, and (multi variant) build ``RaceAgentLoop`` from the
agent-loop YAML the way verl's ``AgentLoopWorker`` does and play one episode against a fake
server manager that samples random ids.

    PYTHONPATH=/tmp/peer-verl python bench/peers/verl_check.py --model DIR --variant multi

``DIR``: a Qwen2 model dir (its config.json and tokenizer; no weights are read).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from verl_grpo import overrides, write_data  # noqa: E402  (bench/peers is not a package)
from workload import Workload  # noqa: E402


def compose(w: Workload, model: Path, out: Path) -> Any:
    """verl's config for the race, composed and checked by verl's own code."""
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils import omega_conf_to_dataclass
    from verl.utils.config import validate_config

    data, reward = write_data(w, out)
    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        cfg = hydra_compose("ppo_trainer", overrides=overrides(w, model, data, reward, out))
    OmegaConf.resolve(cfg)
    ref, critic = need_reference_policy(cfg), need_critic(cfg)
    validate_config(config=cfg, use_reference_policy=ref, use_critic=critic)
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    print(f"composed and validated: reference policy {ref}, critic {critic}, "
          f"ignore_eos {rollout.ignore_eos}, response_length {rollout.response_length}, "
          f"agent loop {rollout.agent.default_agent_loop}")  # fmt: skip
    return cfg


class FakeServer:
    """verl's server manager, faked: random ids, as many as the request's ``max_tokens``."""

    def __init__(self, vocab: int) -> None:
        self.vocab, self.max_tokens = vocab, []

    async def generate(self, *, request_id: str, prompt_ids: list[int],
                       sampling_params: dict[str, Any], **kw: Any) -> Any:  # fmt: skip
        from verl.workers.rollout.replica import TokenOutput

        n = sampling_params["max_tokens"]
        self.max_tokens.append(n)
        ids = [random.randrange(1000, self.vocab) for _ in range(n)]
        step = len(self.max_tokens)  # as verl's client tags outputs with the weights' version
        extra = {"min_global_steps": step, "max_global_steps": step}
        return TokenOutput(token_ids=ids, log_probs=[-1.0] * n, extra_fields=extra)


def play(cfg: Any, model: Path) -> None:
    """One episode of the agent loop the config names, built as verl's workers build it."""
    import hydra
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    rollout = cfg.actor_rollout_ref.rollout
    (entry,) = OmegaConf.load(rollout.agent.agent_loop_config_path)
    tok = AutoTokenizer.from_pretrained(model)
    server = FakeServer(len(tok))

    async def episode() -> Any:  # the loop keeps the running event loop, as in verl's workers
        loop = hydra.utils.instantiate(
            config=entry, trainer_config=DictConfigWrap(config=cfg), server_manager=server,
            tokenizer=tok, processor=None, hf_model_type="qwen2", dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(cfg.data), tools=ToolListWrap([]),
        )  # fmt: skip
        prompt = [{"role": "user", "content": "Task 0: the a of"}]
        return await loop.run({"temperature": 1.0, "logprobs": True}, raw_prompt=prompt)

    out = asyncio.run(episode())
    mask = out.response_mask
    runs = [[mask[0], 0]]
    for m in mask:
        if m == runs[-1][0]:
            runs[-1][1] += 1
        else:
            runs.append([m, 1])
    print(f"requests max_tokens {server.max_tokens}; response {len(out.response_ids)} tokens, "
          f"sampled {sum(mask)}, mask runs (mask, length) {[tuple(r) for r in runs]}, "
          f"logprobs {len(out.response_logprobs or [])}")  # fmt: skip
    assert len(out.response_logprobs or []) == len(mask) == len(out.response_ids)
    steps = (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"])
    assert steps == (1, len(server.max_tokens)), steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--variant", default="multi")
    args = parser.parse_args()
    w = Workload(variant=args.variant)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose(w, args.model, Path(tmp))
        if w.turns > 1:
            play(cfg, args.model)


if __name__ == "__main__":
    main()
