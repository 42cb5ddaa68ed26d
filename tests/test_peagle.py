"""P-EAGLE parallel drafting (``heads.eagle3.p_eagle``): the option and its saved
placeholders, training's slot j = the proposer's depth j+1 logits token by token, the one-forward proposer
(its tree, its exact draft cache), greedy identity with target.generate with random and trained heads (deep
paths accepted), batches, exact sampling (chi-square), the real train loop, and the export refusal. Tiny random
targets (conftest), seeded, fp32.
"""

from __future__ import annotations

import json

import pytest
import test_train
import torch
from test_batch import check_draft_in_place, check_rows, diverged, extra_prompt, padded
from test_distribution import check_eagle_law, small_target  # noqa: F401 (small_target: a fixture)
from test_eagle3 import node_paths, reference_greedy, self_generated, target, trained_head
from test_eagle31 import make_head, training_logits
from test_train_eagle import _eagle_overrides, _greedy_identity
from transformers import DynamicCache

import infer
from heads import Eagle3Config, Eagle3Head, TargetOutput, load_heads, run_target, save_heads
from infer.eagle_draft import EagleProposer
from infer.parallel_draft import BatchParallel, ParallelProposer

V, H, VD = 96, 32, 64
K = 4  # parallel slots

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:aux_layer_ids .* not strictly increasing:UserWarning"),
]
tiny_target, tiny_data = test_train.tiny_target, test_train.tiny_data
_fresh_accelerate_state = test_train._fresh_accelerate_state


def parallel_head(arch: str, seed: int = 1) -> Eagle3Head:
    """`test_eagle31.make_head`'s random EAGLE-3 head (permuted draft vocab, non-trivial norms) with K slots."""
    base = make_head("eagle3", arch, seed)
    torch.manual_seed(seed)
    head = Eagle3Head(Eagle3Config.from_dict(base.config.to_dict() | {"parallel_draft": K}))
    missing = head.load_state_dict(base.state_dict(), strict=False).missing_keys
    assert sorted(missing) == ["mask_embed", "mask_hidden"]
    return head.eval()


def test_config_and_save_load(tmp_path):
    """Off by default (a config.json without the key is EAGLE-3); 0 or 2..32 only; the placeholders exist
    only when it is on, are saved in the safetensors and reload exactly."""
    assert Eagle3Config().parallel_draft == 0 and Eagle3Config().unroll_steps == 7
    assert Eagle3Config(parallel_draft=3, ttt_steps=7).unroll_steps == 3
    saved = {k: v for k, v in Eagle3Config(parallel_draft=3).to_dict().items() if k != "parallel_draft"}
    assert Eagle3Config.from_dict(saved).parallel_draft == 0  # heads saved before the option
    for bad in (1, 33, -1, True, 2.0, "4"):
        with pytest.raises(ValueError, match="parallel_draft must be 0"):
            Eagle3Config(parallel_draft=bad)
    m = target("llama")
    assert not hasattr(Eagle3Head.for_target(m), "mask_embed")
    head = parallel_head("llama")
    save_heads(head, str(tmp_path))
    assert json.load(open(tmp_path / "config.json"))["parallel_draft"] == K
    back = load_heads(str(tmp_path), m)
    assert back.config == head.config
    for name in ("mask_embed", "mask_hidden"):
        assert torch.equal(getattr(back, name), getattr(head, name))
    ids, f = torch.randint(3, V, (1, 5)), torch.randn(1, 5, 3 * H)
    with torch.no_grad():
        emb = m.get_input_embeddings()
        assert torch.equal(back(ids, f, emb, placeholders=2), head(ids, f, emb, placeholders=2))
    with pytest.raises(ValueError, match="parallel_draft > 0"):
        Eagle3Head.for_target(m)(ids, f, emb, placeholders=2)


def test_slots_are_placeholders_in_one_forward():
    """Slot j of the training unroll at pair k = the output at placeholder j of one causal forward over pairs
    0..k and K-1 placeholders; the slots never read the tokens after pair k (they are not drafted yet)."""
    m = target("gemma2")
    head, emb = parallel_head("gemma2"), m.get_input_embeddings()
    g = torch.Generator().manual_seed(4)
    N = 8
    tokens, aux = torch.randint(3, V, (1, N + K - 1), generator=g), torch.randn(1, N, 3 * H, generator=g)
    other = tokens.clone()
    other[:, N:] = (other[:, N:] + 1) % V
    with torch.no_grad():
        ttt = head.ttt_unroll(tokens, aux, emb, None, K)  # [K, 1, N, H]
        assert torch.equal(ttt, head.ttt_unroll(other, aux, emb, None, K))
        for k in (0, 3, N - 1):
            o = head(tokens[:, : k + 1], aux[:, : k + 1], emb, cache=DynamicCache(), placeholders=K - 1)
            for j in range(K):
                assert torch.allclose(o[0, k + j], ttt[j, 0, k], atol=1e-5), (k, j)


