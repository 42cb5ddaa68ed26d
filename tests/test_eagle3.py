"""EAGLE-3 heads: config and aux-layer convention, vocab map, save/load, training-time-test attention
against a brute-force full-mask implementation and against inference-time chains, the loss and its
alignment, the EAGLE-2 tree with a draft vocab, and greedy identity / exact sampling through
`infer.generate` with random and briefly trained heads. Tiny random targets (conftest), seeded.
"""

from __future__ import annotations

import functools
import json
import os
import warnings

import pytest
import torch
from conftest import check_greedy_identity, reference_greedy, tiny_model

import infer
from heads import (
    Eagle3Config,
    Eagle3Head,
    TargetOutput,
    build_vocab_map,
    count_tokens,
    eagle3_loss,
    eagle3_train_forward,
    load_heads,
    run_target,
    save_heads,
)
from heads.eagle3 import default_aux_layer_ids
from infer.eagle_draft import EagleProposer

ARCHS = ["llama", "qwen3", "gemma2", "mistral", "phi3"]
V, H, VD = 96, 32, 64


pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    # the 2-layer tiny targets have only 2 layer inputs, so their aux ids repeat a layer: that warning
    # (tested in test_default_layer_ids) would otherwise repeat for every head built here
    pytest.mark.filterwarnings("ignore:aux_layer_ids .* not strictly increasing:UserWarning"),
]


@functools.cache
def target(arch: str, num_layers: int = 2):
    return tiny_model(arch, num_layers=num_layers)


def fresh_head(arch: str, seed: int = 1, **kw) -> Eagle3Head:
    """A head with the target's own layer (``draft_layer: target``, what this module tests; the Llama layer
    is tested on many architectures in test_draft_layer.py)."""
    torch.manual_seed(seed)
    kw.setdefault("draft_layer", "target")
    return Eagle3Head.for_target(target(arch), **kw).eval()


def aux_out(arch: str, ids: torch.Tensor, head: Eagle3Head) -> TargetOutput:
    with torch.no_grad():
        return run_target(target(arch), ids, aux_layers=head.aux_layer_ids)


# ---------------------------------------------------------------------------------------------- config


def test_config_defaults_and_validation():
    c = Eagle3Config()
    assert (c.ttt_steps, c.step_weight, c.noise, c.draft_vocab_size, c.aux_layer_ids) == (
        7,
        0.8,
        0.0,
        None,
        None,
    )
    tc = {"model_type": "llama", "num_hidden_layers": 32}
    assert Eagle3Config(target_config=tc).aux_layer_ids == [2, 16, 29]  # resolved once the depth is known
    assert Eagle3Config(vocab_size=100).draft_vocab == 100
    assert Eagle3Config(vocab_size=100, draft_vocab_size=10).draft_vocab == 10
    for kw, msg in [
        ({"ttt_steps": 0}, "ttt_steps"),
        ({"step_weight": 0.0}, "step_weight"),
        ({"noise": -0.1}, "noise"),
        ({"draft_vocab_size": 0}, "draft_vocab_size"),
        ({"vocab_size": 10, "draft_vocab_size": 11}, "draft_vocab_size"),
        ({"aux_layer_ids": [1, 2]}, "3 ints"),
        ({"target_config": tc, "aux_layer_ids": [1, 2, 32]}, "out of range"),  # 32 = final-normed output
        ({"target_config": tc, "aux_layer_ids": [-1, 2, 3]}, "out of range"),
        ({"target_config": {"num_hidden_layers": 2}}, "model_type"),
    ]:
        with pytest.raises(ValueError, match=msg):
            Eagle3Config(**kw)
    with pytest.raises(ValueError, match="for_target"):
        Eagle3Head(Eagle3Config())


