"""Prompt lookup as one more branch of the heads' tree.

Prompt lookup (Saxena 2023; transformers' ``prompt_lookup_num_tokens``) drafts by copying: find the last
few tokens earlier in the prompt or the output, and propose the tokens that followed them there. It
needs no model, and it is right where the answer repeats its context (code signatures, quoted
questions, lists), which is often where the heads are weakest. `graft_chain` adds its k tokens to the
heads' tree as one more branch, so one verify forward checks both and the longest accepted path wins.

    index = NgramIndex(prompt_ids, max_ngram=3)     # host, once per generation
    chain = index.continuation(k)                   # host list of <= k tokens, after every step
    tree = graft_chain(tree, chain_tensor(chain, device))  # device ops, no host sync
    index.extend(emitted)                           # the step's accepted tokens and the bonus

Verification is unchanged, so the output is too: greedy stays token-identical and exact sampling
stays exact (`infer.verify.accept_exact` treats the chain as deterministic drafts like any other; a
chain node that repeats an earlier sibling's token gets probability 0 there).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from infer.tree import DraftTree, structure_from_parents

LOOKUP_NGRAM = 3  # the longest suffix searched for: 3 tokens, then 2, then 1 (transformers searches 2, 1)


class NgramIndex:
    """The token history of one generation (host ints) with, for every n-gram of up to ``max_ngram``
    tokens, where its first occurrence ends: a lookup is a few dict reads, whatever the history's length.

    continuation(k): the longest suffix of the history (``max_ngram`` tokens down to 1) that occurred
    before, and the up to k tokens that followed its first occurrence; [] when no suffix did."""

    def __init__(self, tokens: Iterable[int] = (), max_ngram: int = LOOKUP_NGRAM) -> None:
        if max_ngram < 1:
            raise ValueError(f"max_ngram must be >= 1, got {max_ngram}")
        self.max_ngram = max_ngram
        self.tokens: list[int] = []
        self.first_end: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        for tok in tokens:
            self.tokens.append(int(tok))
            end = len(self.tokens)
            for n in range(1, min(self.max_ngram, end) + 1):
                self.first_end.setdefault(tuple(self.tokens[end - n :]), end)

    def continuation(self, k: int) -> list[int]:
        length = len(self.tokens)
        for n in range(min(self.max_ngram, length), 0, -1):
            end = self.first_end.get(tuple(self.tokens[length - n :]))
            if end is not None and end < length:  # the suffix itself is no match: nothing follows it
                return self.tokens[end : end + k]
        return []


def chain_tensor(tokens: list[int], device: torch.device) -> Tensor:
    """[m] long on ``device``. On CUDA the copy goes from pinned memory without blocking: a plain
    host-to-device copy would wait for every kernel queued before it, a host sync per step."""
    t = torch.tensor(tokens, dtype=torch.long)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def graft_chain(tree: DraftTree, chain: Tensor) -> DraftTree:
    """The tree with a chain of drafts added under its root: nodes N+1 .. N+m.

    tree: one `DraftTree` of N+1 nodes (depth <= D = ``retrieve.shape[-1] - 1``); chain: [m] long token ids
    on the tree's device, the chain's first token a child of the root. Returns a `DraftTree` of N+1+m
    nodes whose first N+1 are the input's.

    Where the chain's first j tokens already spell a path of the tree (root -> t_1 -> ... -> t_j), the
    chain's next token hangs under t_j, so a path that both propose is verified once and the chain
    extends it; its first j nodes then stay as a copy of that path under the root, never accepted
    (greedy takes the first of equal paths; exact sampling gives a repeated sibling token probability 0).
    The walk is j vector ops over the nodes, on the device, with no host sync; the tree then keeps a
    static size for a given m.
    """
    m, n1 = chain.shape[0], tree.num_nodes
    device = tree.tokens.device
    depth_limit = tree.retrieve.shape[-1] - 1
    at = torch.zeros((), dtype=torch.long, device=device)  # the deepest node on the chain's path so far
    matched = torch.zeros((), dtype=torch.long, device=device)
    alive = torch.ones((), dtype=torch.bool, device=device)
    for j in range(min(m, depth_limit)):
        hit = (tree.parents == at) & (tree.tokens == chain[j])  # [N+1]: at most one (siblings differ)
        alive = alive & hit.any()
        at = torch.where(alive, hit.long().argmax(), at)
        matched = matched + alive.long()
    idx = torch.arange(m, device=device)
    chained = torch.where(idx == 0, 0, n1 + idx - 1)  # the copy: root -> N+1 -> N+2 -> ...
    parents = torch.cat([tree.parents, torch.where(idx == matched, at, chained)])
    depth = torch.cat([tree.depth, idx + 1])
    ancestors, retrieve, sib_before = structure_from_parents(
        parents, depth, max_depth=max(depth_limit, m), leaves_only=False
    )
    return DraftTree(torch.cat([tree.tokens, chain]), parents, depth, ancestors, retrieve, sib_before)