def proposer_logits(head, m, prefix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `ParallelProposer` on ``prefix`` [k+2] (prompt x_0..x_k, root x_{k+1}) as a chain; returns the
    logits of its one ``head.logits`` call [K, Vd] (depths 1..K) and the K chain tokens."""
    with torch.no_grad():
        out = run_target(m, prefix[None, :-1], aux_layers=head.aux_layer_ids)
    seen, real = [], head.logits
    head.logits = lambda f, lm=None: seen.append(real(f, lm)) or seen[-1]  # shadows the method
    try:
        prop = ParallelProposer(head, m.get_input_embeddings(), m.get_output_embeddings(), 6, 1, K + 1)
        assert prop.depth == K  # clamped to the slots it was trained for
        with torch.no_grad():
            prop.start(prefix[None, :-1], TargetOutput(out.logits, out.hidden, out.aux))
            tree = prop.propose(prefix[-1], max_depth=100)
    finally:
        del head.logits
    assert tree.num_nodes == K + 1 and len(seen) == 1 and seen[0].shape == (1, K, VD)
    return seen[0][0], tree.tokens[1:]


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_training_slots_equal_proposer_depths(arch, monkeypatch):
    """For prefixes ending at pairs k = 0, 3, 6: the logits the training loss scores at slot j equal the
    `ParallelProposer`'s logits at depth j+1 (one ``head.logits`` call for its one forward), max |diff| 1e-5."""
    m = target(arch)
    head = parallel_head(arch)
    prompt = torch.randint(3, V, (8,), generator=torch.Generator().manual_seed(11))
    for k in (0, 3, 6):
        prefix = prompt[: k + 2]
        inf, chain = proposer_logits(head, m, prefix)
        tr = training_logits("eagle3", head, m, torch.cat([prefix, chain]), k, monkeypatch)
        for j in range(K):
            diff = float((tr[j] - inf[j]).abs().max())
            assert diff <= 1e-5, f"{arch}: pair {k}, slot {j}: max |diff| {diff:.3g}"


def reference_parallel_tree(
    head, m, seq: torch.Tensor, T: int, top_k: int, total: int
) -> set[tuple[int, ...]]:
    """The tree by brute force from a fresh forward over the whole real prefix: depth marginals p_1..p_K,
    each depth's best ``top_k`` nodes by cumulative log-prob get the top ``top_k`` of the next marginal."""
    with torch.no_grad():
        out = run_target(m, seq[None, :T], aux_layers=head.aux_layer_ids)
        aux = torch.cat(out.aux, -1)
        o = head(
            seq[None, 1 : T + 1], aux, m.get_input_embeddings(), cache=DynamicCache(), placeholders=K - 1
        )
        logp = torch.log_softmax(head.logits(o[0, T - 1 :]), -1)
    kids = [
        [(float(v), int(head.to_target_ids(i))) for v, i in zip(*row.topk(top_k), strict=True)]
        for row in logp
    ]
    frontier = [(s, (t,)) for s, t in kids[0]]
    cands = list(frontier)
    for d in range(1, K):
        new = [(s + v, (*p, t)) for s, p in frontier for v, t in kids[d]]
        cands += new
        frontier = sorted(new, key=lambda c: -c[0])[:top_k]
    return {p for _, p in sorted(cands, key=lambda c: -c[0])[: total - 1]}


def test_tree_and_exact_cache_across_steps():
    """The proposer's tree equals the brute-force tree before and after an `advance`; the draft cache then
    holds exactly the real pairs (no placeholder state survives a step), so the second tree is the one a
    fresh forward over the longer real prefix gives."""
    m = target("llama")
    head, _ = trained_head("llama", parallel=K)
    seq = self_generated("llama", n=1, T=16, seed=5)[0]
    T, top_k, total = 10, 3, 12
    with torch.no_grad():
        out = run_target(m, seq[None], aux_layers=head.aux_layer_ids)
        prop = ParallelProposer(head, m.get_input_embeddings(), m.get_output_embeddings(), K, top_k, total)
        prop.start(
            seq[None, :T], TargetOutput(torch.empty(0), out.hidden[:, :T], tuple(a[:, :T] for a in out.aux))
        )
        tree = prop.propose(seq[T], max_depth=100)
        assert prop.cache.get_seq_length() == T and tree.num_nodes == total
        assert node_paths(tree) == reference_parallel_tree(head, m, seq, T, top_k, total)
        prop.advance(seq[T : T + 3], out.hidden[0, T : T + 3], tuple(a[0, T : T + 3] for a in out.aux))
        tree = prop.propose(seq[T + 3], max_depth=100)
        assert prop.cache.get_seq_length() == T + 3
        assert node_paths(tree) == reference_parallel_tree(head, m, seq, T + 3, top_k, total)
    with pytest.raises(ValueError, match="parallel_draft"):
        ParallelProposer(Eagle3Head.for_target(m), m.get_input_embeddings(), m.get_output_embeddings())


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma2", "phi3"])
def test_greedy_identity_random_heads(arch):
    m = target(arch)
    head = parallel_head(arch)
    ids = torch.randint(3, V, (1, 6), generator=torch.Generator().manual_seed(7))
    model = infer.SpecModel(m, head)
    assert isinstance(model.proposer(), ParallelProposer)
    for kw in ({"draft_top_k": 4, "total_tokens": 16}, {"draft_top_k": 1, "total_tokens": K + 1}):
        out = infer.generate(model, ids, max_new_tokens=24, do_sample=False, **kw)
        assert torch.equal(out.sequences, reference_greedy(m, ids, 24))


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_greedy_identity_trained_heads_accept_deep(arch):
    """Trained parallel heads (the same 50 steps as test_eagle3's): greedy output identical to
    target.generate (default tree, and a chain), drafts accepted, placeholder slots' drafts included
    (slot 1 onwards learns slowly on the random target's text: top-1 0.36 / 0.12 / 0.10 / 0.08 on llama)."""
    m = target(arch)
    head, hist = trained_head(arch, parallel=K)
    first, last = hist[0]["top1"], hist[-1]["top1"]
    assert all(float(last[j]) > float(first[j]) + 0.05 for j in range(K)), last
    model = infer.SpecModel(m, head)
    taus, longest = [], 0
    for seed, kw in ((100, {}), (101, {"draft_top_k": 1, "total_tokens": K + 1})):
        ids = torch.randint(3, V, (1, 6), generator=torch.Generator().manual_seed(seed))
        out = infer.generate(model, ids, max_new_tokens=40, do_sample=False, adaptive=False, **kw)
        assert torch.equal(out.sequences, reference_greedy(m, ids, 40))
        taus.append(out.stats.mean_accepted_length)
        longest = max(longest, max(out.stats.accepted_lengths))
    assert sum(taus) / len(taus) > 1.2, taus
    assert longest >= 3, longest  # a placeholder slot's draft (depth >= 2) accepted, not only the root's


@pytest.mark.parametrize("side", ["left", "right"])
def test_batch_greedy_identity_trained_heads(side):
    """A batch of 4 prompts of different lengths (padded on ``side``) through `BatchParallel` on a
    `StaticRaggedKV`: every row equals target.generate of its prompt alone, rows accept different amounts."""
    m = target("llama")
    head, _ = trained_head("llama", parallel=K)
    seeded = [torch.randint(3, V, (6,), generator=torch.Generator().manual_seed(i)) for i in (100, 101)]
    rows = [*seeded, extra_prompt(9, 5), extra_prompt(4, 6)]  # the first two: the single-row tests' prompts
    ids, mask = padded(rows, side)
    model = infer.SpecModel(m, head)
    longest = 0
    for kw in ({}, {"draft_top_k": 1, "total_tokens": K + 1}):
        out = infer.generate(model, ids, attention_mask=mask, max_new_tokens=30, **kw)
        check_rows(m, out, rows, ids, 30)
        assert diverged(out)
        longest = max(longest, *out.stats.accepted_lengths)
    assert longest >= 3, longest  # placeholder slots' drafts accepted


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 4])
def test_exact_sampling_law(small_target, batch):  # noqa: F811
    """Exact rejection sampling through parallel-draft heads follows the target's law (chi-square, 4000
    samples, T = 0.6 + top-k 3 + top-p 0.9), drafts accepted, one row or 4 per call:
    `test_distribution.check_eagle_law`."""
    torch.manual_seed(0)
    heads = Eagle3Head.for_target(small_target, parallel_draft=3).eval()
    assert isinstance(infer.SpecModel(small_target, heads).proposer(), ParallelProposer)
    check_eagle_law(small_target, heads, "eagle3", batch=batch)


