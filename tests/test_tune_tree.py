"""Tree tuning (`infer.tree` greedy trees, `infer.tree_choice` size choice), saved inference settings
(`infer.settings`: inference.json), and `infer.tune_tree` (scripts/tune_tree.py)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os

import pytest
import torch
from conftest import tiny_model

from infer.settings import write_settings
from infer.tree import build_tree, default_tree, greedy_nodes, validate_paths
from infer.tree_choice import (
    choose_eagle_budget,
    choose_num_nodes,
    empirical_accept_length,
    expected_accept_curve,
    expected_accept_length,
)
from train.held_out import eval_batches

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def random_acc(seed: int, depth: int = 4, ranks: int = 10) -> torch.Tensor:
    """Random per-depth rank accuracies: each row a random sub-distribution (sum <= 1) over ranks."""
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(depth, ranks + 1, generator=g, dtype=torch.float64) ** 3
    if seed % 2:  # half the tables decay with rank, like trained heads; the others are unordered
        w[:, :ranks] = w[:, :ranks].sort(-1, descending=True).values
    return (w / w.sum(-1, keepdim=True))[:, :ranks]


@pytest.mark.parametrize("seed", range(6))
def test_tuned_tree_beats_default_and_is_valid(seed):
    acc = random_acc(seed)
    default = default_tree(4)
    tau = expected_accept_curve(acc, 63)
    tuned, _ = greedy_nodes(acc, len(default))
    assert expected_accept_length(tuned, acc) >= expected_accept_length(default, acc) - 1e-12
    assert len(tau) == 64 and tau[0] == 1.0
    assert all(b >= a for a, b in zip(tau, tau[1:], strict=False))  # monotone in N
    for n in (1, 2, 5, 17, 40, 63):
        paths, values = greedy_nodes(acc, n)
        assert len(paths) == n and len(validate_paths(paths)) == n  # prefix-closed, no duplicates
        assert values == sorted(values, reverse=True)
        assert expected_accept_length(paths, acc) == pytest.approx(tau[n], rel=1e-12)
        assert {tuple(p) for p in build_tree(acc, n)} == set(paths)


def prefix_closed_subsets(depth: int, ranks: int, n: int):
    every = [p for d in range(1, depth + 1) for p in itertools.product(range(ranks), repeat=d)]
    for sub in itertools.combinations(every, n):
        s = set(sub)
        if all(len(p) == 1 or p[:-1] in s for p in sub):
            yield sub


@pytest.mark.parametrize("seed", range(3))
def test_greedy_is_optimal_by_brute_force(seed):
    acc = random_acc(seed, depth=3, ranks=2)
    for n in (1, 3, 5):
        best = max(expected_accept_length(s, acc) for s in prefix_closed_subsets(3, 2, n))
        assert expected_accept_curve(acc, n)[n] == pytest.approx(best, rel=1e-12)


def test_greedy_limits_and_bad_input():
    acc = random_acc(1)
    paths, _ = greedy_nodes(acc, 63, max_depth=2, max_rank=3)
    assert len(paths) == 3 + 9 and max(len(p) for p in paths) == 2 and max(max(p) for p in paths) == 2
    assert len(expected_accept_curve(acc, 63, max_depth=2, max_rank=3)) == 13  # only 12 paths exist
    with pytest.raises(ValueError, match="probabilities"):
        greedy_nodes(acc + 1, 4)
    with pytest.raises(ValueError, match="depth, ranks"):
        greedy_nodes(acc[0], 4)


def test_empirical_accept_length():
    ranks = torch.tensor([[0, 0, 1], [1, 0, 0], [0, 2, 0], [10, 0, 0]])
    paths = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
    # row 0: [0], [0,0] -> 3; row 1: [1], [1,0] -> 3; row 2: [0] -> 2; row 3: nothing -> 1
    assert empirical_accept_length(paths, ranks) == pytest.approx((3 + 3 + 2 + 1) / 4)
    # with independent ranks drawn from acc, the measured τ converges to the model's expectation
    acc = random_acc(3, depth=3, ranks=4)
    g = torch.Generator().manual_seed(0)
    full = torch.cat([acc, (1 - acc.sum(-1, keepdim=True)).clamp(min=0)], 1)
    sample = torch.stack([torch.multinomial(full[d], 40000, True, generator=g) for d in range(3)], 1)
    tree = build_tree(acc, 12)
    assert empirical_accept_length(tree, sample) == pytest.approx(expected_accept_length(tree, acc), abs=0.02)
    with pytest.raises(ValueError, match="deeper"):
        empirical_accept_length([[0], [0, 0]], ranks[:, :1])


def test_choose_num_nodes_picks_the_argmax():
    tau = [1.0 + 2.0 * (1 - 0.9**n) for n in range(64)]  # diminishing returns
    verify = [0.010 + 0.0004 * k for k in range(1, 65)]
    n, rates = choose_num_nodes(tau, verify, draft_s=0.002)
    brute = max(range(1, 64), key=lambda m: tau[m] / (verify[m] + 0.002))
    assert n == brute and 1 < n < 63
    assert rates[n] == pytest.approx(tau[n] / (verify[n] + 0.002))
    assert choose_num_nodes(tau, [0.01] * 64, 0.0)[0] == 63  # free verification: the biggest tree
    assert choose_num_nodes(tau, [0.01 * k for k in range(1, 65)], 0.0)[0] == 1  # linear cost: chain of 1
    with pytest.raises(ValueError, match="positive"):
        choose_num_nodes(tau, [0.0] * 64, 0.0)


def test_choose_eagle_budget_matches_brute_force():
    acc = random_acc(5, depth=6)
    verify = [0.02 + 0.0003 * k + 0.00001 * k * k for k in range(1, 65)]
    draft = {2: 0.004, 4: 0.008, 6: 0.012}
    best = choose_eagle_budget(acc, verify, draft, draft_top_k=4)
    rate = {
        (d, t): expected_accept_curve(acc, t - 1, max_depth=d, max_rank=4)[t - 1] / (verify[t - 1] + draft[d])
        for d in draft
        for t in range(2, 65)
        if len(expected_accept_curve(acc, t - 1, max_depth=d, max_rank=4)) >= t
    }
    (d, t), r = max(rate.items(), key=lambda kv: kv[1])
    assert (best["depth"], best["total_tokens"]) == (d, t)
    assert best["expected_tokens_per_s"] == pytest.approx(r) and best["draft_top_k"] == 4


def test_profile_grid_and_interpolation():
    from infer.tree_choice import interpolate, profile_grid

    grid = profile_grid(64)
    assert grid[:8] == list(range(1, 9)) and grid[-1] == 64 and {12, 16, 28, 32, 40, 56} <= set(grid)
    assert 33 not in grid and len(grid) < 25
    assert profile_grid(10) == [1, 2, 3, 4, 5, 6, 7, 8, 10]
    assert interpolate([1, 3, 7], [1.0, 3.0, 5.0], 7) == pytest.approx([1, 2, 3, 3.5, 4, 4.5, 5])
    assert interpolate([1, 2], [2.0, 1.0], 2) == [2.0, 1.0]  # measured points are kept as they are


def test_monotone_profile():
    from infer.tree_choice import monotone

    assert monotone([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert monotone([5.0, 1.0, 1.0]) == pytest.approx([7 / 3] * 3)
    assert monotone([1.0, 2.0]) == [1.0, 2.0]


# ---------------------------------------------------------------------------------------- inference.json


def _medusa(tmp_path, target):
    from heads import save_heads
    from heads.medusa import MedusaHeads

    torch.manual_seed(0)
    heads = MedusaHeads.for_target(target, num_heads=3)
    for blk in heads.blocks:  # non-zero weights, so drafts differ from plain top-k
        torch.nn.init.normal_(blk[0].linear.weight, std=0.5)
    save_heads(heads, str(tmp_path))
    return heads


def test_saved_tree_round_trip_medusa(tmp_path, one_thread):
    """A tuned static tree saved with the heads (``inference.json``) is what `infer.load` drafts with;
    explicit trees still win; greedy output stays the target's."""
    import infer

    target = tiny_model("llama")
    _medusa(tmp_path, target)
    paths = [list(p) for p in greedy_nodes(random_acc(2, depth=3), 9)[0]]
    write_settings(str(tmp_path), {"tree": paths}, tuning={"note": "kept for the record"})
    model = infer.load(target, heads=str(tmp_path))
    assert model.settings.tree == paths
    assert model.proposer().tree == paths
    assert model.proposer([[0]]).tree == [[0]]  # an explicit tree still wins
    ids = torch.randint(3, 96, (1, 7), generator=torch.Generator().manual_seed(1))
    ref = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
    out = infer.generate(model, ids, max_new_tokens=24, do_sample=False)
    assert torch.equal(out.sequences, ref)


