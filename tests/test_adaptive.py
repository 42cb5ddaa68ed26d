"""Adaptive speculation (`infer.adaptive`): with useless drafts `infer.generate` falls back to plain
decoding steps within a few steps, with good drafts it keeps the tree, and the output is the same either
way (greedy identity with ``target.generate``, exact sampling). Costs are given (`infer.Adaptive`), so
the decisions are deterministic: the tests count steps and verified nodes, never time. The default
(measured) cost curve is checked for its cache only."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from conftest import ARCHS
from test_distribution import PATHS, PROMPT, chi2_pvalue, good_heads, small_target, target_law
from test_generate import GEN_LENS, heads_for, model, prompt, reference

import infer
from infer import cost
from infer.adaptive import Adapter, Adaptive
from infer.generate import speculative_generate
from infer.tree_choice import interpolate

small_target = small_target  # the module-scoped fixture, collected here too
# a verify-cost curve where k tokens cost 1 + 0.02 (k - 1) single steps (a 33-node tree: 1.64), and a
# draft costing 5% of a step: drafts pay for themselves once about 0.7 tokens per step are accepted
COSTS = Adaptive(verify_s=[1.0 + 0.02 * k for k in range(64)], draft_s=0.05)
ALPHA = 1e-3


LONG = 120  # new tokens where the adapter's first windows and probes are a small part of the steps


def generate(key, kind: str, i: int, adaptive, n: int | None = None, lookup: int | None = 0):
    """The heads' own tree (no prompt lookup beside it, so that sizes and steps are the adapter's alone;
    ``lookup=None``: `infer.generate`'s default)."""
    m = infer.SpecModel(model(*key), heads_for(key, kind))
    return infer.generate(m, prompt(i), max_new_tokens=n or GEN_LENS[i], adaptive=adaptive, lookup=lookup)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_useless_drafts_fall_back_to_plain_decoding(arch):
    """Random heads: within five windows (a chain window, at most one tree window when a lucky draft
    made the chain pay, then chain windows while that draft's weight in α decays) the adapter verifies
    the root alone, apart from short chain probes whose waits double; verified tokens ≈ plain decoding's
    one per forward."""
    key = (arch,)
    for i in range(2):
        out = generate(key, "random", i, COSTS, LONG)
        assert out.sequences.tolist() == reference(key, i, LONG).tolist()
        st = out.stats
        sizes = st.tree_sizes
        assert len(sizes) == len(st.accepted_lengths) == st.num_target_forwards - 1
        first = sizes.index(1)
        assert first <= 5 * COSTS.every and all(n == 1 for n in sizes[first : first + COSTS.probe])
        assert st.adaptive["steps"]["tree"] <= COSTS.every
        assert st.steps_without_drafts >= 0.75 * len(sizes)  # the rest: first windows and probes
        assert st.adaptive["final"] == "none"
        assert sum(sizes) <= 1.5 * len(sizes) + 4 * max(sizes)  # nodes verified ≈ one per forward
        # target forwards ≈ plain decoding's (one per new token)
        assert st.num_target_forwards <= LONG + 1
        fixed = generate(key, "random", i, False, LONG)
        assert fixed.stats.steps_without_drafts <= 1 and fixed.stats.adaptive is None  # the last: no room
        assert sum(fixed.stats.tree_sizes) > 3 * sum(sizes)  # the fixed tree verifies far more


def test_expensive_drafts_leave_after_one_step():
    """A draft costing 5 plain steps: once one chain step shows that even perfect acceptance for the rest
    of the window cannot pay, it is left at once (no full window of such steps), the tree is never tried
    and no probe comes back (such drafts cannot pay even when always right)."""
    key = ("llama",)
    out = generate(key, "random", 0, Adaptive(verify_s=COSTS.verify_s, draft_s=5.0), LONG)
    assert out.sequences.tolist() == reference(key, 0, LONG).tolist()
    assert out.stats.adaptive["steps"] == {"none": LONG - 2, "chain": 1, "tree": 0}
    assert out.stats.steps_without_drafts >= 0.8 * len(out.stats.tree_sizes)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_good_drafts_keep_the_tree(arch):
    """Heads fitted to these continuations: the adapter keeps speculating at full depth (it tries the
    33-node tree after the first chain window; their top-1 chain accepts as much, so it keeps the
    cheaper chain), τ stays high."""
    key = (arch,)
    for i in range(2):
        out = generate(key, "trained_own", i, COSTS)
        assert out.sequences.tolist() == reference(key, i, GEN_LENS[i]).tolist()
        st = out.stats
        assert st.adaptive["steps"]["none"] == 0 and st.steps_without_drafts <= 1  # the last: no room
        assert st.adaptive["chain_depth"] == 4 and st.adaptive["steps"]["tree"] > 0
        assert st.mean_accepted_length > 3.5
        assert max(st.accepted_lengths) >= 4


