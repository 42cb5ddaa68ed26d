"""Draft trees: the shapes speculative decoding verifies in one target forward.

A tree has N+1 nodes. Node 0 is the *root*: the token already chosen by the target at the end of the
previous step (the "bonus" token), whose KV is not yet in the cache. Every other node is a draft token.
Nodes are stored parents-before-children, so ``parents[i] < i``.

A *static* tree (Medusa, Cai et al. 2024) is a list of paths of top-k ranks: ``(0,)`` is head 0's best
token, ``(0, 1)`` is head 1's second-best token placed under it, and so on. Depth d uses Medusa head
d-1. `TreeBuffers` turns such a list into tensors once; they are cached per tree and per depth limit.

All tensors here are small (N ~ 8-64) and live on the model's device.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

Path = tuple[int, ...]


@dataclass(frozen=True)
class DraftTree:
    """One step's tree of candidate tokens, ready for verification.

    tokens:     [N+1] long, token of each node (node 0 = root).
    parents:    [N+1] long, parent node index (-1 for the root); parents[i] < i.
    depth:      [N+1] long, depth of each node (root = 0); position id = past_len + depth.
    ancestors:  [N+1, N+1] bool, ancestors[i, j] = node j is node i or one of its ancestors
                (the tree part of the attention mask).
    retrieve:   [P, D+1] long, root-to-leaf node paths, right-padded with -1.
    sib_before: [N+1, N+1] bool, sib_before[i, j] = j is an earlier sibling of i (same parent, j < i);
                the order in which exact rejection sampling tries siblings.
    """

    tokens: Tensor
    parents: Tensor
    depth: Tensor
    ancestors: Tensor
    retrieve: Tensor
    sib_before: Tensor

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[0]


def structure_from_parents(
    parents: Tensor, depth: Tensor, max_depth: int | None = None, leaves_only: bool = True
) -> tuple[Tensor, Tensor, Tensor]:
    """(ancestors [N+1,N+1], retrieve [P,D+1], sib_before [N+1,N+1]) from parent pointers, as torch ops.

    Ancestors come from walking all parent pointers at once, one gather per depth level, so the cost is
    O(D·N) tiny tensor ops and no Python loop over nodes. Static trees call this once; EAGLE-2 dynamic
    trees call it every step, so with ``max_depth`` given (the proposer knows it) and
    ``leaves_only=False`` no op depends on tensor values and nothing syncs with the host: ``retrieve``
    then holds the root path of every node (P = N+1) instead of only the leaves'. Both give the same
    longest accepted path, since an inner node's path is a prefix of some leaf's.
    """
    n = parents.shape[0]
    device = parents.device
    idx = torch.arange(n, device=device)
    if max_depth is None:
        max_depth = int(depth.max()) if n > 1 else 0  # host sync; static trees only
    # chain[:, k] = k-th ancestor of every node (or -1 above the root)
    chain = [idx]
    p = parents
    for _ in range(max_depth):
        chain.append(p)
        p = torch.where(p >= 0, parents[p.clamp(min=0)], p)
    chain_t = torch.stack(chain, 1)  # [N+1, D+1]: node, parent, grandparent, ...
    valid = chain_t >= 0
    ancestors = (
        torch.zeros(n, n, dtype=torch.int32, device=device).scatter_add_(
            1, chain_t.clamp(min=0), valid.to(torch.int32)
        )
        > 0
    )
    if leaves_only:  # nodes that are nobody's parent (a data-dependent count: syncs)
        is_parent = (
            torch.zeros(n, dtype=torch.int32, device=device).scatter_add_(
                0, parents.clamp(min=0), (parents >= 0).to(torch.int32)
            )
            > 0
        )
        rows = idx[~is_parent]
    else:
        rows = idx
    row_chain = chain_t[rows]  # [P, D+1] node, parent, ..., root, -1, -1
    row_depth = depth[rows]
    # reverse the valid prefix of each row: position k of the path holds the ancestor at depth k
    k = torch.arange(max_depth + 1, device=device)
    src = row_depth[:, None] - k[None, :]
    retrieve = torch.where(src >= 0, row_chain.gather(1, src.clamp(min=0)), torch.full_like(src, -1))
    same_parent = parents[:, None] == parents[None, :]
    sib_before = same_parent & (idx[None, :] < idx[:, None])
    return ancestors, retrieve, sib_before


@dataclass(frozen=True)
class TreeBuffers:
    """A static tree's tensors, built once from its list of rank paths.

    paths:        the rank paths, sorted by (depth, ranks) so parents precede children.
    parents, depth, ancestors, retrieve, sib_before: as in `DraftTree` (root included).
    cand_index:   [N] long, index of each non-root node's token in the flattened heads' top-k
                  ``topk_tokens.view(-1)`` of shape [D*K]: (depth-1)*K + rank.
    topk:         K, the number of top-k candidates needed from each head.
    max_depth:    D, the longest path's length (0 for the root alone).
    """

    paths: tuple[Path, ...]
    parents: Tensor
    depth: Tensor
    ancestors: Tensor
    retrieve: Tensor
    sib_before: Tensor
    cand_index: Tensor
    topk: int
    max_depth: int

    def draft(self, root: Tensor, topk_tokens: Tensor) -> DraftTree:
        """root: [] long; topk_tokens: [D', K'] (D' >= max_depth, K' >= topk) -> the step's `DraftTree`."""
        cands = topk_tokens[: self.max_depth, : self.topk].reshape(-1)[self.cand_index]
        tokens = torch.cat([root.view(1), cands])
        return DraftTree(tokens, self.parents, self.depth, self.ancestors, self.retrieve, self.sib_before)


