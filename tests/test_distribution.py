"""Sampling is exact: ``infer.generate(do_sample=True, acceptance="exact")`` draws from the target's own
warped distribution, whatever the heads propose.

Two levels:
- end to end (marked slow): a 1-layer target with a 6-token vocabulary; the exact probability of every
  continuation is enumerated with full forwards and transformers' own warper classes (temperature,
  top-k, top-p, softmax in float32), then compared with samples of `infer.generate`;
- `accept_exact` alone on random node distributions, where the exact law of one step (accepted drafts
  + bonus token) is enumerated over the tree and compared with many more samples.

Comparison: Pearson's chi-square with bins of expected count < 5 pooled, p-value from the regularised
upper incomplete gamma function. Every test has a fixed seed; a correct sampler must give p > 1e-3.
The same statistic must reject (p < 1e-3) deliberately broken acceptance rules, which shows it has power.
The longest end-to-end cases live in test_distribution_tree.py (Medusa trees) and
test_distribution_eagle.py (EAGLE proposers), with the helpers here, so that test workers share them.
"""

from __future__ import annotations

import dataclasses
import importlib
import random
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from conftest import tiny_model
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

import infer
from heads import MedusaHeads
from infer.draft import row_of
from infer.generate import speculative_generate
from infer.tree import DraftTree, tree_buffers
from infer.verify import Acceptance, accept_exact, sample_from

# the module (``infer.generate`` the attribute is the function): the name the decoding loop calls
infer_generate = importlib.import_module("infer.generate")

V = 6
ALPHA = 1e-3
E2E_SAMPLES = 20_000  # end-to-end draws through infer.generate for the main chain and tree cases
PATHS = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]  # 3 siblings at depth 1, 2 at depth 2


pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------------------- statistics


def chi2_pvalue(counts: Counter, expected: dict[tuple, float]) -> float:
    """Pearson goodness of fit of ``counts`` to the probabilities ``expected``.

    Outcomes of probability 0 that were observed give p = 0. Bins with expected count < 5 are pooled
    (the pool joins the smallest remaining bin if it is itself < 5). p = Q(df/2, X²/2), the upper
    regularised incomplete gamma function, i.e. the chi-square survival function.
    """
    n = sum(counts.values())
    if any(k not in expected or expected[k] <= 0 for k in counts):
        return 0.0
    total = sum(expected.values())
    keys = sorted(expected, key=expected.get, reverse=True)
    bins: list[list[float]] = []
    pool = [0.0, 0.0]
    for k in keys:
        e, o = n * expected[k] / total, counts.get(k, 0)
        if e >= 5:
            bins.append([e, o])
        else:
            pool[0] += e
            pool[1] += o
    if pool[0] > 0:
        if pool[0] >= 5 or not bins:
            bins.append(pool)
        else:
            bins[-1][0] += pool[0]
            bins[-1][1] += pool[1]
    df = len(bins) - 1
    if df < 1:
        return 1.0
    stat = sum((o - e) ** 2 / e for e, o in bins)
    return float(
        torch.special.gammaincc(
            torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)
        )
    )


def test_chi2_pvalue_reference_values():
    # textbook 5% critical values: df=1 -> 3.841, df=10 -> 18.307
    def p(stat, df):
        return float(
            torch.special.gammaincc(
                torch.tensor(df / 2.0, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)
            )
        )

    assert p(3.841, 1) == pytest.approx(0.05, abs=2e-4)
    assert p(18.307, 10) == pytest.approx(0.05, abs=2e-4)
    # a fair die: fine; a loaded die: rejected; an impossible outcome: p = 0
    expected = {(k,): 1 / 6 for k in range(6)}
    g = torch.Generator().manual_seed(0)
    fair = Counter((int(x),) for x in torch.randint(0, 6, (6000,), generator=g))
    assert chi2_pvalue(fair, expected) > ALPHA
    loaded = Counter(
        (int(x),) for x in torch.multinomial(torch.tensor([1.3, 1, 1, 1, 1, 1]), 6000, True, generator=g)
    )
    assert chi2_pvalue(loaded, expected) < ALPHA
    assert chi2_pvalue(Counter({(7,): 1, (1,): 10}), expected) == 0.0