def test_saved_budget_round_trip_eagle(tmp_path, one_thread):
    import infer
    from heads import save_heads
    from heads.eagle import EagleHead

    target = tiny_model("llama")
    torch.manual_seed(0)
    save_heads(EagleHead.for_target(target), str(tmp_path))
    (tmp_path / "inference.json").write_text(json.dumps({"total_tokens": 7, "depth": 3, "draft_top_k": 2}))
    model = infer.load(target, heads=str(tmp_path))
    prop = model.proposer()
    assert (prop.total_tokens, prop.depth, prop.top_k) == (7, 3, 2)
    prop = model.proposer(total_tokens=5)  # explicit arguments override the saved budget one by one
    assert (prop.total_tokens, prop.depth, prop.top_k) == (5, 3, 2)
    ids = torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(2))
    ref = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False)
    out = infer.generate(model, ids, max_new_tokens=20, do_sample=False)
    assert torch.equal(out.sequences, ref)


def test_inference_json_settings_and_precedence(tmp_path, one_thread):
    """``inference.json`` carries any setting (here the acceptance rule) and is checked against the heads:
    budget keys for Medusa heads, unknown keys refused."""
    import infer
    from infer.settings import read_settings

    target = tiny_model("llama")
    heads = _medusa(tmp_path, target)
    write_settings(str(tmp_path), {"tree": [[0], [1]], "acceptance": "typical", "typical_eps": 0.2})
    model = infer.load(target, heads=str(tmp_path))
    assert model.settings.tree == [[0], [1]] and model.settings.acceptance == "typical"
    assert model.settings.typical_eps == 0.2 and model.settings.typical_delta == 0.3
    for bad, message in [
        ({"depth": 3}, r"\['depth'\] only apply to dynamic-tree \(EAGLE\) heads"),
        ({"trees": [[0]]}, r"unknown inference settings \[trees\]"),
        ({"acceptance": "fast"}, "acceptance must be 'exact' or 'typical'"),
        ({"typical_eps": 3}, r"typical_eps must be a number in \[0, 1\]"),
    ]:
        (tmp_path / "inference.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=message) as e:
            read_settings(str(tmp_path), heads.config)
        assert "inference.json" in str(e.value) and "\n" not in str(e.value)


def test_infer_settings_config_and_defaults_of_generate(tmp_path, one_thread):
    """`InferSettings` is a `heads.config` dataclass (YAML, key=value, one-line errors), and a model's
    settings are the defaults of `infer.generate` and of the proposer (explicit arguments still win)."""
    import infer
    from heads import MedusaHeads, config
    from heads.eagle import EagleHead
    from infer.settings import InferSettings

    s = config.load(InferSettings, overrides=["total_tokens=32", "acceptance=typical"])
    assert (s.total_tokens, s.acceptance, s.depth, s.tree) == (32, "typical", 6, None)
    (tmp_path / "s.yaml").write_text("tree: [[0], [0, 0], [1]]\ntypical_delta: 0.5\n")
    assert config.load(InferSettings, str(tmp_path / "s.yaml")).tree == [[0], [0, 0], [1]]
    with pytest.raises(ValueError, match=r"'total_tokens' must be an int in \[2, 4096\], got 1"):
        config.load(InferSettings, overrides=["total_tokens=1"])
    with pytest.raises(ValueError, match="did you mean 'typical_eps'"):
        config.load(InferSettings, overrides=["typical_epsilon=0.1"])
    with pytest.raises(ValueError, match="no parent"):
        InferSettings(tree=[[0, 0]])
    target = tiny_model("llama")
    torch.manual_seed(0)
    heads = MedusaHeads.for_target(target, num_heads=2)
    for p in heads.parameters():
        p.data.normal_(0, 0.1)
    typical = InferSettings(acceptance="typical", typical_eps=0.2, typical_delta=0.1, tree=[[0], [1]])
    tuned, plain = infer.SpecModel(target, heads, settings=typical), infer.SpecModel(target, heads)
    assert tuned.proposer().tree == [[0], [1]] and len(plain.proposer().tree) == 32
    ids = torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(3))
    # a fixed tree: adaptation picks trees from measured timings, and a seeded sample path follows the tree
    kw = {"max_new_tokens": 16, "do_sample": True, "adaptive": False}
    got = infer.generate(tuned, ids, generator=torch.Generator().manual_seed(4), **kw)
    want = infer.generate(
        plain,
        ids,
        tree=[[0], [1]],
        acceptance="typical",
        typical_eps=0.2,
        typical_delta=0.1,
        generator=torch.Generator().manual_seed(4),
        **kw,
    )
    assert torch.equal(got.sequences, want.sequences)
    assert got.stats.accepted_lengths == want.stats.accepted_lengths
    exact = [  # the argument overrides the setting
        infer.generate(
            m, ids, tree=[[0], [1]], acceptance="exact", generator=torch.Generator().manual_seed(4), **kw
        )
        for m in (tuned, plain)
    ]
    assert torch.equal(exact[0].sequences, exact[1].sequences)
    eagle = EagleHead.for_target(target).eval()
    budget = InferSettings(depth=3, draft_top_k=2, total_tokens=7)
    prop = infer.SpecModel(target, eagle, settings=budget).proposer(depth=2)
    assert (prop.total_tokens, prop.depth, prop.top_k) == (7, 2, 2)
    with pytest.raises(ValueError, match="eagle heads draft dynamic trees"):
        infer.SpecModel(target, eagle, settings=InferSettings(tree=[[0]]))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"paths": [[0]]}), r"unknown inference settings \[paths\]"),
        (json.dumps({"tree": [[0]], "extra": 1}), r"unknown inference settings \[extra\]"),
        (json.dumps({"tree": [[0], [1, 1]]}), r"invalid tree: .*no parent \[1\]"),
        (json.dumps({"tree": [[0], [0]]}), "invalid tree: .*duplicate"),
        (json.dumps({"tree": [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]}), "needs 4 Medusa heads"),
        (json.dumps({"tree": [[0.5]]}), "lists of int ranks"),
        (json.dumps([[0]]), "unknown inference settings list"),
    ],
)
def test_malformed_saved_tree_medusa(tmp_path, content, message):
    import infer

    target = tiny_model("llama")
    _medusa(tmp_path, target)
    (tmp_path / "inference.json").write_text(content)
    with pytest.raises(ValueError, match=message) as e:
        infer.load(target, heads=str(tmp_path))
    assert "inference.json" in str(e.value)


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        (
            {"total_tokens": 1, "depth": 3, "draft_top_k": 2},
            r"'total_tokens' must be an int in \[2, 4096\], got 1",
        ),
        (
            {"total_tokens": 8, "depth": "3", "draft_top_k": 2},
            r"'depth' must be an int in \[1, 64\], got '3'",
        ),
        ({"tree": [[0]]}, r"\['tree'\] only apply to static-tree \(Medusa\) heads"),
    ],
)
def test_malformed_saved_budget_eagle(tmp_path, tree, message):
    import infer
    from heads import save_heads
    from heads.eagle import EagleHead

    target = tiny_model("llama")
    save_heads(EagleHead.for_target(target), str(tmp_path))
    (tmp_path / "inference.json").write_text(json.dumps(tree))
    with pytest.raises(ValueError, match=message):
        infer.load(target, heads=str(tmp_path))


