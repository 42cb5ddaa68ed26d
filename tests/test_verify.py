"""Acceptance rules on stub logits (`infer.verify`): never-, always- and partly-accepted trees, ties,
the bonus token, typical acceptance's threshold and exact rejection sampling's extreme cases.

Statistical tests of `accept_exact` (it samples exactly from the target) are in test_distribution.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from infer.tree import DraftTree, chain, tree_buffers
from infer.verify import accept_exact, accept_greedy, accept_typical, longest_path, sample_from

V = 10
# node:    1     2     3       4       5       6
PATHS = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
# node tokens (root = 9); siblings always hold distinct tokens, as top-k drafts do
TOKENS = [9, 3, 5, 4, 6, 7, 8]


def make_tree(paths=PATHS, tokens=TOKENS) -> DraftTree:
    tb = tree_buffers(paths)
    return DraftTree(torch.tensor(tokens), tb.parents, tb.depth, tb.ancestors, tb.retrieve, tb.sib_before)


def one_hot_logits(argmax: list[int], second: list[int] | None = None) -> torch.Tensor:
    """[N+1, V] stub logits: node i's argmax is argmax[i] (and runner-up second[i])."""
    logits = torch.zeros(len(argmax), V)
    for i, a in enumerate(argmax):
        logits[i, a] = 5.0
        if second is not None:
            logits[i, second[i]] = 4.0
    return logits


def emitted(acc, tree) -> list[int]:
    n = int(acc.length)
    return tree.tokens[acc.path[1:n]].tolist() + [int(acc.next_token)]


# ---------------------------------------------------------------------------------------------- greedy


def test_greedy_never_accepted():
    tree = make_tree()
    logits = one_hot_logits([0, 1, 1, 1, 1, 1, 1])  # root predicts 0: no child holds it
    acc = accept_greedy(logits, tree)
    assert int(acc.length) == 1
    assert int(acc.path[0]) == 0
    assert int(acc.next_token) == 0
    assert emitted(acc, tree) == [0]


def test_greedy_always_accepted_chain():
    tokens = [9, 3, 5, 7, 2]
    tree = make_tree(chain(4), tokens)
    logits = one_hot_logits([3, 5, 7, 2, 6])  # every node predicts its child's token
    acc = accept_greedy(logits, tree)
    assert int(acc.length) == 5
    assert acc.path.tolist() == [0, 1, 2, 3, 4]
    assert int(acc.next_token) == 6  # bonus = argmax at the deepest node
    assert emitted(acc, tree) == [3, 5, 7, 2, 6]


def test_greedy_partly_accepted_second_branch():
    tree = make_tree()
    # root -> 5 (node 2, rank 1) -> 7 (node 5), whose argmax 1 is the bonus
    logits = one_hot_logits([5, 0, 7, 0, 0, 1, 0])
    acc = accept_greedy(logits, tree)
    assert int(acc.length) == 3
    assert acc.path.tolist()[:3] == [0, 2, 5]
    assert int(acc.next_token) == 1
    assert emitted(acc, tree) == [5, 7, 1]


def test_greedy_stops_at_first_mismatch():
    tree = make_tree()
    # root -> 3 (node 1) -> 4 (node 3) ok, node 3 predicts 0 but its child holds 8: stop at node 3
    logits = one_hot_logits([3, 4, 0, 0, 0, 0, 0])
    acc = accept_greedy(logits, tree)
    assert acc.path.tolist()[: int(acc.length)] == [0, 1, 3]
    assert int(acc.next_token) == 0
    # a correct grandchild under a rejected node never counts
    logits = one_hot_logits([3, 1, 0, 8, 0, 0, 0])  # node 1 predicts 1 (no child has it), node 3 -> 8
    acc = accept_greedy(logits, tree)
    assert acc.path.tolist()[: int(acc.length)] == [0, 1]
    assert int(acc.next_token) == 1


def test_greedy_ties_follow_argmax_first_index():
    """Equal top logits: the target's greedy choice is the lowest index (torch.argmax), so is ours."""
    tree = make_tree([[0], [1]], [9, 6, 3])
    logits = torch.zeros(3, V)
    logits[0, 3] = logits[0, 6] = 2.0  # tie between tokens 3 and 6: argmax is 3 -> node 2
    logits[2, 4] = logits[2, 1] = 1.0  # tie at node 2: bonus is 1
    acc = accept_greedy(logits, tree)
    assert acc.path.tolist()[: int(acc.length)] == [0, 2]
    assert int(acc.next_token) == 1


def test_longest_path_ties_go_to_first_path():
    retrieve = torch.tensor([[0, 1, 3], [0, 2, 4], [0, 2, -1]])
    ok = torch.tensor([True, True, True, True, True])
    path, length = longest_path(ok, retrieve)
    assert path.tolist() == [0, 1, 3] and int(length) == 3
    ok = torch.tensor([True, True, True, False, True])
    path, length = longest_path(ok, retrieve)
    assert path.tolist() == [0, 2, 4] and int(length) == 3
    ok = torch.tensor([True, False, False, True, True])
    path, length = longest_path(ok, retrieve)
    assert path.tolist() == [0, 1, 3] and int(length) == 1  # nothing accepted: first row, length 1


