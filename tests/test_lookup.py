"""Prompt lookup's branch (`infer.lookup`): the n-gram index, the graft into the heads' tree, and that
`infer.generate` with it stays lossless (greedy identity with lookup drafts accepted several deep, on
several architectures and head types; the exact law of sampling with a lookup chain beside the tree).
The same for a corpus's chain (`infer.lookup.CorpusIndex`, `infer.load(corpus=)`).
"""

from __future__ import annotations

import json
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
from infer.adaptive import Adaptive, ChainPrice
from infer.lookup import CorpusIndex, Lookup, NgramIndex, graft_chain
from infer.prompts import read_corpus
from infer.tree import DraftTree, tree_buffers
from infer.verify import accept_exact, accept_greedy

pytestmark = pytest.mark.usefixtures("one_thread")
FULL_CHAINS = Adaptive(chains=False)  # every lookup chain at its full length: paths reach lookup + 1


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


def test_corpus_index_follows_the_majority_of_the_longest_suffix():
    corpus = CorpusIndex([[5, 6, 7, 1, 2], [6, 7, 1, 3], [9, 6, 7, 1, 2, 4], [8, 7, 0]])
    assert (corpus.n_max, corpus.bits, corpus.num_tokens) == (3, 4, 18)
    # "6 7": three occurrences; 1 follows all, then 2 (twice) beats 3, then 4 is all that goes on
    assert corpus.continuation([0, 6, 7], 4) == [1, 2, 4]
    assert corpus.continuation([9, 6, 7], 2) == [1, 2]  # the trigram "9 6 7": one occurrence
    assert corpus.continuation([3, 7], 1) == [1]  # "3 7" is new, "7": 1 three times against 0 once
    assert corpus.continuation([2, 4], 3) == []  # "2 4" ends a document: nothing follows it
    assert corpus.continuation([3, 11], 3) == [] and corpus.continuation([], 3) == []  # 11 never occurs
    assert corpus.continuation([1, 2], 3) == [4]  # the n-grams of one document never run into the next
    assert CorpusIndex([[70000, 1, 2]]).n_max == 3 and CorpusIndex([[2**21, 1]]).n_max == 2  # 17 / 22 bits
    with pytest.raises(ValueError, match="min_ngram"):
        CorpusIndex([[1]], min_ngram=0)
    with pytest.raises(ValueError, match=">= 0"):
        CorpusIndex([[1, -3]])


def test_lookup_drops_a_chain_that_the_other_one_holds():
    """(prompt lookup's chain, the corpus's): the history [5, 6, 9, 5, 6] gives prompt lookup [9, 5, 6]."""
    history = [5, 6, 9, 5, 6]
    assert Lookup(history, CorpusIndex([[9, 5, 6, 4]])).chains(4) == ([9, 5, 6], [4])
    assert Lookup(history, CorpusIndex([[1, 5, 6, 9]])).chains(4) == ([9, 5, 6], [])  # [9]: a prefix
    assert Lookup(history, CorpusIndex([[1, 5, 6, 9]])).chains(1) == ([], [9])  # equal: one is enough
    assert Lookup([3, 4], CorpusIndex([[3, 4, 8]])).chains(2) == ([], [8])
    assert Lookup(history).chains(4) == ([9, 5, 6], []) and Lookup(history).chains(0) == ([], [])


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
    want = target.generate(ids, max_new_tokens=40, do_sample=False)
    full = infer.generate(spec, ids, max_new_tokens=40, do_sample=False, lookup=6, adaptive=FULL_CHAINS)
    assert torch.equal(full.sequences, want)
    assert full.stats.lookup_accepted >= 6 and max(full.stats.accepted_lengths) == 7
    priced = infer.generate(spec, ids, max_new_tokens=40, do_sample=False, lookup=6)  # chains priced
    assert torch.equal(priced.sequences, want) and priced.stats.lookup_accepted >= 6


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt2"])
def test_greedy_identity_with_corpus_drafts_accepted(arch):
    """The corpus holds what the target says after the prompt (and unrelated text): its chain is
    accepted several tokens deep beside random heads and prompt lookup, and the output is still the
    target's, with and without the corpus."""
    key = (arch,)
    target, ids = model(*key), prompt(1)
    said = target.generate(ids, max_new_tokens=40, do_sample=False)[0].tolist()
    noise = torch.randint(3, 200, (3, 30), generator=torch.Generator().manual_seed(3)).tolist()
    corpus = CorpusIndex([*noise, said[ids.shape[1] - 3 :]])
    spec = infer.SpecModel(target, heads_for(key, "random"), corpus=corpus)
    out = infer.generate(spec, ids, max_new_tokens=40, do_sample=False, lookup=6)
    assert torch.equal(out.sequences[0], torch.tensor(said))
    assert out.stats.corpus_accepted >= 12 and max(out.stats.accepted_lengths) == 7
    off = infer.generate(spec, ids, max_new_tokens=40, do_sample=False, lookup=6, corpus=False)
    assert torch.equal(off.sequences, out.sequences) and off.stats.corpus_accepted == 0
    with pytest.raises(ValueError, match="corpus must be"):
        infer.generate(spec, ids, max_new_tokens=4, corpus=[1, 2])


