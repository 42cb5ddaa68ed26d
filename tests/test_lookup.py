"""Prompt lookup's branch (`infer.lookup`): the n-gram index, the graft into the heads' tree, and that
`infer.generate` with it stays lossless (greedy identity with lookup drafts accepted several deep, on
several architectures and head types; the exact law of sampling with a lookup chain beside the tree).
"""

from __future__ import annotations

from collections import Counter

import pytest
import test_distribution
import torch
from conftest import ARCHS
from test_distribution import (
    ALPHA,
    PATHS,
    chi2_pvalue,
    good_heads,
    sample_counts,
    small_target,  # noqa: F401, F811 (a fixture)
    step_case,
    target_law,
    tree_law,
)
from test_generate import heads_for, model, prompt

import infer
from heads import MedusaHeads
from infer.lookup import NgramIndex, graft_chain
from infer.tree import DraftTree, tree_buffers
from infer.verify import accept_exact, accept_greedy

pytestmark = pytest.mark.usefixtures("one_thread")


def test_index_finds_the_longest_suffix_first_occurrence():
    index = NgramIndex([5, 6, 7, 1, 2, 5, 6, 7, 3, 9, 6, 7])
    assert index.continuation(2) == [1, 2]  # "6 7" first ends at 3 (the trigram "9 6 7" is new)
    index.extend([3])
    assert index.continuation(4) == [9, 6, 7, 3]  # "6 7 3" first ends at 9: what followed, up to now
    index.extend([4])
    assert index.continuation(3) == []  # "4" never occurred before
    assert NgramIndex([1, 2, 3]).continuation(3) == []  # a suffix does not match itself
    assert NgramIndex([4, 4, 4]).continuation(2) == [4]  # "4 4" first ends at 2


def test_index_uses_shorter_suffixes():
    index = NgramIndex([8, 1, 2, 9, 2])
    assert index.continuation(3) == [9, 2]  # "2 9 2" and "9 2" occur only here: the unigram "2" does
    with pytest.raises(ValueError, match="max_ngram"):
        NgramIndex(max_ngram=0)


def _tree(tokens: list[int]) -> DraftTree:
    tb = tree_buffers(PATHS)  # 0: root; 1-3 depth 1 (ranks 0-2); 4, 5 under 1; 6 under 2; 7 under 4
    return DraftTree(torch.tensor(tokens), tb.parents, tb.depth, tb.ancestors, tb.retrieve, tb.sib_before)


TOKENS = [0, 10, 11, 12, 20, 21, 22, 30]  # root, then one token per node of PATHS


def _path_tokens(tree: DraftTree, node: int) -> list[int]:
    out = []
    while node > 0:
        out.append(int(tree.tokens[node]))
        node = int(tree.parents[node])
    return out[::-1]


@pytest.mark.parametrize(
    ("chain", "attach_depth"),
    [([40, 41], 0), ([10, 41, 42], 1), ([10, 20, 30, 43], 3), ([11, 22, 44], 2), ([10, 20], 2)],
    ids=["new", "one-shared", "whole-path", "second-branch", "inside"],
)
def test_graft_extends_the_path_the_chain_shares(chain, attach_depth):
    tree = _tree(TOKENS)
    g = graft_chain(tree, torch.tensor(chain))
    n1, m = tree.num_nodes, len(chain)
    assert g.num_nodes == n1 + m and torch.equal(g.tokens[:n1], tree.tokens)
    assert torch.equal(g.parents[:n1], tree.parents) and torch.equal(g.depth[:n1], tree.depth)
    # every new node spells a prefix of the chain from the root, at its depth
    for j in range(m):
        assert _path_tokens(g, n1 + j) == chain[: j + 1]
        assert int(g.depth[n1 + j]) == j + 1
    if attach_depth < m:  # the first unshared token hangs under the shared path's last tree node
        parent = int(g.parents[n1 + attach_depth])
        assert (parent < n1) and int(g.depth[n1 + attach_depth]) == attach_depth + 1
    # the structure is that of its parent pointers
    for i in range(g.num_nodes):
        anc = {i}
        p = int(g.parents[i])
        while p >= 0:
            anc.add(p)
            p = int(g.parents[p])
        assert set(torch.nonzero(g.ancestors[i]).flatten().tolist()) == anc