def test_default_layer_ids():
    """EAGLE-3's (2, L//2, L-3) where strictly increasing (L >= 7), else (0, L//2, L-1): distinct from 3
    layers on; 1- and 2-layer targets repeat (and warn)."""
    assert default_aux_layer_ids(32) == [2, 16, 29]
    assert default_aux_layer_ids(80) == [2, 40, 77]
    assert default_aux_layer_ids(12) == [2, 6, 9]
    assert default_aux_layer_ids(7) == [2, 3, 4]
    assert default_aux_layer_ids(6) == [0, 3, 5]
    assert default_aux_layer_ids(4) == [0, 2, 3]
    assert default_aux_layer_ids(3) == [0, 1, 2]
    assert default_aux_layer_ids(2) == [0, 1, 1]
    assert default_aux_layer_ids(1) == [0, 0, 0]
    for L in range(1, 200):
        ids = default_aux_layer_ids(L)
        assert all(0 <= i < L for i in ids)
        assert L < 3 or ids[0] < ids[1] < ids[2], (L, ids)
        if L >= 3:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # accepted without a warning
                Eagle3Config(target_config={"model_type": "llama", "num_hidden_layers": L})
    with pytest.warns(UserWarning, match="cannot serve"):
        assert Eagle3Config(target_config={"model_type": "llama", "num_hidden_layers": 2}).aux_layer_ids == [
            0,
            1,
            1,
        ]


def test_aux_ids_validated():
    """Distinct, strictly increasing, inside [0, L-1]; one-line ValueErrors before anything is built."""
    tc = {"model_type": "llama", "num_hidden_layers": 6}
    for ids, msg in [
        ([2, 2, 3], "strictly increasing"),  # a repeat: engines capture each layer once
        ([3, 1, 4], "strictly increasing"),  # out of order: engines capture in sorted order
        ([1, 2, 6], "out of range"),  # 6 = the final-normed output, which no engine captures
    ]:
        with pytest.raises(ValueError, match=msg) as e:
            Eagle3Config(target_config=tc, aux_layer_ids=ids)
        assert "\n" not in str(e.value)
    assert Eagle3Config(target_config=tc, aux_layer_ids=[0, 1, 5]).aux_layer_ids == [0, 1, 5]
    saved = {"head_type": "eagle3", "target_config": tc, "aux_layer_ids": [2, 3, 3]}
    for d in (saved, {**saved, "draft_layer": "target"}):  # a config.json is checked as strictly
        with pytest.raises(ValueError, match="strictly increasing"):
            Eagle3Config.from_dict(d)


def test_aux_ids_are_decoder_layer_inputs():
    """aux id i = HF hidden_states[i] = the input of decoder layer i (checked with forward pre-hooks)."""
    m = target("llama", 6)
    head = Eagle3Head.for_target(m)
    assert head.aux_layer_ids == (0, 3, 5)
    seen = {}

    def hook(i):
        def record(module, args, kwargs):
            seen[i] = args[0] if args else kwargs["hidden_states"]

        return record

    hooks = [
        layer.register_forward_pre_hook(hook(i), with_kwargs=True) for i, layer in enumerate(m.model.layers)
    ]
    try:
        out = run_target(m, torch.randint(3, 96, (1, 7)), aux_layers=(0, 2, 5))
    finally:
        for h in hooks:
            h.remove()
    for a, i in zip(out.aux, (0, 2, 5), strict=True):
        assert torch.equal(a, seen[i])


@pytest.mark.parametrize("arch", ARCHS)
def test_head_structure(arch):
    m = target(arch)
    head = fresh_head(arch, draft_vocab_size=VD)
    attn = head.midlayer.self_attn
    projs = [getattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "qkv_proj") if hasattr(attn, n)]
    assert projs and all(p.in_features == 2 * H for p in projs)
    assert attn.o_proj.out_features == H
    assert type(head.midlayer) is type(m.base_model.layers[0])
    assert type(head.norm) is type(m.base_model.norm)
    assert head.fc.weight.shape == (H, 3 * H) and head.fc.bias is None
    assert head.lm_head.weight.shape == (VD, H)
    assert head.d2t.dtype == torch.long and head.t2d.dtype == torch.bool and int(head.t2d.sum()) == VD
    keys = set(head.state_dict())
    assert {
        "fc.weight",
        "input_norm.weight",
        "hidden_norm.weight",
        "norm.weight",
        "lm_head.weight",
        "d2t",
        "t2d",
    } <= keys
    assert all(
        k.startswith(("fc.", "input_norm.", "hidden_norm.", "midlayer.", "norm.", "lm_head.", "d2t", "t2d"))
        for k in keys
    )
    assert not any("embed" in k or "input_layernorm" in k for k in keys)
    # RoPE tables are the target's
    pos = torch.tensor([[0, 5, 77, 200]])
    x = torch.zeros(1, 4, H)
    for a, b in zip(head.rotary_emb(x, pos), m.base_model.rotary_emb(x, pos), strict=True):
        assert torch.equal(a, b)


