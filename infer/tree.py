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
    """

    paths: tuple[Path, ...]
    parents: Tensor
    depth: Tensor
    ancestors: Tensor
    retrieve: Tensor
    sib_before: Tensor
    cand_index: Tensor
    topk: int

    @property
    def max_depth(self) -> int:
        return max((len(p) for p in self.paths), default=0)

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
    return TreeBuffers(paths, parents, depth, ancestors, retrieve, sib_before, cand, topk)


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


def expected_accept_length(paths: Sequence[Sequence[int]], acc: Tensor) -> float:
    """Expected tokens per step, bonus included: 1 + Σ_nodes Π_{prefix} acc[depth-1, rank].

    acc: [D, K] probability that head d's rank-k token is the right one (ranks disjoint events).
    """
    return 1.0 + sum(float(torch.stack([acc[i, r] for i, r in enumerate(p)]).prod()) for p in paths)


def build_tree(acc: Tensor, num_nodes: int) -> list[list[int]]:
    """Greedy tree that maximises expected accepted length (Medusa's sparse-tree construction).

    acc: [D, K], acc[d, k] = probability that depth-(d+1) head's rank-k token is correct.
    A node's value is the product of acc along its rank path; each step adds the frontier node of
    highest value (a child is only a candidate once its parent is in the tree), so the result is
    always a valid tree and, since values shrink along a path, the best N-node subtree.
    """
    D, K = acc.shape
    import heapq

    chosen: list[Path] = []
    heap: list[tuple[float, Path]] = [(-float(acc[0, k]), (k,)) for k in range(K)]
    heapq.heapify(heap)
    while heap and len(chosen) < num_nodes:
        neg, p = heapq.heappop(heap)
        chosen.append(p)
        if len(p) < D:
            for k in range(K):
                heapq.heappush(heap, (neg * float(acc[len(p), k]), (*p, k)))
    return [list(p) for p in chosen]


def default_accuracies(depth: int, topk: int = 8) -> Tensor:
    """A prior for untuned heads: top-1 accuracy 0.6 decaying 0.8x per head, rank k weight ~ 1/(k+1)^1.5.

    Roughly the shape of trained Medusa heads' accuracies; `scripts/tune_tree.py` replaces it with
    measured numbers.
    """
    d = torch.arange(depth, dtype=torch.float64)[:, None]
    k = torch.arange(topk, dtype=torch.float64)[None, :]
    return 0.6 * 0.8**d * (k + 1) ** -1.5


def default_tree(num_heads: int, num_nodes: int = 32) -> list[list[int]]:
    """The default static tree for ``num_heads`` Medusa heads: `build_tree` on `default_accuracies`."""
    return build_tree(default_accuracies(num_heads), num_nodes)


# --------------------------------------------------------------------------------------------- tuning
#
# Fitting trees to measured heads and hardware (`scripts/tune_tree.py`). Model: a draft node at depth d
# with rank r along its path is correct with probability acc[d-1, r], independently across depths, so
# a root-to-node rank path p = (r_1..r_d) is accepted with probability P(p) = Π_i acc[i-1, r_i] and a
# tree's expected accepted length (bonus token included) is E[τ] = 1 + Σ_{p in tree} P(p) (Medusa's
# sparse trees, Cai et al. 2024; `expected_accept_length`). One step costs t_verify(N+1) + t_draft, so the
# expected throughput of an N-node tree is E[τ(N)] / (t_verify(N+1) + t_draft).


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
    import heapq

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


def expected_accept_curve(
    acc: Tensor, max_nodes: int, *, max_depth: int | None = None, max_rank: int | None = None
) -> list[float]:
    """E[τ(N)] of the greedy N-node tree for N = 0..max_nodes (shorter if fewer paths exist).

    tau[0] = 1 (the bonus token alone); tau[N] = 1 + Σ_{i<N} P(node_i) with the nodes of `greedy_nodes`.
    """
    _, values = greedy_nodes(acc, max_nodes, max_depth=max_depth, max_rank=max_rank)
    tau = [1.0]
    for v in values:
        tau.append(tau[-1] + v)
    return tau


def empirical_accept_length(paths: Sequence[Sequence[int]], ranks: Tensor) -> float:
    """Mean accepted length of a static tree on measured rank vectors (no independence assumption).

    ranks: [M, D] long, ranks[m, d] = rank of the correct token among depth-(d+1)'s candidates at
    held-out position m (anything >= the tree's ranks, e.g. K, means "not among the candidates").
    Greedy verification accepts the deepest node whose path equals ranks[m, :depth]; in a prefix-closed
    tree the nodes that are prefixes of ranks[m] are exactly that node's ancestors and itself, so
    τ_m = 1 + #{p in tree : p == ranks[m, :len(p)]}.
    """
    valid = validate_paths(paths)
    if ranks.dim() != 2:
        raise ValueError(f"ranks must be [positions, depth], got shape {tuple(ranks.shape)}")
    if not valid or ranks.shape[0] == 0:
        return 1.0
    if max(len(p) for p in valid) > ranks.shape[1]:
        raise ValueError(f"the tree is deeper than the {ranks.shape[1]} measured depths")
    hits = torch.zeros(ranks.shape[0], dtype=torch.long)
    for p in valid:
        hits += (ranks[:, : len(p)] == torch.tensor(p)).all(1).long()
    return 1.0 + float(hits.double().mean())


def choose_num_nodes(
    tau: Sequence[float], verify_s: Sequence[float], draft_s: float, min_nodes: int = 1
) -> tuple[int, list[float]]:
    """The tree size N that maximises expected tokens/s, and the expected rate of every N.

    tau: E[τ(N)] for N = 0..; verify_s: [k-1] = seconds to verify k tokens (root + N nodes: k = N+1);
    draft_s: seconds of drafting per step (for Medusa it does not depend on N).
    rate(N) = tau[N] / (verify_s[N] + draft_s), for N up to min(len(tau), len(verify_s)) - 1; the
    result is argmax over N >= min_nodes (ties: the smaller tree).
    """
    n_max = min(len(tau), len(verify_s)) - 1
    if n_max < min_nodes:
        raise ValueError(f"need E[τ] and verify costs up to N = {min_nodes} nodes, got up to {n_max}")
    if draft_s < 0 or any(t <= 0 for t in verify_s[: n_max + 1]):
        raise ValueError("latencies must be positive")
    rates = [tau[n] / (verify_s[n] + draft_s) for n in range(n_max + 1)]
    best = max(range(min_nodes, n_max + 1), key=lambda n: (rates[n], -n))
    return best, rates


def choose_eagle_budget(
    acc: Tensor, verify_s: Sequence[float], draft_s: dict[int, float], draft_top_k: int
) -> dict:
    """EAGLE-2's ``total_tokens`` (and ``depth``) that maximise expected tokens/s.

    acc: [D, K] per-depth rank accuracies of the draft unrolled on its own features (as it drafts);
    verify_s: [k-1] = seconds to verify k tokens; draft_s: {depth: seconds of one `propose` with that
    depth} (EAGLE-2 runs one draft forward per depth level, whatever the tree size).

    E[τ] of a dynamic tree of T tokens is estimated by the best static tree of N = T-1 nodes of depth
    <= depth and ranks < draft_top_k on ``acc`` (`expected_accept_curve`). Assumptions: a calibrated
    draft ranks its candidates like ``acc`` does on average (EAGLE-2 reranks per context, so it is
    usually better than this static estimate, which makes the estimate conservative); EAGLE-2 only
    expands draft_top_k nodes per depth, which the static tree ignores (it matters only for trees wider
    than draft_top_k at some depth). Returns {"total_tokens", "depth", "draft_top_k",
    "expected_accept_length", "expected_tokens_per_s", "curves": {depth: [rate(T) for T = 1..]}}.
    """
    best: dict | None = None
    curves: dict[int, list[float]] = {}
    for depth, t_draft in sorted(draft_s.items()):
        tau = expected_accept_curve(acc, len(verify_s) - 1, max_depth=depth, max_rank=draft_top_k)
        n, rates = choose_num_nodes(tau, verify_s, t_draft)
        curves[depth] = rates
        if best is None or rates[n] > best["expected_tokens_per_s"]:
            best = {
                "total_tokens": n + 1,
                "depth": depth,
                "draft_top_k": draft_top_k,
                "expected_accept_length": tau[n],
                "expected_tokens_per_s": rates[n],
            }
    if best is None:
        raise ValueError("draft_s needs at least one depth")
    return best | {"curves": curves}


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
    layer_types = set(getattr(config, "layer_types", None) or [])
    if "full_attention" in layer_types and "sliding_attention" in layer_types:
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
