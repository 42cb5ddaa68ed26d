"""Export to the engines' formats and import of Medusa / EAGLE / EAGLE-3 checkpoints (`heads.convert`).

The engines' schemas are written out here by hand (docs/design.md §9, from the engines' loaders), not
derived from `heads.convert`: every config field and every weight name and shape is checked. Each
export is re-imported and must give the same draft logits; checkpoints written here in the original
layouts (Medusa ``.pt``/``.safetensors``, EAGLE-1 ``pytorch_model.bin``, EAGLE-3 with ``midlayer.*``)
import; bad inputs fail with specific messages. Tiny random Llama targets (conftest), seeded.
"""

from __future__ import annotations

import functools
import json
import os
import sys

import pytest
import torch
from conftest import check_greedy_identity, tiny_model
from safetensors.torch import load_file, save_file

from heads import Eagle3Head, EagleHead, MedusaHeads, build_vocab_map, load_heads, run_target, save_heads
from heads.convert import export_heads

V, H, L, VD = 96, 32, 4, 64  # tiny Llama: vocab, hidden, layers; EAGLE-3 draft vocab
KV, FF = 16, 64  # k/v projection rows (2 kv heads x head_dim 8), MLP width

pytestmark = pytest.mark.usefixtures("one_thread")


@functools.cache
def target(arch: str = "llama", **kw):
    return tiny_model(arch, num_layers=L, **kw)


def randomise(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Non-trivial weights (Medusa's blocks start at zero; norms at one)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if "norm" in name else 0.0))
    return module.eval()


def medusa(lm_head: str = "target", num_heads: int = 3, num_layers: int = 2) -> MedusaHeads:
    return randomise(
        MedusaHeads.for_target(target(), num_heads=num_heads, num_layers=num_layers, lm_head=lm_head), 1
    )


def eagle(bias: bool = True) -> EagleHead:
    return randomise(EagleHead.for_target(target(), bias=bias), 2)


def eagle3(aux=(1, 2, 3)) -> Eagle3Head:
    head = randomise(Eagle3Head.for_target(target(), draft_vocab_size=VD, aux_layer_ids=list(aux)), 3)
    counts = torch.randint(0, 50, (V,), generator=torch.Generator().manual_seed(4))
    head.set_vocab_map(*build_vocab_map(counts, VD))
    return head


def shapes(path) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in load_file(str(path)).items()}


def read_json(path) -> dict:
    with open(path) as f:
        return json.load(f)


LLAMA_LAYER = {  # one Llama decoder layer without input_layernorm, key -> shape
    "self_attn.q_proj.weight": (H, H),
    "self_attn.k_proj.weight": (KV, H),
    "self_attn.v_proj.weight": (KV, H),
    "self_attn.o_proj.weight": (H, H),
    "mlp.gate_proj.weight": (FF, H),
    "mlp.up_proj.weight": (FF, H),
    "mlp.down_proj.weight": (H, FF),
    "post_attention_layernorm.weight": (H,),
}
LLAMA_DRAFT_CONFIG = {  # the one-layer Llama config of a draft for target() (rope_theta 10000, eps 1e-6)
    "model_type": "llama",
    "hidden_size": H,
    "intermediate_size": FF,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "max_position_embeddings": 256,
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "vocab_size": V,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}


# ---------------------------------------------------------------------------------------------- draft logits


def medusa_logits(heads, hidden):
    with torch.no_grad():
        return heads(hidden, target().get_output_embeddings())


def eagle_logits(head, ids, feats):
    m = target()
    with torch.no_grad():
        return head.logits(head(ids, feats, m.get_input_embeddings()), m.get_output_embeddings())


def eagle3_logits(head, ids):
    """Draft logits over the draft vocab, mapped to target ids, from the target's real aux states."""
    m = target()
    with torch.no_grad():
        aux = torch.cat(run_target(m, ids, aux_layers=head.aux_layer_ids).aux, -1)[:, :-1]
        o = head(ids[:, 1:], aux, m.get_input_embeddings())
        return head.logits(o), head.to_target_ids(torch.arange(head.d2t.shape[0]))


IDS = torch.randint(3, V, (2, 9), generator=torch.Generator().manual_seed(5))
HIDDEN = torch.randn(2, 7, H, generator=torch.Generator().manual_seed(6))


def same(a, b) -> bool:
    if isinstance(a, tuple):
        return all(same(x, y) for x, y in zip(a, b, strict=True))
    return a.shape == b.shape and torch.equal(a, b)


# ---------------------------------------------------------------------------------------------- Medusa export


@pytest.mark.parametrize("lm_head", ["target", "own"])
def test_medusa_to_vllm_schema_and_round_trip(tmp_path, lm_head):
    heads = medusa(lm_head)
    export_heads(heads, str(tmp_path), "vllm", target().get_output_embeddings().weight)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    assert read_json(tmp_path / "config.json") == {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": H,
        "vocab_size": V,
        "num_heads": 3,
        "num_hidden_layers": 2,
        "truncated_vocab_size": V,
        "original_lm_head": lm_head == "target",  # vLLM shares lm_heads.0 over the heads
        "medusa_fc_bias": True,
        "base_model_name_or_path": "tiny-random-llama",
        "torch_dtype": "float32",
    }
    want = {
        f"blocks.{h}.layers.{j}.{p}": (H, H) if p == "weight" else (H,)
        for h in range(3)
        for j in range(2)
        for p in ("weight", "bias")
    }
    want.update({f"lm_heads.{h}.weight": (V, H) for h in range(1 if lm_head == "target" else 3)})
    assert shapes(tmp_path / "model.safetensors") == want
    if lm_head == "target":  # the one target weight vLLM's Medusa needs, and nothing else of the target
        w = load_file(str(tmp_path / "model.safetensors"))["lm_heads.0.weight"]
        assert torch.equal(w, target().get_output_embeddings().weight)
    back = load_heads(str(tmp_path), target())
    assert isinstance(back, MedusaHeads) and back.config.lm_head == lm_head  # shared lm_head recognised
    assert same(medusa_logits(back, HIDDEN), medusa_logits(heads, HIDDEN))


@pytest.mark.parametrize("lm_head", ["target", "own"])
def test_medusa_to_original_schema_and_round_trip(tmp_path, lm_head):
    heads = medusa(lm_head)
    export_heads(heads, str(tmp_path), "medusa", target().get_output_embeddings().weight)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "medusa_lm_head.pt", "medusa_lm_head.safetensors"]
    assert read_json(tmp_path / "config.json") == {
        "base_model_name_or_path": "tiny-random-llama",
        "hidden_size": H,
        "vocab_size": V,
        "medusa_num_heads": 3,
        "medusa_num_layers": 2,
    }
    # FasterDecoding's loader reads medusa_lm_head.pt: the same tensors, and nothing but tensors
    pt = torch.load(tmp_path / "medusa_lm_head.pt", weights_only=True)
    st = load_file(str(tmp_path / "medusa_lm_head.safetensors"))
    assert pt.keys() == st.keys() and all(torch.equal(pt[k], st[k]) for k in st)
    want = {
        f"{h}.{j}.linear.{p}": (H, H) if p == "weight" else (H,)
        for h in range(3)
        for j in range(2)
        for p in ("weight", "bias")
    }
    want.update({f"{h}.2.weight": (V, H) for h in range(3)})
    assert shapes(tmp_path / "medusa_lm_head.safetensors") == want
    back = load_heads(str(tmp_path), target())
    assert back.config.lm_head == lm_head and back.config.num_layers == 2
    assert same(medusa_logits(back, HIDDEN), medusa_logits(heads, HIDDEN))
    # without a target: the heads keep the lm_head copies as their own
    alone = load_heads(str(tmp_path))
    assert alone.config.lm_head == "own" and same(medusa_logits(alone, HIDDEN), medusa_logits(heads, HIDDEN))