def test_check_target():
    head = fresh_head("llama")
    with pytest.raises(ValueError, match="mistral"):
        infer.SpecModel(target("mistral"), head)
    with pytest.raises(ValueError, match="layers"):
        infer.SpecModel(target("llama", 3), head)


# ---------------------------------------------------------------------------------------------- vocab map


def test_vocab_map():
    counts = torch.tensor([5, 0, 9, 5, 1, 9, 2, 5])
    d2t, t2d = build_vocab_map(counts, 4)
    chosen = [2, 5, 0, 3]  # most frequent first: 9, 9 (ids 2, 5), then the 5s by id: 0, 3 (7 loses the tie)
    assert t2d.tolist() == [i in chosen for i in range(8)]
    assert (torch.arange(4) + d2t).tolist() == sorted(chosen)
    assert d2t.dtype == torch.long and bool((d2t[1:] >= d2t[:-1]).all())
    d2t, t2d = build_vocab_map(counts, None)
    assert not d2t.any() and d2t.shape == (8,) and t2d.all()
    with pytest.raises(ValueError, match="draft_vocab_size"):
        build_vocab_map(counts, 9)
    ids = torch.tensor([[3, 3, 4, 7], [7, 1, 1, 1]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 0, 0, 1]])
    assert count_tokens(ids, mask, 8).tolist() == [0, 1, 0, 1, 1, 0, 0, 2]

    head = fresh_head("llama", draft_vocab_size=VD)
    d2t, t2d = build_vocab_map(torch.arange(V).flip(0), VD)  # low ids most frequent: the default map
    assert torch.equal(d2t, head.d2t) and torch.equal(t2d, head.t2d)
    d2t, t2d = build_vocab_map(torch.arange(V), VD)  # high ids most frequent
    head.set_vocab_map(d2t, t2d)
    assert head.to_target_ids(torch.tensor([0, VD - 1])).tolist() == [V - VD, V - 1]
    with pytest.raises(ValueError, match="disagree"):
        head.set_vocab_map(d2t, t2d.roll(1))


def test_lm_head_init_from_target():
    """``lm_head_init: target``: after the vocabulary map, draft row i is the target lm_head's row of token
    i + d2t[i]; the default keeps the random init; anything else is refused at config time."""
    m = target("llama")
    d2t, t2d = build_vocab_map(torch.arange(V) % 7, VD)  # a scattered map, not the first VD ids
    head = fresh_head("llama", draft_vocab_size=VD, lm_head_init="target")
    head.set_vocab_map(d2t, t2d)
    before = head.lm_head.weight.clone()
    head.init_lm_head_from(m)
    rows = m.get_output_embeddings().weight[torch.arange(VD) + d2t]
    assert torch.equal(head.lm_head.weight, rows) and not torch.equal(before, rows)
    assert fresh_head("llama").config.lm_head_init == "random"
    with pytest.raises(ValueError, match="lm_head_init"):
        Eagle3Config.from_dict(fresh_head("llama").config.to_dict() | {"lm_head_init": "zeros"})


def test_lm_head_init_in_training_setup():
    """train.prepare.build_heads applies ``lm_head_init: target`` after it builds the vocabulary map."""
    from types import SimpleNamespace

    from train.prepare import build_heads

    m = target("llama")
    g = torch.Generator().manual_seed(0)
    rows = [
        {"input_ids": torch.randint(3, V, (12,), generator=g).tolist(), "loss_mask": [1] * 12}
        for _ in range(4)
    ]
    cfg = SimpleNamespace(
        heads=SimpleNamespace(
            type="eagle3",
            head_kwargs=lambda: {"draft_layer": "target", "draft_vocab_size": VD, "lm_head_init": "target"},
        ),
        joint=SimpleNamespace(enabled=False),
        target=SimpleNamespace(name_or_path="tiny"),
    )
    heads = build_heads(cfg, m, rows, SimpleNamespace(print=lambda *a: None), None)
    ids = torch.arange(VD) + heads.d2t
    assert torch.equal(heads.lm_head.weight, m.get_output_embeddings().weight[ids].float())