# ---------------------------------------------------------------------------------------------- scripts


def test_measure_profile_and_tune(tmp_path, one_thread):
    """The profile restores the cache each step; the tuned Medusa tree is valid and fits the heads."""
    from infer.cost import measure_profile
    from infer.tune_tree import tune_medusa

    target = tiny_model("llama")
    prefix = torch.randint(3, 96, (1, 12), generator=torch.Generator().manual_seed(0))
    prof = measure_profile(target, prefix, max_k=6, repeats=1, warmup=0)
    assert prof["k"] == [1, 2, 3, 4, 5, 6] and all(t > 0 for t in prof["step_s"])
    assert all(b >= a for a, b in zip(prof["step_s"], prof["step_s"][1:], strict=False))
    sparse = measure_profile(target, prefix, max_k=6, repeats=1, warmup=0, ks=[1, 3, 6])
    assert sparse["k"] == [1, 2, 3, 4, 5, 6] and sparse["k_measured"] == [1, 3, 6]
    assert len(sparse["step_s"]) == len(sparse["step_s_median"]) == 6
    assert all(b >= a for a, b in zip(sparse["step_s"], sparse["step_s"][1:], strict=False))
    with pytest.raises(ValueError, match="from 1 to max_k = 6"):
        measure_profile(target, prefix, max_k=6, repeats=1, warmup=0, ks=[2, 6])
    tree = tune_medusa(
        random_acc(4, depth=3), prof, 0.001, num_heads=3, joint=torch.zeros(5, 3, dtype=torch.long)
    )
    assert len(validate_paths(tree["paths"])) == tree["tuning"]["num_nodes"] <= 5
    zeros = sum(1 for p in tree["paths"] if not any(p))  # every position's ranks are 0: chain nodes hit
    assert tree["tuning"]["measured_accept_length"] == pytest.approx(1 + zeros)


