"""The EAGLE-3 draft layer's attention kernel, with the training-time-test "diagonal" keys."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers import AttentionInterface

ATTN_IMPLEMENTATION = "selfspec_eagle3"


def _grouped(x: Tensor, kv_heads: int) -> Tensor:
    """[B, h, T, D] -> [B, h_kv, G·T, D] (G = h / h_kv): query head h reads kv head h // G (GQA), so the
    G heads of a group share one matmul against the un-repeated keys/values."""
    B, h, T, D = x.shape
    return x.reshape(B, kv_heads, (h // kv_heads) * T, D)


def eagle3_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    softcap: float | None = None,
    eagle3_ttt: tuple[dict[int, tuple[Tensor, Tensor]], int] | None = None,
    **_: Any,
) -> tuple[Tensor, None]:
    """The draft layer's attention kernel (registered as ``"selfspec_eagle3"`` in transformers'
    ``AttentionInterface``; the layer's own q/k/v/o projections, q/k norms and RoPE run around it).

    query: [B, h, T, D]; key/value: [B, h_kv, S, D]; attention_mask: additive [B or 1, 1, T, S] or None.
    softmax(q·kᵀ·scaling, soft-capped, + mask) in fp32, as the architectures' eager kernels do. GQA
    groups the query heads per kv head (`_grouped`) instead of repeating the keys and values.

    eagle3_ttt = (store, j): TTT step j. ``store`` maps step -> (keys, values) [B, h_kv, T, D] of that
    step, aligned with the queries; this call stores its own keys under j. Then the keys are the step-0
    keys of every pair (masked by ``attention_mask``, the causal pair mask) plus, for query t, the keys
    of pair t itself at steps 1..j (one extra score per earlier step: no (K·T)² mask). Gradients flow
    through the stored keys into earlier steps; gradient checkpointing of the draft layer is therefore
    not supported (a recomputed step would see earlier steps' keys without their graph).
    """
    if scaling is None:
        scaling = module.head_dim**-0.5
    extra: list[tuple[Tensor, Tensor]] = []
    if eagle3_ttt is not None:
        store, step = eagle3_ttt
        store[step] = (key, value)
        key, value = store[0]
        extra = [store[i] for i in range(1, step + 1)]
    B, h, T, D = query.shape
    kv = key.shape[1]
    S = key.shape[2]
    q = _grouped(query, kv)  # [B, h_kv, G·T, D]
    scores = torch.matmul(q, key.transpose(2, 3)).view(B, h, T, S) * scaling  # [B, h, T, S]
    if extra:
        q5 = q.view(B, kv, h // kv, T, D)
        diag = torch.stack([(q5 * ke[:, :, None]).sum(-1) for ke, _ in extra], -1).view(B, h, T, -1)
        diag = diag * scaling  # [B, h, T, j]: query t against pair t's keys at steps 1..j
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
        if extra:
            diag = torch.tanh(diag / softcap) * softcap
    if attention_mask is not None:
        scores = scores + attention_mask
    if extra:
        scores = torch.cat([scores, diag], -1)  # [B, h, T, S + j]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    out = torch.matmul(_grouped(probs[..., :S], kv), value).view(B, kv, h // kv, T, D)
    for i, (_, ve) in enumerate(extra):
        out = out + probs[..., S + i].reshape(B, kv, h // kv, T, 1) * ve[:, :, None]
    return out.view(B, h, T, D).transpose(1, 2).contiguous(), None


def register_attention() -> None:
    """Make ``"selfspec_eagle3"`` a transformers attention implementation (idempotent)."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, eagle3_attention)