# ---------------------------------------------------------------------------------------------- save / load


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_save_load_round_trip(arch, tmp_path):
    m = target(arch)
    head = fresh_head(arch, draft_vocab_size=VD, ttt_steps=3, noise=0.05)
    head.set_vocab_map(
        *build_vocab_map(torch.randint(0, 50, (V,), generator=torch.Generator().manual_seed(0)), VD)
    )
    save_heads(head, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    cfg = json.load(open(tmp_path / "config.json"))
    assert cfg["head_type"] == "eagle3" and cfg["target_config"]["model_type"] == arch
    assert cfg["aux_layer_ids"] == [0, 1, 1] and cfg["draft_vocab_size"] == VD and cfg["ttt_steps"] == 3
    loaded = load_heads(str(tmp_path), m)
    assert isinstance(loaded, Eagle3Head) and loaded.config == head.config
    for k, v in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    ids = torch.randint(3, 96, (2, 9))
    f = torch.randn(2, 9, 3 * H)
    emb = m.get_input_embeddings()
    with torch.no_grad():
        assert torch.equal(loaded(ids, f, emb), head(ids, f, emb))
    bf = load_heads(str(tmp_path), m, dtype=torch.bfloat16)
    assert bf.fc.weight.dtype == torch.bfloat16 and bf.d2t.dtype == torch.long and bf.t2d.dtype == torch.bool
    assert torch.equal(bf.d2t, head.d2t)


# ---------------------------------------------------------------------------------------------- TTT attention


def brute_force_ttt(head, tokens, g0, emb, pair_mask, steps):
    """The TTT rollout with the whole (j+1)N x (j+1)N mask materialised, through the architecture's own
    eager attention kernel: query (j, k) sees keys (0, k') for k' <= k (real pairs) and (j', k) for
    1 <= j' <= j, at position ids k + j. Re-runs all earlier steps at every step."""
    B, N, _ = g0.shape
    neg = torch.finfo(g0.dtype).min
    kk = torch.arange(N)
    outs, feats = [], [g0]
    impl = head.layer_config._attn_implementation
    head.layer_config._attn_implementation = "eager"
    try:
        for j in range(steps):
            n = (j + 1) * N
            step = torch.arange(j + 1).repeat_interleave(N)  # [n] step of each row
            pos = kk.repeat(j + 1)  # [n] pair of each row
            causal = (step[None, :] == 0) & (pos[None, :] <= pos[:, None])
            diag = (step[None, :] >= 1) & (step[None, :] <= step[:, None]) & (pos[None, :] == pos[:, None])
            allowed = (causal | diag)[None].expand(B, n, n).clone()
            if pair_mask is not None:
                allowed &= ~((step[None, None, :] == 0) & ~pair_mask.bool().repeat(1, j + 1)[:, None, :])
            mask = torch.zeros(B, 1, n, n).masked_fill_(~allowed[:, None], neg)
            toks = torch.cat([tokens[:, i : i + N] for i in range(j + 1)], 1)
            out = head(toks, torch.cat(feats, 1), emb, position_ids=(pos + step)[None], attention_mask=mask)
            o = out[:, -N:]
            outs.append(o)
            feats.append(o)
    finally:
        head.layer_config._attn_implementation = impl
    return torch.stack(outs)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma2", "phi3"])
def test_ttt_attention_matches_brute_force(arch):
    """Outputs *and* gradients of the O(K·N²) TTT attention equal the full-mask implementation, with a
    padded row, GQA (4 query / 2 kv heads), q/k norms (qwen3), soft-capping (gemma2) and fused qkv (phi3)."""
    m = target(arch)
    head = fresh_head(arch, draft_vocab_size=VD).train()  # train mode: dropout is 0 in these configs
    emb = m.get_input_embeddings()
    K, N, B = 4, 9, 2
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(3, 96, (B, N + K - 1), generator=g)
    aux = torch.randn(B, N, 3 * H, generator=g)
    pair_mask = torch.ones(B, N, dtype=torch.long)
    pair_mask[1, 6:] = 0  # right padding in row 1
    w = torch.randn(K, B, N, H, generator=g)

    def grads(fn):
        head.zero_grad()
        out = fn()
        (out * w).sum().backward()
        return out.detach(), {k: p.grad.clone() for k, p in head.named_parameters() if p.grad is not None}

    fast, g_fast = grads(lambda: head.ttt_unroll(tokens, aux, emb, pair_mask, K))
    slow, g_slow = grads(lambda: brute_force_ttt(head, tokens, head.fuse(aux), emb, pair_mask, K))
    assert fast.shape == (K, B, N, H)
    assert torch.allclose(fast, slow, atol=1e-5), (fast - slow).abs().max()
    assert g_fast.keys() == g_slow.keys() and "fc.weight" in g_fast
    for k in g_fast:
        assert (g_fast[k] - g_slow[k]).norm() <= 1e-5 * g_slow[k].norm(), k


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_ttt_equals_inference_chains(arch):
    """TTT step j at pair k = the draft at depth j+1 of an inference chain rooted at pair k: the real
    pairs 0..k committed in the draft cache, then one node per step at position k+d, fed the parent's
    output and the true next token, attending to the cache (prefix + earlier chain nodes)."""
    from transformers import DynamicCache

    m = target(arch)
    head = fresh_head(arch, draft_vocab_size=VD)
    emb = m.get_input_embeddings()
    K, N = 4, 8
    g = torch.Generator().manual_seed(4)
    tokens = torch.randint(3, 96, (1, N + K - 1), generator=g)
    aux = torch.randn(1, N, 3 * H, generator=g)
    with torch.no_grad():
        ttt = head.ttt_unroll(tokens, aux, emb, None, K)  # [K, 1, N, H]
        for k in (0, 3, N - 1):
            cache = DynamicCache()
            o = head(tokens[:, : k + 1], aux[:, : k + 1], emb, cache=cache)[:, -1:]
            assert torch.allclose(o[0, 0], ttt[0, 0, k], atol=1e-5)
            for j in range(1, K):
                pos = torch.tensor([[k + j]])
                o = head(tokens[:, k + j : k + j + 1], o, emb, position_ids=pos, cache=cache)
                assert torch.allclose(o[0, 0], ttt[j, 0, k], atol=1e-5), (k, j)


# ---------------------------------------------------------------------------------------------- loss


def test_loss_alignment_and_mask():
    """Step j at pair k is scored against target logits k+1+j iff loss_mask[k+2+j] and the tokens are real;
    a draft equal to the (restricted) target gives CE = entropy and top-1 = 1."""
    B, T, K = 2, 7, 3
    d2t, t2d = build_vocab_map(torch.arange(V).flip(0), VD)
    tl = torch.randn(B, T, V)
    tl[..., VD:] -= 100  # the target's argmax is always inside the draft vocab
    # draft logits equal to the target's (restricted) at the aligned positions: logits[j, :, k] = tl[:, k+1+j]
    logits = torch.full((K, B, T - 1, VD), 0.0)
    for j in range(K):
        logits[j, :, : T - 1 - j] = tl[:, 1 + j :, :VD]
    logits.requires_grad_()
    loss_mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 0, 0]])
    attn = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    loss, met = eagle3_loss(logits, tl, loss_mask, d2t, t2d, 0.5, attn)
    # step j scores pairs k with k+2+j <= 6, loss_mask[k+2+j], real tokens k..k+2+j
    expect = [
        [
            [
                k + 2 + j <= 6 and loss_mask[b, k + 2 + j] == 1 and attn[b, k : k + 3 + j].all()
                for k in range(T - 1)
            ]
            for b in range(B)
        ]
        for j in range(K)
    ]
    assert met["count"].tolist() == [float(sum(map(sum, e))) for e in expect] == [7.0, 6.0, 4.0]
    assert met["top1"].tolist() == [1.0, 1.0, 1.0]
    assert torch.isclose(met["simulated_accept_length"], torch.tensor(4.0))
    ce = []
    for j in range(K):
        sel = torch.tensor(expect[j])
        p = torch.softmax(tl[:, 1 + j :][sel[:, : T - 1 - j]][:, :VD], -1)
        ce.append(-(p * p.log()).sum(-1).mean())
    assert torch.allclose(met["loss_step"], torch.stack(ce), atol=1e-5)
    assert torch.isclose(loss, sum(0.5**j * c for j, c in enumerate(ce)), atol=1e-5)
    loss.backward()
    assert logits.grad[:, 1, 3:].abs().sum() == 0  # unscored pairs get no gradient
    # nothing scored: zero loss, still in the graph
    loss, met = eagle3_loss(logits, tl, torch.zeros(B, T), d2t, t2d)
    loss.backward()
    assert loss.item() == 0 and met["count"].sum() == 0 and met["simulated_accept_length"].item() == 1


