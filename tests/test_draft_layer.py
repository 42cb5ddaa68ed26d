"""The engine-native draft layer (``draft_layer: llama``; in a recipe ``heads.eagle.draft_layer`` or
``heads.eagle3.draft_layer``) on many target architectures.

Covers: the recorded one-layer LlamaConfig (sizes, head_dim, KV heads, RoPE, eps) and that the head's
layer is exactly a Llama layer built from it; old-style config.json files (no ``draft_layer`` key) loading
as the target's own layer and generating identically; one-line refusals of ``draft_layer: target`` where
the target's layer cannot be used; and, on every architecture of ``conftest.DRAFT_ARCHS``, EAGLE and
EAGLE-3 heads with the Llama layer trained a few steps on the target's own greedy text, whose drafts are
accepted (mean accepted length > 1.3) while greedy output equals ``target.generate`` token for token
(fp32), plus exact sampling (chi-square) on a non-Llama target. Tiny seeded targets, one thread.
"""

from __future__ import annotations

import functools
import json

import pytest
import torch
from conftest import DRAFT_ARCHS, tiny_model
from torch import nn

import infer
from heads import (
    Eagle3Head,
    EagleHead,
    build_vocab_map,
    count_tokens,
    eagle3_train_forward,
    eagle_train_forward,
    load_heads,
    run_target,
    save_heads,
)
from heads.draft_layer import llama_layer_config, measure_embed_scale
from heads.eagle import draft_llama_config

V, VD = 96, 64
HEADS = {"eagle": EagleHead, "eagle3": Eagle3Head}

pytestmark = pytest.mark.usefixtures("one_thread")


@functools.cache
def target(arch: str) -> nn.Module:
    return tiny_model(arch, num_layers=3)  # 3 layers: EAGLE-3's aux ids (0, 1, 2) are distinct


def fresh(kind: str, arch: str, seed: int = 1, **kw) -> nn.Module:
    torch.manual_seed(seed)
    return HEADS[kind].for_target(target(arch), **kw).eval()


def draft_layer_of(head: nn.Module) -> nn.Module:
    return head.layers[0] if isinstance(head, EagleHead) else head.midlayer


# ---------------------------------------------------------------------------------------------- the layer


@pytest.mark.parametrize("arch", ["qwen3", "gpt2", "falcon", "phi", "gemma3_text"])
def test_llama_layer_is_sized_from_the_target(arch):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    m = target(arch)
    tc = m.config.get_text_config()
    for kind in HEADS:
        head = fresh(kind, arch)
        d = draft_llama_config(head.config)
        assert d == head.config.draft_layer_config and head.config.draft_layer == "llama"
        layer = draft_layer_of(head)
        assert type(layer) is LlamaDecoderLayer and type(head.rotary_emb) is LlamaRotaryEmbedding
        assert d["model_type"] == "llama" and d["num_hidden_layers"] == 1 and d["hidden_size"] == 32
        assert d["hidden_act"] == "silu" and not d["attention_bias"] and not d["mlp_bias"]
        assert d["vocab_size"] == V and d["max_position_embeddings"] == 256
        heads = tc.num_attention_heads
        assert d["num_attention_heads"] == heads and d["head_dim"] == (
            getattr(tc, "head_dim", None) or 32 // heads
        )
        kv = {"falcon": 1, "gpt2": heads}.get(arch, 2)  # Falcon-7B: multi-query; GPT-2: one per head
        assert d["num_key_value_heads"] == kv
        assert layer.self_attn.k_proj.out_features == kv * d["head_dim"]
        assert all(p.bias is None for p in layer.modules() if isinstance(p, nn.Linear))
        # the layer is what LlamaConfig(**d) describes: the exporters rebuild exactly this one
        lc = LlamaConfig(**{k: v for k, v in d.items() if k != "model_type"})
        assert head.layer_config.rope_parameters == lc.rope_parameters == d["rope_parameters"]
        assert head.layer_config.rms_norm_eps == d["rms_norm_eps"]
        pos, x = torch.tensor([[0, 5, 77, 200]]), torch.zeros(1, 4, 32)
        ref = LlamaRotaryEmbedding(lc)
        assert all(torch.equal(a, b) for a, b in zip(head.rotary_emb(x, pos), ref(x, pos), strict=True))
    rope = d["rope_parameters"]
    assert "partial_rotary_factor" not in rope  # phi's 50% rotary: the draft rotates every dimension
    if arch == "gpt2":  # no RoPE in the target: the default theta
        assert rope == {"rope_type": "default", "rope_theta": 10000.0}
    elif arch == "gemma3_text":  # per layer type: the full-attention layers' RoPE
        assert rope == tc.rope_parameters["full_attention"] and rope["rope_theta"] == 1e6
    else:
        assert rope["rope_theta"] == tc.rope_parameters["rope_theta"]
    eps = {"gpt2": "layer_norm_epsilon", "falcon": "layer_norm_epsilon", "phi": "layer_norm_eps"}
    assert d["rms_norm_eps"] == getattr(tc, eps.get(arch, "rms_norm_eps"))


