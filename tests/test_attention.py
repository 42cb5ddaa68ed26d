"""`infer.attention`: the registered tree-attention function and the preallocated tree mask.

The kernel is compared with softmax(q·kᵀ·scale + mask)·v over explicitly repeated K/V, for grouped and
plain heads, boolean and additive masks, the folded (tree) and unfolded (long) paths and the causal
prefill; the mask buffer with `infer.tree.attention_mask` over a generation's worth of trees; and a
verify forward of an sdpa Llama runs through the function without any K/V repeat, with the model's
attention implementation restored afterwards. Exactness of whole trees is `test_tree_exact.py`'s.
"""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from infer.attention import ATTN_IMPLEMENTATION, TreeMask, register, tree_attention
from infer.runner import TreeRunner
from infer.tree import DraftTree, attention_mask, structure_from_parents

pytestmark = pytest.mark.usefixtures("one_thread")


class _Module(torch.nn.Module):
    pass


def reference(q, k, v, mask, scale):
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    scores = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    else:
        T, S = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(T, S, dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(scores, -1) @ v).transpose(1, 2)


@pytest.mark.parametrize("heads", [(8, 2), (4, 4)])
@pytest.mark.parametrize("T", [5, 64])  # 64: g·T too large to fold, SDPA's own GQA path
@pytest.mark.parametrize("kind", ["bool", "float", "causal"])
def test_tree_attention_matches_repeated_kv(heads, T, kind):
    h, h_kv = heads
    g = torch.Generator().manual_seed(T + h_kv)
    S = T if kind == "causal" else T + 11
    q, k, v = (torch.randn(2, n, L, 4, generator=g) for n, L in ((h, T), (h_kv, S), (h_kv, S)))
    mask = torch.rand(1, 1, T, S, generator=g) > 0.5
    mask[..., :, 0] = True  # every query sees at least one key
    if kind == "float":
        mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    elif kind == "causal":
        mask = None
    out, _ = tree_attention(_Module().eval(), q, k, v, mask, scaling=0.37)
    assert out.shape == (2, T, h, 4)
    torch.testing.assert_close(out, reference(q, k, v, mask, 0.37), atol=1e-5, rtol=1e-5)


def test_tree_mask_buffer_matches_attention_mask():
    """A generation's trees of varying size and growing prefix: every step's view equals the float
    mask's visibility, written into the same buffer until it has to grow."""
    g = torch.Generator().manual_seed(0)
    masks = TreeMask(max_nodes=8, max_len=40, device=torch.device("cpu"))
    ptr, past = masks.buf.data_ptr(), 3
    for step in range(12):
        n = int(torch.randint(1, 12 if step > 8 else 8, (1,), generator=g))
        parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)])
        depth = torch.zeros(n, dtype=torch.long)
        for i in range(1, n):
            depth[i] = depth[parents[i]] + 1
        ancestors = structure_from_parents(parents, depth)[0]
        view = masks(ancestors, past)
        assert torch.equal(view, attention_mask(ancestors, depth, past, torch.float32) == 0), step
        if step <= 8:  # within the first buffer's size: no new allocation
            assert masks.buf.data_ptr() == ptr
        past += int(torch.randint(1, n + 1, (1,), generator=g))
    assert masks.buf.data_ptr() != ptr  # the last trees outgrew it


def test_verify_runs_tree_attention_without_kv_repeat(monkeypatch):
    import transformers.integrations.sdpa_attention as sdpa
    from transformers import AttentionInterface

    def no_repeat(*a, **k):
        raise AssertionError("K/V repeated per head")

    register()
    calls = []
    inner = AttentionInterface._global_mapping[ATTN_IMPLEMENTATION]

    def spy(module, query, key, *a, **k):
        calls.append((query.shape[1], key.shape[1]))
        return inner(module, query, key, *a, **k)

    monkeypatch.setitem(AttentionInterface._global_mapping, ATTN_IMPLEMENTATION, spy)
    monkeypatch.setattr(sdpa, "repeat_kv", no_repeat)
    target = tiny_model("llama", attn="sdpa")  # 4 query heads, 2 KV heads, 2 layers
    parents, depth = torch.tensor([-1, 0, 0, 1]), torch.tensor([0, 1, 1, 2])
    tree = DraftTree(torch.tensor([5, 6, 7, 8]), parents, depth, *structure_from_parents(parents, depth))
    prompt = torch.tensor([[3, 4, 9, 10]])

    def steps(runner: TreeRunner) -> None:
        with torch.no_grad():
            runner.prefill(prompt)
            runner.verify(tree)
            runner.accept(torch.tensor([0, 1, 3]))
            runner.verify(tree)

    steps(TreeRunner(target, max_len=20))
    assert target.config._attn_implementation == "sdpa"  # switched for the verify forwards only
    assert calls == [(4, 2)] * 4  # two verify forwards x two layers, K/V with their 2 heads
    with pytest.raises(AssertionError, match="repeated"):  # the stock sdpa path does repeat them
        steps(TreeRunner(target, tree_attention=False))


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_eagle3_greedy_identity_through_tree_attention(arch):
    """EAGLE-3 (aux states from hooks, dynamic trees) on an sdpa target: the registered attention,
    the mask buffer and the static cache, token-identical to the target's own greedy decoding."""
    from test_eagle3 import reference_greedy, trained_head

    import infer

    m = tiny_model(arch, attn="sdpa")  # the weights of test_eagle3's (eager) target
    head, _ = trained_head(arch)
    taus = []
    for seed in (100, 101):
        ids = torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(seed))
        out = infer.generate(
            infer.SpecModel(m, head), ids, max_new_tokens=40, do_sample=False, adaptive=False
        )
        assert torch.equal(out.sequences, reference_greedy(m, ids, 40))
        taus.append(out.stats.mean_accepted_length)
    assert sum(taus) / len(taus) > 1.2, taus  # drafts were accepted: compaction moved entries