def test_medusa_export_needs_the_target_lm_head(tmp_path):
    with pytest.raises(ValueError, match="reuse the target's lm_head"):
        export_heads(medusa("target"), str(tmp_path), "vllm")
    with pytest.raises(ValueError, match="another base model"):
        export_heads(medusa("target"), str(tmp_path), "medusa", torch.zeros(V + 1, H))


# ---------------------------------------------------------------------------------------------- EAGLE export


@pytest.mark.parametrize(("engine", "bias"), [("sglang", True), ("sglang", False), ("vllm", False)])
def test_eagle_export_schema_and_round_trip(tmp_path, engine, bias):
    head = eagle(bias)
    export_heads(head, str(tmp_path), engine)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    assert read_json(tmp_path / "config.json") == {
        "architectures": ["LlamaForCausalLMEagle" if engine == "sglang" else "LlamaForCausalLM"],
        **LLAMA_DRAFT_CONFIG,  # no "bias" key: SGLang's Llama layer would read it as attention bias
        "base_model_name_or_path": "tiny-random-llama",
    }
    want = {"fc.weight": (H, 2 * H), **{f"layers.0.{k}": s for k, s in LLAMA_LAYER.items()}}
    if engine == "sglang":
        want["fc.bias"] = (H,)
    assert shapes(tmp_path / "model.safetensors") == want  # no embed_tokens, no input_layernorm
    if engine == "sglang" and not bias:
        assert not load_file(str(tmp_path / "model.safetensors"))["fc.bias"].any()
    back = load_heads(str(tmp_path), target())
    assert isinstance(back, EagleHead)
    feats = torch.randn(2, 8, H, generator=torch.Generator().manual_seed(7))
    assert same(eagle_logits(back, IDS[:, 1:], feats), eagle_logits(head, IDS[:, 1:], feats))


def test_mistral_target_exports_as_llama(tmp_path):
    """Mistral's decoder layer is Llama's: its heads export as Llama drafts and come back identical."""
    m = tiny_model("mistral", num_layers=L)
    head = randomise(EagleHead.for_target(m), 11)
    export_heads(head, str(tmp_path), "sglang")
    assert read_json(tmp_path / "config.json")["model_type"] == "llama"
    back = load_heads(str(tmp_path), m)
    feats = torch.randn(1, 8, H, generator=torch.Generator().manual_seed(12))
    emb, lm = m.get_input_embeddings(), m.get_output_embeddings()
    with torch.no_grad():
        assert torch.equal(
            back.logits(back(IDS[:1, 1:], feats, emb), lm), head.logits(head(IDS[:1, 1:], feats, emb), lm)
        )


