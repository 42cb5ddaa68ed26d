"""Training-time drafting equals inference-time drafting, token by token, for EAGLE-1,
EAGLE-3 and EAGLE-3.1; and EAGLE-3.1 (``fc_norm`` + ``norm_output``): its definition, training,
greedy identity and exact sampling. Tiny random targets (conftest), seeded, fp32.

The agreement check drives `infer.eagle_draft.EagleProposer` itself on a prefix (a chain: draft_top_k 1,
total_tokens K+1) and records every ``head.logits`` call it makes; the chain's tokens are then the data's
next tokens of a training sequence, so the training loss's draft logits of TTT step j at that pair (read
where the loss reads them) must equal the proposer's logits at depth j+1.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_distribution import check_eagle_law, small_target  # noqa: F401 (small_target: a fixture)
from test_eagle3 import reference_greedy, target, trained_head
from transformers import DynamicCache

import heads.eagle.loss as eagle_loss_mod
import heads.eagle3.loss as eagle3_loss_mod
import infer
from heads import (
    Eagle3Config,
    Eagle3Head,
    EagleHead,
    TargetOutput,
    eagle3_train_forward,
    load_heads,
    run_target,
    save_heads,
)
from heads.eagle import eagle_train_forward
from infer.eagle_draft import EagleProposer

V, H, VD = 96, 32, 64
K = 4  # TTT steps / chain depth

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:aux_layer_ids .* not strictly increasing:UserWarning"),
]

EAGLE31 = {"fc_norm": True, "norm_output": True}


def nontrivial(head: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random weights everywhere, norms included (not their all-ones init), so no part is the identity."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name or "norm." in name:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3 / max(p.shape[-1], 1) ** 0.5 * 2)
    return head.eval()


def make_head(kind: str, arch: str, seed: int = 1) -> torch.nn.Module:
    torch.manual_seed(seed)
    m = target(arch)
    if kind == "eagle":
        return nontrivial(EagleHead.for_target(m, draft_layer="target"), seed)
    extra = EAGLE31 if kind == "eagle3.1" else {}
    head = Eagle3Head.for_target(m, draft_layer="target", draft_vocab_size=VD, ttt_steps=K, **extra)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[torch.randperm(V, generator=torch.Generator().manual_seed(seed))[:VD]] = True
    ids = t2d.nonzero().view(-1)
    head.set_vocab_map(ids - torch.arange(VD), t2d)
    return nontrivial(head, seed)


def proposer_chain(head, m, prefix: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Run the proposer on ``prefix`` [k+2] (prompt x_0..x_k, root x_{k+1}) as a chain of depth K; returns
    the K logits [Vd] it computed (depth 1..K) and the K chain tokens (target ids)."""
    aux_layers = tuple(getattr(head.config, "aux_layer_ids", None) or ())
    with torch.no_grad():
        out = run_target(m, prefix[None, :-1], aux_layers=aux_layers)
    seen: list[torch.Tensor] = []
    real = head.logits

    def spy(feats, lm_head=None):
        z = real(feats, lm_head)
        seen.append(z.detach().reshape(-1, z.shape[-1])[0].clone())
        return z

    head.logits = spy  # the proposer calls head.logits; an instance attribute shadows the method
    try:
        prop = EagleProposer(head, m.get_input_embeddings(), m.get_output_embeddings(), K, 1, K + 1)
        with torch.no_grad():
            prop.start(prefix[None, :-1], TargetOutput(out.logits, out.hidden, out.aux))
            tree = prop.propose(prefix[-1], max_depth=100)
    finally:
        del head.logits
    assert tree.num_nodes == K + 1 and len(seen) == K
    return seen, tree.tokens[1:]