def test_train_loop_with_the_option(tiny_target, tiny_data, tmp_path):
    """A few steps through the real train loop (`train/train_heads.py`) with parallel_draft: it logs one
    top-1 per slot, saves the placeholders, and the saved heads decode greedily exactly like the target."""
    from train import train_heads

    out = str(tmp_path / "run")
    opts = {"heads.eagle3.p_eagle.depths": 3, "train.max_steps": 6, "train.eval_every": 6}
    run = train_heads.start(
        train_heads.load_config(None, _eagle_overrides(tiny_target, tiny_data, out, "eagle3", **opts))
    )
    train_heads.finish(run)
    records = [json.loads(line) for line in open(f"{out}/metrics.jsonl")]
    ev = [r for r in records if "eval/loss" in r][-1]
    assert (
        all(f"eval/step{j}_top1_vs_target" in ev for j in range(3)) and "eval/step3_top1_vs_target" not in ev
    )
    from safetensors.torch import load_file

    w = load_file(f"{out}/model.safetensors")
    assert w["mask_embed"].shape == w["mask_hidden"].shape and w["mask_embed"].ndim == 1
    _greedy_identity(out, tiny_target)


@pytest.mark.parametrize("to", ["speculators", "sglang", "vllm"])
def test_export_refuses(to, tmp_path):
    from heads.convert import export_heads

    with pytest.raises(ValueError, match="parallel-draft"):
        export_heads(parallel_head("llama"), str(tmp_path / "x"), to)
    assert not (tmp_path / "x").exists()