def test_eagle_with_bias_to_vllm_is_refused(tmp_path):
    with pytest.raises(ValueError, match="builds fc without a bias"):
        export_heads(eagle(True), str(tmp_path), "vllm")


@pytest.mark.parametrize("engine, why", [("vllm", "has no d2t"), ("sglang", "--speculative-token-map")])
def test_reduced_vocab_eagle_export_is_refused(tmp_path, engine, why):
    """EAGLE-1 heads with a draft vocabulary: one line naming why the engine's EAGLE-1 format cannot carry
    it, and nothing written."""
    head = randomise(EagleHead.for_target(target(), bias=False, draft_vocab_size=VD), 2)
    head.set_vocab_map(
        *build_vocab_map(torch.randint(0, 50, (V,), generator=torch.Generator().manual_seed(4)), VD)
    )
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=why) as e:
        export_heads(head, str(out), engine)
    assert "\n" not in str(e.value) and "draft_vocab_size" in str(e.value)
    assert not out.exists() or not os.listdir(out)


# ---------------------------------------------------------------------------------------------- EAGLE-3 export


EAGLE3_LAYER = {
    **LLAMA_LAYER,
    "self_attn.q_proj.weight": (H, 2 * H),  # attention reads cat(norm(emb), norm(g))
    "self_attn.k_proj.weight": (KV, 2 * H),
    "self_attn.v_proj.weight": (KV, 2 * H),
    "input_layernorm.weight": (H,),  # the embedding's norm
    "hidden_norm.weight": (H,),
}


def eagle3_weights(prefix: str) -> dict[str, tuple[int, ...]]:
    return {
        "fc.weight": (H, 3 * H),
        **{prefix + k: s for k, s in EAGLE3_LAYER.items()},
        "norm.weight": (H,),
        "lm_head.weight": (VD, H),
        "d2t": (VD,),
        "t2d": (V,),
    }


def test_eagle3_to_sglang_schema_and_round_trip(tmp_path):
    head = eagle3((1, 2, 3))
    export_heads(head, str(tmp_path), "sglang")
    assert read_json(tmp_path / "config.json") == {
        "architectures": ["LlamaForCausalLMEagle3"],
        **LLAMA_DRAFT_CONFIG,
        "draft_vocab_size": VD,  # no target_hidden_size: SafeAILab's EaModel would then skip the embedding
        # SGLang captures the input of layer id+1: selfspec's hidden_states indices (1, 2, 3) are (0, 1, 2)
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True},
        "base_model_name_or_path": "tiny-random-llama",
    }
    w = load_file(str(tmp_path / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in w.items()} == eagle3_weights("midlayer.")
    assert w["d2t"].dtype == torch.int64 and w["t2d"].dtype == torch.bool
    assert torch.equal(w["d2t"], head.d2t) and torch.equal(
        w["midlayer.hidden_norm.weight"], head.hidden_norm.weight
    )
    assert torch.equal(w["midlayer.input_layernorm.weight"], head.input_norm.weight)
    back = load_heads(str(tmp_path), target())
    assert back.aux_layer_ids == (1, 2, 3) and back.config.draft_vocab_size == VD
    assert same(eagle3_logits(back, IDS), eagle3_logits(head, IDS))


@pytest.mark.parametrize("to", ["speculators", "vllm"])
def test_eagle3_to_speculators_schema_and_round_trip(tmp_path, to):
    head = eagle3((1, 2, 3))
    export_heads(head, str(tmp_path), to, speculative_tokens=4)
    assert read_json(tmp_path / "config.json") == {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 4}],
            "verifier": {"name_or_path": "tiny-random-llama", "architectures": ["LlamaForCausalLM"]},
        },
        "transformer_layer_config": {"architectures": ["LlamaForCausalLM"], **LLAMA_DRAFT_CONFIG},
        "draft_vocab_size": VD,
        "norm_before_residual": False,  # written: vLLM reads a missing value as true
        "target_hidden_size": H,
        "eagle_aux_hidden_state_layer_ids": [1, 2, 3],  # vLLM's convention = hidden_states indices
        "torch_dtype": "float32",
    }
    assert shapes(tmp_path / "model.safetensors") == eagle3_weights("layers.0.")
    back = load_heads(str(tmp_path), target())
    assert back.aux_layer_ids == (1, 2, 3)
    assert same(eagle3_logits(back, IDS), eagle3_logits(head, IDS))


# ---------------------------------------------------------------------------------------------- import


