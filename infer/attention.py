"""Tree attention as a registered attention function, and the tree mask in one preallocated buffer.

transformers' own ``sdpa`` path repeats K/V for every query head as soon as a mask is given
(docs/design.md §5): on a 4:1 grouped-query model that copies the whole cached prefix 4x, in every
layer, at every verify step. `tree_attention` is registered in transformers' ``AttentionInterface``
under ``ATTN_IMPLEMENTATION`` and receives the un-repeated K/V. It folds the query heads that share
a KV head into the query length,

    q [B, h, T, D] -> [B, h_kv, g·T, D]  (g = h / h_kv; head j uses KV head j // g, as repeat_kv does)

so one SDPA call over h_kv heads computes exactly softmax(q·kᵀ·scale + mask)·v of every head with
no K/V copy, whatever kernel SDPA picks. (``enable_gqa=True`` with a mask does the same on CPU, about
as fast here; transformers itself only uses it without a mask on CUDA, where not every masked kernel
implements it. Neither was measured on a GPU.) Only the mask is tiled g times, once per forward (all
layers share it): g·T·S bytes against 2·h·S·D·itemsize per layer for the K/V repeat.

`TreeMask` keeps the boolean tree mask of a whole generation in one buffer: the prefix columns are
always visible, so a step only rewrites the previous tree's block (now prefix) and its own.
Measured on this project's CPU (`scripts/bench_target_step.py`, `results/target-step-cpu/`).

`TreeRunner` switches an ``sdpa`` target whose attention dispatches through the interface
(``_supports_attention_backend``) to this function for the duration of each of its forwards only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import sdpa_mask

from heads.graft import unwrap_peft

ATTN_IMPLEMENTATION = "selfspec_tree"
# (mask, groups, tiled mask) of the last forward's masks (two: full and sliding layers), for all its layers
_packed: list[tuple[Tensor, int, Tensor]] = []


def _tile_mask(mask: Tensor, groups: int) -> Tensor:
    """mask [B, 1, T, S] -> [B, 1, g·T, S], row r·T + t = row t (query head r of each KV group).

    Every layer of one forward gets the same mask object (one per layer type), so each is tiled once
    per forward. The memo holds the masks themselves, so their memory cannot be reused by another
    mask while an entry lives. `TreeMask` and `BatchTreeMask` write their buffers in place between
    forwards but return a new view object each step, so a memo entry never matches a later step. Under
    ``torch.compile`` the memo is bypassed (the graph computes the tiling; a memo would be guarded on)."""
    B, _, T, S = mask.shape
    if torch.compiler.is_compiling():  # traced, the memo would be guarded on (a recompile per step)
        return mask.expand(B, groups, T, S).reshape(B, 1, groups * T, S)
    for src, g, tiled in _packed:
        if src is mask and g == groups:
            return tiled
    tiled = mask.expand(B, groups, T, S).reshape(B, 1, groups * T, S)
    _packed[:] = [*_packed[-1:], (mask, groups, tiled)]
    return tiled


def tree_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """query [B, h, T, D]; key/value [B, h_kv, S, D] (not repeated); attention_mask: boolean (True =
    attend) or additive [B or 1, 1, T, S'], or None for plain causal attention over T = S (a prefill).
    S' < S (a static cache's unfilled slots after the mask's columns): only the first S' keys count.
    Returns ([B, T, h, D], None) like transformers' attention functions."""
    for name in ("position_bias", "s_aux", "sinks"):
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"selfspec tree attention does not implement {name!r}")
    if softcap is not None:
        raise NotImplementedError("selfspec tree attention does not implement softcap; use eager")
    if attention_mask is not None and attention_mask.shape[-1] < key.shape[2]:
        # a static cache hands over all its slots; the runner's mask covers the filled ones only
        key, value = key[:, :, : attention_mask.shape[-1]], value[:, :, : attention_mask.shape[-1]]
    B, h, T, D = query.shape
    h_kv, S = key.shape[1], key.shape[2]
    g = h // h_kv
    causal = attention_mask is None and T > 1
    if causal and S != T:
        raise ValueError(f"causal attention without a mask needs as many keys as queries, got {T} and {S}")
    p = dropout if module.training else 0.0
    if attention_mask is None:  # a prefill (or one token): causal SDPA takes GQA natively, no mask needed
        out = nn.functional.scaled_dot_product_attention(
            query, key, value, dropout_p=p, scale=scaling, is_causal=causal, enable_gqa=g > 1
        )
        return out.transpose(1, 2).contiguous(), None
    # fold the groups into the query length when the tiled mask is smaller than the K/V repeat it
    # replaces (a tree: T <= 64); a long masked prefill keeps the mask as is and asks SDPA for GQA
    fold = g > 1 and g * T < 2 * (h - h_kv) * D * key.element_size()
    if fold:
        query = query.reshape(B, h_kv, g * T, D)
        attention_mask = _tile_mask(attention_mask, g)
    out = nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=p, scale=scaling, enable_gqa=g > 1 and not fold
    )
    if fold:
        out = out.reshape(B, h, T, D)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Register `tree_attention` (and sdpa's mask builder for it, so prefills and sliding windows get
    the masks sdpa would get) with transformers. Idempotent."""
    if ATTN_IMPLEMENTATION not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTN_IMPLEMENTATION, tree_attention)
    if ATTN_IMPLEMENTATION not in AttentionMaskInterface._global_mapping:
        AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)


def wants_tree_attention(model: nn.Module) -> bool:
    """True for an ``sdpa`` target whose attention layers dispatch through ``AttentionInterface``."""
    base = unwrap_peft(model)
    return base.config._attn_implementation == "sdpa" and bool(
        getattr(base, "_supports_attention_backend", False)
    )


@contextlib.contextmanager
def attention_implementation(model: nn.Module, name: str) -> Iterator[None]:
    """Run ``model`` with ``config._attn_implementation = name`` (and its sub-configs) inside the block."""
    cfg = unwrap_peft(model).config
    saved = cfg._attn_implementation
    cfg._attn_implementation = name
    try:
        yield
    finally:
        cfg._attn_implementation = saved


class TreeMask:
    """The boolean tree mask [1, 1, N+1, past + N+1] of every step of one generation, in one buffer.

    Column j < past (the cached prefix) is True in every row; the tree block holds ``ancestors``
    (node i sees node j iff j is i or an ancestor of i). The buffer grows (doubling) only when a tree
    or the sequence outgrows it; size it with the expected maximum to allocate once.
    """

    def __init__(self, max_nodes: int, max_len: int, device: torch.device) -> None:
        self.buf = torch.ones(1, 1, max_nodes, max_len, dtype=torch.bool, device=device)
        self.block: tuple[int, int] = (0, 0)  # (past, n) of the tree block written last

    def __call__(self, ancestors: Tensor, past: int) -> Tensor:
        n = ancestors.shape[0]
        rows, cols = self.buf.shape[2:]
        if n > rows or past + n > cols:
            grown = torch.ones(
                1, 1, max(n, rows), max(past + n, 2 * cols), dtype=torch.bool, device=self.buf.device
            )
            grown[..., :rows, :cols] = self.buf
            self.buf = grown
        old_past, old_n = self.block
        self.buf[0, 0, :, old_past : old_past + old_n] = True  # the last tree's columns are prefix now
        self.buf[0, 0, :n, past : past + n] = ancestors
        self.block = (past, n)
        return self.buf[:, :, :n, : past + n]


class BatchTreeMask:
    """The masks of every verify step of one batched generation, in buffers allocated once.

    Step masks are [B, 1, n, S + n] views (S filled slots, n tree nodes per row): row b's node i sees
    slot j iff ``kv_pos[b, j] >= 0`` (a filled slot, `infer.cache.RaggedKV`) and tree node k iff k is
    i or an ancestor of i. With a sliding ``window`` the sliding layers' mask also needs
    ``q_pos - k_pos < window`` (by position, not slot: holes do not count); ``additive`` gives the
    float masks (0 / ``finfo.min``) that eager and transformers' sdpa take, else the boolean ones of
    `tree_attention`. Each step rewrites the [B, n, S + n] window in place (its prefix columns change
    as the window slides and when rows are packed), with no temporary of that size. The buffers
    ([B, rows, cols] per kind) grow (doubling) only when a tree or the sequence outgrows them; a batch
    that lost rows uses their first rows.
    """

    def __init__(self, batch: int, rows: int, cols: int, device: torch.device, *, window: int | None = None,
                 mixed: bool = False, additive: torch.dtype | None = None) -> None:  # fmt: skip
        self.window, self.mixed, self.additive, self.device = window, mixed, additive, device
        self.kinds = ["full_attention"] + (["sliding_attention"] if window is not None else [])
        self._alloc(batch, rows, cols)

    def _alloc(self, batch: int, rows: int, cols: int) -> None:
        shape, dev = (batch, rows, cols), self.device
        self.filled = torch.zeros(batch, cols, dtype=torch.bool, device=dev)  # kv_pos >= 0, per slot
        self.vis = {k: torch.zeros(shape, dtype=torch.bool, device=dev) for k in self.kinds}
        # additive buffers only for the masks handed out: a sliding-only model needs no full one
        handed = self.kinds if self.mixed else self.kinds[-1:]
        self.add = {k: torch.zeros(shape, dtype=self.additive, device=dev) for k in handed} if self.additive else {}

    def __call__(self, kv_pos: Tensor, ancestors: Tensor, q_pos: Tensor):
        """kv_pos [B, S] long (-1: a hole), ancestors [B, n, n] bool, q_pos [B, n] long -> the mask
        [B, 1, n, S + n] (bool or additive), or a dict of them per layer type for mixed models."""
        (B, S), n = kv_pos.shape, ancestors.shape[1]
        b0, r0, c0 = self.filled.shape[0], *self.vis["full_attention"].shape[1:]
        if B > b0 or n > r0 or S + n > c0:
            self._alloc(max(B, b0), max(n, r0), max(S + n, 2 * c0))
        torch.ge(kv_pos, 0, out=self.filled[:B, :S])
        vis = self.vis["full_attention"][:B, :n, : S + n]
        vis[:, :, :S] = self.filled[:B, None, :S]
        vis[:, :, S:] = ancestors
        out = {"full_attention": vis}
        if self.window is not None:  # visible and k_pos > q_pos - window
            lo = (q_pos - self.window)[:, :, None]
            slide = self.vis["sliding_attention"][:B, :n, : S + n]
            torch.gt(kv_pos[:, None, :], lo, out=slide[:, :, :S])
            torch.gt(q_pos[:, None, :], lo, out=slide[:, :, S:])
            out["sliding_attention"] = slide.logical_and_(vis)
        if not self.mixed:
            out = {k: out[k] for k in self.kinds[-1:]}
        if self.additive is not None:
            neg = torch.finfo(self.additive).min
            out = {k: self.add[k][:B, :n, : S + n].fill_(neg).masked_fill_(v, 0) for k, v in out.items()}
        out = {k: v[:, None] for k, v in out.items()}
        return out if self.mixed else out[self.kinds[-1]]
