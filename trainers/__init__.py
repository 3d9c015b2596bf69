"""Training: advantages and losses, batching/packing, policy worker, orchestration."""
