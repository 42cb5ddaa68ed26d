"""EAGLE-1/2 heads and EAGLE-2 dynamic-tree drafting.

Covers: construction per architecture (the draft layer is the target's own, minus input norm), a clear
error for GPT-2, heads-only save/load, the loss and its alignment, the dynamic tree against a naive
per-path reference, and greedy identity / exact sampling through `infer.generate` with random and
briefly trained heads. Tiny random targets (conftest), seeded; about 30 s on 2 cores.
"""

from __future__ import annotations

import functools
import json
import os
from collections import Counter

import pytest
import torch
from conftest import check_greedy_identity, reference_greedy, tiny_model
from torch import nn

import infer
from heads import (
    EagleConfig,
    EagleHead,
    build_vocab_map,
    count_tokens,
    eagle_loss,
    eagle_train_forward,
    load_heads,
    save_heads,
)
from heads.graft import TargetOutput, run_target
from infer.eagle_draft import EagleProposer, draft_step

EAGLE_ARCHS = ["llama", "qwen2", "qwen3", "mistral", "gemma2", "phi3"]
D2T = 32  # a reduced draft vocabulary: 32 of the tiny targets' 96 tokens


pytestmark = pytest.mark.usefixtures("one_thread")


@functools.cache
def target(arch: str):
    return tiny_model(arch)


def fresh_head(arch: str, seed: int = 1, **kw) -> EagleHead:
    """A head with the target's own layer (``draft_layer: target``, what this module tests; the Llama layer
    is tested on many architectures in test_draft_layer.py)."""
    torch.manual_seed(seed)
    kw.setdefault("draft_layer", "target")
    return EagleHead.for_target(target(arch), **kw).eval()


# ---------------------------------------------------------------------------------------------- construction


@pytest.mark.parametrize("arch", EAGLE_ARCHS)
def test_layer_is_the_targets_own(arch):
    m = target(arch)
    head = fresh_head(arch)
    t_layer = m.base_model.layers[0]
    d_layer = head.layers[0]
    assert type(d_layer) is type(t_layer)
    assert isinstance(d_layer.input_layernorm, nn.Identity)
    # same parameters (names and shapes: head_dim, GQA, qkv bias, q/k norms), minus the input norm
    t_shapes = {k: v.shape for k, v in t_layer.state_dict().items() if not k.startswith("input_layernorm")}
    d_shapes = {k: v.shape for k, v in d_layer.state_dict().items()}
    assert d_shapes == t_shapes
    tc = m.config.get_text_config()
    lc = head.layer_config
    assert lc.model_type == tc.model_type and lc.num_hidden_layers == 1
    assert lc.rope_parameters == tc.rope_parameters
    assert getattr(lc, "head_dim", None) == getattr(tc, "head_dim", None)
    assert getattr(lc, "attention_bias", None) == getattr(tc, "attention_bias", None)
    # RoPE tables identical to the target's at arbitrary positions
    pos = torch.tensor([[0, 5, 77, 200]])
    x = torch.zeros(1, 4, tc.hidden_size)
    for a, b in zip(head.rotary_emb(x, pos), m.base_model.rotary_emb(x, pos), strict=True):
        assert torch.equal(a, b)
    # heads-only: fc and the layer, no embedding / lm_head / input norm
    keys = set(head.state_dict())
    assert keys and all(k.startswith(("fc.", "layers.0.")) for k in keys), keys
    assert {"fc.weight", "fc.bias"} <= keys
    assert not any("embed" in k or "lm_head" in k or "input_layernorm" in k for k in keys)


