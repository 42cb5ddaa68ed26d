"""Static trees, their tensors, the greedy tree builder and the 4D verification mask (`infer.tree`)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from infer.tree import (
    DraftTree,
    attention_mask,
    build_tree,
    chain,
    default_accuracies,
    default_tree,
    structure_from_parents,
    tree_buffers,
    validate_paths,
)
from infer.tree_choice import expected_accept_length

# node:    1     2     3       4       5       6
PATHS = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


def test_tree_buffers_hand_written():
    tb = tree_buffers(list(reversed(PATHS)))  # input order does not matter: sorted by (depth, ranks)
    assert tb.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
    assert tb.parents.tolist() == [-1, 0, 0, 1, 1, 2, 3]
    assert tb.depth.tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert tb.max_depth == 3
    assert tb.topk == 2
    # (depth-1) * K + rank into the heads' flattened [D, K] top-k
    assert tb.cand_index.tolist() == [0, 1, 2, 3, 2, 4]
    expected_anc = {0: {0}, 1: {0, 1}, 2: {0, 2}, 3: {0, 1, 3}, 4: {0, 1, 4}, 5: {0, 2, 5}, 6: {0, 1, 3, 6}}
    for i in range(7):
        assert set(torch.nonzero(tb.ancestors[i]).flatten().tolist()) == expected_anc[i], i
    # leaves 4, 5, 6 in node order, root first, right-padded with -1
    assert tb.retrieve.tolist() == [[0, 1, 4, -1], [0, 2, 5, -1], [0, 1, 3, 6]]
    sib = {(i, j) for i, j in torch.nonzero(tb.sib_before).tolist()}
    assert sib == {(2, 1), (4, 3)}


def test_tree_buffers_are_cached_and_draft_gathers_topk():
    assert tree_buffers(PATHS) is tree_buffers([tuple(p) for p in PATHS])
    tb = tree_buffers(PATHS)
    topk = torch.tensor(
        [[10, 11, 12], [20, 21, 22], [30, 31, 32], [40, 41, 42]]
    )  # [D', K'] larger than needed
    tree = tb.draft(torch.tensor(7), topk)
    assert isinstance(tree, DraftTree)
    assert tree.tokens.tolist() == [7, 10, 11, 20, 21, 20, 30]
    assert tree.num_nodes == 7
    assert tree.parents is tb.parents and tree.retrieve is tb.retrieve


def test_chain_tree():
    assert chain(3) == [[0], [0, 0], [0, 0, 0]]
    tb = tree_buffers(chain(4))
    assert tb.parents.tolist() == [-1, 0, 1, 2, 3]
    assert tb.retrieve.tolist() == [[0, 1, 2, 3, 4]]
    assert torch.equal(tb.ancestors, torch.ones(5, 5, dtype=torch.bool).tril())
    assert not tb.sib_before.any()
    assert tb.topk == 1


def test_wide_tree_siblings():
    tb = tree_buffers([[2], [0], [1]])
    assert tb.parents.tolist() == [-1, 0, 0, 0]
    assert tb.retrieve.tolist() == [[0, 1], [0, 2], [0, 3]]
    assert torch.nonzero(tb.sib_before).tolist() == [[2, 1], [3, 1], [3, 2]]
    assert tb.topk == 3


@pytest.mark.parametrize(
    ("paths", "message"),
    [
        ([[0], [0, 1], [1, 1]], r"\[1, 1\] has no parent \[1\]"),
        ([[0, 0]], "no parent"),
        ([[0], [1], [0]], "duplicate"),
        ([[0], (0,)], "duplicate"),
        ([[0], [-1]], "negative rank"),
        ([[0], [0, -2]], "negative rank"),
        ([[]], "non-empty"),
    ],
)
def test_validate_paths_errors(paths, message):
    with pytest.raises(ValueError, match=message):
        validate_paths(paths)
    with pytest.raises(ValueError, match=message):
        tree_buffers(paths)


def test_max_depth_cut():
    tb = tree_buffers(PATHS, max_depth=2)
    assert tb.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0))
    assert tb.max_depth == 2
    assert tb.retrieve.tolist() == [[0, 1, 3], [0, 1, 4], [0, 2, 5]]
    one = tree_buffers(PATHS, max_depth=1)
    assert one.paths == ((0,), (1,))
    assert one.retrieve.tolist() == [[0, 1], [0, 2]]
    empty = tree_buffers(PATHS, max_depth=0)
    assert empty.paths == ()
    assert empty.max_depth == 0
    assert empty.parents.tolist() == [-1]
    assert empty.retrieve.tolist() == [[0]]
    # a cut tree keeps its candidates' (depth, rank) meaning
    assert tb.cand_index.tolist() == tree_buffers(PATHS).cand_index[:5].tolist()


def _brute_ancestors(parents: list[int]) -> torch.Tensor:
    n = len(parents)
    anc = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            anc[i, j] = True
            j = parents[j]
    return anc


@pytest.mark.parametrize("seed", range(5))
def test_structure_from_parents_random_trees(seed):
    """The vectorised structure (used for dynamic trees too) equals a pointer walk on random trees."""
    g = torch.Generator().manual_seed(seed)
    n = 2 + int(torch.randint(0, 20, (1,), generator=g))
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    depth = [0] * n
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    anc, retrieve, sib = structure_from_parents(torch.tensor(parents), torch.tensor(depth))
    assert torch.equal(anc, _brute_ancestors(parents))
    leaves = [i for i in range(n) if i not in parents]
    assert retrieve.shape == (len(leaves), max(depth) + 1)
    for row, leaf in zip(retrieve.tolist(), leaves, strict=True):
        path = [leaf]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        path.reverse()
        assert row == path + [-1] * (max(depth) + 1 - len(path))
    for i, j in itertools.product(range(n), range(n)):
        assert bool(sib[i, j]) == (j < i and parents[i] == parents[j]), (i, j)


def _all_subtrees(depth: int, topk: int, size: int):
    nodes = [p for d in range(1, depth + 1) for p in itertools.product(range(topk), repeat=d)]
    for subset in itertools.combinations(nodes, size):
        have = set(subset)
        if all(len(p) == 1 or p[:-1] in have for p in subset):
            yield [list(p) for p in subset]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("size", [1, 3, 5])
def test_build_tree_is_optimal(seed, size):
    """Greedy construction = best subtree of ``size`` nodes by expected accept length (brute force)."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.rand(2, 3, generator=g, dtype=torch.float64)
    acc = 0.95 * raw / raw.sum(-1, keepdim=True)  # disjoint events per depth
    tree = build_tree(acc, size)
    assert len(tree) == size
    validate_paths(tree)
    best = max(expected_accept_length(t, acc) for t in _all_subtrees(2, 3, size))
    assert expected_accept_length(tree, acc) == pytest.approx(best, abs=1e-12)