def test_llama_layer_config_follows_unusual_target():
    """An explicit head_dim != H / heads, linear RoPE scaling and its theta carry over; biases do not."""
    from transformers import Qwen2Config

    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 50000.0},
    )
    tc = {**cfg.to_dict(), "head_dim": 8}
    d = llama_layer_config(tc)
    assert d["head_dim"] == 8 and d["num_attention_heads"] == 2 and d["num_key_value_heads"] == 1
    assert d["rope_parameters"] == {"rope_type": "linear", "factor": 2.0, "rope_theta": 50000.0}
    assert d["intermediate_size"] == 48 and d["vocab_size"] == 64 and d["attention_bias"] is False
    # a model type transformers does not know (remote code): sized from the standard key names
    custom = {"model_type": "my_lm", "hidden_size": 32, "num_attention_heads": 4, "vocab_size": 64}
    d = llama_layer_config(custom)
    assert (d["head_dim"], d["num_key_value_heads"], d["intermediate_size"]) == (8, 4, 128)
    with pytest.raises(ValueError, match="cannot size a Llama draft layer"):
        llama_layer_config({"model_type": "my_lm", "n_embd": 32})
    # Falcon's KV layout: multi-query = 1 KV head; the new decoder architecture states num_kv_heads
    from transformers import FalconConfig

    falcon = FalconConfig(
        hidden_size=32, num_attention_heads=4, new_decoder_architecture=True, num_kv_heads=2
    )
    assert llama_layer_config(falcon.to_dict())["num_key_value_heads"] == 2
    assert (
        llama_layer_config(FalconConfig(hidden_size=32, num_attention_heads=4).to_dict())[
            "num_key_value_heads"
        ]
        == 1
    )


def test_config_validation():
    from heads import Eagle3Config, EagleConfig

    for cls in (EagleConfig, Eagle3Config):
        with pytest.raises(ValueError, match="draft_layer must be one of"):
            cls(draft_layer="mistral")
        with pytest.raises(ValueError, match="only for draft_layer: llama"):
            cls(draft_layer="target", draft_layer_config={"model_type": "llama"})
        tc = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 3}
        good = llama_layer_config(tc)
        for bad, msg in [
            ({**good, "model_type": "qwen2"}, "LlamaConfig"),
            ({**good, "hidden_size": 64}, "hidden_size 64"),
            ({**good, "num_key_value_heads": 3}, "does not divide"),
            ({**good, "intermediate_size": 10**9}, "out of bounds"),  # refused before anything is allocated
            ({**good, "head_dim": "8"}, "positive ints"),
        ]:
            with pytest.raises(ValueError, match=msg):
                cls(hidden_size=32, target_config=tc, draft_layer_config=bad)


def test_embedding_scale_is_what_the_graft_passes():
    """Gemma-3 scales inside its embedding module (the draft sees sqrt(H)-scaled rows, in training and at
    inference); Granite's embedding_multiplier is applied outside it (the draft sees plain rows)."""
    for arch, scale in (("gemma3_text", 32**0.5), ("granite", 1.0), ("llama", 1.0)):
        m = target(arch)
        assert measure_embed_scale(m.get_input_embeddings()) == pytest.approx(scale, rel=1e-6)
    ids = torch.randint(3, V, (1, 5))
    m = target("gemma3_text")
    with torch.no_grad():
        assert torch.equal(m(ids, output_hidden_states=True).hidden_states[0], m.get_input_embeddings()(ids))