def test_layer_config_follows_unusual_target():
    """rope_theta, linear rope scaling, attention bias and a non-default head_dim all carry over."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        attention_bias=True,
        max_position_embeddings=128,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 50000.0},
    )
    m = AutoModelForCausalLM.from_config(cfg).eval()
    head = EagleHead.for_target(m, draft_layer="target")
    lc = head.layer_config
    assert lc.rope_parameters["rope_theta"] == 50000.0 and lc.rope_parameters["factor"] == 2.0
    assert lc.head_dim == 8 and lc.attention_bias is True
    assert head.layers[0].self_attn.q_proj.weight.shape == (16, 32)
    assert head.layers[0].self_attn.q_proj.bias is not None
    pos = torch.arange(100)[None]
    x = torch.zeros(1, 100, 32)
    assert all(
        torch.equal(a, b) for a, b in zip(head.rotary_emb(x, pos), m.model.rotary_emb(x, pos), strict=True)
    )


def test_embedding_is_what_the_target_decoder_sees():
    """Gemma2 scales embeddings by sqrt(H) inside its embedding module: the draft gets them scaled."""
    m = target("gemma2")
    ids = torch.randint(3, 96, (1, 5))
    with torch.no_grad():
        seen = m(ids, output_hidden_states=True).hidden_states[0]  # input of decoder layer 0
        emb = m.get_input_embeddings()(ids)
    assert torch.equal(seen, emb)
    assert torch.allclose(emb, m.get_input_embeddings().weight[ids] * 32**0.5)


def test_unsupported_architecture_is_named():
    with pytest.raises(NotImplementedError, match="'gpt2'.*draft_layer: llama"):
        EagleHead.for_target(tiny_model("gpt2"), draft_layer="target")


def test_config_validation():
    with pytest.raises(ValueError, match="noise"):
        EagleConfig(noise=-1)
    with pytest.raises(ValueError, match="nothing to train"):
        EagleConfig(w_reg=0, w_cls=0)
    with pytest.raises(ValueError, match="for_target"):
        EagleHead(EagleConfig())


# ---------------------------------------------------------------------------------------------- save / load


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_save_load_round_trip(arch, tmp_path):
    m = target(arch)
    head = fresh_head(arch, noise=0.05, bias=False)
    save_heads(head, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    cfg = json.load(open(tmp_path / "config.json"))
    assert cfg["head_type"] == "eagle" and cfg["target_config"]["model_type"] == arch
    assert cfg["noise"] == 0.05 and cfg["bias"] is False
    loaded = load_heads(str(tmp_path), m)
    assert isinstance(loaded, EagleHead) and loaded.config == head.config
    ids = torch.randint(3, 96, (2, 9))
    f = torch.randn(2, 9, m.config.hidden_size)
    emb = m.get_input_embeddings()
    with torch.no_grad():
        assert torch.equal(loaded(ids, f, emb), head(ids, f, emb))


def test_load_rejects_other_architecture(tmp_path):
    save_heads(fresh_head("llama"), str(tmp_path))
    with pytest.raises(ValueError, match="mistral"):  # same vocab and hidden size, other layer type
        load_heads(str(tmp_path), target("mistral"))


# ---------------------------------------------------------------------------------------------- draft vocabulary


def random_map_head(arch: str, vocab: int = D2T, seed: int = 3) -> EagleHead:
    head = fresh_head(arch, draft_vocab_size=vocab)
    counts = torch.randint(0, 50, (96,), generator=torch.Generator().manual_seed(seed))
    head.set_vocab_map(*build_vocab_map(counts, vocab))
    return head


def test_draft_vocab_config():
    m = target("llama")
    assert EagleConfig(draft_vocab_size=0).draft_vocab_size is None  # 0 = the full vocabulary
    full = EagleHead.for_target(m, draft_vocab_size=96)  # the target's own size: no map either
    assert full.config.draft_vocab_size is None and full.config.draft_vocab == 96
    assert "d2t" not in full.state_dict() and not full.reduced_vocab  # the pre-option checkpoint layout
    head = EagleHead.for_target(m, draft_vocab_size=D2T)
    assert head.config.draft_vocab == D2T and head.state_dict()["d2t"].shape == (D2T,)
    assert head.state_dict()["t2d"].shape == (96,)
    for bad, why in ((97, "vocab size"), (-1, ">= 1"), (True, ">= 1"), (2.5, ">= 1")):
        with pytest.raises(ValueError, match=why):
            EagleHead.for_target(m, draft_vocab_size=bad)


@pytest.mark.parametrize("arch", ["llama", "gemma2"])  # gemma2: the target's logit soft-cap
def test_reduced_vocab_logits_are_the_target_rows(arch):
    """Draft logits over the draft vocabulary = the full-vocabulary logits at target ids i + d2t[i], and a
    new map is picked up (the gathered rows are not stale)."""
    m = target(arch)
    head = random_map_head(arch)
    f = torch.randn(2, 3, m.config.hidden_size)
    lm_head = m.get_output_embeddings()
    with torch.no_grad():
        full = fresh_head(arch).logits(f, lm_head)  # [2, 3, 96]
        z = head.logits(f, lm_head)
        assert z.shape == (2, 3, D2T)
        assert torch.allclose(z, full[..., head.t2d], atol=1e-6)
        head.set_vocab_map(*build_vocab_map(torch.arange(96), D2T))  # now the top 32 ids
        assert torch.allclose(head.logits(f, lm_head), full[..., 96 - D2T :], atol=1e-6)
    assert head.to_target_ids(torch.tensor([0, D2T - 1])).tolist() == [96 - D2T, 95]


def test_reduced_vocab_loss():
    """With the prediction equal to the target feature: zero regression, CE = the entropy of the target
    distribution renormalised over the draft vocabulary, top-1 = how often the target's argmax is in it."""
    m = target("llama")
    head = random_map_head("llama")
    lm_head = m.get_output_embeddings()
    f = torch.randn(2, 7, 32)
    mask = torch.ones(2, 7)
    _, met = eagle_loss(f.clone().requires_grad_(), f, lm_head, mask, vocab=(head.d2t, head.t2d))
    with torch.no_grad():
        logits = lm_head(f.reshape(-1, 32))
    p = torch.softmax(logits[:, head.t2d], -1)
    assert met["loss_reg"].item() == 0
    assert torch.allclose(met["loss_cls"], -(p * p.log()).sum(-1).mean())
    inside = head.t2d[logits.argmax(-1)].float().mean()
    assert 0 < inside < 1 and torch.allclose(met["top1"], inside)