def generate_tau(model, prompts: list, new_tokens: int, **kw) -> float:
    """Σ accepted tokens / Σ verify steps of greedy `infer.generate` with the fixed tree over ``prompts``: the expectation for
    the refinement's measured τ, computed here without `infer.tree_choice.measure_tau` (which the refinement uses)."""
    import infer

    lengths = [
        a
        for ids in prompts
        for a in infer.generate(
            model, ids, max_new_tokens=new_tokens, do_sample=False, adaptive=False, lookup=0, **kw
        ).stats.accepted_lengths
    ]
    return sum(lengths) / len(lengths)


def test_refine_eagle_picks_by_measured_tau(tmp_path, one_thread):
    """As for Medusa below, with a head trained on the target's own text (`test_eagle.trained_head`), so
    that drafts are accepted and each candidate's τ depends on its budget and on every prompt."""
    from test_eagle import target as eagle_target
    from test_eagle import trained_head

    import infer
    from infer.tune_tree import refine_eagle, tune_eagle

    target = eagle_target("llama")
    model = infer.SpecModel(target, trained_head("llama")[0].eval())
    prof = {"step_s": [0.01 + 0.001 * k for k in range(1, 65)]}
    draft = {2: 0.002, 6: 0.006}
    tree = tune_eagle(random_acc(1, depth=6), prof, draft, draft_top_k=3)
    prompts = [torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(s)) for s in (100, 101)]
    tree = refine_eagle(model, tree, prompts, prof, draft, max_new_tokens=24)
    cands = tree["tuning"]["refined"]["candidates"]
    # per depth: the static best and 16, 24, 32, 48, 64 (deduplicated); plus the default
    assert "default" in cands and 11 <= len(cands) <= 13  # 2 depths x (5 sizes + the static best) + 1
    assert all(f"depth={d},total_tokens={t}" in cands for d in (2, 6) for t in (16, 24, 32, 48, 64))
    best = max(cands.values(), key=lambda c: c["expected_tokens_per_s"])
    assert {k: tree[k] for k in ("depth", "total_tokens", "draft_top_k")} == {
        k: best[k] for k in ("depth", "total_tokens", "draft_top_k")
    }
    # every candidate's τ is infer.generate's with its budget, and the kept one has the best τ / cost
    rate = {}
    for name, c in cands.items():
        tau = generate_tau(model, prompts, 24, **{k: c[k] for k in ("depth", "total_tokens", "draft_top_k")})
        assert c["measured_accept_length"] == pytest.approx(tau, rel=1e-12), name
        rate[name] = tau / (prof["step_s"][c["total_tokens"] - 1] + draft[c["depth"]])
        assert c["expected_tokens_per_s"] == pytest.approx(rate[name])
    assert cands[max(rate, key=rate.get)] == best
    taus = [c["measured_accept_length"] for c in cands.values()]
    assert min(taus) > 1.4 and len(set(taus)) > 1, taus  # measured 1.59-2.0: drafts accepted, budgets differ


