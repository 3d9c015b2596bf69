"""The names a run's config chooses from: loss aggregation modes, policy losses, KL kinds,
advantage estimators (with what the config checks of each), packed-attention kernels and
compute dtypes.

Torch-free, so that loading, checking and printing a config (``agentloop train --print-config``)
imports no torch; the modules that implement each choice take their names from here.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ADV_ESTIMATORS",
    "AGG_MODES",
    "COMPUTE_DTYPES",
    "ESTIMATOR_SPECS",
    "KL_KINDS",
    "PACKED_ATTN_IMPLEMENTATIONS",
    "POLICY_LOSS_MODES",
    "TURN_ESTIMATORS",
    "EstimatorSpec",
]

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_KINDS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
POLICY_LOSS_MODES = ("vanilla", "gspo")


@dataclass(frozen=True)
class EstimatorSpec:
    """What the config checks of an advantage estimator; its function is the row of the same
    name in ``trainers/advantages.py``'s ``ESTIMATORS``."""

    group_baseline: bool
    """Its baseline is the rest of the prompt's group, so it needs ``rollout.n >= 2``."""
    per_turn: bool = False
    """It credits each turn from per-turn rewards (``Trajectory.turn_rewards``): it has no
    token-level form and takes no KL in the reward (``algorithm.use_kl_in_reward``)."""


#: The advantage estimators by name (``algorithm.adv_estimator``); the config reads this table.
ESTIMATOR_SPECS: dict[str, EstimatorSpec] = {
    "grpo": EstimatorSpec(group_baseline=True),
    "rloo": EstimatorSpec(group_baseline=True),
    "reinforce_plus_plus": EstimatorSpec(group_baseline=False),
    "turn_rloo": EstimatorSpec(group_baseline=True, per_turn=True),
}
ADV_ESTIMATORS = tuple(ESTIMATOR_SPECS)
#: Estimators that credit each turn from per-turn rewards (see ``trainers/turn_advantages.py``).
TURN_ESTIMATORS = tuple(name for name, spec in ESTIMATOR_SPECS.items() if spec.per_turn)
#: The trainer's compute dtypes on CUDA (on a CPU everything is fp32).
COMPUTE_DTYPES = ("bfloat16", "float32")

# Attention implementations that keep packed sequences apart given restarting position_ids and
# no attention_mask (transformers 5.x): sdpa/eager/flex through masking_utils'
# find_packed_sequence_indices (a block-diagonal causal mask; sdpa/eager materialise it as
# [1, 1, T, T]), flash through cu_seqlens (trainers/logprobs.py passes them: a varlen kernel,
# no T² mask).
PACKED_ATTN_IMPLEMENTATIONS = (
    "sdpa",
    "eager",
    "flex_attention",
    "flash_attention_2",
    "flash_attention_3",
    "varlen",  # agentloop.trainers.varlen: PyTorch's varlen kernel (CUDA), SDPA per sequence (CPU)
)