def test_reduced_vocab_save_load_and_tampered_map(tmp_path):
    from safetensors.torch import load_file, save_file

    m = target("llama")
    head = random_map_head("llama")
    save_heads(head, str(tmp_path))
    assert json.load(open(tmp_path / "config.json"))["draft_vocab_size"] == D2T
    loaded = load_heads(str(tmp_path), m)
    assert torch.equal(loaded.d2t, head.d2t) and torch.equal(loaded.t2d, head.t2d)
    f = torch.randn(1, 4, 32)
    with torch.no_grad():
        assert torch.equal(
            loaded.logits(f, m.get_output_embeddings()), head.logits(f, m.get_output_embeddings())
        )
    state = load_file(str(tmp_path / "model.safetensors"))
    state["d2t"] = state["d2t"].clone()
    state["d2t"][-1] = 10_000  # a target id far outside the vocabulary
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="d2t and t2d disagree"):
        load_heads(str(tmp_path), m)


# ---------------------------------------------------------------------------------------------- loss


def test_forward_is_causal_and_cache_consistent():
    from transformers import DynamicCache

    m, head = target("qwen3"), fresh_head("qwen3")
    emb = m.get_input_embeddings()
    ids, f = torch.randint(3, 96, (1, 10)), torch.randn(1, 10, 32)
    with torch.no_grad():
        full = head(ids, f, emb)
        assert torch.allclose(head(ids[:, :6], f[:, :6], emb), full[:, :6], atol=1e-6)
        cache = DynamicCache()
        a = head(ids[:, :6], f[:, :6], emb, cache=cache)
        b = head(ids[:, 6:], f[:, 6:], emb, cache=cache)
    assert torch.allclose(torch.cat([a, b], 1), full, atol=1e-6)


def test_loss_alignment_and_mask():
    """A prediction equal to the target feature gives zero regression loss and top-1 = 1."""
    m = target("llama")
    lm_head = m.get_output_embeddings()
    f = torch.randn(2, 5, 32)
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0]])
    loss, met = eagle_loss(f.clone().requires_grad_(), f, lm_head, mask)
    assert met["count"].item() == 3 and met["loss_reg"].item() == 0 and met["top1"].item() == 1
    probs = torch.softmax(lm_head(f[mask.bool()]), -1)
    assert torch.allclose(met["loss_cls"], -(probs * probs.log()).sum(-1).mean())  # CE = entropy
    # no scored position: zero loss, still in the graph
    pred = f.clone().requires_grad_()
    loss, met = eagle_loss(pred, f, lm_head, torch.zeros(2, 5))
    loss.backward()
    assert loss.item() == 0 and met["count"].item() == 0 and pred.grad is not None