def training_logits(kind: str, head, m, seq: torch.Tensor, k: int, monkeypatch) -> list[torch.Tensor]:
    """The draft logits the training loss reads for pair k at steps 0..K-1 (EAGLE-3: the packed rows
    handed to the loss; EAGLE-1/2: the draft features handed to `eagle_loss`, through ``head.logits``,
    then ``ttt_unroll`` for the deeper steps, as `infer.head_accuracy` scores them)."""
    T = seq.shape[0]
    ids = seq[None]
    loss_mask = torch.zeros(1, T, dtype=torch.long)
    # step j at pair k scores token k+2+j (EAGLE-1/2 trains step 0 only: then pair k's is the one row)
    loss_mask[0, k + 2 : k + 2 + (1 if kind == "eagle" else K)] = 1
    ones = torch.ones_like(loss_mask)
    emb = m.get_input_embeddings()
    got: dict = {}
    if kind == "eagle":
        real = eagle_loss_mod.eagle_loss

        def spy(pred, *a, **kw):
            got["pred"], got["mask"] = pred.detach(), a[2].detach()
            return real(pred, *a, **kw)

        monkeypatch.setattr(eagle_loss_mod, "eagle_loss", spy)
        with torch.no_grad():
            out = run_target(m, ids)
            eagle_train_forward(head, out, ids, ones, loss_mask, m.get_output_embeddings(), emb)
            assert got["mask"][0].nonzero().view(-1).tolist() == [k]
            step0 = head.logits(got["pred"][0, k], m.get_output_embeddings())
            toks = torch.cat([ids[:, 1:], ids[:, -1:].expand(1, K - 1)], 1)  # [1, N + K - 1], N = T - 1
            unroll = head.ttt_unroll(toks, out.hidden[:, :-1], emb, None, K)  # [K, 1, N, H]
            assert torch.allclose(unroll[0, 0, k], got["pred"][0, k], atol=1e-6)
            return [step0] + [head.logits(unroll[j, 0, k], m.get_output_embeddings()) for j in range(1, K)]
    real3 = eagle3_loss_mod._packed_loss

    def spy3(z, scored, *a, **kw):
        got["z"], got["scored"] = z.detach(), [s.clone() for s in scored]
        return real3(z, scored, *a, **kw)

    monkeypatch.setattr(eagle3_loss_mod, "_packed_loss", spy3)
    with torch.no_grad():
        out = run_target(m, ids, aux_layers=head.aux_layer_ids)
        eagle3_train_forward(head, out, ids, ones, loss_mask, out.logits, emb)
    rows, start = [], 0
    for s in got["scored"]:  # packed: step 0's rows first, each step's in pair order
        pairs = s[0].nonzero().view(-1).tolist()
        assert k in pairs
        rows.append(got["z"][start + pairs.index(k)].float())
        start += len(pairs)
    assert start == got["z"].shape[0]
    return rows


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "eagle3.1"])
@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_training_drafts_equal_inference_drafts(kind, arch, monkeypatch):
    """For prefixes ending at pairs k = 0, 3, 6: training's draft logits of TTT step j at pair k equal the
    proposer's draft logits at depth j+1 (fp32, max |diff| <= 1e-5), for every j < K."""
    m = target(arch)
    head = make_head(kind, arch)
    g = torch.Generator().manual_seed(11)
    prompt = torch.randint(3, V, (8,), generator=g)
    for k in (0, 3, 6):
        prefix = prompt[: k + 2]
        inf_logits, chain = proposer_chain(head, m, prefix)
        seq = torch.cat([prefix, chain])  # the chain's tokens are the data's next tokens
        tr_logits = training_logits(kind, head, m, seq, k, monkeypatch)
        for j in range(K):
            diff = float((tr_logits[j] - inf_logits[j]).abs().max())
            assert diff <= 1e-5, f"{kind}/{arch}: pair {k}, TTT step {j} vs depth {j + 1}: max |diff| {diff:.3g}"


# ---------------------------------------------------------------------------------------------- EAGLE-3.1


def test_eagle31_config():
    """Off by default (a config.json without the keys loads as EAGLE-3); bools only; saved and reloaded."""
    c = Eagle3Config()
    assert (c.fc_norm, c.norm_output, c.variant) == (False, False, "eagle3")
    assert Eagle3Config(**EAGLE31).variant == "eagle3.1"
    assert Eagle3Config(fc_norm=True).variant == "eagle3+fc_norm"
    old = {k: v for k, v in Eagle3Config().to_dict().items() if k not in EAGLE31}
    assert Eagle3Config.from_dict(old).variant == "eagle3"
    for bad in ({"fc_norm": "yes"}, {"norm_output": 1}):
        with pytest.raises(ValueError, match="true or false"):
            Eagle3Config(**bad)