@pytest.mark.parametrize("ext", ["pt", "safetensors"])
def test_import_original_medusa(tmp_path, ext):
    """A checkpoint as Medusa writes it: {h}.{l}.linear.*, {h}.{L}.weight, medusa_lm_head.{pt,safetensors}."""
    g = torch.Generator().manual_seed(8)
    K, Lm = 2, 1
    sd = {}
    for h in range(K):
        sd[f"{h}.0.linear.weight"] = torch.randn(H, H, generator=g) * 0.1
        sd[f"{h}.0.linear.bias"] = torch.randn(H, generator=g) * 0.1
        sd[f"{h}.{Lm}.weight"] = torch.randn(V, H, generator=g)
    json.dump(
        {"medusa_num_heads": K, "medusa_num_layers": Lm, "base_model_name_or_path": "x/y"},
        open(tmp_path / "config.json", "w"),
    )
    if ext == "pt":
        torch.save(sd, tmp_path / "medusa_lm_head.pt")
    else:
        save_file(sd, str(tmp_path / "medusa_lm_head.safetensors"))
    heads = load_heads(str(tmp_path), target())
    assert (
        heads.config.num_heads == K
        and heads.config.lm_head == "own"
        and heads.config.base_model_name_or_path == "x/y"
    )
    x = HIDDEN[0, 0]
    for h in range(K):  # Medusa's head: lm_head(x + SiLU(W x + b))
        ref = (x + torch.nn.functional.silu(sd[f"{h}.0.linear.weight"] @ x + sd[f"{h}.0.linear.bias"])) @ sd[
            f"{h}.1.weight"
        ].T
        torch.testing.assert_close(medusa_logits(heads, x)[h], ref, rtol=1e-5, atol=1e-5)


def eagle1_state(seed: int = 9, embed: bool = True) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    sd = {f"layers.0.{k}": torch.randn(s, generator=g) * 0.2 for k, s in LLAMA_LAYER.items()}
    sd["layers.0.post_attention_layernorm.weight"] += 1
    sd["fc.weight"] = torch.randn(H, 2 * H, generator=g) * 0.1
    sd["fc.bias"] = torch.randn(H, generator=g) * 0.1
    if embed:  # original EAGLE checkpoints carry the frozen embedding
        sd["embed_tokens.weight"] = target().get_input_embeddings().weight.clone()
    return sd


def eagle1_config(**kw) -> dict:
    return {"architectures": ["LlamaForCausalLM"], **LLAMA_DRAFT_CONFIG, "bias": True, **kw}


def test_import_eagle1_pytorch_model_bin(tmp_path):
    sd = eagle1_state()
    torch.save(sd, tmp_path / "pytorch_model.bin")
    json.dump(eagle1_config(), open(tmp_path / "config.json", "w"))
    head = load_heads(str(tmp_path), target())
    assert isinstance(head, EagleHead) and head.config.bias
    assert "embed_tokens.weight" not in head.state_dict()  # the target's embedding stays the target's
    assert torch.equal(head.fc.bias, sd["fc.bias"]) and torch.equal(
        head.layers[0].mlp.up_proj.weight, sd["layers.0.mlp.up_proj.weight"]
    )
    # it is the engines' function: fc(cat(emb, f)) through a Llama layer without input norm
    export_heads(head, str(tmp_path / "re"), "sglang")
    re = load_file(str(tmp_path / "re" / "model.safetensors"))
    assert all(torch.equal(re[k], v) for k, v in sd.items() if k != "embed_tokens.weight")


def test_import_eagle1_missing_fc_bias(tmp_path):
    """config says bias=true but fc.bias is missing (a known tracker issue): imported as no bias, warned;
    bias=false with a non-zero fc.bias (SafeAILab's trainer with its Llama-3 config): the bias is kept, warned."""
    sd = eagle1_state(embed=False)
    del sd["fc.bias"]
    save_file(sd, str(tmp_path / "model.safetensors"))
    json.dump(eagle1_config(), open(tmp_path / "config.json", "w"))
    with pytest.warns(UserWarning, match="no fc.bias"):
        head = load_heads(str(tmp_path), target())
    assert head.fc.bias is None
    sd = eagle1_state(embed=False)
    save_file(sd, str(tmp_path / "model.safetensors"))
    json.dump(eagle1_config(bias=False), open(tmp_path / "config.json", "w"))
    with pytest.warns(UserWarning, match="bias=false but fc.bias is present and non-zero; importing"):
        head = load_heads(str(tmp_path), target())
    assert torch.equal(head.fc.bias, sd["fc.bias"])


def test_import_eagle3_midlayer_checkpoint_and_generate(tmp_path):
    """An HF/SGLang EAGLE-3 checkpoint (midlayer.*, SGLang aux ids) drives infer.generate losslessly."""
    ref = eagle3((1, 2, 3))
    g = {k: v for k, v in ref.state_dict().items()}
    sd = {"fc.weight": g["fc.weight"], "norm.weight": g["norm.weight"], "lm_head.weight": g["lm_head.weight"]}
    sd.update({k: v for k, v in g.items() if k.startswith("midlayer.")})
    sd["midlayer.input_layernorm.weight"] = g["input_norm.weight"]
    sd["midlayer.hidden_norm.weight"] = g["hidden_norm.weight"]
    sd["d2t"], sd["t2d"] = g["d2t"], g["t2d"]
    sd["embed_tokens.weight"] = target().get_input_embeddings().weight.clone()
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "model.safetensors"))
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **LLAMA_DRAFT_CONFIG,
        "draft_vocab_size": VD,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True},
    }
    json.dump(cfg, open(tmp_path / "config.json", "w"))
    head = load_heads(str(tmp_path), target())
    assert head.aux_layer_ids == (1, 2, 3)  # SGLang id j = output of layer j = hidden_states[j + 1]
    assert same(eagle3_logits(head, IDS), eagle3_logits(ref, IDS))
    check_greedy_identity(
        target(), head, n=16, seed=10, high=V, tree=dict(depth=3, draft_top_k=3, total_tokens=10)
    )


