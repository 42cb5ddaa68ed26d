"""KV-cache bookkeeping for tree verification.

The verify forward appends the KV of all N+1 tree nodes after the prefix. Only the accepted root-to-node
path belongs to the sequence, so its entries are gathered into the contiguous slots right after the
prefix and everything after them is dropped. Accepted tokens are never re-run.

Two caches: transformers' ``DynamicCache`` (grows by concatenation: every verify forward re-allocates
and copies each layer's whole KV) and its ``StaticCache`` (`new_static_cache`: one buffer per layer
sized for the whole generation, written in place at the next free slots; compaction moves the
accepted entries and resets the fill level, nothing is re-allocated per step). A batch keeps the
same static layout (`StaticRaggedKV`: one `FilledStaticLayer` per layer and one slot-position buffer,
[B, capacity] each), docs/design.md §4.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import Cache, StaticLayer


def _is_static(layer) -> bool:
    return isinstance(layer, StaticLayer)


def _set_fill(layer, end: int) -> None:
    """A static layer's fill level (the next write's slot) is ``end``; later slots are stale."""
    layer.cumulative_length.fill_(end)
    if isinstance(layer, FilledStaticLayer):
        layer.end = end


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
            _set_fill(layer, past_len + n)


def new_cache():
    """A cache that keeps every position in every layer.

    Sliding-window layers are *not* evicted here: rejected tree nodes would otherwise push valid prefix
    tokens out of the window. The window is applied through the attention mask instead
    (`infer.tree.attention_mask`), which gives the same attention as the model's own sliding cache.
    """
    return DynamicCache()


def new_static_cache(config, max_len: int):
    """transformers' ``StaticCache`` of ``max_len`` slots per layer, for a model without sliding-window
    layers (a static sliding layer is a ring buffer: rejected drafts would overwrite the prefix).

    Its layers return all ``max_len`` slots to attention; the verify mask covers only the filled ones
    and `infer.attention.tree_attention` attends to those alone."""
    return StaticCache(config=config, max_cache_len=max_len)


def ensure_capacity(cache, needed: int) -> None:
    """Grow every static layer of ``cache`` to at least ``needed`` slots (doubling; a tree larger than
    planned for). The filled slots are copied once; dynamic layers are left alone."""
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


def take_slots(cache, start: int, src: Tensor) -> None:
    """Row b's slots start..start+L-1 get the entries now at slots ``src[b]`` ([B, L] long), in every
    layer, and the cache ends there. One gather of the L entries and one write per layer and tensor: a
    static layer is written in place and its fill level set to start+L (the cost does not depend on its
    length), a dynamic one is cut at ``start`` and the L entries concatenated. `compact` is the one-row
    case with a contiguous destination."""
    L = src.shape[1]
    for layer in cache.layers:
        static = _is_static(layer)
        for name in ("keys", "values"):
            t = getattr(layer, name)  # [B, H_kv, S, D]
            idx = src[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3])
            moved = t.gather(2, idx)  # a copy first: source and destination slots may overlap
            if static:
                t[:, :, start : start + L] = moved
            else:
                setattr(layer, name, torch.cat([t[:, :, :start], moved], 2))
        if static:
            _set_fill(layer, start + L)


def select_rows(cache, rows: Tensor) -> None:
    """Keep only batch rows ``rows`` ([B'] long) of every layer (finished rows leave the batch): one
    ``index_select`` per layer and tensor (a static layer's buffers are re-allocated at B' rows, once)."""
    for layer in cache.layers:
        for name in ("keys", "values"):
            setattr(layer, name, getattr(layer, name).index_select(0, rows))
        if _is_static(layer) and layer.is_initialized:
            layer.batch_size = rows.shape[0]


class RaggedKV:
    """A ``DynamicCache`` for a batch whose rows hold different numbers of tokens.

    All rows share one slot axis (transformers writes a forward's KV at the same slots in every row);
    ``pos`` [B, S] long is the position id of the token in each slot, -1 for a slot that holds nothing
    for that row (left padding, a row's unaccepted share of a step's slots). Attention masks are built
    from ``pos``: a slot is visible iff pos >= 0 (and, for sliding windows, by position, not slot), so
    the holes are never attended and each row sees exactly its own sequence.
    """

    def __init__(self, pos: Tensor) -> None:
        self.cache = new_cache()
        self.pos = pos

    @property
    def slots(self) -> int:
        return self.pos.shape[1]

    def visible(self, rows_q: int) -> Tensor:
        """[B, rows_q, S] bool: the filled slots, for each of ``rows_q`` queries of every row."""
        return (self.pos >= 0)[:, None, :].expand(-1, rows_q, -1)

    def reserve(self, extra: int) -> None:
        """Room for ``extra`` more slots: a growing cache always has it."""

    def extend(self, pos: Tensor) -> None:
        """Record the positions [B, n] of the n slots a forward just appended."""
        self.pos = torch.cat([self.pos, pos], 1)

    def take(self, start: int, src: Tensor, pos: Tensor) -> None:
        """`take_slots` with the positions ``pos`` [B, L] of the moved entries (-1: none)."""
        take_slots(self.cache, start, src)
        self.pos = torch.cat([self.pos[:, :start], pos], 1)

    def clear_holes(self) -> None:
        """Zero the K/V of slots that hold no token (padding): never attended, but a masked key still
        multiplies its value by a zero weight, and padding's states need not be finite."""
        hole = (self.pos < 0)[:, None, :, None]
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                getattr(layer, name)[:, :, : hole.shape[2]].masked_fill_(hole, 0)

    def crop(self, slots: int) -> None:
        """Keep the first ``slots`` slots: drop the tail, e.g. a draft's tree steps, whose KV the cache
        holds without positions recorded here."""
        extra = self.cache.get_seq_length() - slots
        if extra > 0:
            self.cache.crop(-extra)  # transformers' crop takes minus the count to remove
        self.pos = self.pos[:, :slots]

    def select(self, rows: Tensor) -> None:
        select_rows(self.cache, rows)
        self.pos = self.pos.index_select(0, rows)

    def tolerated(self, width: int, slack: int) -> int:
        """Holes (slots beyond the longest row's ``width``) left open by `pack`: ``slack`` and half the
        longest row (a growing cache: the O(S) pack stays amortised)."""
        return max(slack, width // 2)

    def pack(self, longest: int | None = None, slack: int = 32) -> None:
        """Close the holes once they outgrow `tolerated`: each row's filled slots move, in order, to the
        right end of a slot axis as long as its longest row (a left-padded layout). O(S) copy, amortised
        over the many steps that made the holes. ``longest``: the longest row's filled slots when the
        caller knows it on the host (else read back: a sync)."""
        filled = self.pos >= 0
        width = int(filled.sum(1).max()) if longest is None else longest
        if self.slots - width <= self.tolerated(width, slack):
            return
        order = torch.sort(filled.to(torch.int8), dim=1, stable=True).indices[:, -width:]  # holes first
        self.take(0, order, self.pos.gather(1, order))


class FilledStaticLayer(StaticLayer):
    """transformers' ``StaticLayer`` (one preallocated buffer, written in place at its fill level) that
    hands attention only the filled slots [B, H_kv, end, D] (views, no copy): the draft's attention
    then costs O(filled), not O(capacity). ``end`` is the fill level kept on the host, so reading it
    never syncs; `crop` resets it with ``cumulative_length``."""

    def __init__(self, max_cache_len: int) -> None:
        super().__init__(max_cache_len)
        self.end = 0

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        self.end += key_states.shape[-2]
        return keys[:, :, : self.end], values[:, :, : self.end]

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        self.end -= abs(tokens_to_remove)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """A mask transformers builds (a prefill with a 2D mask) covers what `update` returns: the
        filled slots plus the new ones, as a dynamic layer's would."""
        return self.end + query_length, 0


def new_filled_cache(capacity: int) -> Cache:
    """A cache of `FilledStaticLayer`s of ``capacity`` slots each, for any architecture: its layers are
    plain full-length buffers (a sliding-window layer too: the window is applied by the mask, so
    rejected drafts never evict prefix entries, as in `new_cache`), written in place and grown only by
    `ensure_capacity`. The layers appear lazily, one per attention layer, at the first forward."""
    return Cache(layer_class_to_replicate=functools.partial(FilledStaticLayer, capacity))


class StaticRaggedKV(RaggedKV):
    """`RaggedKV` on preallocated buffers: every layer a `FilledStaticLayer` of ``capacity`` slots and
    the slot positions in one [B, capacity] buffer (``pos`` is the view of its first ``slots`` columns).

    A verify forward writes its N+1 nodes' KV at slots ``slots..slots+N`` of every row (in place, at the
    layers' fill level), `take` moves the accepted paths with one fixed-size gather per layer and sets
    the fill level, `crop` only moves it; nothing is allocated per step. Attention sees the filled
    slots only (views), so any attention implementation and any mask type fit. `pack` closes the
    holes once they exceed ``slack`` (the caller sizes ``capacity`` for its rows + that slack + a
    tree); `reserve` grows the buffers (doubling, one copy) only for a generation longer than planned.
    `select` re-allocates the buffers once at the remaining rows."""

    def __init__(self, pos: Tensor, capacity: int) -> None:
        B, T = pos.shape
        self.capacity = max(capacity, T)
        self.cache = new_filled_cache(self.capacity)
        self.buf = pos.new_full((B, self.capacity), -1)
        self.buf[:, :T] = pos
        self.n = T  # filled slots (host)

    @property
    def pos(self) -> Tensor:  # type: ignore[override]
        return self.buf[:, : self.n]

    def reserve(self, extra: int) -> None:
        """Room for ``extra`` more slots; grows every buffer (doubling) only if there is none."""
        need = self.n + extra
        if need <= self.capacity:
            return
        ensure_capacity(self.cache, need)
        self.capacity = max(need, 2 * self.capacity)  # as `ensure_capacity` sizes each layer
        self.cache.layer_class_to_replicate = functools.partial(FilledStaticLayer, self.capacity)
        grown = self.buf.new_full((self.buf.shape[0], self.capacity), -1)
        grown[:, : self.n] = self.pos
        self.buf = grown

    def extend(self, pos: Tensor) -> None:
        m = pos.shape[1]
        self.buf[:, self.n : self.n + m] = pos
        self.n += m

    def take(self, start: int, src: Tensor, pos: Tensor) -> None:
        take_slots(self.cache, start, src)
        self.buf[:, start : start + pos.shape[1]] = pos
        self.n = start + pos.shape[1]

    def crop(self, slots: int) -> None:
        for layer in self.cache.layers:
            if layer.end > slots:
                _set_fill(layer, slots)
        self.n = min(self.n, slots)

    def select(self, rows: Tensor) -> None:
        select_rows(self.cache, rows)
        self.buf = self.buf.index_select(0, rows)

    def tolerated(self, width: int, slack: int) -> int:
        """Exactly ``slack``: the capacity was planned for it."""
        return slack


class StaticDraftKV:
    """The EAGLE draft layer's KV for batch size 1 with nothing padded: `RaggedKV`'s interface over a
    preallocated `FilledStaticLayer` and one preallocated additive mask buffer.

    ``buf`` [1, R, capacity] (R = max(mask_rows, the longest commit seen)) keeps one invariant between
    calls: the committed columns (< ``slots``) are 0 (visible), every later column is ``finfo.min``.
    A commit writes its causal block in place (`commit_mask`) and `extend` turns those columns visible;
    a propose's tree block lives after ``slots`` (`tree_mask`) and `crop` resets it to ``finfo.min``
    and the layer's fill level: the tree steps' KV is dropped by moving a length, not by a copy.
    Capacity grows (doubling, one copy) only when a generation outgrows its plan.
    """

    def __init__(self, capacity: int, mask_rows: int, device: torch.device) -> None:
        self.cache = Cache(layers=[FilledStaticLayer(capacity)])
        self.capacity, self.rows, self.device = capacity, mask_rows, device
        self.buf: Tensor | None = None  # allocated on first use, in the draft's dtype
        self.slots = 0  # committed pairs (host)
        self.tree_end = 0  # columns of the last propose's tree block (host)

    def _reserve(self, rows: int, cols: int, dtype: torch.dtype) -> None:
        """Grow the cache and the mask buffer to ``cols`` slots and ``rows`` mask rows if needed."""
        if cols > self.capacity:
            ensure_capacity(self.cache, cols)
            self.capacity = self.cache.layers[0].max_cache_len
        if (
            self.buf is None
            or self.buf.dtype != dtype
            or rows > self.buf.shape[1]
            or cols > self.buf.shape[2]
        ):
            self.rows = max(self.rows, rows)
            self.buf = torch.full((1, self.rows, self.capacity), torch.finfo(dtype).min, dtype=dtype,
                                  device=self.device)  # fmt: skip
            self.buf[:, :, : self.slots] = 0

    def commit_mask(self, ok: Tensor, dtype: torch.dtype) -> Tensor:
        """ok: [1, m] (all True) -> the additive mask [1, 1, m, slots + m] of m new pairs: the committed
        prefix and themselves, causally (a view of the buffer)."""
        m, C = ok.shape[1], self.slots
        self._reserve(m, C + m, dtype)
        causal = torch.ones(m, m, dtype=torch.bool, device=self.device).tril_()
        self.buf[0, :m, C : C + m] = torch.zeros((), dtype=dtype, device=self.device).masked_fill(
            ~causal, torch.finfo(dtype).min
        )
        return self.buf[:, None, :m, : C + m]

    def extend(self, pos: Tensor) -> None:
        """The m pairs just committed (positions ``pos`` [1, m], all >= 0) become prefix."""
        m = pos.shape[1]
        self.buf[:, :, self.slots : self.slots + m] = 0
        self.slots += m

    def tree_mask(self, queries: int, tree_cols: int, dtype: torch.dtype) -> Tensor:
        """[1, queries, slots + tree_cols]: prefix visible, the tree block all ``finfo.min``, for the
        caller to fill in place (a view of the buffer)."""
        self._reserve(queries, self.slots + tree_cols, dtype)
        self.tree_end = self.slots + tree_cols
        return self.buf[:, :queries, : self.tree_end]

    def crop(self, slots: int) -> None:
        """Drop everything after ``slots`` (== the committed pairs): the tree block's mask and KV."""
        if self.tree_end > slots:
            self.buf[:, :, slots : self.tree_end] = torch.finfo(self.buf.dtype).min
        self.tree_end = slots
        extra = self.cache.layers[0].end - slots
        if extra > 0:
            self.cache.layers[0].crop(-extra)

    def pack(self, longest: int | None = None, slack: int = 32) -> None:
        """Nothing to close: one row, no holes."""