def test_sample_from_is_exact():
    g = torch.Generator().manual_seed(0)
    w = torch.tensor([0.5, 0.0, 2.0, 1.0, 0.25, 0.25])  # unnormalised weights, one zero
    draws = sample_from(w.expand(40000, V), g)
    expected = {(k,): float(w[k] / w.sum()) for k in range(V)}
    assert chi2_pvalue(Counter((int(x),) for x in draws), expected) > ALPHA


# ------------------------------------------------------------------------------- a reference sampler


def children_of(parents: list[int]) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in parents]
    for i, p in enumerate(parents):
        if p >= 0:
            kids[p].append(i)
    return kids


def tree_law(probs: list[list[float]], parents: list[int], tokens: list[int]) -> dict[tuple, float]:
    """Exact law of one step's emitted tokens (accepted drafts, then the bonus): sample from the target
    token by token, continuing while the token is a child's draft and stopping after the first that is
    not. This is what the target alone would emit, cut at a point the tokens themselves decide. A token
    that several children draft continues under the first of them (`accept_exact` never accepts the
    others)."""
    kids = children_of(parents)
    law: dict[tuple, float] = {}

    def walk(v: int, prefix: tuple, mass: float) -> None:
        by_token: dict[int, int] = {}
        for c in kids[v]:
            by_token.setdefault(tokens[c], c)
        for x in range(len(probs[v])):
            q = mass * probs[v][x]
            if q == 0:
                continue
            if x in by_token:
                walk(by_token[x], (*prefix, x), q)
            else:
                law[(*prefix, x)] = law.get((*prefix, x), 0.0) + q

    walk(0, (), 1.0)
    return law


def rejection_walk(
    probs: list[list[float]],
    parents: list[int],
    tokens: list[int],
    rng: random.Random,
    *,
    renormalise: bool = True,
    residual: bool = True,
    always: bool = False,
) -> tuple[list[int], int]:
    """Recursive rejection sampling written node by node, with switches that break it:
    ``renormalise=False`` tests sibling j with p(x_j) instead of p(x_j) / (1 - Σ_{i<j} p(x_i));
    ``residual=False`` samples the bonus from p instead of p with the rejected drafts removed;
    ``always=True`` accepts the first child with probability 1."""
    kids = children_of(parents)
    v, nodes = 0, [0]
    while True:
        p = probs[v]
        removed, taken = 0.0, None
        for c in kids[v]:
            x = tokens[c]
            chance = 1.0 if always else (p[x] / max(1.0 - removed, 1e-30) if renormalise else p[x])
            if rng.random() < chance:
                taken = c
                break
            removed += p[x]
        if taken is None:
            drop = {tokens[c] for c in kids[v]} if residual else set()
            weights = [0.0 if t in drop else p[t] for t in range(len(p))]
            return nodes, rng.choices(range(len(p)), weights=weights)[0]
        nodes.append(taken)
        v = taken


def as_accept_exact(**switches) -> Callable:
    """`rejection_walk` behind `accept_exact`'s signature, to monkeypatch into the generate loop."""
    rng = random.Random(1234)

    def accept(probs: torch.Tensor, tree: DraftTree, generator=None) -> Acceptance:
        if probs.dim() == 3:  # a batch of trees (the batched loop): row by row
            rows = [accept(probs[b], row_of(tree, b)) for b in range(probs.shape[0])]
            fields = zip(*(dataclasses.astuple(r) for r in rows), strict=True)
            return Acceptance(*(torch.stack(t) for t in fields))
        nodes, bonus = rejection_walk(
            probs.double().tolist(), tree.parents.tolist(), tree.tokens.tolist(), rng, **switches
        )
        width = tree.retrieve.shape[-1]
        path = torch.tensor(nodes + [-1] * (width - len(nodes)), dtype=torch.long)
        return Acceptance(path, torch.tensor(len(nodes)), torch.tensor(bonus))

    return accept


