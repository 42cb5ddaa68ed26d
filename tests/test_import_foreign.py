"""Importing heads in the layouts the original trainers write today (`heads.convert` import side).

Each checkpoint is written here, by this test's own code, in the layout the trainer produces (read from
FasterDecoding/Medusa's ``train_legacy.py``/``medusa_model_legacy.py`` and SafeAILab/EAGLE's
``traineagle3``), loaded through ``infer.load(target, heads=dir)``, checked to be the function that
trainer's model computes, and must generate greedily exactly what ``target.generate`` does.
Tiny random Llama target (conftest), seeded.
"""

from __future__ import annotations

import functools
import json

import pytest
import torch
from conftest import tiny_model
from safetensors.torch import save_file

import infer
from heads import Eagle3Head, build_vocab_map, run_target

V, H, VD = 96, 32, 64

pytestmark = pytest.mark.usefixtures("one_thread")


@functools.cache
def target():
    return tiny_model("llama", num_layers=4)


def greedy_identical(heads_dir, **kw) -> infer.SpecModel:
    """infer.load(target, heads=dir), then its greedy output == target.generate's (fp32)."""
    m = target()
    spec = infer.load(m, heads=str(heads_dir))
    ids = torch.randint(3, V, (1, 6), generator=torch.Generator().manual_seed(11))
    out = infer.generate(spec, ids, max_new_tokens=16, do_sample=False, **kw)
    assert torch.equal(out.sequences, m.generate(ids, max_new_tokens=16, do_sample=False))
    return spec


def medusa_blocks(K: int, layers: int, seed: int = 8) -> dict[str, torch.Tensor]:
    """Residual blocks as Medusa's ``medusa_head`` ModuleList names them: {h}.{l}.linear.weight|bias."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for h in range(K):
        for j in range(layers):
            sd[f"{h}.{j}.linear.weight"] = torch.randn(H, H, generator=g) * 0.1
            sd[f"{h}.{j}.linear.bias"] = torch.randn(H, generator=g) * 0.1
    return sd


def medusa_reference(sd, h: int, layers: int, lm_head: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Medusa's head h: ResBlocks x <- x + SiLU(W x + b), then the lm_head."""
    for j in range(layers):
        x = x + torch.nn.functional.silu(x @ sd[f"{h}.{j}.linear.weight"].T + sd[f"{h}.{j}.linear.bias"])
    return x @ lm_head.T


@pytest.mark.parametrize("version", ["2", None])
def test_medusa_version2_heads_use_the_target_lm_head(tmp_path, version):
    """train_legacy.py: MedusaConfig(..., version="2").save_pretrained + medusa_lm_head.safetensors with the
    residual blocks only; the logits come from the base model's lm_head. A file with no per-head lm_head
    and no version field is read the same way."""
    K, Lm = 3, 1
    sd = medusa_blocks(K, Lm)
    cfg = {"medusa_num_heads": K, "medusa_num_layers": Lm, "base_model_name_or_path": "x/y"}
    if version is not None:
        cfg["version"] = version
    json.dump({**cfg, "transformers_version": "4.41.0"}, open(tmp_path / "config.json", "w"))
    save_file(sd, str(tmp_path / "medusa_lm_head.safetensors"))
    spec = greedy_identical(tmp_path)
    heads = spec.heads
    assert heads.config.lm_head == "target" and heads.config.num_heads == K and heads.lm_heads is None
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(3))
    lm = target().get_output_embeddings()
    with torch.no_grad():
        got = heads(x, lm)
    for h in range(K):
        torch.testing.assert_close(got[h], medusa_reference(sd, h, Lm, lm.weight, x), rtol=1e-5, atol=1e-5)


def test_medusa_version2_refusals(tmp_path):
    from heads import load_heads

    K = 2
    sd = medusa_blocks(K, 1)
    json.dump(
        {"medusa_num_heads": K, "medusa_num_layers": 1, "version": "2"}, open(tmp_path / "config.json", "w")
    )
    save_file(sd, str(tmp_path / "medusa_lm_head.safetensors"))
    with pytest.raises(ValueError, match="base model's lm_head; pass the target"):
        load_heads(str(tmp_path))
    save_file(
        {**sd, **{f"{h}.1.weight": torch.zeros(V, H) for h in range(K)}},
        str(tmp_path / "medusa_lm_head.safetensors"),
    )
    with pytest.raises(ValueError, match="version 2 means the heads share"):
        load_heads(str(tmp_path), target())