def test_import_eagle3_norm_before_residual_refused(tmp_path):
    head = eagle3()
    export_heads(head, str(tmp_path), "speculators")
    cfg = read_json(tmp_path / "config.json")
    for value in (True, None):
        if value is None:
            cfg.pop("norm_before_residual")
        else:
            cfg["norm_before_residual"] = value
        json.dump(cfg, open(tmp_path / "config.json", "w"))
        with pytest.raises(ValueError, match="norm_before_residual"):
            load_heads(str(tmp_path), target())


# ---------------------------------------------------------------------------------------------- bad input


def test_unsupported_export_target(tmp_path):
    with pytest.raises(
        ValueError, match=r"medusa heads cannot be exported to 'sglang' \(SGLang has no Medusa"
    ):
        export_heads(medusa(), str(tmp_path), "sglang", target().get_output_embeddings().weight)
    with pytest.raises(ValueError, match="cannot be exported to 'medusa'"):
        export_heads(eagle3(), str(tmp_path), "medusa")


def test_target_layers_without_an_engine_class_are_refused(tmp_path):
    """draft_layer: target heads export only where an engine has that architecture's draft class."""
    q2, q3 = tiny_model("qwen2", num_layers=L), tiny_model("qwen3", num_layers=L)
    cases = [
        (EagleHead.for_target(q2, draft_layer="target"), "vllm"),  # SGLang has Qwen2 EAGLE, vLLM not
        (EagleHead.for_target(q3, draft_layer="target"), "sglang"),
        (Eagle3Head.for_target(q3, draft_layer="target"), "sglang"),  # vLLM has Qwen3 EAGLE-3, SGLang not
        (Eagle3Head.for_target(q2, draft_layer="target"), "speculators"),
    ]
    for head, to in cases:
        with pytest.raises(ValueError, match=r"has no qwen\d \w+ draft class .*draft_layer=llama") as e:
            export_heads(head, str(tmp_path / to), to)
        assert "\n" not in str(e.value)
    export_heads(Eagle3Head.for_target(q3, draft_layer="target"), str(tmp_path / "q3"), "vllm")
    cfg = read_json(tmp_path / "q3" / "config.json")
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["num_aux_layers"] == 3


def test_aux_id_zero_exports_as_sglang_minus_one(tmp_path):
    head = eagle3((0, 1, 2))
    export_heads(head, str(tmp_path / "sg"), "sglang")  # SGLang captures the input of layer id+1
    assert read_json(tmp_path / "sg" / "config.json")["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [
        -1,
        0,
        1,
    ]
    assert load_heads(str(tmp_path / "sg"), target()).aux_layer_ids == (0, 1, 2)
    export_heads(head, str(tmp_path / "v"), "speculators")  # vLLM takes it as is
    assert read_json(tmp_path / "v" / "config.json")["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]


def test_unsorted_aux_ids_are_refused(tmp_path):
    head = eagle3((1, 2, 3))
    head.config.aux_layer_ids = (3, 1, 2)  # a head saved before ids were checked at training time
    for to in ("sglang", "speculators"):
        with pytest.raises(ValueError, match="not distinct and increasing.*sorted, de-duplicated"):
            export_heads(head, str(tmp_path), to)


def test_full_vocab_eagle3_writes_no_vocab_map(tmp_path):
    head = randomise(Eagle3Head.for_target(target(), aux_layer_ids=[1, 2, 3]), 3)
    for to in ("sglang", "speculators"):
        export_heads(head, str(tmp_path / to), to)
        assert not {"d2t", "t2d"} & set(load_file(str(tmp_path / to / "model.safetensors")))
        back = load_heads(str(tmp_path / to), target())
        assert same(eagle3_logits(back, IDS), eagle3_logits(head, IDS))


def test_unknown_head_type(tmp_path):
    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    json.dump({"model_type": "bert", "hidden_size": H}, open(tmp_path / "config.json", "w"))
    with pytest.raises(ValueError, match="unknown head type: config.json has no selfspec head_type"):
        load_heads(str(tmp_path), target())


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupt_safetensors(tmp_path, damage):
    export_heads(eagle3(), str(tmp_path), "speculators")
    path = tmp_path / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"\x07" * 64)
    with pytest.raises(ValueError, match="corrupt or truncated safetensors"):
        load_heads(str(tmp_path), target())


class Payload:
    """A custom class in a pickle: rebuilding it means importing and running this module's code, which
    torch.load(weights_only=True) refuses."""

    def __init__(self) -> None:
        self.note = "unpickling me imports test_convert"


def test_pickled_code_is_refused(tmp_path):
    torch.save({"0.0.linear.weight": torch.zeros(H, H), "evil": Payload()}, tmp_path / "medusa_lm_head.pt")
    json.dump({"medusa_num_heads": 1, "medusa_num_layers": 1}, open(tmp_path / "config.json", "w"))
    with pytest.raises(ValueError, match="contains pickled code .* refused"):
        load_heads(str(tmp_path), target())
    (tmp_path / "medusa_lm_head.pt").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ValueError, match="corrupt or truncated"):
        load_heads(str(tmp_path), target())


