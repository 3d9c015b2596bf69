"""Real model shapes for the benchmarks' random-init models (nothing is downloaded): Qwen2.5-0.5B,
1.5B and 3B (tied embeddings), 7B and 32B (untied, a larger vocab)."""

from __future__ import annotations

from typing import Any

QWEN2_SHAPES: dict[str, dict[str, Any]] = {
    "0.5B": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "1.5B": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                 num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 tie_word_embeddings=True),
    "3B": dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008,
               num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
               tie_word_embeddings=True),
    "7B": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False),
    "32B": dict(vocab_size=152064, hidden_size=5120, intermediate_size=27648,
                num_hidden_layers=64, num_attention_heads=40, num_key_value_heads=8,
                tie_word_embeddings=False),
}  # fmt: skip