def test_eagle31_definition():
    """An EAGLE-3.1 head is the EAGLE-3 head with the same weights (i) fed cat(n_0(low), n_1(mid), n_2(high))
    instead of the raw aux features and (ii) handed its own post-norm state norm(o) at every next step;
    its outputs are that post-norm state and its logits lm_head(output) (normed once, not twice). The
    per-layer norms make fc blind to each aux layer's scale."""
    m = target("llama")
    emb = m.get_input_embeddings()
    h31 = make_head("eagle3.1", "llama")
    assert sorted(k for k in h31.state_dict() if k.startswith("fc_norm")) == [f"fc_norm.{i}.weight" for i in range(3)]
    h3 = Eagle3Head.for_target(m, draft_layer="target", draft_vocab_size=VD, ttt_steps=K)
    h3.load_state_dict({k: v for k, v in h31.state_dict().items() if not k.startswith("fc_norm.")})
    h3.eval()
    g = torch.Generator().manual_seed(5)
    N = 6
    tokens = torch.randint(3, V, (1, N + K - 1), generator=g)
    scale = torch.tensor([1.0, 6.0, 40.0]).repeat_interleave(H)  # the three layers' scales differ
    aux = torch.randn(1, N, 3 * H, generator=g) * scale
    with torch.no_grad():
        normed = torch.cat([n(a) for n, a in zip(h31.fc_norm, aux.chunk(3, -1), strict=True)], -1)
        assert torch.allclose(h31.fuse(aux), h3.fuse(normed), atol=1e-5)
        assert torch.allclose(h31.fuse(aux * torch.tensor([3.0, 0.2, 9.0]).repeat_interleave(H)),
                              h31.fuse(aux), atol=1e-4)
        ttt = h31.ttt_unroll(tokens, aux, emb, None, K)  # [K, 1, N, H]
        for k in (0, 2, N - 1):
            cache = DynamicCache()
            h = h3.norm(h3(tokens[:, : k + 1], normed[:, : k + 1], emb, cache=cache)[:, -1:])
            assert torch.allclose(h[0, 0], ttt[0, 0, k], atol=1e-5)
            for j in range(1, K):
                o = h3(tokens[:, k + j : k + j + 1], h, emb, position_ids=torch.tensor([[k + j]]), cache=cache)
                h = h3.norm(o)  # EAGLE-3.1 feeds the post-norm state back
                assert torch.allclose(h[0, 0], ttt[j, 0, k], atol=1e-5), (k, j)
        z = h31.logits(ttt)
        assert torch.allclose(z, h31.lm_head(ttt).float(), atol=1e-6)
        assert not torch.allclose(z, h3.logits(ttt), atol=1e-3)  # EAGLE-3's logits would norm again


def test_eagle31_save_load_round_trip(tmp_path):
    m = target("llama")
    head = make_head("eagle3.1", "llama")
    save_heads(head, str(tmp_path))
    cfg = json.load(open(tmp_path / "config.json"))
    assert cfg["fc_norm"] is True and cfg["norm_output"] is True
    loaded = load_heads(str(tmp_path), m)
    assert loaded.config == head.config and loaded.config.variant == "eagle3.1"
    ids, f = torch.randint(3, V, (2, 7)), torch.randn(2, 7, 3 * H)
    with torch.no_grad():
        emb = m.get_input_embeddings()
        assert torch.equal(loaded(ids, f, emb), head(ids, f, emb))