def test_greedy_accepts_the_whole_chain_through_the_shared_path():
    """The target's argmaxes follow 10 -> 20 -> 30 -> 43 -> 44: the heads' path gives three, the chain
    grafted under it the rest."""
    tree = graft_chain(_tree(TOKENS), torch.tensor([10, 20, 30, 43, 44]))
    want = {0: 10, 1: 20, 4: 30, 7: 43}  # node -> the target's argmax there
    logits = torch.zeros(tree.num_nodes, 64)
    for node, tok in want.items():
        logits[node, tok] = 1.0
    chain_nodes = list(range(8, 13))
    logits[chain_nodes[3], 44] = 1.0  # the node of 43 predicts 44
    logits[chain_nodes[4], 50] = 1.0  # and after 44 the bonus is 50
    acc = accept_greedy(logits, tree)
    n = int(acc.length)
    assert n == 6 and tree.tokens[acc.path[1:n]].tolist() == [10, 20, 30, 43, 44]
    assert int(acc.next_token) == 50


def test_exact_sampling_law_with_a_repeated_sibling():
    """A chain beside the tree repeats tokens the tree drafted (the copy of a shared path under the root):
    one step of `accept_exact` still follows the target's law. Before repeated siblings were given
    probability 0, the copy was tried again at its renormalised probability and this failed."""
    probs, tree = step_case(0, "good")
    shared = _path_tokens(tree, 7)  # the deepest path of PATHS, all drafted by "good" heads
    g = graft_chain(tree, torch.tensor([*shared, int(probs[7].argmax())]))
    probs_ext = _extend(probs, g)
    law = tree_law(probs_ext.double().tolist(), g.parents.tolist(), g.tokens.tolist())
    gen = torch.Generator().manual_seed(0)
    counts: Counter = Counter()
    deep = 0
    for _ in range(20000):
        acc = accept_exact(probs_ext, g, gen)
        n = int(acc.length)
        counts[(*g.tokens[acc.path[1:n]].tolist(), int(acc.next_token))] += 1
        deep += n == 5
    assert deep > 500  # the chain's node under the shared path is reached and accepted
    assert chi2_pvalue(counts, law) > ALPHA


def _extend(probs: torch.Tensor, tree: DraftTree) -> torch.Tensor:
    """Node distributions for the grafted tree: a new node copies the distribution of the tree node with
    the same path (the target sees the same text), and a node past the tree gets a fixed random one."""
    rows = [probs[i] for i in range(probs.shape[0])]
    by_path = {tuple(_path_tokens(tree, i)): i for i in range(probs.shape[0])}
    g = torch.Generator().manual_seed(9)
    for i in range(probs.shape[0], tree.num_nodes):
        same = by_path.get(tuple(_path_tokens(tree, i)))
        rows.append(
            probs[same] if same is not None else torch.softmax(torch.randn(probs.shape[1], generator=g), -1)
        )
    return torch.stack(rows)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("heads", ["random", "trained"])
def test_greedy_identity_with_lookup_drafts_accepted(arch, heads):
    """Random heads accept almost nothing, trained ones a mix. The prompt holds the target's own
    continuation of its start, then the start again, so lookup has text to copy (as a chat answer
    quotes its question): its drafts are accepted six deep, past the 4 Medusa heads, beside the
    heads' own, and the output is still the target's."""
    key = (arch,)
    target, start = model(*key), prompt(0)
    ids = torch.cat(
        [start, target.generate(start, max_new_tokens=24, do_sample=False)[:, start.shape[1] :], start], 1
    )
    spec = infer.SpecModel(target, heads_for(key, heads))
    out = infer.generate(spec, ids, max_new_tokens=40, do_sample=False, lookup=6)
    assert torch.equal(out.sequences, target.generate(ids, max_new_tokens=40, do_sample=False))
    assert out.stats.lookup_accepted >= 6 and max(out.stats.accepted_lengths) == 7