def validate_paths(paths: Sequence[Sequence[int]]) -> tuple[Path, ...]:
    """Check a static tree: no duplicates, non-negative ranks, every path's prefix present."""
    out = tuple(sorted({tuple(int(r) for r in p) for p in paths}, key=lambda p: (len(p), p)))
    if len(out) != len(paths):
        raise ValueError("tree has duplicate paths")
    have = set(out)
    for p in out:
        if not p:
            raise ValueError("tree paths must be non-empty (the root is implicit)")
        if min(p) < 0:
            raise ValueError(f"tree path {list(p)} has a negative rank")
        if len(p) > 1 and p[:-1] not in have:
            raise ValueError(f"tree path {list(p)} has no parent {list(p[:-1])} in the tree")
    return out


@functools.lru_cache(maxsize=64)
def _buffers(paths: tuple[Path, ...], device_str: str) -> TreeBuffers:
    device = torch.device(device_str)
    index = {p: i + 1 for i, p in enumerate(paths)}
    parents = torch.tensor([-1] + [index.get(p[:-1], 0) for p in paths], dtype=torch.long, device=device)
    depth = torch.tensor([0] + [len(p) for p in paths], dtype=torch.long, device=device)
    ancestors, retrieve, sib_before = structure_from_parents(parents, depth)
    topk = max((p[-1] for p in paths), default=0) + 1
    cand = torch.tensor([(len(p) - 1) * topk + p[-1] for p in paths], dtype=torch.long, device=device)
    D = max((len(p) for p in paths), default=0)
    return TreeBuffers(paths, parents, depth, ancestors, retrieve, sib_before, cand, topk, D)


def tree_buffers(
    paths: Sequence[Sequence[int]], device: torch.device | str = "cpu", max_depth: int | None = None
) -> TreeBuffers:
    """Cached `TreeBuffers` for ``paths``, optionally cut to nodes of depth <= ``max_depth``.

    The cut is how generation ends exactly at ``max_new_tokens``: with r tokens still to emit, drafts
    deeper than r-1 could never be used, and for absolute-position models they could even run past the
    context window.
    """
    valid = validate_paths(paths)
    if max_depth is not None:
        valid = tuple(p for p in valid if len(p) <= max_depth)
    return _buffers(valid, str(torch.device(device)))


def chain(depth: int) -> list[list[int]]:
    """The chain tree: each head's top-1 only (plain speculative decoding with `depth` drafts)."""
    return [[0] * d for d in range(1, depth + 1)]


def greedy_nodes(
    acc: Tensor, max_nodes: int, *, max_depth: int | None = None, max_rank: int | None = None
) -> tuple[list[Path], list[float]]:
    """The nodes of the greedy tree in the order they are added, and each node's path probability.

    acc: [D, K] with acc[d, k] = P(depth-(d+1) candidate of rank k is the correct token), in [0, 1]
    (ranks are disjoint events, so each row sums to <= 1). ``max_depth`` / ``max_rank`` restrict the
    tree to depth <= max_depth and ranks < max_rank (e.g. EAGLE-2's depth and draft_top_k).

    Each step adds the frontier node (a child of a chosen node, or a depth-1 node) of highest P(p).
    Since acc <= 1, a child never beats its parent, so the first N nodes are the N largest values of
    all admissible paths; ties go to the shorter path (a tuple sorts before its extensions), so they
    are prefix-closed. No prefix-closed N-node tree has a larger Σ P(p) (any N values sum to at most
    the N largest), so under the independence model the first N nodes are the optimal N-node tree,
    and the trees for growing N are nested: E[τ(N)] = 1 + Σ_{i<N} values[i] is non-decreasing in N.
    """
    if acc.dim() != 2:
        raise ValueError(f"acc must be [depth, ranks], got shape {tuple(acc.shape)}")
    a = acc.double().cpu()
    if bool(((a < 0) | (a > 1)).any()) or bool(torch.isnan(a).any()):
        raise ValueError("accuracies must be probabilities in [0, 1]")
    D = a.shape[0] if max_depth is None else min(max_depth, a.shape[0])
    K = a.shape[1] if max_rank is None else min(max_rank, a.shape[1])
    rows = a[:D, :K].tolist()
    nodes: list[Path] = []
    values: list[float] = []
    heap: list[tuple[float, Path]] = [(-rows[0][k], (k,)) for k in range(K)] if D > 0 else []
    heapq.heapify(heap)
    while heap and len(nodes) < max_nodes:
        neg, p = heapq.heappop(heap)
        nodes.append(p)
        values.append(-neg)
        if len(p) < D:
            for k in range(K):
                heapq.heappush(heap, (neg * rows[len(p)][k], (*p, k)))
    return nodes, values