# ----------------------------------------------------------------------------- accept_exact, one step


def warp_probs(logits: torch.Tensor, temperature=1.0, top_k=None, top_p=None) -> torch.Tensor:
    """softmax(warpers(logits)) in float32 with transformers' classes, in transformers' order."""
    procs = LogitsProcessorList()
    if temperature != 1.0:
        procs.append(TemperatureLogitsWarper(temperature))
    if top_k:
        procs.append(TopKLogitsWarper(top_k=top_k))
    if top_p is not None and top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p=top_p))
    return torch.softmax(procs(None, logits.float()), dim=-1)


def step_case(seed: int, heads: str, scale: float = 1.5, **warp) -> tuple[torch.Tensor, DraftTree]:
    """Random node distributions on PATHS; drafts chosen like good (the parent's most likely tokens),
    bad (its least likely) or random heads."""
    g = torch.Generator().manual_seed(seed)
    tb = tree_buffers(PATHS)
    n = tb.parents.shape[0]
    probs = warp_probs(torch.randn(n, V, generator=g) * scale, **warp)
    tokens = [int(torch.randint(0, V, (1,), generator=g))]
    for i in range(1, n):
        parent, rank = int(tb.parents[i]), tb.paths[i - 1][-1]
        order = probs[parent].argsort(descending=True, stable=True)
        if heads == "good":
            tokens.append(int(order[rank]))
        elif heads == "bad":
            tokens.append(int(order[-1 - rank]))
        else:  # random distinct tokens per parent: a fixed permutation per parent
            perm = torch.randperm(V, generator=torch.Generator().manual_seed(seed * 100 + parent))
            tokens.append(int(perm[rank]))
    tree = DraftTree(torch.tensor(tokens), tb.parents, tb.depth, tb.ancestors, tb.retrieve, tb.sib_before)
    return probs, tree


STEP_CASES = [
    ("T=1 good heads", 0, "good", {}),
    ("T=0.6 bad heads", 1, "bad", {"temperature": 0.6}),
    ("top-p 0.8 random heads", 3, "random", {"top_p": 0.8, "scale": 1.0}),
    ("top-k 3 good heads", 4, "good", {"top_k": 3}),
]


@pytest.mark.parametrize(("name", "seed", "heads", "warp"), STEP_CASES, ids=[c[0] for c in STEP_CASES])
def test_accept_exact_one_step_law(name, seed, heads, warp):
    probs, tree = step_case(seed, heads, **warp)
    law = tree_law(probs.double().tolist(), tree.parents.tolist(), tree.tokens.tolist())
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-6)
    g = torch.Generator().manual_seed(seed)
    counts: Counter = Counter()
    accepted = 0
    for _ in range(20000):
        acc = accept_exact(probs, tree, g)
        host = torch.cat(
            [acc.length.view(1), acc.next_token.view(1), tree.tokens[acc.path.clamp(min=0)]]
        ).tolist()
        n = host[0]
        counts[(*host[3 : 2 + n], host[1])] += 1
        accepted += n - 1
    if heads == "good":
        assert accepted > 2000  # the tree is really walked, several levels deep
    assert chi2_pvalue(counts, law) > ALPHA, name


def _walk_counts(probs, tree, samples, seed, **switches) -> Counter:
    rng = random.Random(seed)
    p, parents, tokens = probs.double().tolist(), tree.parents.tolist(), tree.tokens.tolist()
    counts: Counter = Counter()
    for _ in range(samples):
        nodes, bonus = rejection_walk(p, parents, tokens, rng, **switches)
        counts[(*(tokens[i] for i in nodes[1:]), bonus)] += 1
    return counts