def test_refine_medusa_picks_by_measured_tau(tmp_path, one_thread):
    """Candidates are greedy trees of several sizes plus the default; the kept tree is the best by measured
    τ / step cost, its τ is what infer.generate measures, and the record keeps the rank-vector τ apart."""
    import infer
    from heads import MedusaHeads
    from infer.tune_tree import refine_medusa, tune_medusa

    target = tiny_model("llama")
    torch.manual_seed(0)
    heads = MedusaHeads.for_target(target, num_heads=3)
    for p in heads.parameters():
        p.data.normal_(0, 0.1)
    model = infer.SpecModel(target, heads.eval())
    prof = {"step_s": [0.01 + 0.0002 * k for k in range(1, 65)]}
    acc = random_acc(2, depth=3)
    tree = tune_medusa(acc, prof, 0.001, num_heads=3, joint=torch.zeros(5, 3, dtype=torch.long))
    chosen = len(tree["paths"])
    prompts = [torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(s)) for s in range(2)]
    tree = refine_medusa(model, tree, acc, prompts, prof, 0.001, max_new_tokens=8)
    rec = tree["tuning"]
    cands = rec["refined"]["candidates"]
    assert "default" in cands and f"greedy,{chosen} nodes" in cands
    assert {c["num_nodes"] for c in cands.values()} >= {16, 32, 48, 63, chosen}
    best = max(cands.values(), key=lambda c: c["expected_tokens_per_s"])
    assert len(validate_paths(tree["paths"])) == len(tree["paths"]) == rec["num_nodes"] == best["num_nodes"]
    assert rec["measured_accept_length"] == best["measured_accept_length"]
    assert rec["default_measured_accept_length"] == cands["default"]["measured_accept_length"]
    assert "rank_vector_accept_length" in rec and "default_rank_vector_accept_length" in rec
    # every candidate's τ is infer.generate's with its tree (the nested greedy trees on acc, or the
    # default), and the kept tree has the best τ / cost
    trees = {
        name: default_tree(3) if name == "default" else greedy_nodes(acc, c["num_nodes"])[0]
        for name, c in cands.items()
    }
    rate = {}
    for name, c in cands.items():
        tau = generate_tau(model, prompts, 8, tree=[list(p) for p in trees[name]])
        assert c["measured_accept_length"] == pytest.approx(tau, rel=1e-12), name
        rate[name] = tau / (prof["step_s"][c["num_nodes"]] + 0.001)
        assert c["expected_tokens_per_s"] == pytest.approx(rate[name])
    kept = max(rate, key=rate.get)
    assert cands[kept] == best and sorted(map(tuple, tree["paths"])) == sorted(map(tuple, trees[kept]))