def build_tree(acc: Tensor, num_nodes: int) -> list[list[int]]:
    """Greedy tree that maximises expected accepted length (Medusa's sparse-tree construction): the first
    ``num_nodes`` nodes of `greedy_nodes` as lists. acc: [D, K] probabilities, see `greedy_nodes`."""
    return [list(p) for p in greedy_nodes(acc, num_nodes)[0]]


def default_accuracies(depth: int, topk: int = 8) -> Tensor:
    """A prior for untuned heads: top-1 accuracy 0.6 decaying 0.8x per head, rank k weight ~ 1/(k+1)^1.5.

    Roughly the shape of trained Medusa heads' accuracies; `infer.tune_tree` replaces it with
    measured numbers.
    """
    d = torch.arange(depth, dtype=torch.float64)[:, None]
    k = torch.arange(topk, dtype=torch.float64)[None, :]
    return 0.6 * 0.8**d * (k + 1) ** -1.5


def default_tree(num_heads: int, num_nodes: int = 32) -> list[list[int]]:
    """The default static tree for ``num_heads`` Medusa heads: `build_tree` on `default_accuracies`."""
    return build_tree(default_accuracies(num_heads), num_nodes)


def attention_mask(
    ancestors: Tensor,
    depth: Tensor,
    past_len: int,
    dtype: torch.dtype,
    config=None,
) -> Tensor | dict[str, Tensor]:
    """The 4D additive mask for verifying a tree after ``past_len`` cached tokens (docs/design.md §4).

    Returns [1, 1, N+1, past_len + N+1]: 0 where node i may attend (the whole prefix, and its own
    ancestors including itself), ``finfo(dtype).min`` elsewhere. transformers uses a 4D mask as given,
    so any stock decoder-only model runs tree attention without a modified modeling file.

    Sliding-window attention (``config.sliding_window``) additionally hides keys (prefix or ancestor)
    ``window`` or more positions before the query's position ``past_len + depth``. A model with both
    full and sliding layers (``config.layer_types``, e.g. Gemma 2/3) gets the dict
    {"full_attention", "sliding_attention"} that its forward accepts in place of one mask.
    """
    n = ancestors.shape[0]
    device = ancestors.device
    neg = torch.finfo(dtype).min
    tree_part = torch.zeros(n, n, dtype=dtype, device=device).masked_fill_(~ancestors, neg)
    full = torch.cat([torch.zeros(n, past_len, dtype=dtype, device=device), tree_part], 1)[None, None]
    window = sliding_window(config)
    if window is None:
        return full
    q_pos = past_len + depth  # [N+1]
    # keys: the prefix, then the tree nodes at their own positions (a deep tree can outgrow the window)
    k_pos = torch.cat([torch.arange(past_len, device=device), q_pos])
    far = (q_pos[:, None] - k_pos[None, :]) >= window  # [N+1, past + N+1]
    sliding = full.masked_fill(far[None, None], neg)
    if mixed_layers(config):
        return {"full_attention": full, "sliding_attention": sliding}
    return sliding


def sliding_window(config) -> int | None:
    """The sliding window of the attention layers of ``config`` that have one, or None."""
    if config is None:
        return None
    window = getattr(config, "sliding_window", None)
    if not window or getattr(config, "use_sliding_window", True) is False:
        return None
    layer_types = set(getattr(config, "layer_types", None) or [])
    if layer_types and "sliding_attention" not in layer_types:
        return None
    return int(window)


def mixed_layers(config) -> bool:
    """True for a model with both full and sliding-window layers (``config.layer_types``, e.g. Gemma 2/3):
    its forward takes a dict of masks {"full_attention", "sliding_attention"} in place of one."""
    layer_types = set(getattr(config, "layer_types", None) or [])
    return sliding_window(config) is not None and {"full_attention", "sliding_attention"} <= layer_types