def test_soft_cross_entropy_matches_log_softmax(monkeypatch):
    """The chunked loss kernel = -Σ p log_softmax(z) weighted, values and gradients (gradcheck in float64),
    across several chunks, with targets indexed per row and not summing to exactly 1."""
    from heads.eagle3.loss import _SoftCrossEntropy

    monkeypatch.setattr(_SoftCrossEntropy, "_chunk", staticmethod(lambda z: 3))  # 7 rows: 3 chunks
    g = torch.Generator().manual_seed(6)
    z = torch.randn(7, 5, generator=g, dtype=torch.float64, requires_grad=True)
    p = torch.softmax(torch.randn(4, 5, generator=g, dtype=torch.float64), -1) * 0.9
    index = torch.tensor([0, 3, 3, 1, 2, 0, 1])
    w = torch.rand(7, generator=g, dtype=torch.float64)
    total, ce, top = _SoftCrossEntropy.apply(z, p, index, w)
    ref = -(p[index] * torch.log_softmax(z, -1)).sum(-1)
    assert (
        torch.allclose(ce, ref) and torch.allclose(total, (ref * w).sum()) and torch.equal(top, z.argmax(-1))
    )
    (gz,) = torch.autograd.grad((ref * w).sum() * 1.7, z)
    (gz2,) = torch.autograd.grad(_SoftCrossEntropy.apply(z, p, index, w)[0] * 1.7, z)
    assert torch.allclose(gz, gz2)
    assert torch.autograd.gradcheck(lambda z: _SoftCrossEntropy.apply(z, p, index, w)[0], (z,))