def test_eagle31_training_reduces_loss():
    """50 TTT steps on the tiny random target's own text (the loss floor is its near-uniform entropy):
    measured τ 1.03 -> 1.31 here (EAGLE-3 in the same run: 1.05 -> 1.56), top-1 up at every step."""
    _, hist = trained_head("llama", eagle31=True)
    mean = lambda h, k: sum(float(x[k]) for x in h) / len(h)  # noqa: E731
    first, last = hist[:5], hist[-5:]
    assert mean(last, "loss") < mean(first, "loss") - 0.01
    assert mean(last, "simulated_accept_length") > mean(first, "simulated_accept_length") + 0.2
    assert all(float(hist[-1]["top1"][j]) > float(hist[0]["top1"][j]) + 0.1 for j in range(K)), hist[-1]["top1"]


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_eagle31_greedy_identity_trained_heads_accept(arch):
    """Greedy output is token-identical to target.generate with trained EAGLE-3.1 heads (default tree and
    a chain), and their drafts are accepted."""
    m = target(arch)
    head, _ = trained_head(arch, eagle31=True)
    model = infer.SpecModel(m, head)
    taus = []
    for seed, kw in ((100, {}), (101, {"draft_top_k": 1, "total_tokens": 7})):
        ids = torch.randint(3, V, (1, 6), generator=torch.Generator().manual_seed(seed))
        out = infer.generate(model, ids, max_new_tokens=40, do_sample=False, adaptive=False, **kw)
        assert torch.equal(out.sequences, reference_greedy(m, ids, 40))
        taus.append(out.stats.mean_accepted_length)
        # two drafts deep accepted (3 tokens a step) more than once, in the tree and in the chain
        assert sum(a >= 3 for a in out.stats.accepted_lengths) >= 2, out.stats.accepted_lengths
    assert sum(taus) / len(taus) > 1.4, taus  # measured 1.65 (llama), 1.97 (gemma2)


@pytest.mark.slow
def test_eagle31_exact_sampling_law(small_target):  # noqa: F811
    """Exact rejection sampling through EAGLE-3.1 heads follows the target's law (chi-square, 4000 samples,
    T = 0.6 + top-k 3 + top-p 0.9), drafts accepted: `test_distribution.check_eagle_law`."""
    torch.manual_seed(0)
    heads = Eagle3Head.for_target(small_target, **EAGLE31).eval()
    check_eagle_law(small_target, heads, "eagle3")


@pytest.mark.parametrize("to", ["speculators", "sglang"])
def test_eagle31_export_and_import_round_trip(to, tmp_path):
    """Both engines' layouts carry ``fc_norm: true`` and ``norm_output: true`` at the top level of config.json
    (where vLLM 0.32/0.33 and SGLang 0.5.23 read them) and the weights ``fc_norm.{0,1,2}.weight``; importing
    the export gives the same head. EAGLE-3 exports write neither key (both engines default them to off)."""
    from safetensors.torch import load_file

    from heads.convert import export_heads

    m = target("llama", 4)
    torch.manual_seed(2)
    head = nontrivial(Eagle3Head.for_target(m, aux_layer_ids=[0, 2, 3], **EAGLE31), 2)
    export_heads(head, str(tmp_path / "31"), to)
    cfg = json.load(open(tmp_path / "31" / "config.json"))
    assert cfg["fc_norm"] is True and cfg["norm_output"] is True
    w = load_file(str(tmp_path / "31" / "model.safetensors"))
    for i in range(3):
        assert torch.equal(w[f"fc_norm.{i}.weight"], head.fc_norm[i].weight)
    back = load_heads(str(tmp_path / "31"), m)
    assert back.config.variant == "eagle3.1"
    ids, f = torch.randint(3, V, (1, 7)), torch.randn(1, 7, 3 * H)
    with torch.no_grad():
        emb = m.get_input_embeddings()
        assert torch.allclose(back.logits(back(ids, f, emb)), head.logits(head(ids, f, emb)), atol=1e-6)
    export_heads(Eagle3Head.for_target(m, aux_layer_ids=[0, 2, 3]), str(tmp_path / "3"), to)
    cfg3 = json.load(open(tmp_path / "3" / "config.json"))
    assert "fc_norm" not in cfg3 and "norm_output" not in cfg3
    cfg["norm_before_fc"], cfg["fc_norm"] = True, False  # gpt-oss style single norm: no selfspec equivalent
    json.dump(cfg, open(tmp_path / "31" / "config.json", "w"))
    with pytest.raises(ValueError, match="norm_before_fc"):
        load_heads(str(tmp_path / "31"), m)