def test_build_tree_more_nodes_than_exist_and_default_tree():
    acc = torch.full((2, 2), 0.3, dtype=torch.float64)
    assert sorted(map(tuple, build_tree(acc, 100))) == [(0,), (0, 0), (0, 1), (1,), (1, 0), (1, 1)]
    tree = default_tree(4)
    assert len(tree) == 32
    validate_paths(tree)
    assert max(len(p) for p in tree) <= 4
    assert [0] in tree and [0, 0] in tree and [0, 0, 0, 0] in tree
    assert expected_accept_length(tree, default_accuracies(4)) > expected_accept_length(
        chain(4), default_accuracies(4)
    )
    assert expected_accept_length([], default_accuracies(4)) == 1.0


def _brute_mask(tb, past, window=None):
    """0/1 allowed matrix [N+1, past+N+1] by definition: prefix + own ancestors, within the window."""
    n = tb.parents.shape[0]
    depth = tb.depth.tolist()
    allowed = torch.zeros(n, past + n, dtype=torch.bool)
    for i in range(n):
        q = past + depth[i]
        for k in range(past + n):
            k_pos = k if k < past else past + depth[k - past]
            ok = k < past or bool(tb.ancestors[i, k - past])
            if window is not None and q - k_pos >= window:
                ok = False
            allowed[i, k] = ok
    return allowed