def test_train_forward_shift():
    """The unroll's inputs: pairs (x_{k+1}, aux_k), step j reads x_{k+1+j}. The training path (draft
    logits of the scored rows only, packed) gives the loss, metrics and gradients of `eagle3_loss` over
    the full [K, B, N, Vd] logits of that unroll, with a padded row and a partial loss mask."""
    arch = "llama"
    m = target(arch)
    head = fresh_head(arch, draft_vocab_size=VD, ttt_steps=3).train()
    head.set_vocab_map(*build_vocab_map(torch.arange(V).flip(0), VD))
    emb = m.get_input_embeddings()
    ids = torch.randint(3, 96, (2, 8), generator=torch.Generator().manual_seed(5))
    am = torch.ones_like(ids)
    am[1, 6:] = 0
    lm = am.clone()
    lm[0, :3] = 0
    out = run_target(m, ids, am, aux_layers=head.aux_layer_ids)

    def run(fn):
        head.zero_grad()
        loss, met = fn()
        loss.backward()
        return loss.detach(), met, {k: p.grad.clone() for k, p in head.named_parameters()}

    fast = run(lambda: eagle3_train_forward(head, out, ids, am, lm, None, emb))
    tokens = torch.cat([ids[:, 1:], ids[:, -1:].expand(2, 2)], 1)
    aux = torch.cat(out.aux, -1)[:, :-1]
    pair = (am[:, :-1] & am[:, 1:]).long()

    def full():
        logits = head.logits(head.ttt_unroll(tokens, aux, emb, pair, 3))
        return eagle3_loss(logits, out.logits, lm, head.d2t, head.t2d, head.config.step_weight, am)

    slow = run(full)
    assert torch.allclose(fast[0], slow[0], atol=1e-6)
    for k in ("loss_step", "top1", "count", "simulated_accept_length"):
        assert torch.allclose(fast[1][k], slow[1][k], atol=1e-6), k
    # predicted token k+2+j: row 0 in max(2+j, 3)..7 (loss mask), row 1 in 2+j..5 (padding after 5)
    assert fast[1]["count"].tolist() == [5.0 + 4, 5 + 3, 4 + 2]
    for k in slow[2]:
        assert torch.allclose(fast[2][k], slow[2][k], atol=1e-6), k
    with pytest.raises(ValueError, match="aux_layers"):
        eagle3_train_forward(head, run_target(m, ids), ids, None, lm, None, emb)