def test_greedy_duplicate_tokens_in_branches():
    """Dynamic trees may hold the same token in two branches; the first fully valid path wins."""
    tree = make_tree([[0], [1], [0, 0], [1, 0]], [9, 3, 3, 5, 5])
    logits = one_hot_logits([3, 5, 5, 2, 2])
    acc = accept_greedy(logits, tree)
    assert acc.path.tolist() == [0, 1, 3] and int(acc.length) == 3
    assert int(acc.next_token) == 2


def test_greedy_root_only_tree():
    tree = make_tree([[0]], [4, 4])
    acc = accept_greedy(one_hot_logits([7, 1]), tree)
    assert int(acc.length) == 1 and int(acc.next_token) == 7


@pytest.mark.parametrize("seed", range(20))
def test_greedy_matches_sequential_definition(seed):
    """Random logits with planted agreement: accepted = the longest run of drafts equal to the
    parent's argmax, found by walking the tree node by node."""
    g = torch.Generator().manual_seed(seed)
    tree = make_tree()
    logits = torch.randn(7, V, generator=g)
    for i in range(1, 7):  # plant the child's token as its parent's argmax half of the time
        if torch.rand(1, generator=g) < 0.6:
            logits[int(tree.parents[i]), int(tree.tokens[i])] = 10.0 + float(torch.rand(1, generator=g))
    acc = accept_greedy(logits, tree)
    best: list[int] = [0]
    for row in tree.retrieve.tolist():
        walk = [0]
        for node in row[1:]:
            if node < 0 or int(tree.tokens[node]) != int(logits[walk[-1]].argmax()):
                break
            walk.append(node)
        if len(walk) > len(best):
            best = walk
    assert acc.path.tolist()[: int(acc.length)] == best
    assert int(acc.next_token) == int(logits[best[-1]].argmax())


# --------------------------------------------------------------------------------------------- typical


def _entropy(p: list[float]) -> float:
    return -sum(x * math.log(x) for x in p if x > 0)


def _probs_row(head: dict[int, float]) -> torch.Tensor:
    """A distribution with the given masses, the rest spread evenly over the other tokens."""
    rest = (1.0 - sum(head.values())) / (V - len(head))
    return torch.tensor([head.get(v, rest) for v in range(V)], dtype=torch.float64)


def test_typical_threshold_eps_binds():
    # peaked: delta * exp(-H) > eps, so the threshold is eps = 0.09
    row = _probs_row({0: 0.85, 3: 0.095})
    threshold = min(0.09, 0.3 * math.exp(-_entropy(row.tolist())))
    assert threshold == 0.09
    tree = make_tree([[0], [1]], [9, 3, 4])
    probs = row.expand(3, V).clone()
    acc = accept_typical(probs, tree, eps=0.09, delta=0.3)
    assert acc.path.tolist()[: int(acc.length)] == [0, 1]  # p(3) = 0.095 > 0.09
    tree = make_tree([[0], [1]], [9, 4, 5])  # p(4) = p(5) = 0.0069 < 0.09
    assert int(accept_typical(probs, tree, eps=0.09, delta=0.3).length) == 1


def test_typical_threshold_entropy_binds():
    # flat: delta * exp(-H) = 0.3 / 10 = 0.03 < eps, so 0.05 passes (it would fail against eps alone)
    row = _probs_row({3: 0.05, 4: 0.029})
    threshold = 0.3 * math.exp(-_entropy(row.tolist()))
    assert 0.029 < threshold < 0.05 < 0.09
    probs = row.expand(3, V).clone()
    acc = accept_typical(probs, make_tree([[0], [1]], [9, 4, 3]))
    assert acc.path.tolist()[: int(acc.length)] == [0, 2]  # token 4 (0.029) fails, 3 (0.05) passes
    # with delta = 0 the threshold is 0 and anything of positive mass passes
    acc = accept_typical(probs, make_tree([[0], [1]], [9, 4, 3]), eps=0.09, delta=0.0)
    assert acc.path.tolist()[: int(acc.length)] == [0, 1]