def test_checkpoint_for_another_base_model(tmp_path):
    other = tiny_model("llama", num_layers=L, vocab_size=V + 8)
    export_heads(medusa("own"), str(tmp_path / "m"), "vllm")
    with pytest.raises(ValueError, match=f"another base model: vocab {V} x hidden {H}"):
        load_heads(str(tmp_path / "m"), other)
    sd = eagle1_state()
    torch.save(sd, tmp_path / "pytorch_model.bin")
    json.dump(eagle1_config(), open(tmp_path / "config.json", "w"))
    with pytest.raises(ValueError, match="another base model"):
        load_heads(str(tmp_path), other)
    wide = tiny_model("llama", num_layers=L, hidden_size=2 * H)
    json.dump(eagle1_config(vocab_size=V, hidden_size=H), open(tmp_path / "config.json", "w"))
    with pytest.raises(ValueError, match="another base model"):
        load_heads(str(tmp_path), wide)
    export_heads(eagle3(), str(tmp_path / "e3"), "sglang")
    with pytest.raises(ValueError, match="another base model"):
        load_heads(str(tmp_path / "e3"), other)


def test_eagle_import_needs_the_target(tmp_path):
    export_heads(eagle(), str(tmp_path), "sglang")
    with pytest.raises(ValueError, match="needs the target model: its draft layer is rebuilt"):
        load_heads(str(tmp_path))


# ---------------------------------------------------------------------------------------------- CLI


def test_export_cli(tmp_path, capsys):
    from heads import engine_export as cli  # what scripts/export_heads.py runs

    m = target()
    m.save_pretrained(tmp_path / "target")
    heads = medusa("target")
    heads.config.base_model_name_or_path = str(tmp_path / "target")
    save_heads(heads, str(tmp_path / "heads"))
    cli.main(["--heads", str(tmp_path / "heads"), "--to", "vllm", "--out", str(tmp_path / "out")])
    assert "loading target" in capsys.readouterr().out  # the shared lm_head needs the target's weights
    back = load_heads(str(tmp_path / "out"), m)
    assert same(medusa_logits(back, HIDDEN), medusa_logits(heads, HIDDEN))
    cli.main(
        [
            "--heads",
            str(tmp_path / "heads"),
            "--to",
            "medusa",
            "--out",
            str(tmp_path / "o2"),
            "--target",
            str(tmp_path / "target"),
        ]
    )
    capsys.readouterr()
    export = tmp_path / "e3"
    save_heads(eagle3(), str(tmp_path / "h3"))
    cli.main(["--heads", str(tmp_path / "h3"), "--to", "sglang", "--out", str(export)])
    assert "loading target" not in capsys.readouterr().out  # EAGLE-3 exports hold no target weight
    with pytest.raises(ValueError, match="cannot be exported"):
        cli.main(["--heads", str(tmp_path / "heads"), "--to", "sglang", "--out", str(tmp_path / "x")])


def test_committed_engine_table_is_the_scripts_output():
    """results/engine-support/table.md is what scripts/engine_table.py writes from the committed
    results.json (which tests/test_engines.py's run produced; its slow test compares a fresh run)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "scripts"))
    import engine_table

    with open(os.path.join(root, "results", "engine-support", "results.json")) as f:
        doc = json.load(f)
    with open(os.path.join(root, "results", "engine-support", "table.md")) as f:
        assert engine_table.render(doc) == f.read()


def test_readme_quotes_the_engine_support_table():
    """docs/serving.md's engine table is results/engine-support/table.md (written by scripts/engine_table.py
    from tests/test_engines.py's results)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "results", "engine-support", "table.md")) as f:
        table = f.read()
    with open(os.path.join(root, "docs", "serving.md")) as f:
        readme = f.read()
    start = readme.index("<!-- engine-support table: generated by tests/test_engines.py")
    block = readme[readme.index("\n", start) + 1 : readme.index("<!-- end of engine-support table -->")]
    assert block == table


@pytest.mark.parametrize("arch", ["qwen3", "phi3"])
def test_llama_layer_export_describes_the_trained_layer(tmp_path, arch):
    """A draft_layer: llama head's engine config is the Llama layer it was trained with (any target)."""
    m = tiny_model(arch, num_layers=L)
    head = Eagle3Head.for_target(m, aux_layer_ids=[1, 2, 3])
    layer = head.config.draft_layer_config
    for to, key in (("sglang", None), ("speculators", "transformer_layer_config")):
        export_heads(head, str(tmp_path / to), to)
        cfg = read_json(tmp_path / to / "config.json")
        cfg = cfg[key] if key else cfg
        sizes = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")
        assert {k: cfg[k] for k in (*sizes, "rms_norm_eps")} == {
            k: layer[k] for k in (*sizes, "rms_norm_eps")
        }
        assert cfg["model_type"] == "llama" and cfg["rope_theta"] == layer["rope_parameters"]["rope_theta"]


# ---------------------------------------------------------------------------------------------- Gemma embedding scale