def self_generated(arch: str, n: int = 16, T: int = 48, seed: int = 0) -> torch.Tensor:
    """The target's own greedy continuations of random 4-token prompts: [n, T] (self-distillation data)."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, 96, (n, 4), generator=g)
    return target(arch).generate(
        prompts, max_new_tokens=T - 4, do_sample=False, eos_token_id=None, pad_token_id=0
    )


@functools.cache
def trained_head(arch: str, steps: int = 50, ttt_steps: int = 4, eagle31: bool = False, parallel: int = 0):
    """A head (draft vocab 64 of 96, map from the data) trained ``steps`` Adam steps on the target's own
    greedy text (``eagle31``: with EAGLE-3.1's fc_norm and norm_output; ``parallel``: P-EAGLE's
    parallel_draft slots); returns (head, per-step metrics)."""
    m = target(arch)
    seqs = self_generated(arch)
    ones = torch.ones_like(seqs)
    opts = {"fc_norm": True, "norm_output": True} if eagle31 else {}
    opts |= {"parallel_draft": parallel} if parallel else {}
    head = fresh_head(arch, seed=0, draft_vocab_size=VD, ttt_steps=ttt_steps, **opts)
    head.set_vocab_map(*build_vocab_map(count_tokens(seqs, ones, V), VD))
    out = aux_out(arch, seqs, head)
    head.train()
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    history = []
    for _ in range(steps):
        loss, met = eagle3_train_forward(head, out, seqs, ones, ones, out.logits, m.get_input_embeddings())
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append({k: v.detach().clone() for k, v in met.items()})
    return head.eval(), history


def test_training_reduces_loss():
    _, hist = trained_head("llama")
    first, last = hist[:5], hist[-5:]
    mean = lambda h, k: sum(float(x[k]) for x in h) / len(h)  # noqa: E731
    assert mean(last, "loss") < mean(first, "loss") - 0.01
    assert mean(last, "simulated_accept_length") > mean(first, "simulated_accept_length") + 0.3
    assert all(float(hist[-1]["top1"][j]) > float(hist[0]["top1"][j]) + 0.15 for j in range(4)), hist[-1][
        "top1"
    ]


# ---------------------------------------------------------------------------------------------- drafting


def reference_tree(head, m, toks, aux, depth, K, total_tokens):
    """EAGLE-2 over an EAGLE-3 head by brute force: each node's children from a fresh chain along its
    root-to-node path (commit the real pairs, then one draft step per node), draft ids mapped by d2t."""
    from transformers import DynamicCache

    emb = m.get_input_embeddings()

    def children(path, score):
        cache = DynamicCache()
        o = head(toks[None], aux[None], emb, cache=cache)[:, -1:]
        for d, tok in enumerate(path, 1):
            o = head(
                torch.tensor([[tok]]), o, emb, position_ids=torch.tensor([[len(toks) - 1 + d]]), cache=cache
            )
        top = torch.log_softmax(head.logits(o[0, 0]), -1).topk(K)
        ids = head.to_target_ids(top.indices)
        return [(score + float(v), (*path, int(i))) for v, i in zip(top.values, ids, strict=True)]

    frontier = children((), 0.0)
    cands = list(frontier)
    for _ in range(depth - 1):
        kids = [c for s, p in frontier for c in children(p, s)]
        cands += kids
        frontier = sorted(kids, key=lambda c: -c[0])[:K]
    return {p for _, p in sorted(cands, key=lambda c: -c[0])[: total_tokens - 1]}


def node_paths(tree) -> set[tuple[int, ...]]:
    paths: dict[int, tuple[int, ...]] = {0: ()}
    for i in range(1, tree.num_nodes):
        paths[i] = (*paths[int(tree.parents[i])], int(tree.tokens[i]))
    return {p for i, p in paths.items() if i}


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_dynamic_tree_matches_reference(arch):
    """The proposer's EAGLE-2 tree over an EAGLE-3 head (aux features at the root, d2t-mapped ids, the
    draft's own outputs in the tree) equals the brute-force tree, before and after an `advance`."""
    m = target(arch)
    head, _ = trained_head(arch)
    depth, K, total = 4, 2, 15
    seq = self_generated(arch, n=1, T=14, seed=5)[0]
    T = 10
    with torch.inference_mode():
        out = run_target(m, seq[None], aux_layers=head.aux_layer_ids)
        aux = torch.cat(out.aux, -1)[0]  # [14, 3H]
        prop = EagleProposer(head, m.get_input_embeddings(), m.get_output_embeddings(), depth, K, total)
        assert prop.aux_layers == head.aux_layer_ids == (0, 1, 1)
        prop.start(
            seq[None, :T], TargetOutput(torch.empty(0), out.hidden[:, :T], tuple(a[:, :T] for a in out.aux))
        )
        tree = prop.propose(seq[T], max_depth=100)
        assert bool(head.t2d[tree.tokens[1:]].all())  # only draft-vocab tokens are drafted
        assert node_paths(tree) == reference_tree(head, m, seq[1 : T + 1], aux[:T], depth, K, total)
        prop.advance(seq[T : T + 3], out.hidden[0, T : T + 3], tuple(a[0, T : T + 3] for a in out.aux))
        tree = prop.propose(seq[T + 3], max_depth=100)
        assert prop.cache.get_seq_length() == T + 3
        assert node_paths(tree) == reference_tree(head, m, seq[1 : T + 4], aux[: T + 3], depth, K, total)


