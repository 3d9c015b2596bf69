"""Where a weight update is cut into chunks (agentloop/engines/weight_chunks.py)."""

from __future__ import annotations

import math

from agentloop.engines.weight_chunks import ChunkPlan, block_of

# A two-layer Qwen2-shaped checkpoint: embeddings, then per layer attention and MLP, then the head.
SHAPES: dict[str, tuple[int, ...]] = {
    "model.embed_tokens.weight": (64, 16),
    **{
        f"model.layers.{i}.{part}": shape
        for i in range(2)
        for part, shape in {
            "self_attn.q_proj.weight": (16, 16),
            "self_attn.k_proj.weight": (8, 16),
            "self_attn.v_proj.weight": (8, 16),
            "self_attn.o_proj.weight": (16, 16),
            "mlp.gate_proj.weight": (32, 16),
            "mlp.up_proj.weight": (32, 16),
            "mlp.down_proj.weight": (16, 32),
            "input_layernorm.weight": (16,),
        }.items()
    },
    "model.norm.weight": (16,),
    "lm_head.weight": (64, 16),
}


def _cut(plan: ChunkPlan, itemsize: int) -> list[list[str]]:
    chunks: list[list[str]] = []
    for name, shape in SHAPES.items():
        if plan.starts_chunk(name, math.prod(shape), itemsize) or not chunks:
            chunks.append([])
        chunks[-1].append(name)
    return chunks


def test_blocks_are_never_split_and_a_block_that_would_not_fit_starts_a_chunk() -> None:
    layer = [math.prod(s) for n, s in SHAPES.items() if block_of(n) == "model.layers.0"]
    layer_bytes = 2 * sum(layer)
    # a layer fits; after the embeddings, a layer's first tensor would fit but not the layer
    limit = layer_bytes + 100
    chunks = _cut(ChunkPlan.for_checkpoint(SHAPES, limit), itemsize=2)
    blocks = [[block_of(n) for n in c] for c in chunks]
    assert [sorted(set(b)) for b in blocks] == [
        ["model.embed_tokens"], ["model.layers.0"], ["model.layers.1", "model.norm"],
        ["lm_head"],
    ]  # fmt: skip
    assert [n for c in chunks for n in c] == list(SHAPES)  # every tensor, in order, once
    for chunk in chunks:
        size = 2 * sum(math.prod(SHAPES[n]) for n in chunk)
        assert size <= limit or len({block_of(n) for n in chunk}) == 1


def test_a_block_larger_than_the_limit_is_a_chunk_alone_and_sets_the_capacity() -> None:
    plan = ChunkPlan.for_checkpoint(SHAPES, limit=256)
    chunks = _cut(plan, itemsize=2)
    assert all(len({block_of(n) for n in c}) == 1 for c in chunks)
    largest = 2 * max(
        sum(math.prod(s) for n, s in SHAPES.items() if block_of(n) == b)
        for b in {block_of(n) for n in SHAPES}
    )
    assert plan.capacity(2) == largest > 256
    total = 4 * sum(math.prod(s) for s in SHAPES.values())
    assert ChunkPlan.for_checkpoint(SHAPES, limit=1 << 30).capacity(4) == total  # not the limit
    assert ChunkPlan.for_checkpoint({}, limit=1 << 20).capacity(4) == 1 << 20