def _price_run(price: ChainPrice, chain: list[int], says, steps: int, order: int = 3) -> list[int]:
    """``steps`` steps of one chain found in full every step after an ``order``-token match, with the
    heads accepting nothing: the step emits ``says(step)``; the path holds the chain's nodes as far as
    it was grafted and right. Returns the length the price gave each step."""
    lengths = []
    for i in range(steps):
        m, emitted = price.length(0, order), says(i)
        right = 0
        while right < min(m, len(emitted) - 1) and chain[right] == emitted[right]:
            right += 1
        price.observe([(0, order, chain, m)], emitted[: right + 1], [1] * right, 1 + m, 1)
        lengths.append(price.length(0, order))
    return lengths


def test_chain_price_cuts_a_chain_that_does_not_pay_and_takes_it_back_when_it_matches():
    """On a cost curve where every verified token costs 0.05 plain steps, a chain that is never right
    goes to length 0 within a few steps; while it is not grafted, the emitted tokens still show when
    it would have been right, and it comes back at full length. Where verifying costs nothing more per
    token (flat), a useless chain stays: it costs nothing."""
    chain = [5, 6, 7, 8, 9, 10, 11, 12]
    steep = ChainPrice(lambda n: 1.0 + 0.05 * (n - 1), k=8)
    wrong = _price_run(steep, chain, lambda i: [1, 2], 12)
    assert wrong[-1] == 0 and wrong.index(0) <= 8
    back = _price_run(steep, chain, lambda i: [*chain, 99], 12)  # offered 0 tokens, yet seen right
    assert back[0] >= 1 and back[-1] == 8
    flat = ChainPrice(lambda n: 1.0, k=8)
    assert _price_run(flat, chain, lambda i: [1, 2], 12) == [8] * 12


def test_chain_price_keeps_the_part_of_a_chain_that_is_right_per_match_length():
    """A chain right for its first 3 tokens every step, then wrong: on a steep cost curve the price
    keeps those 3 (each adds a token a step) and drops the rest (they add none). Chains after a shorter
    match are priced on their own: those never right go to 0 while the 3-token ones keep 3."""
    chain = [5, 6, 7, 8, 9, 10, 11, 12]
    steep = ChainPrice(lambda n: 1.0 + 0.05 * (n - 1), k=8)
    assert _price_run(steep, chain, lambda i: [5, 6, 7, 1, 2], 20)[-1] == 3
    assert _price_run(steep, chain, lambda i: [1, 2], 20, order=1)[-1] == 0
    assert steep.length(0, 3) == 3 and steep.length(0, 2) == 8  # a class not seen yet: full length