@pytest.mark.parametrize("seed", range(10))
def test_typical_matches_formula(seed):
    g = torch.Generator().manual_seed(seed)
    tree = make_tree()
    probs = torch.softmax(torch.randn(7, V, generator=g, dtype=torch.float64) * 2, -1)
    eps, delta = 0.09, 0.3
    ok = [True]
    for i in range(1, 7):
        p = probs[int(tree.parents[i])].tolist()
        ok.append(p[int(tree.tokens[i])] > min(eps, delta * math.exp(-_entropy(p))))
    best: list[int] = [0]
    for row in tree.retrieve.tolist():
        walk = [0]
        for node in row[1:]:
            if node < 0 or not ok[node]:
                break
            walk.append(node)
        best = walk if len(walk) > len(best) else best
    acc = accept_typical(probs, tree, eps, delta, torch.Generator().manual_seed(0))
    assert acc.path.tolist()[: int(acc.length)] == best
    assert float(probs[best[-1], int(acc.next_token)]) > 0


def test_typical_one_hot_is_greedy():
    """As temperature -> 0, p is one-hot: only the argmax passes and the bonus is the argmax."""
    tree = make_tree()
    logits = one_hot_logits([5, 0, 7, 0, 0, 1, 0], second=[3, 1, 1, 1, 1, 2, 1])
    probs = torch.softmax(logits / 1e-5, -1)
    for seed in range(5):
        acc = accept_typical(probs, tree, generator=torch.Generator().manual_seed(seed))
        greedy = accept_greedy(logits, tree)
        assert emitted(acc, tree) == emitted(greedy, tree) == [5, 7, 1]


# ----------------------------------------------------------------------------------------------- exact


def test_exact_point_mass_always_accepts_right_child():
    """The target puts all mass on one child (not the first sibling): it is accepted every time,
    and the bonus is the point mass at the deepest node."""
    tree = make_tree()
    probs = torch.zeros(7, V)
    for node, tok in [(0, 5), (2, 7), (5, 1)]:  # root -> node 2 (token 5) -> node 5 (token 7) -> bonus 1
        probs[node, tok] = 1.0
    probs[[1, 3, 4, 6]] = 1.0 / V
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        acc = accept_exact(probs, tree, g)
        assert emitted(acc, tree) == [5, 7, 1]


def test_exact_zero_mass_never_accepts():
    """Drafts with zero target mass are never accepted, and the bonus avoids them too."""
    tree = make_tree()
    probs = torch.full((7, V), 1.0 / (V - 2))
    probs[0, [3, 5]] = 0.0  # the root's children hold 3 and 5
    g = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(300):
        acc = accept_exact(probs, tree, g)
        assert int(acc.length) == 1
        assert int(acc.next_token) not in (3, 5)
        seen.add(int(acc.next_token))
    assert seen == set(range(V)) - {3, 5}


def test_exact_rejected_children_excluded_from_bonus():
    """When the root's children are rejected the bonus comes from the residual, which never holds
    them, however little mass they had."""
    tree = make_tree([[0], [1]], [9, 3, 5])
    probs = torch.full((3, V), 1.0 / V)
    probs[0] = torch.tensor([0.2, 0.2, 0.2, 1e-3, 0.2, 0.0, 0.199, 0.0, 0.0, 0.0])
    g = torch.Generator().manual_seed(1)
    bonus = set()
    for _ in range(2000):
        acc = accept_exact(probs, tree, g)
        if int(acc.length) == 1:
            bonus.add(int(acc.next_token))
    assert bonus == {0, 1, 2, 4, 6}


def test_exact_certain_children_and_leaf_bonus():
    """A child holding all its parent's mass is always accepted; at a leaf the bonus is drawn from
    the full distribution there."""
    tree = make_tree(chain(2), [9, 3, 4])
    probs = torch.zeros(3, V)
    probs[0, 3] = 1.0
    probs[1, 4] = 1.0
    probs[2, [6, 8]] = 0.5
    g = torch.Generator().manual_seed(0)
    out = {tuple(emitted(accept_exact(probs, tree, g), tree)) for _ in range(100)}
    assert out == {(3, 4, 6), (3, 4, 8)}


def test_exact_second_sibling_with_all_remaining_mass():
    """Once the first sibling is rejected, a second sibling holding all the remaining mass has
    residual probability 1: it must always be accepted (the renormalisation of the residual)."""
    tree = make_tree([[0], [1]], [9, 3, 5])
    probs = torch.full((3, V), 1.0 / V)
    probs[0] = 0.0
    probs[0, 3], probs[0, 5] = 0.5, 0.5
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        acc = accept_exact(probs, tree, g)
        assert int(acc.length) == 2
        assert int(tree.tokens[acc.path[1]]) in (3, 5)


def test_sample_from_respects_zero_weights_and_generator():
    w = torch.tensor([0.0, 2.0, 0.0, 1.0, 0.0])
    s = [int(sample_from(w, torch.Generator().manual_seed(i))) for i in range(300)]
    assert set(s) == {1, 3}
    a = [int(sample_from(w, torch.Generator().manual_seed(7))) for _ in range(5)]
    assert len(set(a)) == 1  # same generator state, same sample
    batch = sample_from(torch.eye(4)[[2, 0, 3]], torch.Generator().manual_seed(0))
    assert batch.tolist() == [2, 0, 3]