def test_train_forward_shift():
    """Pair k = (x_{k+1}, f_k) is scored against f_{k+1} iff loss_mask[k+2] (and padding allows it)."""
    m = target("llama")
    head = fresh_head("llama", noise=0.0)
    ids = torch.randint(3, 96, (2, 8))
    out = run_target(m, ids)
    seen = {}

    def spy(pred, tgt, lm_head, mask, *a, **k):
        seen.update(pred=pred, tgt=tgt, mask=mask)
        return eagle_loss(pred, tgt, lm_head, mask, *a, **k)

    import heads.eagle.loss as he

    loss_mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 0, 0]])
    attn = torch.tensor([[1] * 8, [1] * 6 + [0] * 2])
    orig, he.eagle_loss = he.eagle_loss, spy
    try:
        eagle_train_forward(
            head, out, ids, attn, loss_mask, m.get_output_embeddings(), m.get_input_embeddings()
        )
    finally:
        he.eagle_loss = orig
    assert torch.equal(seen["tgt"], out.hidden[:, 1:])
    expected = torch.tensor([[0, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    assert torch.equal(seen["mask"], expected)
    with torch.no_grad():
        direct = head(ids[:1, 1:], out.hidden[:1, :-1], m.get_input_embeddings())
    assert torch.allclose(seen["pred"][:1], direct, atol=1e-6)

    class Wrapper(nn.Module):  # what DDP / DeepSpeed / accelerate put around the head
        def __init__(self, module):
            super().__init__()
            self.module = module
            self.calls = 0

        def forward(self, *a, **k):
            self.calls += 1
            return self.module(*a, **k)

    args = (out, ids, attn, loss_mask, m.get_output_embeddings(), m.get_input_embeddings())
    wrapped = Wrapper(head)
    assert torch.equal(eagle_train_forward(wrapped, *args)[0], eagle_train_forward(head, *args)[0])
    assert wrapped.calls == 1


def self_generated(arch: str, n: int = 16, T: int = 48, seed: int = 0) -> torch.Tensor:
    """The target's own greedy continuations of random 4-token prompts: [n, T] (self-distillation data)."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, 96, (n, 4), generator=g)
    return target(arch).generate(
        prompts, max_new_tokens=T - 4, do_sample=False, eos_token_id=None, pad_token_id=0
    )


@functools.cache
def trained_head(
    arch: str, steps: int = 60, vocab: int | None = None
) -> tuple[EagleHead, list[float], list[float]]:
    """A head trained ``steps`` Adam steps on the target's own greedy text; returns (head, losses, top1).
    ``vocab``: a reduced draft vocabulary of that many tokens, the most frequent of that text (as
    training builds it, `train.prepare.install_vocab_map`)."""
    m = target(arch)
    seqs = self_generated(arch)
    with torch.no_grad():
        out = run_target(m, seqs)
    out = TargetOutput(logits=out.logits[:, -1:], hidden=out.hidden)  # as the training loop gets it
    head = fresh_head(arch, seed=0, draft_vocab_size=vocab).train()
    if vocab is not None:
        ones = torch.ones_like(seqs)
        head.set_vocab_map(*build_vocab_map(count_tokens(seqs, ones, m.config.vocab_size), vocab))
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    ones = torch.ones_like(seqs)
    losses, top1 = [], []
    for _ in range(steps):
        loss, met = eagle_train_forward(
            head, out, seqs, ones, ones, m.get_output_embeddings(), m.get_input_embeddings()
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        top1.append(met["top1"].item())
    return head.eval(), losses, top1


def test_training_reduces_loss():
    _, losses, top1 = trained_head("llama")
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5, losses
    assert top1[-1] > top1[0] + 0.2, top1


# ---------------------------------------------------------------------------------------------- dynamic tree


def check_tree(tree, total_tokens: int, depth: int) -> None:
    n = tree.num_nodes
    idx = torch.arange(n)
    assert 1 <= n <= total_tokens
    assert (
        tree.parents[0] == -1
        and bool((tree.parents[1:] < idx[1:]).all())
        and bool((tree.parents[1:] >= 0).all())
    )
    assert bool((tree.depth[1:] == tree.depth[tree.parents[1:]] + 1).all())
    assert int(tree.depth.max()) <= depth
    same_parent = (tree.parents[:, None] == tree.parents[None, :]) & (idx[:, None] != idx[None, :])
    assert not bool((same_parent & (tree.tokens[:, None] == tree.tokens[None, :])).any()), (
        "siblings repeat a token"
    )
    # ancestors/retrieve are consistent with the parents
    for i in range(1, n):
        p = int(tree.parents[i])
        assert tree.ancestors[i, i] and bool((tree.ancestors[i] >= tree.ancestors[p]).all())


def node_paths(tree) -> set[tuple[int, ...]]:
    """Each non-root node as its token path from the root (root excluded)."""
    paths: dict[int, tuple[int, ...]] = {0: ()}
    for i in range(1, tree.num_nodes):
        paths[i] = (*paths[int(tree.parents[i])], int(tree.tokens[i]))
    return {p for i, p in paths.items() if i}


def reference_tree(head, m, toks, feats, depth, K, total_tokens):
    """EAGLE-2 by brute force: every node's distribution from a fresh, sequential, cache-free run of the
    draft along its root-to-node path (pairs = real pairs, then (node token, parent's predicted feature))."""
    emb, lm_head = m.get_input_embeddings(), m.get_output_embeddings()

    def child_logp(path: tuple[int, ...]) -> torch.Tensor:
        t, f = toks, feats
        f_hat = head(t[None], f[None], emb)[0, -1]
        for tok in path:
            t = torch.cat([t, torch.tensor([tok])])
            f = torch.cat([f, f_hat[None]])
            f_hat = head(t[None], f[None], emb)[0, -1]
        return torch.log_softmax(head.logits(f_hat, lm_head), -1)

    def children(path, score):
        top = child_logp(path).topk(K)
        ids = head.to_target_ids(top.indices) if head.reduced_vocab else top.indices  # draft -> target ids
        return [(score + float(v), (*path, int(i))) for v, i in zip(top.values, ids, strict=True)]

    frontier = children((), 0.0)
    cands = list(frontier)
    for _ in range(depth - 1):
        kids = [c for s, p in frontier for c in children(p, s)]
        cands += kids
        frontier = sorted(kids, key=lambda c: -c[0])[:K]
    return {p for _, p in sorted(cands, key=lambda c: -c[0])[: total_tokens - 1]}


@pytest.mark.parametrize(
    "arch, K, total, vocab",
    [
        ("llama", 3, 12, None),
        ("phi3", 3, 12, None),
        ("llama", 2, 15, None),
        ("qwen3", 2, 15, None),
        ("gemma2", 2, 15, None),
        ("phi3", 2, 15, None),
        ("llama", 3, 12, D2T),
        ("gemma2", 2, 15, D2T),
    ],
)
def test_dynamic_tree_matches_reference(arch, K, total, vocab):
    """Two propose steps (the second after `advance`) equal the brute-force EAGLE-2 tree. With K=2,
    total=15 every candidate (2 + 3·4) is kept, so depth-3/4 nodes check the deep tree masks too.
    ``vocab``: a reduced draft vocabulary; the reference ranks its logits and maps ids through d2t."""
    m = target(arch)
    head, *_ = trained_head(arch, vocab=vocab)
    depth = 4
    seq = self_generated(arch, n=1, T=14, seed=5)[0]  # prompt = 10 tokens, then 4 target tokens
    T = 10
    with torch.inference_mode():
        hidden = run_target(m, seq[None]).hidden[0]  # [14, H]
        prop = EagleProposer(head, m.get_input_embeddings(), m.get_output_embeddings(), depth, K, total)
        prop.start(seq[None, :T], TargetOutput(logits=torch.empty(0), hidden=hidden[None, :T]))
        tree = prop.propose(seq[T], max_depth=100)
        check_tree(tree, total, depth)
        assert tree.num_nodes == total and (total < 15 or int(tree.depth.max()) == depth)
        assert node_paths(tree) == reference_tree(head, m, seq[1 : T + 1], hidden[:T], depth, K, total)
        if vocab is not None:
            assert bool(head.t2d[tree.tokens[1:]].all())  # only draft-vocabulary tokens are proposed
        # accept root + 2 tokens (their target features come from the verify forward), new root seq[T+3]
        prop.advance(seq[T : T + 3], hidden[T : T + 3], ())
        tree = prop.propose(seq[T + 3], max_depth=100)
        check_tree(tree, total, depth)
        assert prop.cache.get_seq_length() == T + 3  # pairs 0..T+2; no tree KV left behind
        assert node_paths(tree) == reference_tree(head, m, seq[1 : T + 4], hidden[: T + 3], depth, K, total)


@pytest.mark.parametrize("arch, vocab", [("llama", None), ("gemma2", D2T)])
def test_score_temperature_shapes_the_tree_only(arch, vocab):
    """Tree scores are log_softmax(logits / t): the same tokens are ranked (draft_step's top-k ids do not
    move), the scores are the tempered ones, and as t -> 0 a tree of depth + 1 tokens is the draft's
    top-1 chain, the tree that draft_top_k = 1 drafts (greedy acceptance needs the argmax only)."""
    m = target(arch)
    head, *_ = trained_head(arch, vocab=vocab)
    depth = 4
    seq = self_generated(arch, n=1, T=14, seed=5)[0]
    T = 10
    emb, lm = m.get_input_embeddings(), m.get_output_embeddings()

    def tree(top_k: int, t: float | None):
        prop = EagleProposer(head, emb, lm, depth, top_k, depth + 1, greedy_score_temperature=t or 1.0)
        if t is not None:
            prop.decoding(None)  # greedy: scored at greedy_score_temperature
        prop.start(seq[None, :T], TargetOutput(logits=torch.empty(0), hidden=hidden[None, :T]))
        return prop.propose(seq[T], max_depth=100)

    with torch.inference_mode():
        hidden = run_target(m, seq[None]).hidden[0]
        chain = tree(1, None)
        sharp = tree(4, 0.01)
        assert int(chain.depth.max()) == depth and torch.equal(sharp.tokens, chain.tokens)
        assert torch.equal(sharp.parents, chain.parents)
        # draft_step itself, cache-free over the prompt's pairs: same ids, tempered log-probs
        causal = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)[None, None]
        args = (seq[None, 1 : T + 1], hidden[None, :T], torch.arange(T)[None], causal, None, 4)
        f1, s1, i1 = draft_step(head, emb, lm, getattr(head, "d2t", None), *args)
        f4, s4, i4 = draft_step(head, emb, lm, getattr(head, "d2t", None), *args, 0, 0, 4.0)
        assert torch.equal(i1, i4) and torch.allclose(f1, f4)
        assert torch.allclose(
            s4, torch.log_softmax(4.0 * head.logits(f1, lm), -1).topk(4, -1).values, atol=1e-5
        )
        assert not torch.allclose(s1, s4)


def test_generate_scores_greedy_and_sampled_trees_at_their_temperature(monkeypatch):
    """`generate` tells the proposer the decoding mode: greedy scores at the settings'
    greedy_score_temperature, sampling at the sampling temperature; greedy stays token-identical at any
    score temperature (it only reshapes the tree)."""
    from infer.settings import InferSettings

    m = target("llama")
    head, *_ = trained_head("llama")
    ids = torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(100))
    seen = []
    orig = EagleProposer.decoding

    def spy(self, temperature):
        orig(self, temperature)
        seen.append(self.score_scale)

    monkeypatch.setattr(EagleProposer, "decoding", spy)
    for t in (0.05, 0.5, 3.0):
        model = infer.SpecModel(m, head, settings=InferSettings(greedy_score_temperature=t))
        out = infer.generate(model, ids, max_new_tokens=32, do_sample=False, adaptive=False)
        assert torch.equal(out.sequences, reference_greedy(m, ids, 32))
        assert seen[-1] == pytest.approx(1 / t)
    g = torch.Generator().manual_seed(0)
    infer.generate(model, ids, max_new_tokens=8, do_sample=True, temperature=0.7, generator=g, adaptive=False)
    assert seen[-1] == pytest.approx(1 / 0.7)
    for bad in (0, -1.0, float("nan"), 11.0, True, "0.5"):
        with pytest.raises(ValueError, match="greedy_score_temperature"):
            InferSettings(greedy_score_temperature=bad)


def test_dynamic_tree_limits():
    m = target("qwen2")
    head = fresh_head("qwen2")
    emb, lm_head = m.get_input_embeddings(), m.get_output_embeddings()
    ids = torch.randint(3, 96, (1, 7))
    with torch.inference_mode():
        out = run_target(m, ids)
        for depth, k, total, max_depth in [
            (6, 8, 48, 100),
            (5, 4, 60, 100),
            (6, 8, 48, 2),
            (3, 2, 100, 100),
            (1, 5, 3, 9),
        ]:
            prop = EagleProposer(head, emb, lm_head, depth, k, total)
            prop.start(ids, out)
            tree = prop.propose(torch.tensor(5), max_depth=max_depth)
            check_tree(tree, total, min(depth, max_depth))
            assert tree.num_nodes == min(total, 1 + k + (min(depth, max_depth) - 1) * k * k)
        prop = EagleProposer(head, emb, lm_head)
        prop.start(ids, out)
        tree = prop.propose(torch.tensor(5), max_depth=0)
        assert tree.num_nodes == 1 and prop.cache.get_seq_length() == 0  # nothing drafted, nothing run
        prop.advance(torch.tensor([5, 9]), torch.randn(2, 32), ())
        tree = prop.propose(torch.tensor(4), max_depth=3)
        check_tree(tree, 48, 3)
        assert prop.cache.get_seq_length() == ids.shape[1] + 2
    with pytest.raises(ValueError, match="total_tokens"):
        EagleProposer(head, emb, lm_head, total_tokens=1)


# ---------------------------------------------------------------------------------------------- generate


@pytest.mark.parametrize("arch", EAGLE_ARCHS)
def test_greedy_identity_random_heads(arch):
    check_greedy_identity(target(arch), fresh_head(arch))


@pytest.mark.parametrize(
    "arch, vocab",
    [(a, None) for a in ("llama", "qwen3", "gemma2", "mistral", "phi3")] + [("llama", D2T), ("gemma2", D2T)],
)
def test_greedy_identity_trained_heads_accept(arch, vocab):
    m = target(arch)
    head, *_ = trained_head(arch, vocab=vocab)
    model = infer.SpecModel(m, head)
    taus = []
    for seed in (100, 101):
        ids = torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(seed))
        out = infer.generate(model, ids, max_new_tokens=40, do_sample=False, adaptive=False)  # 6 / 8 / 48
        assert torch.equal(out.sequences, reference_greedy(m, ids, 40))
        taus.append(out.stats.mean_accepted_length)
    assert sum(taus) / len(taus) > 1.3, taus


@pytest.mark.parametrize("arch, vocab", [("llama", None), ("phi3", None), ("llama", D2T)])
def test_greedy_identity_deep_chains(arch, vocab):
    """Narrow trees (a chain, then top-2) reach depth 6: long accepts keep positions and KV right."""
    m = target(arch)
    model = infer.SpecModel(m, trained_head(arch, vocab=vocab)[0])
    ids = torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(100))
    longest = 0
    for k, total in ((1, 7), (2, 20)):
        out = infer.generate(
            model, ids, max_new_tokens=40, do_sample=False, draft_top_k=k, total_tokens=total, adaptive=False
        )
        assert torch.equal(out.sequences, reference_greedy(m, ids, 40))
        longest = max(longest, *out.stats.accepted_lengths)
    assert longest >= 5


def check_exact_sampling(model, m, ids: torch.Tensor, samples: int = 300) -> None:
    """Sampling through ``model`` (heads on target ``m``) against facts known without the sampler:

    - top-k 1 leaves one token per position, so sampling must give target.generate's greedy output,
      with drafts accepted (a sampler that takes tokens from the draft, or accepts unchecked, fails);
    - at T = 0.7 / top-k 3, the first two new tokens (the prefill's, then the first tree step's, where
      acceptance and the residual act) must follow the target's own law P(x1) P(x2 | x1), computed by
      enumeration from its warped softmax: Pearson chi-square over ``samples`` draws (the 9 cells)."""
    from test_distribution import ALPHA, chi2_pvalue, warp_probs

    # the fixed tree (adaptive=False) throughout: the drafts must be proposed for acceptance to be checked
    fixed = {"eos_token_id": [], "adaptive": False}
    g = torch.Generator().manual_seed(0)
    out = infer.generate(model, ids, max_new_tokens=30, do_sample=True, top_k=1, generator=g, **fixed)
    assert torch.equal(out.sequences, m.generate(ids, max_new_tokens=30, do_sample=False, eos_token_id=None))
    assert max(out.stats.accepted_lengths) >= 3, out.stats.accepted_lengths
    warp = {"temperature": 0.7, "top_k": 3}
    with torch.no_grad():
        p1 = warp_probs(m(ids).logits[:, -1], **warp)[0].double()
        firsts = [int(x) for x in p1.nonzero()]
        nxt = torch.cat([ids.repeat(len(firsts), 1), torch.tensor(firsts)[:, None]], dim=1)
        p2 = warp_probs(m(nxt).logits[:, -1], **warp).double()
    law = {
        (a, b): float(p1[a] * p2[i, b])
        for i, a in enumerate(firsts)
        for b in p2[i].nonzero().flatten().tolist()
    }
    counts: Counter = Counter()
    accepted = 0
    for _ in range(samples):
        # 3 new tokens, so the first tree step may draft (the last token is never drafted); 2 are kept
        out = infer.generate(model, ids, max_new_tokens=3, do_sample=True, generator=g, **fixed, **warp)
        key = tuple(out.sequences[0, ids.shape[1] : ids.shape[1] + 2].tolist())
        counts[key] += 1
        accepted += out.stats.accepted_lengths[0] > 1
    assert accepted > samples // 10, accepted  # the second token is often an accepted draft
    assert chi2_pvalue(counts, law) > ALPHA, counts


@pytest.mark.parametrize("arch, vocab", [("llama", None), ("gemma2", None), ("llama", D2T)])
def test_exact_sampling_runs(arch, vocab):
    """top-k 1 sampling = greedy with drafts accepted; the first two tokens follow the target's law."""
    m = target(arch)
    head, *_ = trained_head(arch, vocab=vocab)
    ids = torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(3))
    check_exact_sampling(infer.SpecModel(m, head), m, ids)