@pytest.mark.parametrize("arch", ["gemma2", "cohere", "granite", "llama"])
def test_eagle_draft_logits_are_the_targets_function_of_a_feature(arch):
    """EAGLE-1 scores features as the target does: Gemma2's soft-cap, Cohere's logit_scale and Granite's
    1 / logits_scaling are applied (the Llama layer does not carry them; they come from the target)."""
    m = target(arch)
    head = fresh("eagle", arch)
    want = {"gemma2": (1.0, 30.0), "cohere": (0.5, None), "granite": (0.5, None)}.get(arch, (1.0, None))
    assert (head.logit_scale, head.logit_softcap) == want
    out = run_target(m, torch.randint(3, V, (2, 7)))
    assert torch.allclose(head.logits(out.hidden, m.get_output_embeddings()), out.logits, atol=1e-5)


# ---------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox", "falcon", "olmo2", "exaone4"])
def test_target_layer_refused_with_a_pointer_to_llama(arch):
    m = target(arch)
    for cls in HEADS.values():
        with pytest.raises(NotImplementedError, match="draft_layer: llama") as e:
            cls.for_target(m, draft_layer="target")
        assert "\n" not in str(e.value)
        assert type(draft_layer_of(cls.for_target(m)).self_attn).__name__ == "LlamaAttention"


@pytest.mark.parametrize("arch", ["cohere", "phi"])
def test_eagle3_target_layer_without_post_attention_norm_is_refused(arch):
    with pytest.raises(NotImplementedError, match="post_attention_layernorm.*draft_layer: llama") as e:
        fresh("eagle3", arch, draft_layer="target")
    assert "\n" not in str(e.value)
    fresh("eagle", arch, draft_layer="target")  # EAGLE-1 keeps the target's parallel block


# ---------------------------------------------------------------------------------------------- save / load


def generate(m, head, seed: int = 7, n: int = 24):
    ids = torch.randint(3, V, (1, 6), generator=torch.Generator().manual_seed(seed))
    out = infer.generate(
        infer.SpecModel(m, head),
        ids,
        max_new_tokens=n,
        do_sample=False,
        depth=4,
        draft_top_k=4,
        total_tokens=16,
        adaptive=False,  # the same tree both times: accepted lengths compared
    )
    return ids, out


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_target_layer_save_load_round_trip(kind, tmp_path):
    """A head with the target's own layer saves ``draft_layer: target``, loads as that layer and drafts
    exactly as the head that was saved: same outputs, same trees accepted, same tokens."""
    m = target("qwen3")
    head = fresh(kind, "qwen3", draft_layer="target")
    save_heads(head, str(tmp_path))
    cfg = json.load(open(tmp_path / "config.json"))
    assert cfg["draft_layer"] == "target" and cfg["draft_layer_config"] is None
    loaded = load_heads(str(tmp_path), m)
    assert loaded.config.draft_layer == "target" and loaded.config == head.config
    assert type(draft_layer_of(loaded)) is type(m.base_model.layers[0])
    ids, a = generate(m, head)
    _, b = generate(m, loaded)
    assert torch.equal(a.sequences, b.sequences) and a.stats.accepted_lengths == b.stats.accepted_lengths
    assert torch.equal(a.sequences, m.generate(ids, max_new_tokens=24, do_sample=False))


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_llama_layer_save_load_round_trip(kind, tmp_path):
    m = target("phi")
    head = fresh(kind, "phi")
    save_heads(head, str(tmp_path))
    cfg = json.load(open(tmp_path / "config.json"))
    assert cfg["draft_layer"] == "llama" and cfg["draft_layer_config"] == draft_llama_config(head.config)
    loaded = load_heads(str(tmp_path), m)
    assert loaded.config == head.config
    for k, v in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    _, a = generate(m, head)
    _, b = generate(m, loaded)
    assert torch.equal(a.sequences, b.sequences) and a.stats.accepted_lengths == b.stats.accepted_lengths


