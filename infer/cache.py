"""KV-cache bookkeeping for tree verification.

The verify forward appends the KV of all N+1 tree nodes after the prefix. Only the accepted root-to-node
path belongs to the sequence, so its entries are gathered into the contiguous slots right after the
prefix and everything after them is dropped. Accepted tokens are never re-run.

Two caches: transformers' ``DynamicCache`` (grows by concatenation: every verify forward re-allocates
and copies each layer's whole KV) and its ``StaticCache`` (`new_static_cache`: one buffer per layer
sized for the whole generation, written in place at the next free slots; compaction moves the
accepted entries and resets the fill level, nothing is re-allocated per step).
"""

from __future__ import annotations

from torch import Tensor


def _is_static(layer) -> bool:
    from transformers.cache_utils import StaticLayer

    return isinstance(layer, StaticLayer)


def compact(cache, past_len: int, keep: Tensor) -> None:
    """Keep tree nodes ``keep`` ([n] long, node indices, root first) at slots past_len..past_len+n-1.

    cache: a transformers ``Cache`` whose layers hold ``keys``/``values`` of shape [B, H_kv, S, D]
    with S = past_len + N + 1 after the verify forward (a static layer: S = its capacity, filled up to
    past_len + N + 1). Works in place: the root (node 0) already sits at slot past_len, so only the
    n-1 accepted drafts are gathered (one ``index_select`` and one copy per layer and tensor); then a
    dynamic layer is truncated to past_len + n and a static one's fill level set to it.
    """
    n = keep.shape[0]
    src = keep[1:] + past_len  # [n-1] the accepted drafts' current slots
    for layer in cache.layers:
        static = _is_static(layer)
        for name in ("keys", "values"):
            t = getattr(layer, name)
            if n > 1:
                t[:, :, past_len + 1 : past_len + n] = t.index_select(2, src)
            if not static:
                setattr(layer, name, t[:, :, : past_len + n])
        if static:
            layer.cumulative_length.fill_(past_len + n)


def new_cache():
    """A cache that keeps every position in every layer.

    Sliding-window layers are *not* evicted here: rejected tree nodes would otherwise push valid prefix
    tokens out of the window. The window is applied through the attention mask instead
    (`infer.tree.attention_mask`), which gives the same attention as the model's own sliding cache.
    """
    from transformers import DynamicCache

    return DynamicCache()


def new_static_cache(config, max_len: int):
    """transformers' ``StaticCache`` of ``max_len`` slots per layer, for a model without sliding-window
    layers (a static sliding layer is a ring buffer: rejected drafts would overwrite the prefix).

    Its layers return all ``max_len`` slots to attention; the verify mask covers only the filled ones
    and `infer.attention.tree_attention` attends to those alone."""
    from transformers import StaticCache

    return StaticCache(config=config, max_cache_len=max_len)


def ensure_capacity(cache, needed: int) -> None:
    """Grow every static layer of ``cache`` to at least ``needed`` slots (doubling; a tree larger than
    planned for). The filled slots are copied once; dynamic layers are left alone."""
    import torch

    for layer in cache.layers:
        if not _is_static(layer) or layer.max_cache_len >= needed:
            continue
        size = max(needed, 2 * layer.max_cache_len)
        if layer.is_initialized:
            fill = int(layer.cumulative_length)
            for name in ("keys", "values"):
                old = getattr(layer, name)
                new = torch.zeros((*old.shape[:2], size, old.shape[3]), dtype=old.dtype, device=old.device)
                new[:, :, :fill] = old[:, :, :fill]
                setattr(layer, name, new)
        layer.max_cache_len = size