def test_dynamic_options_are_for_eagle_only():
    from heads import MedusaHeads

    m = target("llama")
    with pytest.raises(ValueError, match="eagle"):
        infer.SpecModel(m, MedusaHeads.for_target(m)).proposer(depth=3)
    with pytest.raises(ValueError, match="dynamic"):
        infer.SpecModel(m, fresh_head("llama")).proposer(tree=[[0]])


# ---------------------------------------------------------------------------------------------- TTT unroll


def _unroll_eagle_copy(head, embed, input_ids, feats, attention_mask, steps):
    """A verbatim copy of scripts/eval_heads.py's private ``unroll_eagle`` (before it calls
    ``head.ttt_unroll``): the reference `EagleHead.ttt_unroll` must reproduce."""
    from transformers import DynamicCache

    B, T = input_ids.shape
    N = T - 1
    dtype = head.fc.weight.dtype
    am = attention_mask.bool()
    pair = am[:, :-1] & am[:, 1:]  # [B, N] pair k needs tokens k and k+1
    toks = torch.cat([input_ids[:, 1:], input_ids[:, -1:].expand(B, max(steps - 1, 0))], 1)  # [B, N+steps-1]
    cache = DynamicCache()
    out = head(toks[:, :N], feats[:, :-1], embed, attention_mask=pair.long(), cache=cache)
    outs = [out]
    k = torch.arange(N, device=input_ids.device)
    prefix = (k[None, :] <= k[:, None])[None] & pair[:, None, :]  # [B, N, N] step-0 keys
    eye = torch.eye(N, dtype=torch.bool, device=input_ids.device).expand(B, N, N)
    neg = torch.finfo(dtype).min
    for j in range(1, steps):
        allowed = torch.cat([prefix] + [eye] * j, 2)  # step 0, steps 1..j-1, this step
        mask = torch.zeros(allowed.shape, dtype=dtype, device=input_ids.device).masked_fill_(~allowed, neg)
        pos = (k + j)[None]
        out = head(
            toks[:, j : j + N], out, embed, position_ids=pos, attention_mask=mask[:, None], cache=cache
        )
        outs.append(out)
    return outs