def test_medusa_head_prefixed_keys(tmp_path):
    """Heads saved through the model's ``medusa_head`` attribute: medusa_head.{h}.{l}.linear.*, and the
    Medusa-1 per-head lm_head medusa_head.{h}.{L}.weight; as a torch.save'd medusa_lm_head.pt."""
    K, Lm = 2, 2
    sd = medusa_blocks(K, Lm, seed=9)
    g = torch.Generator().manual_seed(10)
    lm = {h: torch.randn(V, H, generator=g) * 0.3 for h in range(K)}
    sd.update({f"{h}.{Lm}.weight": w for h, w in lm.items()})
    json.dump({"medusa_num_heads": K, "medusa_num_layers": Lm}, open(tmp_path / "config.json", "w"))
    torch.save({f"medusa_head.{k}": v for k, v in sd.items()}, tmp_path / "medusa_lm_head.pt")
    heads = greedy_identical(tmp_path).heads
    assert heads.config.lm_head == "own" and heads.config.num_layers == Lm
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        got = heads(x)
    for h in range(K):
        torch.testing.assert_close(got[h], medusa_reference(sd, h, Lm, lm[h], x), rtol=1e-5, atol=1e-5)


def safeailab_eagle3_state(head: Eagle3Head, frozen: int) -> dict[str, torch.Tensor]:
    """What traineagle3's ``cnets.Model`` state dict holds for a draft: ``fc``, ``midlayer.*`` (with its
    ``input_layernorm`` and ``hidden_norm``), ``norm``, ``lm_head``, ``d2t``, ``t2d``, plus ``frozen``
    tensors of its frozen ``target_model`` (and the frozen embedding)."""
    own = head.state_dict()
    sd = {
        k: v for k, v in own.items() if k.startswith(("fc.", "midlayer.", "norm.", "lm_head.", "d2t", "t2d"))
    }
    sd["midlayer.input_layernorm.weight"] = own["input_norm.weight"]
    sd["midlayer.hidden_norm.weight"] = own["hidden_norm.weight"]
    tsd = target().state_dict()
    for k in list(tsd)[:frozen]:
        sd[f"target_model.{k}"] = tsd[k].clone()
    sd["embed_tokens.weight"] = target().get_input_embeddings().weight.clone()
    return {k: v.clone() for k, v in sd.items()}


def test_safeailab_eagle3_trainer_output_drops_target_tensors(tmp_path):
    """A traineagle3 run (its config.json: LlamaForCausalLM with draft_vocab_size; pytorch_model.bin from
    save_16bit_model) that carries 13 target_model.* tensors: they are dropped with a warning that says
    how many, and the draft is the same function."""
    m = target()
    torch.manual_seed(2)
    head = Eagle3Head.for_target(m, draft_vocab_size=VD)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    head.set_vocab_map(
        *build_vocab_map(torch.randint(0, 50, (V,), generator=torch.Generator().manual_seed(1)), VD)
    )
    torch.save(safeailab_eagle3_state(head, frozen=13), tmp_path / "pytorch_model.bin")
    tc = m.config
    json.dump(
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": H,
            "intermediate_size": tc.intermediate_size,
            "num_attention_heads": tc.num_attention_heads,
            "num_key_value_heads": tc.num_key_value_heads,
            "num_hidden_layers": 1,
            "vocab_size": V,
            "draft_vocab_size": VD,
            "rms_norm_eps": tc.rms_norm_eps,
            "max_position_embeddings": 256,
            "rope_theta": tc.rope_parameters["rope_theta"],
            "torch_dtype": "float16",
        },
        open(tmp_path / "config.json", "w"),
    )
    with pytest.warns(UserWarning, match=r"dropped 13 frozen target tensors \(target_model\.\*\)"):
        spec = greedy_identical(tmp_path, depth=3, draft_top_k=3, total_tokens=10)
    got = spec.heads
    assert got.aux_layer_ids == head.aux_layer_ids  # the trainer's fixed (2, L//2, L-3)
    assert got.state_dict().keys() == head.state_dict().keys()
    assert all(torch.equal(got.state_dict()[k], v) for k, v in head.state_dict().items())
    ids = torch.randint(3, V, (1, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        aux = torch.cat(run_target(m, ids, aux_layers=head.aux_layer_ids).aux, -1)[:, :-1]
        emb = m.get_input_embeddings()
        assert torch.equal(got(ids[:, 1:], aux, emb), head(ids[:, 1:], aux, emb))