def test_heads_draft_all_their_slots_by_default(tmp_path):
    """P-EAGLE heads with K = 8 slots (more than EAGLE-2's default depth 6) draft depth 8 unless asked for
    less: in memory, loaded from a directory, and in the offline eval's depths; an explicit ``depth`` and a
    saved ``inference.json`` win; sequential heads keep 6. The tree tuner compares against that default. Greedy output stays the target's at depth 8."""
    from infer.head_accuracy import default_depth
    from infer.settings import write_settings

    m = target("llama")
    base = make_head("eagle3", "llama", 3)
    head = Eagle3Head(Eagle3Config.from_dict(base.config.to_dict() | {"parallel_draft": 8}))
    head.load_state_dict(base.state_dict(), strict=False)
    head.eval()
    model = infer.SpecModel(m, head)
    assert model.proposer().depth == 8 and model.proposer(depth=5).depth == 5
    assert infer.SpecModel(m, Eagle3Head.for_target(m)).proposer().depth == 6
    assert default_depth(head) == 8 and default_depth(Eagle3Head.for_target(m)) == 6
    # the tree tuner's untuned budget: a SpecModel built without saved settings
    assert model.settings.budget()["depth"] == 8
    assert infer.SpecModel(m, Eagle3Head.for_target(m)).settings.budget()["depth"] == 6
    save_heads(head, str(tmp_path))
    assert infer.load(m, heads=str(tmp_path)).proposer().depth == 8
    write_settings(str(tmp_path), {"total_tokens": 24})  # a saved budget without a depth keeps depth 8
    assert (lambda p: (p.depth, p.total_tokens))(infer.load(m, heads=str(tmp_path)).proposer()) == (8, 24)
    write_settings(str(tmp_path), {"depth": 5})
    assert infer.load(m, heads=str(tmp_path)).proposer().depth == 5
    ids = torch.randint(3, V, (1, 6), generator=torch.Generator().manual_seed(8))
    for kw in ({"draft_top_k": 4, "total_tokens": 24}, {"draft_top_k": 1, "total_tokens": 9}):
        out = infer.generate(model, ids, max_new_tokens=24, do_sample=False, **kw)
        assert torch.equal(out.sequences, reference_greedy(m, ids, 24))


def test_sequential_heads_keep_the_sequential_proposer():
    m = target("llama")
    prop = infer.SpecModel(m, Eagle3Head.for_target(m)).proposer()
    assert type(prop) is EagleProposer


@pytest.mark.parametrize("pack", [False, True])
def test_batch_draft_cache_and_masks_are_written_in_place(monkeypatch, pack):
    """`BatchParallel`'s draft cache (a `StaticRaggedKV`) and masks (one `BatchTreeMask`) are allocated
    once per generation and written in place (test_batch.check_draft_in_place); the rows stay exact."""
    m = target("llama")
    head, _ = trained_head("llama", parallel=K)
    seeded = [torch.randint(3, V, (6,), generator=torch.Generator().manual_seed(i)) for i in (100, 101)]
    rows = [*seeded, extra_prompt(9, 5), extra_prompt(4, 6)]
    ids, mask = padded(rows, "left")
    out = check_draft_in_place(monkeypatch, BatchParallel, infer.SpecModel(m, head), ids, mask, 30, pack)
    check_rows(m, out, rows, ids, 30)
    assert diverged(out)
