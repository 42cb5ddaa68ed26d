"""Named shapes of the random Llama targets the benchmarks build (`bench.measure.random_llama`): timing
depends on these sizes, not on the weights."""

from __future__ import annotations

# `transformers.LlamaConfig`'s names for `llama_shape`'s arguments, in their order.
_CONFIG_KEYS = (
    "vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads num_key_value_heads "
    "max_position_embeddings"
).split()


def llama_shape(
    vocab: int, hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, max_pos: int
) -> dict[str, int]:
    """`transformers.LlamaConfig` keyword arguments: vocabulary size, hidden and MLP widths, decoder layers,
    query and key/value heads (fewer key/value heads: grouped-query attention), positions."""
    return dict(
        zip(_CONFIG_KEYS, (vocab, hidden, intermediate, layers, heads, kv_heads, max_pos), strict=True)
    )


# TinyLlama-1.1B's shape: 22 layers, hidden 2048, 32 query / 4 KV heads (8:1 grouped-query attention).
LLAMA_1B = llama_shape(32000, 2048, 5632, layers=22, heads=32, kv_heads=4, max_pos=2048)
# The same code path in seconds on a CPU (the test suite's end-to-end run of the device check).
LLAMA_SMALL = llama_shape(128, 64, 128, layers=2, heads=4, kv_heads=2, max_pos=512)
# About 35M parameters in fp32: long contexts stay affordable on a CPU (`bench.target_step`).
LLAMA_35M = llama_shape(32000, 384, 1024, layers=6, heads=6, kv_heads=2, max_pos=8192)