def test_load_prompts_text_and_chat_rows(tmp_path):
    """Text rows give their first tokens; chat rows give the conversation before the first assistant turn,
    rendered with the template's generation prompt (the held-out chat data `--measure-tau` reads)."""
    from demo import SYSTEM_PROMPT, train_tokenizer
    from infer.prompts import load_prompts

    tok = train_tokenizer(["def f(x):\n    return x + 1\n"] * 20, vocab_size=300, max_length=128)
    conv = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "def f(x):\n"},
        {"role": "assistant", "content": "    return x + 1"},
    ]
    sharegpt = [{"from": "human", "value": "def g():\n"}, {"from": "gpt", "value": "    pass"}]
    rows = [{"text": "def f(x):\n    return x + 1\n"}, {"messages": conv}, {"conversations": sharegpt}]
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text, chat, share = load_prompts(str(path), tok, 3, max_tokens=4)
    assert text.shape == (1, 4) and torch.equal(
        text, tok(rows[0]["text"], return_tensors="pt").input_ids[:, :4]
    )
    want = tok.apply_chat_template(conv[:2], add_generation_prompt=True, tokenize=False)
    assert tok.decode(chat[0]) == want and want.endswith("<|assistant|>") and "return" not in want
    assert tok.decode(share[0]).endswith("def g():\n<|end|>\n<|assistant|>")
    assert [p.shape for p in load_prompts(str(path), tok, 5, skip=1)] == [chat.shape, share.shape]
    path.write_text(json.dumps({"messages": conv[:2]}) + "\n")
    with pytest.raises(ValueError, match="data.jsonl row 0: conversation has no assistant turn"):
        load_prompts(str(path), tok, 1)
    path.write_text(json.dumps({"prompt": "x"}) + "\n")
    with pytest.raises(ValueError, match="row 0: prompts need a non-empty 'text' field or a chat 'messages'"):
        load_prompts(str(path), tok, 1)