def test_lookup_is_on_by_default_for_one_row_only():
    key = ("llama",)
    spec = infer.SpecModel(model(*key), heads_for(key, "random"))
    one = infer.generate(spec, prompt(0), max_new_tokens=30, do_sample=False)
    assert one.stats.lookup_accepted > 0
    off = infer.generate(spec, prompt(0), max_new_tokens=30, do_sample=False, lookup=0)
    assert off.stats.lookup_accepted == 0 and torch.equal(off.sequences, one.sequences)
    saved = infer.SpecModel(spec.target, spec.heads, settings=infer.InferSettings(lookup=0))  # inference.json
    assert infer.generate(saved, prompt(0), max_new_tokens=30, do_sample=False).stats.lookup_accepted == 0
    ids = torch.cat([prompt(0), prompt(0)])
    batch = infer.generate(spec, ids, max_new_tokens=30, do_sample=False)  # a batch: no lookup
    assert torch.equal(batch.sequences[:1], one.sequences)
    with pytest.raises(ValueError, match="lookup .* one unpadded row only"):
        infer.generate(spec, ids, max_new_tokens=4, do_sample=False, lookup=3)
    for bad in (-1, 65, 2.0, True):
        with pytest.raises(ValueError, match="lookup must be an int"):
            infer.generate(spec, prompt(0), max_new_tokens=4, do_sample=False, lookup=bad)
        with pytest.raises(ValueError, match="'lookup' must be an int in"):
            infer.InferSettings(lookup=bad)


def test_adapter_prices_the_heads_by_their_own_drafts():
    """Heads that are never right (their top-1 is the target's least likely token) beside a chain that
    often is: the adapter drops the heads to plain decoding as it does without the chain (it counts
    their accepted drafts, not the chain's), while the chain keeps drafting."""
    from test_adaptive import COSTS, LONG

    key = ("llama",)
    target, start = model(*key), prompt(0)
    ids = torch.cat(
        [start, target.generate(start, max_new_tokens=24, do_sample=False)[:, start.shape[1] :], start], 1
    )
    heads = MedusaHeads.for_target(target, num_heads=4, lm_head="own")
    with torch.no_grad():
        for h in heads.lm_heads:
            h.weight.neg_()
    spec = infer.SpecModel(target, heads.eval())
    out = infer.generate(spec, ids, max_new_tokens=LONG, do_sample=False, adaptive=COSTS, lookup=6)
    assert torch.equal(out.sequences, target.generate(ids, max_new_tokens=LONG, do_sample=False))
    st = out.stats
    assert st.adaptive["final"] == "none" and st.adaptive["steps"]["tree"] == 0
    assert st.adaptive["steps"]["none"] >= 0.6 * len(st.tree_sizes)
    assert st.lookup_accepted >= 40


@pytest.mark.slow
def test_generate_exact_with_lookup(small_target, monkeypatch):  # noqa: F811
    """End to end: the continuations of `speculative_generate` with a chain of 3 beside one good Medusa
    draft follow the target's law. The prompt is the usual one, the target's greedy continuation of it,
    then the prompt again, so lookup proposes what the target is likely to say. The chain often starts
    with the heads' token (then it is grafted under it, and its copy under the root is never accepted);
    a step of 3 or 4 tokens needs two or three accepted drafts, so lookup's."""
    start = test_distribution.PROMPT
    said = small_target.generate(start, max_new_tokens=4, do_sample=False)[:, start.shape[1] :]
    monkeypatch.setattr(test_distribution, "PROMPT", torch.cat([start, said, start], 1))
    law = target_law(small_target, 5)
    counts, accepted = sample_counts(small_target, good_heads(small_target), [[0]], 5, 3000, seed=5, lookup=3)
    assert Counter(accepted)[3] + Counter(accepted)[4] >= 300
    assert chi2_pvalue(counts, law) > ALPHA
