"""The target side of the decoding loop: prefill, one tree-verify forward per step, KV bookkeeping.

    runner = TreeRunner(target, aux_layers)
    out = runner.prefill(prompt_ids)        # cache holds the prompt; out.logits: last position only
    out = runner.verify(tree)               # logits/hidden of all N+1 nodes (docs/design.md §4)
    runner.accept(keep)                     # the cache keeps the prefix + the accepted path

`speculative_generate` drives it; ``tests/test_tree_exact.py`` drives it with random trees and checks
every node against a cache-free forward, so both see the same code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from heads.graft import TargetOutput, run_target_lean
from infer.attention import (
    ATTN_IMPLEMENTATION,
    BatchTreeMask,
    TreeMask,
    attention_implementation,
    register,
    wants_tree_attention,
)
from infer.cache import (
    RaggedKV,
    StaticRaggedKV,
    compact,
    ensure_capacity,
    new_cache,
    new_filled_cache,
    new_static_cache,
)
from infer.compiled import backend_of, compiled_step
from infer.support import check_target
from infer.tree import DraftTree, mixed_layers, sliding_window

TREE_SLOTS = 64  # room planned for one tree beyond max_len; mask buffer and static cache grow if exceeded


class TreeRunner:
    """Owns the target's KV cache for one generation (batch size 1).

    target: a frozen transformers causal LM (checked with `infer.support.check_target`);
    aux_layers: ``hidden_states`` indices the proposer reads besides the last post-norm state;
    max_len: the longest sequence expected (prompt + new tokens), to size the cache and the mask buffer
    once (max_len + TREE_SLOTS slots; both grow, doubling, only if a tree needs more);
    tree_attention: verify ``sdpa`` targets with `infer.attention.tree_attention` (no K/V repeat per
    head) instead of transformers' sdpa;
    static: keep the KV in preallocated per-layer buffers written in place (False: a growing
    ``DynamicCache``, which `infer.cost` cuts back between timed steps). Two layouts, by target:

    - ``sdpa`` with tree attention and no sliding window: transformers' ``StaticCache`` and the boolean
      `infer.attention.TreeMask`, whose step rewrites only the last tree's columns and its own;
    - every other target (sliding windows, mixed full / sliding layers, eager, tree attention off):
      the batched path's layout at one row, `infer.cache.new_filled_cache` (full-length buffers for
      every layer: windows are applied by the mask) and a one-row `infer.attention.BatchTreeMask`
      rewritten in place per step (boolean for tree attention, additive float otherwise; sliding
      windows by position; a dict of both for mixed layers).

    checked: the caller ran `infer.support.check_target` on this target already.
    compile: run the verify forward (the target's forward over the tree, with its hooks) under
    ``torch.compile(dynamic=True)`` (`infer.compiled.CompiledStep`, one per target, reused by every
    generation; True: inductor, a string: that backend); the prefill stays eager (it runs once).
    ``past`` is the number of tokens whose KV is in the cache.
    """

    def __init__(
        self,
        target: nn.Module,
        aux_layers: Sequence[int] = (),
        *,
        max_len: int = 0,
        tree_attention: bool = True,
        static: bool = True,
        compile: bool | str = False,
        checked: bool = False,
    ) -> None:
        if not checked:  # `speculative_generate` checks once per call, before building its runner
            check_target(target)
        self.target = target
        self.aux_layers = tuple(aux_layers)
        self.text_cfg = target.config.get_text_config()
        self.past = 0
        self.static = static
        self.tree_attention = tree_attention and wants_tree_attention(target)
        if self.tree_attention:
            register()
        window, cols = sliding_window(self.text_cfg), max_len + TREE_SLOTS
        device = next(target.parameters()).device
        self.mask: TreeMask | BatchTreeMask
        if self.tree_attention and window is None:
            self.mask = TreeMask(TREE_SLOTS, cols, device)
            self.cache = new_static_cache(target.config, cols) if static else new_cache()
        else:
            additive = None if self.tree_attention else target.dtype
            self.mask = BatchTreeMask(1, TREE_SLOTS, cols, device, window=window,
                                      mixed=mixed_layers(self.text_cfg), additive=additive)  # fmt: skip
            self.cache = new_filled_cache(cols) if static else new_cache()
            self.slot_pos = torch.arange(cols, device=device)[None]  # [1, cols]: slot j holds position j
        backend = backend_of(compile)
        self.compiled = compiled_step(target, self.aux_layers, backend) if backend else None

    def prefill(self, input_ids: Tensor) -> TargetOutput:
        """input_ids: [1, T] -> logits [1, 1, V] of the last position only; hidden [1, T, H] and aux
        [1, T, H] each (the proposers read every prompt position's features)."""
        out = run_target_lean(
            self.target, input_ids, aux_layers=self.aux_layers, cache=self.cache, use_cache=True
        )
        self.past = input_ids.shape[1]
        return out

    def _mask(self, tree: DraftTree, q_pos: Tensor):
        """The step's mask, a view of the generation's buffer: [1, 1, N+1, past + N+1] (or a dict per
        layer type). One row has no holes, so the prefix slots' positions are 0..past-1."""
        if isinstance(self.mask, TreeMask):
            return self.mask(tree.ancestors, self.past)
        if self.slot_pos.shape[1] < self.past:
            self.slot_pos = torch.arange(2 * self.past, device=self.slot_pos.device)[None]
        return self.mask(self.slot_pos[:, : self.past], tree.ancestors[None], q_pos)

    def verify(self, tree: DraftTree) -> TargetOutput:
        """One forward over the tree's N+1 nodes after the cached prefix: node i attends to the prefix
        and its ancestors, at position ``past + depth[i]``. Returns logits [1, N+1, V], hidden and aux
        [1, N+1, H]; the cache then holds past + N+1 entries until `accept`."""
        if self.static:
            ensure_capacity(self.cache, self.past + tree.num_nodes)
        q_pos = (self.past + tree.depth)[None]
        mask = self._mask(tree, q_pos)
        switch = attention_implementation(self.target, ATTN_IMPLEMENTATION) if self.tree_attention else None
        with switch or contextlib.nullcontext():
            if self.compiled is not None:
                return self.compiled(tree.tokens[None], mask, q_pos, self.cache)
            return run_target_lean(
                self.target,
                tree.tokens[None],
                mask,
                aux_layers=self.aux_layers,
                logits_to_keep=0,
                position_ids=q_pos,
                cache=self.cache,
                use_cache=True,
            )

    def accept(self, keep: Tensor) -> None:
        """keep: [n] node indices of the accepted path, root first: their KV moves to slots past..past+n-1,
        the rest of the tree's KV is dropped."""
        compact(self.cache, self.past, keep)
        self.past += keep.shape[0]


class BatchRunner:
    """`TreeRunner` for a batch of rows of different lengths (`infer.cache.RaggedKV`).

    Rows share one slot axis; each row keeps its own positions (``next_pos`` [B]: the position of its
    next token, the step's root) and sees only its own filled slots. Row b's tree nodes sit at
    positions ``next_pos[b] + depth`` (clamped to the context, which only a node deeper than its row
    can use ever reaches). The masks live in one `infer.attention.BatchTreeMask` per generation:
    boolean for `infer.attention.tree_attention` on ``sdpa`` targets without sliding windows, additive
    float otherwise (sliding windows by position, a dict for mixed full / sliding layers, as
    `infer.tree.attention_mask`).

    max_len: the longest row expected (the padded prompt + new tokens), to size the buffers once;
    static: keep the KV in a `infer.cache.StaticRaggedKV` of max_len + ``slack`` + TREE_SLOTS slots,
    written in place (every architecture: sliding windows are applied by the mask), instead of a
    growing ``DynamicCache``. ``slack``: the holes tolerated before the cache is packed; with a static
    cache max(32, max_len // 8), so the O(S) pack runs a bounded number of times per generation.
    compile: the verify forward under ``torch.compile`` as `TreeRunner`'s (the same per-target
    `infer.compiled.CompiledStep`); the prefill, masks and cache bookkeeping stay eager.
    """

    def __init__(self, target: nn.Module, aux_layers: Sequence[int] = (), *, max_len: int = 0,
                 static: bool = True, compile: bool | str = False, checked: bool = False) -> None:  # fmt: skip
        if not checked:
            check_target(target)
        self.target = target
        self.aux_layers = tuple(aux_layers)
        cfg = target.config.get_text_config()
        self.window = sliding_window(cfg)
        self.mixed = mixed_layers(cfg)
        ctx = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        self.max_pos = ctx - 1 if ctx else None
        self.tree_attention = self.window is None and wants_tree_attention(target)
        if self.tree_attention:
            register()
        self.max_len, self.static = max_len, static
        self.kv: RaggedKV | None = None
        self.mask: BatchTreeMask | None = None
        self.next_pos: Tensor | None = None
        self.lengths: list[int] = []
        self.slack = max(32, max_len // 8) if static else 32  # holes tolerated before `RaggedKV.pack`
        self._start = 0  # slots before the last verified tree
        backend = backend_of(compile)
        self.compiled = compiled_step(target, self.aux_layers, backend) if backend else None

    def prefill(self, input_ids: Tensor, valid: Tensor) -> TargetOutput:
        """input_ids, valid: [B, T], left-padded (every row's last token at T-1) -> logits [B, 1, V],
        hidden and aux [B, T, H] (padding positions hold garbage no one reads)."""
        pos = valid.long().cumsum(1) - 1
        B, T = input_ids.shape
        cols = max(self.max_len, T) + self.slack + TREE_SLOTS
        slot_pos = torch.where(valid, pos, -1)
        self.kv = StaticRaggedKV(slot_pos, cols) if self.static else RaggedKV(slot_pos)
        additive = None if self.tree_attention else self.target.dtype
        self.mask = BatchTreeMask(B, TREE_SLOTS, cols, input_ids.device, window=self.window, mixed=self.mixed,
                                  additive=additive)  # fmt: skip
        self.next_pos = valid.sum(1)
        self.lengths = self.next_pos.tolist()  # each row's tokens in the cache, on the host
        out = run_target_lean(
            self.target,
            input_ids,
            valid.long(),
            aux_layers=self.aux_layers,
            position_ids=pos.clamp(min=0),
            cache=self.kv.cache,
            use_cache=True,
        )
        self.kv.clear_holes()
        return out

    def verify(self, tree: DraftTree) -> TargetOutput:
        """tree: a batch of trees (fields [B, N+1...]) -> logits [B, N+1, V], hidden and aux [B, N+1, H].
        Node i of row b attends to row b's filled slots and its own ancestors."""
        n = tree.tokens.shape[1]
        q_pos = self.next_pos[:, None] + tree.depth
        if self.max_pos is not None:
            q_pos = q_pos.clamp(max=self.max_pos)
        self.kv.reserve(n)
        mask = self.mask(self.kv.pos, tree.ancestors, q_pos)
        self._start = self.kv.slots
        switch = attention_implementation(self.target, ATTN_IMPLEMENTATION) if self.tree_attention else None
        with switch or contextlib.nullcontext():
            if self.compiled is not None:
                out = self.compiled(tree.tokens, mask, q_pos, self.kv.cache)
            else:
                out = self._verify_eager(tree.tokens, mask, q_pos)
        self.kv.extend(q_pos)
        return out

    def _verify_eager(self, tokens: Tensor, mask, q_pos: Tensor) -> TargetOutput:
        return run_target_lean(self.target, tokens, mask, aux_layers=self.aux_layers, logits_to_keep=0,
                               position_ids=q_pos, cache=self.kv.cache, use_cache=True)  # fmt: skip

    def accept(self, path: Tensor, length: Tensor, counts: list[int]) -> None:
        """path: [B, L] accepted node indices root first (L = the longest row's count; -1 or unaccepted
        nodes beyond a row's ``length`` [B], the same as ``counts`` on the host): row b's accepted KV
        moves to the L slots after the prefix, the rest of its share becomes holes, and the tree's
        other slots are dropped."""
        j = torch.arange(path.shape[1], device=path.device)
        pos = torch.where(j < length[:, None], self.next_pos[:, None] + j, -1)
        self.kv.take(self._start, self._start + path.clamp(min=0), pos)
        self.next_pos = self.next_pos + length
        self.lengths = [a + n for a, n in zip(self.lengths, counts, strict=True)]
        self.kv.pack(max(self.lengths), self.slack)

    def select(self, rows: list[int]) -> None:
        """Keep batch rows ``rows`` only (the others finished)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.next_pos.device)
        self.kv.select(index)
        self.next_pos = self.next_pos.index_select(0, index)
        self.lengths = [self.lengths[r] for r in rows]