def _code_target_and_heads(tmp_path):
    """(code snippets, tokenizer, tiny target, its saved directory) with random Medusa heads (2) for it saved in
    ``tmp_path/heads``."""
    from demo import train_tokenizer
    from heads import MedusaHeads, save_heads

    code = ["def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i, i * i)\n"]
    tok = train_tokenizer(code * 20, vocab_size=300, max_length=256)
    target = tiny_model("llama", vocab_size=300)
    target_dir = str(tmp_path / "target")
    target.save_pretrained(target_dir)
    tok.save_pretrained(target_dir)
    torch.manual_seed(0)
    heads = MedusaHeads.for_target(target, num_heads=2)
    for p in heads.parameters():
        p.data.normal_(0, 0.1)
    save_heads(heads, str(tmp_path / "heads"))
    return code, tok, target, target_dir


def test_cli_tunes_medusa_on_chat_data_and_load_uses_it(tmp_path, one_thread):
    """scripts/tune_tree.py's command line end to end on chat-format held-out data: accuracies, a (grid)
    profile, the measured-τ refinement with chat prompts, inference.json written, and `infer.load`
    picking the tree up."""
    import infer
    from heads.config import parse_cli
    from infer.tune_tree import TuneOptions, tune_tree

    code, tok, target, target_dir = _code_target_and_heads(tmp_path)
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"def f{i}(x):\n"},
                {"role": "assistant", "content": "    return x + 1\n" * (1 + i % 3) + code[i % 2]},
            ]
        }
        for i in range(8)
    ]
    data = tmp_path / "eval-chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = [
        "--heads",
        str(tmp_path / "heads"),
        "--target",
        target_dir,
        "--data",
        str(data),
        "--dtype",
        "fp32",
    ]
    argv += ["--max-examples", "4", "--max-k", "40", "--repeats", "1", "--measure-tau", "2"]
    tune_tree(parse_cli(TuneOptions, [*argv, "--max-new-tokens", "8"]), eval_batches)
    with open(tmp_path / "heads" / "inference.json") as f:
        saved = json.load(f)
    rec = saved["tuning"]
    assert rec["refined"]["prompts"] == 2 and "default" in rec["refined"]["candidates"]
    assert {c["num_nodes"] for c in rec["refined"]["candidates"].values()} >= {16, 32}
    assert rec["profile"]["k"] == list(range(1, 41)) and rec["profile"]["k_measured"][-1] == 40
    assert len(validate_paths(saved["tree"])) == rec["num_nodes"]
    assert all(len(p) <= 2 for p in saved["tree"])
    loaded = infer.load(target, heads=str(tmp_path / "heads"))
    assert [list(p) for p in loaded.settings.tree] == saved["tree"]
    assert loaded.proposer().tree == saved["tree"]