@pytest.mark.parametrize(("name", "seed", "heads", "warp"), STEP_CASES, ids=[c[0] for c in STEP_CASES])
def test_reference_walk_is_exact(name, seed, heads, warp):
    """The node-by-node reference (used below to build broken variants) passes the same test."""
    probs, tree = step_case(seed, heads, **warp)
    law = tree_law(probs.double().tolist(), tree.parents.tolist(), tree.tokens.tolist())
    assert chi2_pvalue(_walk_counts(probs, tree, 20000, seed), law) > ALPHA


@pytest.mark.parametrize(
    "switches",
    [{"renormalise": False}, {"residual": False}, {"always": True}],
    ids=["no-renorm", "bonus-from-p", "always"],
)
def test_broken_rules_are_detected_one_step(switches):
    """Power: each classic mistake is rejected with fewer samples than the real test uses."""
    probs, tree = step_case(0, "good")
    law = tree_law(probs.double().tolist(), tree.parents.tolist(), tree.tokens.tolist())
    assert chi2_pvalue(_walk_counts(probs, tree, 1000, 0, **switches), law) < ALPHA


# ------------------------------------------------------------------------------------- end to end


PROMPT = torch.tensor([[3, 5]])


@pytest.fixture(scope="module")
def small_target():
    """1 layer, vocab 6; lm_head scaled so next-token distributions are far from uniform."""
    target = tiny_model("llama", seed=0, vocab_size=V, hidden_size=16, num_layers=1)
    with torch.no_grad():
        target.lm_head.weight.mul_(30.0)
    target.generation_config.eos_token_id = None  # every continuation has exactly L tokens
    return target


def target_law(target, length: int, **warp) -> dict[tuple, float]:
    """Exact probability of every continuation of PROMPT of ``length`` tokens, by enumeration:
    one batched full forward per depth, float32 warped softmax, products in float64."""
    law: dict[tuple, float] = {(): 1.0}
    for _ in range(length):
        seqs = list(law)
        batch = torch.tensor([PROMPT[0].tolist() + list(s) for s in seqs])
        with torch.no_grad():
            probs = warp_probs(target(batch).logits[:, -1], **warp).double().tolist()
        law = {
            (*s, x): law[s] * row[x]
            for s, row in zip(seqs, probs, strict=True)
            for x in range(V)
            if row[x] > 0
        }
    return law