# ---------------------------------------------------------------------------------------------- generate


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_identity_random_heads(arch):
    m = target(arch)
    head = fresh_head(arch, draft_vocab_size=VD)
    head.set_vocab_map(
        *build_vocab_map(torch.randint(0, 9, (V,), generator=torch.Generator().manual_seed(1)), VD)
    )
    check_greedy_identity(m, head)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma2", "mistral"])
def test_greedy_identity_trained_heads_accept(arch):
    m = target(arch)
    head, _ = trained_head(arch)
    model = infer.SpecModel(m, head)
    taus = []
    for seed in (100, 101):
        ids = torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(seed))
        out = infer.generate(model, ids, max_new_tokens=40, do_sample=False, adaptive=False)  # 6 / 8 / 48
        assert torch.equal(out.sequences, reference_greedy(m, ids, 40))
        taus.append(out.stats.mean_accepted_length)
        # two drafts deep accepted (3 tokens a step), repeatedly: depth-2 tree paths are walked
        assert sum(a >= 3 for a in out.stats.accepted_lengths) >= 3, out.stats.accepted_lengths
    assert sum(taus) / len(taus) > 1.8, taus  # measured 1.95-2.6 per prompt


def test_greedy_identity_bf16_and_chain():
    """A bf16 target and head; a chain (top-1) tree, so long accepts move positions and KV far."""
    m = tiny_model("llama", dtype=torch.bfloat16)
    head, _ = trained_head("llama")
    head = Eagle3Head(head.config)
    head.load_state_dict(trained_head("llama")[0].state_dict())
    head = head.to(torch.bfloat16).eval()
    ids = torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(100))
    model = infer.SpecModel(m, head)
    for k, total, tau in ((1, 7, 1.4), (8, 48, 2.0)):  # measured τ 1.56 (chain) and 2.44 (tree)
        out = infer.generate(
            model, ids, max_new_tokens=40, do_sample=False, draft_top_k=k, total_tokens=total, adaptive=False
        )
        assert torch.equal(out.sequences, reference_greedy(m, ids, 40))
        accepted = out.stats.accepted_lengths
        assert out.stats.mean_accepted_length > tau and sum(a >= 3 for a in accepted) >= 2, (k, accepted)


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_exact_sampling_runs(arch):
    """top-k 1 sampling = greedy with drafts accepted; the first two tokens follow the target's law."""
    from test_eagle import check_exact_sampling

    m = target(arch)
    head, _ = trained_head(arch)
    ids = torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(3))
    check_exact_sampling(infer.SpecModel(m, head), m, ids)


def test_proposer_dispatch():
    m = target("llama")
    prop = infer.SpecModel(m, fresh_head("llama")).proposer(depth=3, draft_top_k=200)
    assert isinstance(prop, EagleProposer) and prop.aux_layers == (0, 1, 1) and prop.top_k == V
    prop = infer.SpecModel(m, fresh_head("llama", draft_vocab_size=5)).proposer(draft_top_k=8)
    assert prop.top_k == 5
    with pytest.raises(ValueError, match="dynamic"):
        infer.SpecModel(m, fresh_head("llama")).proposer(tree=[[0]])
