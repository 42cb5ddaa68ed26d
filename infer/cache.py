"""KV-cache bookkeeping for tree verification.

The verify forward appends the KV of all N+1 tree nodes after the prefix. Only the accepted root-to-node
path belongs to the sequence, so its entries are gathered into the contiguous slots right after the
prefix and everything after them is dropped. Accepted tokens are never re-run.
"""

from __future__ import annotations

from torch import Tensor


def compact(cache, past_len: int, keep: Tensor) -> None:
    """Keep tree nodes ``keep`` ([n] long, node indices, root first) at slots past_len..past_len+n-1.

    cache: a transformers ``Cache`` whose layers hold ``keys``/``values`` of shape [B, H_kv, S, D]
    with S = past_len + N + 1 after the verify forward. Works in place: the root (node 0) already sits
    at slot past_len, so only the n-1 accepted drafts are gathered (one ``index_select`` and one copy
    per layer and tensor); when nothing was accepted the cache is only truncated.
    """
    n = keep.shape[0]
    src = keep[1:] + past_len  # [n-1] the accepted drafts' current slots
    for layer in cache.layers:
        for name in ("keys", "values"):
            t = getattr(layer, name)
            if n > 1:
                t[:, :, past_len + 1 : past_len + n] = t.index_select(2, src)
            setattr(layer, name, t[:, :, : past_len + n])


def new_cache():
    """A cache that keeps every position in every layer.

    Sliding-window layers are *not* evicted here: rejected tree nodes would otherwise push valid prefix
    tokens out of the window. The window is applied through the attention mask instead
    (`infer.tree.attention_mask`), which gives the same attention as the model's own sliding cache.
    """
    from transformers import DynamicCache

    return DynamicCache()
