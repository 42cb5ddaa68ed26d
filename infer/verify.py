"""Acceptance rules: which drafted path the target keeps, and the next token it emits.

Pure functions over tensors, no model state. Each takes the target's logits at every tree node and the
tree, and returns an `Acceptance`: the accepted root-to-node path and the bonus token sampled (or
argmaxed) from the target at the last accepted node. Tokens emitted per step = accepted drafts + 1.

Rules:
- `accept_greedy`: drafts must equal the target's argmax; output is token-identical to greedy decoding.
- `accept_exact`: multi-draft recursive rejection sampling (Leviathan et al. 2023; Chen et al. 2023;
  SpecInfer, Miao et al. 2024; EAGLE, Li et al. 2024). Output follows the target's (warped)
  distribution exactly.
- `accept_typical`: Medusa's typical acceptance (Cai et al. 2024). Faster, *not* lossless.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from infer.settings import DEFAULTS
from infer.tree import DraftTree


@dataclass(frozen=True)
class Acceptance:
    """path: [D+1] long node indices root-first, padded with -1; length: [] long number of valid
    entries (root included, so 1 = no draft accepted); next_token: [] long, the bonus token.
    For a batch of trees (`DraftTree` fields with a leading row dimension B) each gains that
    dimension: path [B, D+1], length [B], next_token [B]."""

    path: Tensor
    length: Tensor
    next_token: Tensor


def longest_path(ok: Tensor, retrieve: Tensor) -> tuple[Tensor, Tensor]:
    """The root-to-leaf prefix with most consecutive ``ok`` nodes.

    ok: [N+1] bool, node passes its test given its parent (the root always passes).
    retrieve: [P, D+1] root-to-leaf paths padded with -1.
    Returns (path [D+1], length []). Ties go to the first path in ``retrieve``.
    A batch of trees (ok [B, N+1], retrieve [B, P, D+1]) gives path [B, D+1], length [B]: every op
    here works on the last dimensions, so one tree and a batch run the same code.
    """
    idx = retrieve.clamp(min=0).flatten(-2)  # [..., P*(D+1)]
    ok_paths = ok.gather(-1, idx).view(retrieve.shape) & (retrieve >= 0)  # [..., P, D+1]
    lengths = ok_paths.long().cumprod(-1).sum(-1)  # [..., P]
    best = lengths.argmax(-1, keepdim=True)  # [..., 1], the first maximal path
    path = retrieve.gather(-2, best[..., None].expand(*best.shape, retrieve.shape[-1])).squeeze(-2)
    return path, lengths.gather(-1, best).squeeze(-1)


def _pick(x: Tensor, index: Tensor) -> Tensor:
    """x [..., M], index [...] -> x[..., index] (one entry per tree)."""
    return x.gather(-1, index[..., None]).squeeze(-1)


def _last_node(path: Tensor, length: Tensor) -> Tensor:
    return _pick(path, length - 1)


def _parent_prob(probs: Tensor, tree: DraftTree) -> Tensor:
    """probs [..., N+1, V] -> [..., N+1]: p_parent(i)(x_i) of every node (the root's entry is meaningless)."""
    V = probs.shape[-1]
    return probs.flatten(-2).gather(-1, tree.parents.clamp(min=0) * V + tree.tokens)


def _node_row(probs: Tensor, node: Tensor) -> Tensor:
    """probs [..., N+1, V], node [...] -> [..., V], the row of each tree's ``node``."""
    return probs.gather(-2, node[..., None, None].expand(*node.shape, 1, probs.shape[-1])).squeeze(-2)


def accept_greedy(logits: Tensor, tree: DraftTree) -> Acceptance:
    """logits: [N+1, V] (or [B, N+1, V] with a batch of trees). Node i is ok iff
    tokens[i] == argmax(logits[parent(i)])."""
    # max().indices is argmax (the first maximal index, as torch documents for both), but several times
    # faster than argmax on bf16 CPU logits, where argmax was the largest cost of acceptance
    pred = logits.max(-1).indices  # [..., N+1]
    ok = tree.tokens == pred.gather(-1, tree.parents.clamp(min=0))
    ok[..., 0] = True
    path, length = longest_path(ok, tree.retrieve)
    return Acceptance(path, length, _pick(pred, _last_node(path, length)))


def sample_from(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Sample one index from unnormalised non-negative weights [..., V] without a host sync.

    Inverse-CDF in float64: with t = u · Σw, u ~ U(0, 1], return the first v whose cumulative weight
    reaches t. That has probability w_v / Σw, and a zero-weight entry is never returned. float64 keeps
    tiny probabilities from rounding away in the running sum over a large vocabulary.
    """
    cdf = probs.double().cumsum(-1)
    u = 1.0 - torch.rand(
        (*probs.shape[:-1], 1), dtype=torch.float64, device=probs.device, generator=generator
    )
    return (cdf < u * cdf[..., -1:]).sum(-1).clamp(max=probs.shape[-1] - 1)


def accept_exact(probs: Tensor, tree: DraftTree, generator: torch.Generator | None = None) -> Acceptance:
    """Recursive rejection sampling over a tree of deterministic drafts (q = δ(x)).

    probs: [N+1, V] the target's warped distribution p_v at every node (temperature, top-k, top-p
    applied exactly as in plain sampling); [B, N+1, V] with a batch of trees (rows independent).

    At node v, children c_1..c_m (tokens x_j, tried in index order) are tested in turn: with
    residual r_1 = p_v, accept x_j w.p. r_j(x_j); on rejection r_{j+1} = r_j with x_j zeroed,
    renormalised. Since q is a point mass, r_j(x_j) = p_v(x_j) / (1 - Σ_{i<j} p_v(x_i)): every node's
    acceptance probability is known up front, so all coin flips are drawn at once and the walk
    becomes "the first child whose coin succeeds", a vectorised test with no loop over nodes. If
    every child is rejected (or v is a leaf) the bonus token is sampled from r_{m+1} = p_v with all
    children zeroed. The emitted token at every position is then distributed exactly as p_v.
    A child whose token an earlier sibling already drafted (a prompt-lookup chain beside the heads'
    tree, `infer.lookup`) has r_j(x_j) = 0: it is never accepted and takes no mass from later siblings.
    """
    q = _parent_prob(probs, tree)  # [..., N+1] p_parent(x_i)
    q[..., 0] = 0
    repeated = (tree.sib_before & (tree.tokens[..., :, None] == tree.tokens[..., None, :])).any(-1)
    q = q.masked_fill(repeated, 0)
    sib = tree.sib_before.to(probs.dtype)  # [..., N+1, N+1]
    before = (sib @ q[..., None]).squeeze(-1)  # mass of earlier siblings
    p_acc = (q / (1 - before).clamp(min=1e-30)).clamp(max=1.0)
    u = torch.rand(q.shape, device=q.device, generator=generator, dtype=probs.dtype)
    coin = u < p_acc
    first = coin & ~((sib @ coin.to(probs.dtype)[..., None]).squeeze(-1) > 0)
    first[..., 0] = True
    path, length = longest_path(first, tree.retrieve)
    last = _last_node(path, length)
    # residual at the last node: its children's tokens removed
    is_child = (tree.parents == last[..., None]).to(probs.dtype)  # [..., N+1]
    removed = torch.zeros(q.shape[:-1] + probs.shape[-1:], device=probs.device, dtype=probs.dtype)
    removed.scatter_add_(-1, tree.tokens, is_child)
    p_last = _node_row(probs, last)  # [..., V]
    residual = p_last * (removed == 0)
    # if every bit of mass sat on rejected children (only possible through rounding), fall back to p_v
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_last)
    return Acceptance(path, length, sample_from(residual, generator))


def accept_typical(
    probs: Tensor,
    tree: DraftTree,
    eps: float = DEFAULTS.typical_eps,
    delta: float = DEFAULTS.typical_delta,
    generator: torch.Generator | None = None,
) -> Acceptance:
    """Medusa typical acceptance: draft x under parent v is ok iff p_v(x) > min(eps, delta·exp(-H(p_v))).

    probs: [N+1, V] (or [B, N+1, V]) temperature-scaled target distribution. The longest ok path is
    kept and the bonus token is sampled from p at its last node. Not lossless: it trades exactness for
    longer accepts. As temperature -> 0, p_v becomes one-hot and only the argmax passes, so this
    reduces to greedy.
    """
    entropy = -(probs * torch.log(probs.clamp(min=1e-30))).sum(-1)  # [..., N+1]
    threshold = torch.minimum(torch.full_like(entropy, eps), delta * torch.exp(-entropy))
    ok = _parent_prob(probs, tree) > threshold.gather(-1, tree.parents.clamp(min=0))
    ok[..., 0] = True
    path, length = longest_path(ok, tree.retrieve)
    return Acceptance(path, length, sample_from(_node_row(probs, _last_node(path, length)), generator))
