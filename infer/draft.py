"""Proposers: how each head type drafts a tree for the next verification step.

A proposer follows the target through generation. `generate` calls it with the target's outputs so the
heads always see the hidden states of exactly the tokens that were accepted:

    start(prompt_ids, out)      after the prefill forward (out.hidden: [1, T, H])
    propose(root, max_depth)    -> DraftTree rooted at the token the target just chose
    advance(tokens, hidden, aux) after verification, with the n accepted nodes (root first)

This is the same role as transformers' ``CandidateGenerator``, with a tree instead of a chain.

For a batch, ``proposer.batched()`` gives a `BatchProposer` over the same heads: the same calls with a
leading row dimension (rows of different lengths, left-aligned), trees as `DraftTree` fields of shape
[B, N+1, ...] (one tree per row, all of one size), and ``select(rows)`` when finished rows leave.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace

import torch
from torch import Tensor, nn

from heads.graft import TargetOutput
from infer.compiled import compiled
from infer.tree import DraftTree, TreeBuffers, tree_buffers, validate_paths


class Proposer:
    """Base class; ``aux_layers`` lists the ``hidden_states`` indices the heads need besides the last."""

    aux_layers: tuple[int, ...] = ()
    backend: str | None = None  # `compile`: the dynamo backend of the draft step, None for eager
    depth: int = 0  # the deepest tree this proposer drafts (0: unknown, not adapted by `infer.adaptive`)
    width: int | None = None  # 1: draft a chain (each depth's best token) instead of the tree, set per step

    def compile(self, backend: str | None) -> None:
        """Run the draft step (the heads' forward, lm_head and top-k: `medusa_topk`,
        `infer.eagle_draft.draft_step`) under ``torch.compile`` with this dynamo backend (None: eager);
        set by `generate` from its ``compile=`` for every call, batches included."""
        self.backend = backend

    def decoding(self, temperature: float | None) -> None:
        """Called by `generate` before every generation with the sampling temperature (None: greedy), for
        proposers that score their trees by the draft's probabilities (`infer.eagle_draft`); a no-op by
        default (a static tree has no scores)."""

    def plan(self, max_len: int) -> None:
        """Called before `start` with the longest sequence expected (prompt + new tokens), so that a
        proposer with a cache can preallocate it; a no-op by default."""

    def start(self, prompt_ids: Tensor, out: TargetOutput) -> None:
        raise NotImplementedError

    def propose(self, root: Tensor, max_depth: int) -> DraftTree:
        raise NotImplementedError

    def advance(self, tokens: Tensor, hidden: Tensor, aux: tuple[Tensor, ...]) -> None:
        raise NotImplementedError

    def batched(self) -> BatchProposer:
        """A `BatchProposer` drafting with the same heads and settings, one tree per row."""
        raise NotImplementedError(f"{type(self).__name__} drafts for batch size 1 only")


class BatchProposer:
    """The batch form of `Proposer` (see the module docstring).

    start(prompt_ids [B, T], out, valid [B, T])   left-aligned: every row's last token at T-1
    propose(root [B], max_depth)  -> DraftTree with fields [B, N+1], [B, N+1, N+1], [B, P, D+1]
    advance(tokens [B, L], hidden [B, L, H], aux, length [B])  row b's first length[b] entries accepted
    select(rows [B'])             keep those rows only
    """

    aux_layers: tuple[int, ...] = ()

    def start(self, prompt_ids: Tensor, out: TargetOutput, valid: Tensor) -> None:
        raise NotImplementedError

    def propose(self, root: Tensor, max_depth: int) -> DraftTree:
        raise NotImplementedError

    def advance(self, tokens: Tensor, hidden: Tensor, aux: tuple[Tensor, ...], length: Tensor) -> None:
        raise NotImplementedError

    def select(self, rows: Tensor) -> None:
        raise NotImplementedError


def rows_of(tree: DraftTree, batch: int) -> DraftTree:
    """One tree's structure for every row of a batch (a static tree: the same shape in every row);
    ``tokens`` [B, N+1] is taken as given when already batched."""
    fields = [t.expand(batch, *t.shape) for t in (tree.parents, tree.depth, tree.ancestors)]
    fields += [t.expand(batch, *t.shape) for t in (tree.retrieve, tree.sib_before)]
    tokens = tree.tokens if tree.tokens.dim() == 2 else tree.tokens.expand(batch, -1)
    return DraftTree(tokens, *fields)


def row_of(tree: DraftTree, b: int = 0) -> DraftTree:
    """Row ``b`` of a batch of trees, as one tree."""
    return DraftTree(*(getattr(tree, f.name)[b] for f in fields(tree)))


def root_only(root: Tensor) -> DraftTree:
    """A tree with no drafts: verification degenerates into one plain decoding step."""
    z = torch.zeros(1, dtype=torch.long, device=root.device)
    return DraftTree(
        root.view(1),
        z - 1,
        z,
        torch.ones(1, 1, dtype=torch.bool, device=root.device),
        z.view(1, 1),
        torch.zeros(1, 1, dtype=torch.bool, device=root.device),
    )


def root_only_rows(root: Tensor) -> DraftTree:
    """root: [B] -> a batch of trees without drafts, each row's own root."""
    return rows_of(replace(root_only(root[0]), tokens=root[:, None]), root.shape[0])


def medusa_topk(heads: nn.Module, lm_head: nn.Module, hidden: Tensor, depth: int, k: int) -> Tensor:
    """The Medusa draft step: hidden [B, H] (the last accepted position's state) -> token ids [B, D, K],
    head d's k best tokens (Cai et al. 2024, Medusa: head d predicts the token d+2 positions ahead), from
    the heads' own forward over their first ``depth`` heads. ``depth`` and ``k`` are the whole tree's (a cut
    tree slices the result), so under ``torch.compile`` a proposer has one graph however its trees are cut."""
    return heads(hidden, lm_head, num_heads=depth).topk(k, dim=-1).indices.transpose(0, 1)


class MedusaProposer(Proposer):
    """Static-tree drafting with Medusa heads: node at depth d, rank k = head (d-1)'s k-th best token."""

    def __init__(self, heads: nn.Module, lm_head: nn.Module, tree: Sequence[Sequence[int]]) -> None:
        self.heads, self.lm_head = heads, lm_head
        self.tree = [list(p) for p in tree]
        self.depth = max((len(p) for p in self.tree), default=0)
        if self.depth > heads.config.num_heads:
            raise ValueError(
                f"tree depth {self.depth} needs {self.depth} Medusa heads, these heads have "
                f"{heads.config.num_heads}"
            )
        validate_paths(self.tree)  # fail at construction, not at the first step
        self._buffers: dict[tuple[int, torch.device, bool], TreeBuffers] = {}  # per depth cut and device
        self._rows: BatchMedusa | None = None  # the one-row batch this proposer drafts with

    def start(self, prompt_ids: Tensor, out: TargetOutput) -> None:
        self._rows = BatchMedusa(self)
        self._rows.start(prompt_ids, out, torch.ones_like(prompt_ids, dtype=torch.bool))

    def buffers(self, max_depth: int, device: torch.device) -> TreeBuffers:
        """The tree cut to ``max_depth`` (with ``width`` 1: its rank-0 chain); built once per cut
        (validating and hashing the paths every step cost as much as the mask)."""
        key = (min(max_depth, self.depth), device, self.width == 1)
        if key not in self._buffers:
            paths = [p for p in self.tree if not any(p)] if key[2] else self.tree
            self._buffers[key] = tree_buffers(paths, device, max_depth=key[0])
        return self._buffers[key]

    def propose(self, root: Tensor, max_depth: int) -> DraftTree:
        return row_of(self._rows.propose(root.view(1), max_depth))

    def advance(self, tokens: Tensor, hidden: Tensor, aux: tuple[Tensor, ...]) -> None:
        n = torch.full((1,), tokens.shape[0], dtype=torch.long, device=tokens.device)
        self._rows.advance(tokens[None], hidden[None], tuple(a[None] for a in aux), n)

    def batched(self) -> BatchMedusa:
        return BatchMedusa(self)


class BatchMedusa(BatchProposer):
    """`MedusaProposer` for a batch: one head forward over all rows' last accepted states [B, H]; every
    row's tree has the static shape, filled with its own top-k tokens."""

    def __init__(self, single: MedusaProposer) -> None:
        self.single = single
        self.hidden: Tensor | None = None  # [B, H]

    def start(self, prompt_ids: Tensor, out: TargetOutput, valid: Tensor) -> None:
        self.hidden = out.hidden[:, -1]

    def propose(self, root: Tensor, max_depth: int) -> DraftTree:
        single, B = self.single, root.shape[0]
        tb = single.buffers(max_depth, root.device)
        if not tb.paths:
            return root_only_rows(root)
        # the whole tree's top-k, cut here: a cut's smaller depth and k would each be a graph under compile
        full = single.buffers(single.depth, root.device)
        topk = compiled(medusa_topk, single.backend)(single.heads, single.lm_head, self.hidden, full.max_depth,
                                                      full.topk)[:, : tb.max_depth, : tb.topk]  # fmt: skip
        tokens = torch.cat([root[:, None], topk.reshape(B, -1)[:, tb.cand_index]], 1)  # [B, N+1]
        return rows_of(DraftTree(tokens, tb.parents, tb.depth, tb.ancestors, tb.retrieve, tb.sib_before), B)

    def advance(self, tokens: Tensor, hidden: Tensor, aux: tuple[Tensor, ...], length: Tensor) -> None:
        self.hidden = hidden[torch.arange(hidden.shape[0], device=hidden.device), length - 1]

    def select(self, rows: Tensor) -> None:
        self.hidden = self.hidden.index_select(0, rows)