def prompt_batch(batch: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """PROMPT ``batch`` times, as [batch, T] ids and mask: for batch > 1, rows alternately left- and
    right-padded by one pad token (id 0), so every row of a batch is the same prompt at another layout."""
    if batch == 1:
        return PROMPT, None
    rows = [[0, *PROMPT[0].tolist()] if r % 2 == 0 else [*PROMPT[0].tolist(), 0] for r in range(batch)]
    mask = [[0] + [1] * PROMPT.shape[1] if r % 2 == 0 else [1] * PROMPT.shape[1] + [0] for r in range(batch)]
    return torch.tensor(rows), torch.tensor(mask)


def sample_counts(
    target,
    heads,
    tree,
    length: int,
    samples: int,
    seed: int,
    proposer=None,
    batch: int = 1,
    lookup: int = 0,
    corpus=None,
    adaptive=None,
    **warp,
) -> tuple[Counter, list[int]]:
    """Draw ``samples`` continuations of PROMPT through `speculative_generate` with exact acceptance,
    ``batch`` rows per call (`prompt_batch`; each row one sample). ``proposer`` overrides the one built
    from ``heads`` and ``tree``; ``lookup``: prompt lookup's chain beside the tree (`infer.lookup`), and
    ``corpus``'s (`infer.lookup.CorpusIndex`); ``adaptive``: an `infer.Adaptive` (None: the fixed tree)."""
    assert samples % batch == 0
    proposer = proposer or infer.SpecModel(target, heads).proposer(tree)
    g = torch.Generator().manual_seed(seed)
    kw = {
        "temperature": warp.get("temperature", 1.0),
        "top_k": warp.get("top_k") or 0,
        "top_p": warp.get("top_p", 1.0),
    }
    ids, mask = prompt_batch(batch)
    counts: Counter = Counter()
    accepted: list[int] = []
    for _ in range(samples // batch):
        out = speculative_generate(
            target,
            proposer,
            ids,
            max_new_tokens=length,
            do_sample=True,
            acceptance="exact",
            generator=g,
            attention_mask_2d=mask,
            lookup=lookup,
            corpus=corpus,
            adaptive=adaptive,
            **kw,
        )
        for row in out.sequences[:, ids.shape[1] :].tolist():
            counts[tuple(row)] += 1
        accepted += out.stats.accepted_lengths
    return counts, accepted


def good_heads(target) -> MedusaHeads:
    """Fresh Medusa heads: every head proposes the target's own top-k for the next token."""
    return MedusaHeads.for_target(target, num_heads=3)


def bad_heads(target) -> MedusaHeads:
    """Own lm_heads = -W: every head's top-1 is the target's least likely next token."""
    heads = MedusaHeads.for_target(target, num_heads=3, lm_head="own")
    with torch.no_grad():
        for h in heads.lm_heads:
            h.weight.neg_()
    return heads


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 4])
def test_generate_exact_bad_heads(small_target, batch):
    """Heads whose top-1 is the target's least likely token (3 siblings of them), temperature 0.6."""
    law = target_law(small_target, 3, temperature=0.6)
    counts, _ = sample_counts(
        small_target, bad_heads(small_target), [[0], [1], [2]], 3, 600, seed=3, batch=batch, temperature=0.6
    )
    assert chi2_pvalue(counts, law) > ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 4])
def test_generate_detects_broken_acceptance(small_target, monkeypatch, batch):
    """Power, end to end: the bonus drawn from p instead of the residual (rejected drafts come back) is
    caught with fewer samples than the correct-rule tests use. (`test_reference_walk_is_exact` shows
    the unbroken node-by-node rule passes.) Batch 4: the batched loop uses the same rule."""
    law = target_law(small_target, 4)
    monkeypatch.setattr(infer_generate, "accept_exact", as_accept_exact(residual=False))
    counts, _ = sample_counts(small_target, good_heads(small_target), PATHS, 4, 500, seed=2, batch=batch)
    assert chi2_pvalue(counts, law) < ALPHA


# ------------------------------------------------------------------------- EAGLE proposers, end to end


def eagle_counts(
    target, heads, length: int, samples: int, seed: int, batch: int = 1, **warp
) -> tuple[Counter, list[int]]:
    """`sample_counts` for dynamic-tree (EAGLE) heads, with a small tree that fits the 6-token vocab."""
    proposer = infer.SpecModel(target, heads).proposer(depth=3, draft_top_k=3, total_tokens=8)
    return sample_counts(target, heads, None, length, samples, seed, proposer=proposer, batch=batch, **warp)


def check_eagle_law(target, heads, kind: str, batch: int = 1) -> None:
    """4000 3-token samples of EAGLE-2 dynamic-tree generation follow the target's law (chi-square),
    with drafts accepted; T = 1 for EAGLE, T = 0.6 + top-k 3 + top-p 0.9 for EAGLE-3; ``batch`` rows
    per call."""
    warp = {} if kind == "eagle" else {"temperature": 0.6, "top_k": 3, "top_p": 0.9}
    law = target_law(target, 3, **warp)
    counts, accepted = eagle_counts(target, heads, 3, 4000, seed=5, batch=batch, **warp)
    assert sum(counts.values()) == 4000
    assert max(accepted) == 2  # drafts do get accepted, so the tree walk is exercised
    assert chi2_pvalue(counts, law) > ALPHA