def gemma_eagle(arch: str = "gemma2", **kw) -> EagleHead:
    return randomise(EagleHead.for_target(target(arch), bias=False, **kw), 21)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_gemma_eagle_export_folds_the_embedding_scale(tmp_path, engine):
    """Both engines feed the draft's fc the raw rows W[x] of the target's embedding; selfspec feeds it
    embed(x) = sqrt(H) W[x] (Gemma). The exported fc on (W[x], f) is selfspec's fc on (embed(x), f)."""
    m = target("gemma2")
    emb = m.get_input_embeddings()
    head = gemma_eagle()
    assert head.config.embed_scale == float(torch.tensor(H**0.5))  # measured at for_target, recorded
    export_heads(head, str(tmp_path), engine)
    fc = load_file(str(tmp_path / "model.safetensors"))["fc.weight"]
    ids, f = IDS[:, 1:], torch.randn(2, 8, H, generator=torch.Generator().manual_seed(22))
    with torch.no_grad():
        ours = head.fc(torch.cat([emb(ids), f], -1))
        raw = torch.cat([emb.weight[ids], f], -1)  # what the engines' draft looks up
        theirs = raw @ fc.T
        assert torch.allclose(theirs, ours, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(
            head.fc(raw), ours, rtol=1e-2, atol=1e-2
        )  # unfolded, it is another function


def test_gemma_eagle_without_recorded_scale(tmp_path):
    """Heads saved before embed_scale was recorded: a Gemma export needs the target (which gives the same
    fold); non-Gemma heads assume 1.0; a target whose scale differs from the recorded one is refused."""
    head = gemma_eagle()
    export_heads(head, str(tmp_path / "recorded"), "sglang")
    head.config.embed_scale = None
    with pytest.raises(ValueError, match="without its embedding scale") as e:
        export_heads(head, str(tmp_path / "x"), "sglang")
    assert "\n" not in str(e.value) and not os.path.exists(tmp_path / "x")
    export_heads(head, str(tmp_path / "measured"), "sglang", target=target("gemma2"))
    fc = [load_file(str(tmp_path / d / "model.safetensors"))["fc.weight"] for d in ("recorded", "measured")]
    assert torch.equal(*fc)
    llama = eagle(False)
    assert llama.config.embed_scale == 1.0
    llama.config.embed_scale = None
    export_heads(llama, str(tmp_path / "llama"), "vllm")
    assert torch.equal(load_file(str(tmp_path / "llama" / "model.safetensors"))["fc.weight"], llama.fc.weight)
    head.config.embed_scale = 2.0
    with pytest.raises(ValueError, match="other than the one"):
        export_heads(head, str(tmp_path / "y"), "sglang", target=target("gemma2"))


def test_gemma_eagle_import_unfolds_the_scale(tmp_path):
    """An EAGLE-1 checkpoint's fc takes raw rows (as the engines feed it): importing divides the scale out."""
    m = target("gemma2")
    head = randomise(EagleHead.for_target(m, bias=False, draft_layer="target"), 23)
    state = {k: v.clone() for k, v in head.state_dict().items()}
    state["fc.weight"][:, :H] *= head.config.embed_scale
    save_file(state, str(tmp_path / "model.safetensors"))
    tc = m.config.to_dict()
    with open(tmp_path / "config.json", "w") as f:
        json.dump({**tc, "num_hidden_layers": 1, "architectures": ["Gemma2ForCausalLM"]}, f)
    back = load_heads(str(tmp_path), m)
    assert back.config.embed_scale == head.config.embed_scale
    assert torch.allclose(back.fc.weight, head.fc.weight, rtol=1e-6, atol=0)


def test_gemma_eagle3_input_norm_cancels_the_scale_up_to_eps():
    """EAGLE-3 (not folded): the engines' input_layernorm(W[x]) vs selfspec's input_norm(s W[x]). RMSNorm
    makes them x / sqrt(ms + eps) vs x / sqrt(ms + eps / s^2) (ms = mean(x^2)): a relative deviation
    1 - sqrt((ms + eps/s^2) / (ms + eps)) <= eps (1 - 1/s^2) / (2 ms), 0 for a zero row (here, init std
    0.02 and eps 1e-6: at most 2.8e-3)."""
    m = target("gemma2")
    head = Eagle3Head.for_target(m, aux_layer_ids=[1, 2, 3])
    emb, s = m.get_input_embeddings(), head.config.embed_scale
    eps = head.config.draft_layer_config["rms_norm_eps"]
    ids = torch.arange(V)
    with torch.no_grad():
        ours, theirs = head.input_norm(emb(ids)), head.input_norm(emb.weight[ids])
    ms = emb.weight[ids].pow(2).mean(-1)
    rel = (theirs - ours).norm(dim=-1) / ours.norm(dim=-1).clamp_min(1e-30)
    bound = eps * (1 - 1 / s**2) / (2 * ms.clamp_min(1e-30)) + 1e-6  # + fp32 rounding
    assert (rel <= bound).all() and rel.max() > 0, (rel.max(), bound.min())  # near, not exactly, cancelled


def test_export_cli_measures_the_gemma_scale_of_old_heads(tmp_path, capsys):
    """Gemma EAGLE-1 heads without embed_scale: the CLI loads the target for it, and the fc is the fold
    (Gemma-3, whose EAGLE-1 drafts both engines serve)."""
    from heads import engine_export as cli  # what scripts/export_heads.py runs

    target("gemma3_text").save_pretrained(tmp_path / "target")
    head = gemma_eagle("gemma3_text")
    export_heads(head, str(tmp_path / "recorded"), "vllm")
    head.config.embed_scale = None
    head.config.base_model_name_or_path = None
    save_heads(head, str(tmp_path / "heads"))
    with pytest.raises(SystemExit, match="embedding scale"):
        cli.main(["--heads", str(tmp_path / "heads"), "--to", "vllm", "--out", str(tmp_path / "x")])
    cli.main(
        [
            "--heads",
            str(tmp_path / "heads"),
            "--to",
            "vllm",
            "--out",
            str(tmp_path / "out"),
            "--target",
            str(tmp_path / "target"),
        ]
    )
    assert "embedding scale" in capsys.readouterr().out
    fc = [load_file(str(tmp_path / d / "model.safetensors"))["fc.weight"] for d in ("recorded", "out")]
    assert torch.equal(*fc)


def _unserved_case_ids() -> dict[str, tuple[str, str, str]]:
    """tests/engines/cases.py's pairs that the engines' own code refuses: id -> (head type, arch, --to)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "engines"))
    from cases import CASES, NOT_SERVED

    return {c[0]: (c[1], c[3], c[4]) for c in CASES if c[0] in NOT_SERVED}


def test_unserved_exports_are_the_pairs_the_engines_refuse():
    """The CLI's refusals (the registry entries' ``unserved``, `heads.engine_export.unserved`) are exactly
    the pairs test_engines.py finds refused in the engines' own code (``vllm`` being EAGLE-3's alias of
    ``speculators``)."""
    from heads.engine_export import unserved

    refused = set(_unserved_case_ids().values())
    aliased = {(h, a, "vllm") for h, a, to in refused if h == "eagle3" and to == "speculators"}
    assert set(unserved()) == refused | aliased


UNSERVED_PAIRS = [
    ("eagle", "gemma2", "vllm"), ("eagle", "gemma2", "sglang"), ("eagle3", "gemma2", "speculators"),
    ("eagle3", "gemma2", "sglang"), ("eagle3", "gemma3_text", "vllm"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "arch", "to"), UNSERVED_PAIRS)
def test_export_cli_refuses_pairs_no_engine_serves(tmp_path, monkeypatch, kind, arch, to):
    """Gemma-2 EAGLE / EAGLE-3 drafts (and Gemma-3 EAGLE-3 for vLLM): one line naming the engine class
    that lacks the hook, before the target is loaded or anything is written."""
    from heads import engine_export as cli  # what scripts/export_heads.py runs

    head = (
        gemma_eagle(arch) if kind == "eagle" else Eagle3Head.for_target(target(arch), aux_layer_ids=[0, 2, 3])
    )
    save_heads(head, str(tmp_path / "heads"))
    monkeypatch.setattr(cli, "load_target", lambda *a, **k: pytest.fail("the target was loaded"))
    with pytest.raises(ValueError, match=rf"not exporting {kind} heads for a '{arch}' target to '{to}'") as e:
        cli.main(["--heads", str(tmp_path / "heads"), "--to", to, "--out", str(tmp_path / "out")])
    assert "\n" not in str(e.value) and "ForCausalLM" in str(e.value)
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize(("kind", "arch", "to"), UNSERVED_PAIRS)
def test_export_heads_warns_on_pairs_no_engine_serves(tmp_path, kind, arch, to):
    """`heads.export_heads` (the Python API, which the engine tests use to show the engines refuse these
    pairs) writes them, with a warning naming the engine class that lacks the hook."""
    head = (
        gemma_eagle(arch) if kind == "eagle" else Eagle3Head.for_target(target(arch), aux_layer_ids=[0, 2, 3])
    )
    with pytest.warns(
        UserWarning, match=rf"no engine serves {kind} heads for a '{arch}' target .*ForCausalLM"
    ):
        paths = export_heads(head, str(tmp_path / "out"), to)
    assert all(os.path.isfile(p) for p in paths)


def test_export_cli_exports_gemma3_eagle3_for_sglang(tmp_path):
    """The pair of the same family that SGLang does serve is exported."""
    from heads import engine_export as cli

    save_heads(Eagle3Head.for_target(target("gemma3_text"), aux_layer_ids=[0, 2, 3]), str(tmp_path / "heads"))
    paths = cli.main(["--heads", str(tmp_path / "heads"), "--to", "sglang", "--out", str(tmp_path / "out")])
    assert {os.path.basename(p) for p in paths} == {"config.json", "model.safetensors"}


def test_embed_scale_is_the_modules_own_factor_in_its_dtype():
    """Gemma multiplies by sqrt(H) rounded to the weight dtype: a bf16 target records that rounded value."""
    import copy

    from heads.draft_layer import target_embed_scale

    m = copy.deepcopy(target("gemma2")).to(torch.bfloat16)
    assert target_embed_scale(m) == float(torch.tensor(H**0.5).to(torch.bfloat16)) != H**0.5
    assert target_embed_scale(target()) == 1.0  # Llama: a plain lookup