def _check(mask, allowed, dtype):
    assert mask.shape == (1, 1, *allowed.shape)
    assert mask.dtype == dtype
    neg = torch.finfo(dtype).min
    assert torch.equal(mask[0, 0] == 0, allowed)
    assert torch.equal(mask[0, 0] == neg, ~allowed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_mask_full(dtype):
    tb = tree_buffers(PATHS)
    for past in (0, 1, 5):
        _check(attention_mask(tb.ancestors, tb.depth, past, dtype), _brute_mask(tb, past), dtype)
    # a config with no sliding window gives the same plain mask
    for cfg in (
        SimpleNamespace(sliding_window=None),
        SimpleNamespace(sliding_window=4, use_sliding_window=False),
    ):
        _check(attention_mask(tb.ancestors, tb.depth, 5, dtype, cfg), _brute_mask(tb, 5), dtype)


@pytest.mark.parametrize("window", [1, 2, 3, 4, 8])
def test_attention_mask_sliding_window(window):
    """Keys window or more positions behind the query are hidden, in the prefix and among ancestors."""
    tb = tree_buffers(PATHS + [[0, 0, 0, 0], [0, 0, 0, 0, 0]])  # deeper than small windows
    cfg = SimpleNamespace(sliding_window=window)
    for past in (0, 3, 10):
        mask = attention_mask(tb.ancestors, tb.depth, past, torch.float32, cfg)
        _check(mask, _brute_mask(tb, past, window), torch.float32)
        assert (mask[0, 0].diagonal(past) == 0).all()  # a node always sees itself


def test_attention_mask_mixed_layer_types():
    tb = tree_buffers(PATHS)
    cfg = SimpleNamespace(sliding_window=3, layer_types=["sliding_attention", "full_attention"])
    masks = attention_mask(tb.ancestors, tb.depth, 6, torch.float32, cfg)
    assert set(masks) == {"full_attention", "sliding_attention"}
    _check(masks["full_attention"], _brute_mask(tb, 6), torch.float32)
    _check(masks["sliding_attention"], _brute_mask(tb, 6, 3), torch.float32)
    # only sliding layers: one (sliding) mask; only full layers: the window is ignored
    only_sliding = SimpleNamespace(sliding_window=3, layer_types=["sliding_attention"] * 2)
    _check(
        attention_mask(tb.ancestors, tb.depth, 6, torch.float32, only_sliding),
        _brute_mask(tb, 6, 3),
        torch.float32,
    )
    only_full = SimpleNamespace(sliding_window=3, layer_types=["full_attention"] * 2)
    _check(
        attention_mask(tb.ancestors, tb.depth, 6, torch.float32, only_full), _brute_mask(tb, 6), torch.float32
    )


def test_attention_mask_real_configs():
    import transformers as tf

    tb = tree_buffers(PATHS)
    gemma = tf.Gemma2Config(num_hidden_layers=2, sliding_window=4)
    masks = attention_mask(tb.ancestors, tb.depth, 7, torch.float32, gemma)
    assert isinstance(masks, dict)
    _check(masks["sliding_attention"], _brute_mask(tb, 7, 4), torch.float32)
    mistral = tf.MistralConfig(num_hidden_layers=2, sliding_window=4)
    _check(
        attention_mask(tb.ancestors, tb.depth, 7, torch.float32, mistral),
        _brute_mask(tb, 7, 4),
        torch.float32,
    )
    llama = tf.LlamaConfig(num_hidden_layers=2)
    _check(attention_mask(tb.ancestors, tb.depth, 7, torch.float32, llama), _brute_mask(tb, 7), torch.float32)
    qwen2 = tf.Qwen2Config(num_hidden_layers=2, sliding_window=4)  # use_sliding_window is off by default
    _check(attention_mask(tb.ancestors, tb.depth, 7, torch.float32, qwen2), _brute_mask(tb, 7), torch.float32)
