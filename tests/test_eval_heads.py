"""`infer.head_accuracy` (scripts/eval_heads.py): the EAGLE unroll matches inference-style drafting, ranks and
accuracies are right."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from heads.unroll import cached_unroll
from infer.head_accuracy import RankStats, batch_ranks, evaluate_heads, summary


def unroll_eagle(head, embed, input_ids, feats, attention_mask, steps):
    """`heads.unroll.cached_unroll` (the cache + 4D-mask unroll behind both EAGLE heads' inference-style
    evaluation) called the way `infer.head_accuracy` calls it: ``steps`` x [B, T-1, H]."""
    B = input_ids.shape[0]
    toks = torch.cat([input_ids[:, 1:], input_ids[:, -1:].expand(B, steps - 1)], 1)
    am = attention_mask.bool()
    return list(cached_unroll(head, toks, feats[:, :-1], embed, (am[:, :-1] & am[:, 1:]).long(), steps))


def _batch(T: int = 14, B: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 96, (B, T), generator=g)
    am = torch.ones(B, T, dtype=torch.long)
    if B > 1:  # right padding on row 1
        am[1, T - 4 :] = 0
        ids[1, T - 4 :] = 0
    return {"input_ids": ids, "attention_mask": am, "loss_mask": am.clone()}


def test_unroll_matches_eagle3_ttt(one_thread):
    """The cache + 4D-mask unroll (used for EAGLE-1/2) equals EAGLE-3's own training-time-test unroll."""
    from heads.eagle3 import Eagle3Head
    from heads.graft import run_target

    target = tiny_model("llama", num_layers=4)
    torch.manual_seed(0)
    head = Eagle3Head.for_target(target).eval()
    b = _batch()
    out = run_target(target, b["input_ids"], b["attention_mask"], aux_layers=head.aux_layer_ids)
    feats = torch.cat(out.aux, -1)
    steps = 4
    with torch.no_grad():
        mine = unroll_eagle(
            head, target.get_input_embeddings(), b["input_ids"], feats, b["attention_mask"], steps
        )
        ids = b["input_ids"]
        toks = torch.cat([ids[:, 1:], ids[:, -1:].expand(2, steps - 1)], 1)
        am = b["attention_mask"].bool()
        pair = (am[:, :-1] & am[:, 1:]).long()
        ref = head.ttt_unroll(toks, feats[:, :-1], target.get_input_embeddings(), pair, steps)
    real = pair.bool()  # padded pairs may differ (never scored)
    for j in range(steps):
        assert torch.allclose(mine[j][real], ref[j][real], atol=1e-5), j


def test_unroll_step_follows_a_drafted_chain(one_thread):
    """Step j at pair k equals drafting a chain from position k with the proposer's conventions."""
    from heads.eagle import EagleHead
    from heads.graft import run_target
    from infer.cache import new_cache

    target = tiny_model("llama")
    torch.manual_seed(1)
    head = EagleHead.for_target(target).eval()
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.2)
    b = _batch(T=10, B=1)
    ids, embed = b["input_ids"], target.get_input_embeddings()
    f = run_target(target, ids).hidden
    outs = unroll_eagle(head, embed, ids, f, b["attention_mask"], 3)
    k = 4  # chain from pair 4: run pairs 0..4 causally, then feed the own outputs one at a time
    with torch.no_grad():
        cache = new_cache()
        o = head(ids[:, 1 : k + 2], f[:, : k + 1], embed, cache=cache)[:, -1:]
        assert torch.allclose(o, outs[0][:, k : k + 1], atol=1e-5)
        for j in (1, 2):
            o = head(
                ids[:, k + 1 + j : k + 2 + j], o, embed, position_ids=torch.tensor([[k + j]]), cache=cache
            )
            assert torch.allclose(o, outs[j][:, k : k + 1], atol=1e-5), j


def test_medusa_ranks_and_labels(one_thread):
    from heads.graft import run_target
    from heads.medusa import MedusaHeads

    target = tiny_model("llama")
    torch.manual_seed(0)
    heads = MedusaHeads.for_target(target, num_heads=3).eval()
    for blk in heads.blocks:
        torch.nn.init.normal_(blk[0].linear.weight, std=0.5)
    b = _batch()
    ranks, scored = batch_ranks(heads, target, b, depth=3)
    T = b["input_ids"].shape[1]
    out = run_target(target, b["input_ids"], b["attention_mask"])
    logits = heads(out.hidden, target.get_output_embeddings())  # [3, B, T, V]
    greedy = out.logits.argmax(-1)
    for d in range(3):
        for bi in range(2):
            n_real = int(b["attention_mask"][bi].sum())
            for t in range(T):
                ok = t + 2 + d < n_real
                assert bool(scored[d, bi, t]) == ok, (d, bi, t)
                if ok:  # label: the target's greedy token t+2+d; rank among head d's logits at t
                    z = logits[d, bi, t]
                    r = int((z > z[greedy[bi, t + 1 + d]]).sum())
                    assert int(ranks[d, bi, t]) == min(r, 10)
    data_ranks, _ = batch_ranks(heads, target, b, depth=3, labels="data")
    z = logits[1, 0, 2]
    assert int(data_ranks[1, 0, 2]) == min(int((z > z[b["input_ids"][0, 5]]).sum()), 10)


@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle3"])
def test_evaluate_heads_summary(kind, one_thread):
    from heads.eagle import EagleHead
    from heads.eagle3 import Eagle3Head
    from heads.medusa import MedusaHeads

    target = tiny_model("llama", num_layers=4)
    torch.manual_seed(0)
    cls = {"medusa": MedusaHeads, "eagle": EagleHead, "eagle3": Eagle3Head}[kind]
    heads = cls.for_target(target, **({"num_heads": 3} if kind == "medusa" else {})).eval()
    stats = evaluate_heads(heads, target, [_batch(seed=s) for s in range(2)], depth=3, progress=False)
    res = summary(stats)
    assert res["depth"] == 3 and len(res["topk_acc"][0]) == 10
    # 2 batches x (14 + 10 real tokens) - (d + 2) unscored positions per row at depth d+1
    assert res["count"] == [2 * (12 + 8), 2 * (11 + 7), 2 * (10 + 6)]
    for row, probs in zip(res["topk_acc"], res["rank_probs"], strict=True):
        assert row == pytest.approx(torch.tensor(probs).cumsum(0).tolist())
        assert all(b >= a for a, b in zip(row, row[1:], strict=False)) and row[-1] <= 1 + 1e-12
    assert res["joint_positions"] == 2 * (10 + 6)
    assert res["sim_accept_length"] >= 1.0


def test_rank_stats():
    counts = torch.tensor([[2, 1, 0, 1], [1, 0, 1, 2]])  # K = 3 ranks + "miss"
    s = RankStats(counts, torch.zeros(0, 2, dtype=torch.long))
    assert s.rank_probs().tolist() == [[0.5, 0.25, 0.0], [0.25, 0.0, 0.25]]
    assert s.topk_acc().tolist() == [[0.5, 0.75, 0.75], [0.25, 0.25, 0.5]]