@pytest.mark.parametrize("arch", ARCHS)
def test_mixed_drafts_identity_and_eagle(arch):
    """Heads with some drafts accepted, and EAGLE heads (random: chain probes of the dynamic tree and
    root-only steps), under a pace that switches often: greedy identity whatever the tree."""
    from heads import EagleHead

    key = (arch,)
    fast = Adaptive(verify_s=COSTS.verify_s, draft_s=0.05, every=1, probe=1, max_probe=2)
    for i in range(2):
        ref = reference(key, i, GEN_LENS[i]).tolist()
        out = generate(key, "trained", i, fast, lookup=None)  # with prompt lookup's chain (the default)
        assert out.sequences.tolist() == ref
        torch.manual_seed(0)
        eagle = EagleHead.for_target(model(*key)).eval()
        m = infer.SpecModel(model(*key), eagle)
        out = infer.generate(m, prompt(i), max_new_tokens=GEN_LENS[i], adaptive=fast)
        assert out.sequences.tolist() == ref
        steps = out.stats.adaptive["steps"]
        assert steps["chain"] > 0 and steps["none"] > 0  # the chain and plain paths both ran


def test_measured_costs_are_cached(tmp_path, monkeypatch):
    """The default measures the verify-cost curve once per device, dtype and target shape, then reads
    it from ``$SELFSPEC_CACHE/verify_cost`` (a second process measures nothing)."""
    monkeypatch.setenv("SELFSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(cost, "_MEMO", {})
    target = model("llama")
    step_s = cost.verify_seconds(target)
    assert len(step_s) == cost.MAX_K and step_s == sorted(step_s) and step_s[0] > 0
    assert len(list((tmp_path / "verify_cost").glob("*.json"))) == 1
    monkeypatch.setattr(cost, "_MEMO", {})

    def measured(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(cost, "measure_profile", measured)
    assert cost.verify_seconds(target) == step_s
    out = infer.generate(
        infer.SpecModel(target, heads_for(("llama",), "random")), prompt(0), max_new_tokens=8
    )
    assert out.stats.adaptive is not None


def test_bad_options():
    with pytest.raises(ValueError, match="every"):
        Adaptive(every=0)
    with pytest.raises(ValueError, match="verify_s"):
        Adaptive(verify_s=[1.0, 0.0])
    m = infer.SpecModel(model("llama"), heads_for(("llama",), "random"))
    with pytest.raises(ValueError, match="adaptive must be"):
        infer.generate(m, prompt(0), max_new_tokens=4, adaptive="yes")


def _sample(target, proposer, samples: int, seed: int, adaptive: Adaptive) -> tuple[Counter, Counter]:
    g = torch.Generator().manual_seed(seed)
    counts, modes = Counter(), Counter()
    for _ in range(samples):
        out = speculative_generate(target, proposer, PROMPT, max_new_tokens=3, do_sample=True, generator=g,
                                   adaptive=adaptive)  # fmt: skip
        counts[tuple(out.sequences[0, PROMPT.shape[1] :].tolist())] += 1
        modes.update({k: v for k, v in out.stats.adaptive["steps"].items() if v})
    return counts, modes


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["medusa", "eagle3"])
def test_sampling_is_exact_with_adaptation(small_target, kind):
    """4000 3-token samples (T = 1) follow the target's law while the adapter picks each step's tree
    from the previous steps' acceptance (a decision after every step, probes after one)."""
    from heads.eagle3 import Eagle3Head

    torch.manual_seed(0)
    if kind == "medusa":
        proposer = infer.SpecModel(small_target, good_heads(small_target)).proposer(PATHS)
    else:
        heads = Eagle3Head.for_target(small_target).eval()
        proposer = infer.SpecModel(small_target, heads).proposer(depth=3, draft_top_k=3, total_tokens=8)
    pace = Adaptive(verify_s=[1.0 + 0.1 * k for k in range(64)], draft_s=0.0, every=1, probe=1, max_probe=1)
    counts, modes = _sample(small_target, proposer, 4000, 7, pace)
    assert len(modes) >= 2, modes  # the tree did change with acceptance
    assert chi2_pvalue(counts, target_law(small_target, 3)) > ALPHA


def test_compiled_path_adapts_on_request():
    """``compile``: a fixed tree by default (no new shapes to compile); asked to adapt, the compiled
    verify and draft steps run every shape the adapter picks (tree, chain, root alone), identically."""
    key = ("llama",)
    fast = Adaptive(verify_s=COSTS.verify_s, draft_s=0.05, every=1, probe=1, max_probe=2)
    m = infer.SpecModel(model(*key), heads_for(key, "trained"))
    ref = reference(key, 0, GEN_LENS[0]).tolist()
    out = infer.generate(m, prompt(0), max_new_tokens=GEN_LENS[0], compile="eager")
    assert out.sequences.tolist() == ref and out.stats.adaptive is None
    out = infer.generate(m, prompt(0), max_new_tokens=GEN_LENS[0], compile="eager", adaptive=fast)
    assert out.sequences.tolist() == ref
    assert len(set(out.stats.tree_sizes)) >= 3, out.stats.tree_sizes


# verify cost of k tokens in plain steps, SmolLM2-135M-Instruct in bf16 on 2 cores
# (results/smollm2-eagle31/more-steps/adaptive.md), linear between the measured k
SMOLLM2_COST = {1: 1.0, 2: 1.10, 4: 1.11, 8: 1.14, 16: 1.24, 32: 1.35, 64: 1.68}


def _replay(alpha: float, seed: int, steps: int = 600, draft_s: float = 0.43) -> tuple[Counter, float]:
    """The adapter fed seeded acceptances (no model): each draft depth of a chain is accepted with
    probability ``alpha`` (a 48-node depth-6 tree's with alpha + 0.1). Returns the steps per mode and the
    tokens per plain step of time."""
    curve = interpolate(list(SMOLLM2_COST), list(SMOLLM2_COST.values()), 64)
    rng = random.Random(seed)
    adapter = Adapter(Adaptive(verify_s=curve, draft_s=draft_s), curve, depth=6)
    modes, tokens, time_ = Counter(), 0, 0.0
    for _ in range(steps):
        depth, width = adapter.shape()
        nodes = 1 if depth == 0 else depth + 1 if width == 1 else 48
        p = alpha + 0.1 if nodes == 48 else alpha
        accepted = 1 + next((j for j in range(depth) if rng.random() >= p), depth)
        adapter.observe(accepted, nodes, depth)
        modes["none" if depth == 0 else "chain" if width == 1 else "tree"] += 1
        tokens += accepted
        time_ += curve[nodes - 1] + (draft_s * depth / 6 if depth else 0.0)
    return modes, tokens / time_


def test_drafts_that_pay_keep_drafting_through_unlucky_windows():
    """Chains accepting each depth with probability 0.5 pay about 1.5x on SmolLM2's costs, yet one 4-step
    window in five accepts at most one draft: pricing from the pooled, decaying evidence (``memory``)
    keeps drafting (a window priced alone left 20-35% of steps plain). Useless drafts still go plain."""
    for seed in range(3):
        modes, rate = _replay(0.5, seed)
        assert modes["none"] <= 0.05 * sum(modes.values()), modes
        assert rate > 1.28  # a fixed depth-6 chain: 1.29
        modes, rate = _replay(0.02, seed)
        assert modes["none"] >= 0.8 * sum(modes.values()), modes
        assert rate > 0.98