def test_cli_without_data_scores_the_runs_held_out_split(tmp_path, one_thread):
    """Heads whose run held out a seeded split of ``data.path`` (no ``eval_path``, as the SmolLM2 recipes
    train): tune_tree.py and eval_heads.py without ``--data`` score exactly the rows `build_datasets` held
    out for that run (its data options and ``train.seed``), and --measure-tau takes its prompts from them."""
    from heads.config import parse_cli
    from infer.head_accuracy import EvalOptions, default_data, eval_heads, held_out_prompts
    from infer.tune_tree import TuneOptions, tune_tree
    from train.config import load_config, to_yaml
    from train.data import build_datasets
    from train.held_out import held_out

    code, tok, target, target_dir = _code_target_and_heads(tmp_path)
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"def f{i}(x):\n"},
                {"role": "assistant", "content": f"    return x + {i}\n" * (1 + i % 3) + code[i % 2]},
            ]
        }
        for i in range(40)
    ]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    heads_dir = tmp_path / "heads"
    cfg = load_config(
        None,
        [f"target.name_or_path={target_dir}", f"data.path={data}", "data.eval_fraction=0.25", "train.seed=3"],
    )
    (heads_dir / "train_config.yaml").write_text(to_yaml(cfg))  # what a training run writes beside its heads

    config = default_data(str(heads_dir))
    assert config == str(heads_dir / "train_config.yaml")
    train, ev = build_datasets(cfg.data, tok, seed=3)  # what that run trained and evaluated on
    held = held_out(config, tok)
    assert held["input_ids"] == ev["input_ids"] and len(ev) == 10
    assert not set(map(tuple, ev["input_ids"])) & set(map(tuple, train["input_ids"]))
    assert held["input_ids"] != build_datasets(cfg.data, tok, seed=0)[1]["input_ids"]  # the seed counts
    batches = eval_batches(config, tok, 4, 256, 1)
    assert [b["input_ids"][0].tolist() for b in batches] == ev["input_ids"][:4]
    prompts = held_out_prompts(eval_batches, config, tok, 2, 4)
    for p, full, mask in zip(prompts, ev[4:6]["input_ids"], ev[4:6]["loss_mask"], strict=True):
        n = p.shape[1]  # the prompt stops right before the first answer token
        assert p[0].tolist() == full[:n] and not any(mask[:n]) and mask[n] == 1

    base = ["--heads", str(heads_dir), "--target", target_dir, "--dtype", "fp32", "--max-examples", "4"]
    result = eval_heads(parse_cli(EvalOptions, [*base, "--output", str(tmp_path / "acc.json")]), eval_batches)
    assert result["data"] == config and sum(result["count"]) > 0
    argv = [*base, "--max-k", "24", "--repeats", "1", "--measure-tau", "2", "--max-new-tokens", "8"]
    tune_tree(parse_cli(TuneOptions, argv), eval_batches)
    saved = json.loads((heads_dir / "inference.json").read_text())
    assert saved["tuning"]["refined"]["prompts"] == 2
    assert len(validate_paths(saved["tree"])) == saved["tuning"]["num_nodes"]

    # a held-out split that the accuracies read whole leaves no prompts for --measure-tau: the script's one line
    script = importlib.util.spec_from_file_location(
        "tune_tree_script", os.path.join(ROOT, "scripts", "tune_tree.py")
    )
    cli = importlib.util.module_from_spec(script)
    script.loader.exec_module(cli)
    whole = [*base[:-1], "64", "--max-k", "8", "--repeats", "1", "--measure-tau", "2", "--dry-run"]
    with pytest.raises(
        SystemExit, match=r"^error: .* after the first 64; give --prompts FILE, or --measure-tau 0$"
    ):
        cli.main(whole)

    (heads_dir / "train_config.yaml").write_text("data: [not, a, run]\n")
    with pytest.raises(ValueError, match="not a selfspec training run config"):
        eval_batches(config, tok, 4, 256, 1)