# ---------------------------------------------------------------------------------------------- every arch


def self_generated(arch: str, n: int = 16, T: int = 40, seed: int = 0) -> torch.Tensor:
    """The target's own greedy continuations of random 4-token prompts: [n, T] (self-distillation data)."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, V, (n, 4), generator=g)
    return target(arch).generate(
        prompts, max_new_tokens=T - 4, do_sample=False, eos_token_id=None, pad_token_id=0
    )


def trained(kind: str, arch: str, steps: int) -> nn.Module:
    """A Llama-layer head trained ``steps`` Adam steps through the real loss on the target's greedy text."""
    m = target(arch)
    seqs = self_generated(arch)
    ones = torch.ones_like(seqs)
    emb, lm_head = m.get_input_embeddings(), m.get_output_embeddings()
    if kind == "eagle":
        head = fresh(kind, arch, seed=0)
    else:
        head = fresh(kind, arch, seed=0, draft_vocab_size=VD, ttt_steps=3)
        head.set_vocab_map(*build_vocab_map(count_tokens(seqs, ones, V), VD))
    with torch.no_grad():
        out = run_target(m, seqs, aux_layers=getattr(head, "aux_layer_ids", ()))
    head.train()
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    for _ in range(steps):
        if kind == "eagle":
            loss, _ = eagle_train_forward(head, out, seqs, ones, ones, lm_head, emb)
        else:
            loss, _ = eagle3_train_forward(head, out, seqs, ones, ones, out.logits, emb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("arch", DRAFT_ARCHS)
def test_trained_llama_layer_heads_accept_and_stay_lossless(arch, kind):
    """EAGLE / EAGLE-3 with the Llama layer on ``arch``: a few training steps make drafts accepted (deep
    tree paths are walked) and greedy output is still token-identical to target.generate."""
    m = target(arch)
    head = trained(kind, arch, steps=40)
    assert head.config.draft_layer == "llama"
    model = infer.SpecModel(m, head)
    taus = []
    for seed in (100, 101):
        ids = torch.randint(3, V, (1, 6), generator=torch.Generator().manual_seed(seed))
        out = infer.generate(model, ids, max_new_tokens=40, do_sample=False, adaptive=False)  # 6 / 8 / 48
        assert torch.equal(out.sequences, m.generate(ids, max_new_tokens=40, do_sample=False))
        taus.append(out.stats.mean_accepted_length)
    assert sum(taus) / len(taus) > 1.3, taus


@pytest.mark.parametrize("arch", DRAFT_ARCHS)
def test_random_llama_layer_heads_are_lossless(arch):
    """Untrained heads (drafts mostly rejected) on every architecture: greedy identity, both head types."""
    m = target(arch)
    for kind in HEADS:
        ids, out = generate(m, fresh(kind, arch))
        assert torch.equal(out.sequences, m.generate(ids, max_new_tokens=24, do_sample=False)), kind


# ---------------------------------------------------------------------------------------------- sampling


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_exact_sampling_with_llama_layer_on_phi(kind):
    """test_distribution's end-to-end chi-square on a Phi (phi-1/2) target, with Llama-layer heads, 4 rows
    per call (the single-row loop's law is tested on the Llama target in test_distribution_eagle)."""
    from test_distribution import V as DV
    from test_distribution import check_eagle_law

    torch.manual_seed(0)
    layers = 3 if kind == "eagle3" else 1  # EAGLE-3: three distinct aux layers; EAGLE-1 reads the last only
    m = tiny_model("phi", seed=0, vocab_size=DV, hidden_size=16, num_layers=layers)
    with torch.no_grad():
        m.get_output_embeddings().weight.mul_(30.0)  # next-token distributions far from uniform
    m.generation_config.eos_token_id = None
    head = HEADS[kind].for_target(m).eval()
    assert head.config.draft_layer == "llama"
    check_eagle_law(m, head, kind, batch=4)