def test_priced_chains_verify_fewer_tokens_with_the_same_output():
    """A corpus whose chain is junk for this prompt, on a verify-cost curve where width costs: with the
    chains priced (the default) the corpus's chain is mostly cut and each step verifies fewer tokens
    than with every chain at full length, and the output is the target's either way."""
    from test_adaptive import LONG

    key = ("llama",)
    target, ids = model(*key), prompt(1)
    vocab = target.config.vocab_size
    junk = torch.randint(3, vocab, (8, 40), generator=torch.Generator().manual_seed(4)).tolist()
    spec = infer.SpecModel(target, heads_for(key, "random"), corpus=CorpusIndex(junk))
    want = target.generate(ids, max_new_tokens=LONG, do_sample=False)
    costs = {"verify_s": [1.0 + 0.05 * k for k in range(64)], "draft_s": 0.05}
    runs = {}
    for chains in (True, False):
        adaptive = Adaptive(**costs, chains=chains)
        out = infer.generate(spec, ids, max_new_tokens=LONG, do_sample=False, lookup=8, adaptive=adaptive)
        assert torch.equal(out.sequences, want)
        runs[chains] = (sum(out.stats.tree_sizes) / len(out.stats.tree_sizes), out.stats.adaptive)
    assert runs[True][0] < 0.6 * runs[False][0]
    assert runs[True][1]["chain_mean"][1] < 1.5 and "chain_mean" not in runs[False][1]  # the corpus's


def test_load_reads_a_corpus_file(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(64)} | {"[UNK]": 64}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    fast.chat_template = "{% for m in messages %}w1 {{ m['content'] }} w2 {% endfor %}"
    rows = [
        {"text": "w5 w6 w7"},
        {"messages": [{"role": "user", "content": "w8"}, {"role": "assistant", "content": "w9 w10"}]},
    ]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert read_corpus(str(path), fast) == [[5, 6, 7], [1, 8, 2, 1, 9, 10, 2]]
    assert read_corpus(str(path), fast, max_tokens=5) == [[5, 6, 7]]
    (tmp_path / "bad.jsonl").write_text('{"text": ""}\n')
    with pytest.raises(ValueError, match="bad.jsonl row 0: rows need a non-empty 'text'"):
        read_corpus(str(tmp_path / "bad.jsonl"), fast)
    with pytest.raises(ValueError, match="corpus= must be a JSONL file"):
        infer.load("demo-tiny", heads="unused", corpus=str(tmp_path / "missing.jsonl"))


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


@pytest.mark.slow
def test_generate_exact_with_a_corpus(small_target):  # noqa: F811
    """The law of sampling with a corpus chain of 3 beside one good Medusa draft: the corpus holds the
    prompt's end and the target's greedy continuation, so its chain proposes what the target is likely to
    say, and steps of 3 or 4 tokens need its drafts."""
    start = test_distribution.PROMPT
    said = small_target.generate(start, max_new_tokens=4, do_sample=False)[0]
    law = target_law(small_target, 5)
    corpus = CorpusIndex([said.tolist()])
    counts, accepted = sample_counts(
        small_target, good_heads(small_target), [[0]], 5, 3000, seed=6, lookup=3, corpus=corpus
    )
    assert Counter(accepted)[3] + Counter(accepted)[4] >= 300
    assert chi2_pvalue(counts, law) > ALPHA


@pytest.mark.slow
def test_generate_exact_with_priced_chains(small_target, monkeypatch):  # noqa: F811
    """The law of sampling while each chain's length follows the sample's own past: a corpus chain and
    prompt lookup's beside one good Medusa draft, cut to `ChainPrice.length` and, so that cuts are
    frequent within 5-token samples, further to 1 token when the chains grafted so far in the sample
    hold an odd number of tokens (which depends on what was accepted)."""
    start = test_distribution.PROMPT
    said = small_target.generate(start, max_new_tokens=4, do_sample=False)[0]
    law = target_law(small_target, 5)
    lengths = Counter()
    length = ChainPrice.length

    def cut(self, *args, **kwargs):
        m = length(self, *args, **kwargs)
        lengths[m := m if sum(self.offered.values()) % 2 == 0 else min(m, 1)] += 1
        return m

    monkeypatch.setattr(ChainPrice, "length", cut)
    pace = Adaptive(verify_s=[1.0 + 0.1 * k for k in range(64)], draft_s=0.0, every=1, probe=1, max_probe=1)
    counts, accepted = sample_counts(
        small_target, good_heads(small_target), [[0]], 5, 3000, seed=8, lookup=3, corpus=CorpusIndex([said.tolist()]),
        adaptive=pace,
    )  # fmt: skip
    assert lengths[3] >= 300 and lengths[0] + lengths[1] >= 300, lengths
    assert Counter(accepted)[3] + Counter(accepted)[4] >= 300
    assert chi2_pvalue(counts, law) > ALPHA