@pytest.mark.parametrize("draft_layer", ["target", "llama"])
def test_ttt_unroll_is_eval_heads_unroll(draft_layer):
    """`EagleHead.ttt_unroll` (what scripts/eval_heads.py calls) returns exactly what its private
    ``unroll_eagle`` returned: the same K outputs on padded batches, step by step."""
    m = target("llama")
    head = fresh_head("llama", draft_layer=draft_layer)
    embed = m.get_input_embeddings()
    ids = torch.randint(3, 96, (2, 9), generator=torch.Generator().manual_seed(4))
    am = torch.tensor([[1] * 9, [1] * 6 + [0] * 3])
    feats = run_target(m, ids, am).hidden
    steps = 3
    with torch.no_grad():
        ref = _unroll_eagle_copy(head, embed, ids, feats, am, steps)
        toks = torch.cat([ids[:, 1:], ids[:, -1:].expand(2, steps - 1)], 1)
        pair = am[:, :-1].bool() & am[:, 1:].bool()
        got = head.ttt_unroll(toks, feats[:, :-1], embed, pair, steps)
    assert got.shape == (steps, 2, 8, head.config.hidden_size)
    for j in range(steps):
        assert torch.equal(got[j], ref[j]), j
    with pytest.raises(ValueError, match=r"TTT input_ids must be \[B, N \+ K - 1\]"):
        head.ttt_unroll(ids, feats[:, :-1], embed, pair, steps)


