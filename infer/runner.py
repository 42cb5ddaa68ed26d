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

from torch import Tensor, nn

from heads.graft import TargetOutput, run_target_lean
from infer.attention import (
    ATTN_IMPLEMENTATION,
    TreeMask,
    attention_implementation,
    register,
    wants_tree_attention,
)
from infer.cache import compact, ensure_capacity, new_cache, new_static_cache
from infer.support import check_target
from infer.tree import DraftTree, attention_mask, sliding_window

TREE_SLOTS = 64  # room planned for one tree beyond max_len; mask buffer and static cache grow if exceeded


class TreeRunner:
    """Owns the target's KV cache for one generation (batch size 1).

    target: a frozen transformers causal LM (checked with `infer.support.check_target`);
    aux_layers: ``hidden_states`` indices the proposer reads besides the last post-norm state;
    max_len: the longest sequence expected (prompt + new tokens), to size the mask buffer once;
    tree_attention: verify ``sdpa`` targets with `infer.attention.tree_attention` (no K/V repeat per
    head, one boolean mask buffer per generation) instead of transformers' sdpa with a float mask;
    static: with tree attention, keep the KV in transformers' ``StaticCache`` of max_len + TREE_SLOTS slots
    (grown if a tree needs more), written in place, instead of a ``DynamicCache``.
    Sliding-window models keep a ``DynamicCache`` and the float masks of `infer.tree.attention_mask`,
    rebuilt per step.
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
    ) -> None:
        check_target(target)
        self.target = target
        self.aux_layers = tuple(aux_layers)
        self.text_cfg = target.config.get_text_config()
        self.cache = new_cache()
        self.past = 0
        self.tree_attention = tree_attention and wants_tree_attention(target)
        self.mask: TreeMask | None = None
        self.static = False
        if self.tree_attention:
            register()
            if sliding_window(self.text_cfg) is None:
                device = next(target.parameters()).device
                self.mask = TreeMask(TREE_SLOTS, max_len + TREE_SLOTS, device)
                self.static = static
                if static:
                    self.cache = new_static_cache(target.config, max_len + TREE_SLOTS)

    def prefill(self, input_ids: Tensor) -> TargetOutput:
        """input_ids: [1, T] -> logits [1, 1, V] of the last position only; hidden [1, T, H] and aux
        [1, T, H] each (the proposers read every prompt position's features)."""
        out = run_target_lean(
            self.target, input_ids, aux_layers=self.aux_layers, cache=self.cache, use_cache=True
        )
        self.past = input_ids.shape[1]
        return out

    def verify(self, tree: DraftTree) -> TargetOutput:
        """One forward over the tree's N+1 nodes after the cached prefix: node i attends to the prefix
        and its ancestors, at position ``past + depth[i]``. Returns logits [1, N+1, V], hidden and aux
        [1, N+1, H]; the cache then holds past + N+1 entries until `accept`."""
        if self.static:
            ensure_capacity(self.cache, self.past + tree.num_nodes)
        if self.mask is not None:
            mask = self.mask(tree.ancestors, self.past)
        else:
            mask = attention_mask(tree.ancestors, tree.depth, self.past, self.target.dtype, self.text_cfg)
        switch = attention_implementation(self.target, ATTN_IMPLEMENTATION) if self.tree_attention else None
        with switch or contextlib.nullcontext():
            return run_target_lean(
                self.target,
                tree.tokens[None],
                mask,
                aux_layers=self.aux_layers,
                logits_to_keep=0,
                position_ids=(self.past + tree.depth)[None],
                cache=self.cache,
                use_cache=True,
            )

    def accept(self, keep: Tensor) -> None:
        """keep: [n] node indices of the accepted path, root first: their KV moves to slots past..past+n-1,
        the rest of the tree's KV is dropped."""
        compact(self.cache, self.past, keep)
        self.past += keep.shape[0]