def test_cached_unroll_agrees_with_eagle3_ttt_kernel():
    """The one cache-based unroll (`heads.unroll.cached_unroll`, EAGLE-1/2's ``ttt_unroll``) computes
    on an EAGLE-3 head what its TTT attention kernel computes (`Eagle3Head.ttt_unroll`): the two
    implementations of the training-time test are the same function."""
    from heads import Eagle3Head
    from heads.unroll import cached_unroll

    m = target("llama")
    torch.manual_seed(2)
    with pytest.warns(UserWarning, match="not strictly increasing"):  # a 2-layer target repeats an aux layer
        head = Eagle3Head.for_target(m).eval()
    ids = torch.randint(3, 96, (2, 9), generator=torch.Generator().manual_seed(5))
    am = torch.tensor([[1] * 9, [1] * 7 + [0] * 2])
    aux = torch.cat(run_target(m, ids, am, aux_layers=head.aux_layer_ids).aux, -1)[:, :-1]
    steps = 3
    toks = torch.cat([ids[:, 1:], ids[:, -1:].expand(2, steps - 1)], 1)
    pair = am[:, :-1].bool() & am[:, 1:].bool()
    with torch.no_grad():
        kernel = head.ttt_unroll(toks, aux, m.get_input_embeddings(), pair, steps)
        cached = cached_unroll(head, toks, aux, m.get_input_embeddings(), pair, steps)
    assert kernel.shape == cached.shape == (steps, 2, 8, head.config.hidden_size)
    assert torch.allclose(kernel[:, pair], cached[:, pair], atol=1e-5)
