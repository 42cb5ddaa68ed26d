"""The graft (`heads.graft`) on every architecture, and Medusa heads: structure, init, save/load."""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import tiny_model
from safetensors.torch import load_file
from torch import nn

from heads import (
    REGISTRY,
    MedusaConfig,
    MedusaHeads,
    load_heads,
    load_target,
    run_target,
    save_heads,
    target_dims,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _ids(vocab: int = 96, b: int = 2, t: int = 9, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, vocab, (b, t), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------- graft


def test_run_target_graft(arch):
    model = tiny_model(arch)
    ids = _ids()
    out = run_target(model, ids, aux_layers=(0, 1, 2))
    ref = model(input_ids=ids, output_hidden_states=True)
    vocab, hidden = target_dims(model)
    assert (vocab, hidden) == (96, 32)
    assert out.hidden.shape == (2, 9, hidden)
    assert out.logits.shape == (2, 9, vocab)
    torch.testing.assert_close(out.logits, ref.logits)
    lm = model.get_output_embeddings()(out.hidden)
    cap = getattr(model.config, "final_logit_softcapping", None)
    if arch == "gemma2":
        assert cap  # Gemma 2 soft-caps its final logits: logits = cap * tanh(lm_head(h) / cap)
        lm = cap * torch.tanh(lm / cap)
    torch.testing.assert_close(lm, out.logits, atol=1e-5, rtol=1e-5)
    # aux layers are hidden_states[i]: the input of decoder layer i (0 = embeddings)
    assert len(ref.hidden_states) == 3  # num_layers + 1
    assert len(out.aux) == 3
    for i, a in enumerate(out.aux):
        torch.testing.assert_close(a, ref.hidden_states[i])
    assert run_target(model, ids).aux == ()


def test_load_target_frozen(tmp_path):
    model = tiny_model("llama")
    model.save_pretrained(tmp_path / "tgt")
    loaded = load_target(str(tmp_path / "tgt"))
    assert not loaded.training
    assert all(not p.requires_grad for p in loaded.parameters())
    assert all(not m.training for m in loaded.modules())
    ids = _ids()
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    bf16 = load_target(str(tmp_path / "tgt"), dtype="bf16")
    assert next(bf16.parameters()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        load_target(str(tmp_path / "tgt"), dtype="int3")


def test_load_target_missing_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_target(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError):
        load_target("./definitely/not/here")


# --------------------------------------------------------------------------------------------- medusa


def test_medusa_separate_modules_per_head_and_layer():
    model = tiny_model("llama")
    heads = MedusaHeads.for_target(model, num_heads=3, num_layers=2)
    assert len(heads.blocks) == 3
    blocks = [blk for head in heads.blocks for blk in head]
    assert len(blocks) == 6
    assert len({id(b) for b in blocks}) == 6
    params = list(heads.parameters())
    assert len(params) == 6 * 2  # weight + bias per ResBlock, nothing shared
    assert len({p.data_ptr() for p in params}) == len(params)
    assert heads.lm_heads is None  # default reuses the target's lm_head
    with torch.no_grad():
        heads.blocks[0][0].linear.weight.fill_(1.0)
    assert all(float(b.linear.weight.detach().abs().sum()) == 0 for b in blocks[1:])
    own = MedusaHeads.for_target(model, num_heads=3, lm_head="own")
    ptrs = [h.weight.data_ptr() for h in own.lm_heads]
    assert len(set(ptrs)) == 3
    assert model.lm_head.weight.data_ptr() not in ptrs


@pytest.mark.parametrize("lm_head", ["target", "own"])
@pytest.mark.parametrize("num_layers", [1, 2])
def test_medusa_zero_init_equals_target_head(lm_head, num_layers):
    """A fresh head is the identity followed by (a copy of) the target's lm_head."""
    model = tiny_model("qwen2")
    heads = MedusaHeads.for_target(model, num_heads=3, num_layers=num_layers, lm_head=lm_head)
    h = run_target(model, _ids()).hidden  # [2, 9, H]
    logits = heads(h, model.get_output_embeddings())
    assert logits.shape == (3, 2, 9, 96)
    expect = model.get_output_embeddings()(h)
    for k in range(3):
        torch.testing.assert_close(logits[k], expect)
    torch.testing.assert_close(heads.features(h), h.expand(3, *h.shape))


def test_medusa_needs_lm_head_and_sizes():
    model = tiny_model("llama")
    heads = MedusaHeads.for_target(model, num_heads=2)
    with pytest.raises(ValueError, match="lm_head"):
        heads(torch.zeros(3, 32))
    with pytest.raises(ValueError, match="hidden_size and vocab_size"):
        MedusaHeads(MedusaConfig(num_heads=2))


def test_medusa_for_target_dtype_and_metadata():
    model = tiny_model("llama", dtype=torch.bfloat16)
    heads = MedusaHeads.for_target(model, num_heads=2, lm_head="own")
    assert {p.dtype for p in heads.parameters()} == {torch.bfloat16}
    assert heads.config.base_model_name_or_path == "tiny-random-llama"
    assert (heads.config.vocab_size, heads.config.hidden_size) == (96, 32)


def _randomise(module: nn.Module, seed: int = 0) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            nn.init.normal_(p, std=0.2)


@pytest.mark.parametrize("lm_head", ["target", "own"])
def test_medusa_save_load_round_trip(tmp_path, lm_head):
    model = tiny_model("llama")
    heads = MedusaHeads.for_target(model, num_heads=3, num_layers=2, lm_head=lm_head)
    _randomise(heads)
    out = tmp_path / "heads"
    save_heads(heads, str(out))
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["head_type"] == "medusa"
    assert cfg["base_model_name_or_path"] == "tiny-random-llama"
    assert (cfg["vocab_size"], cfg["hidden_size"]) == (96, 32)
    assert (cfg["num_heads"], cfg["num_layers"], cfg["lm_head"]) == (3, 2, lm_head)
    assert isinstance(cfg["selfspec_version"], str) and cfg["selfspec_version"]
    state = load_file(str(out / "model.safetensors"))
    assert set(state) == set(heads.state_dict())
    assert all(k.startswith(("blocks.", "lm_heads.")) for k in state)  # never target weights
    if lm_head == "target":
        assert not any(k.startswith("lm_heads.") for k in state)
    loaded = load_heads(str(out), model)
    assert isinstance(loaded, MedusaHeads) and not loaded.training
    assert loaded.config == heads.config
    h = run_target(model, _ids()).hidden
    lm = model.get_output_embeddings()
    torch.testing.assert_close(loaded(h, lm), heads(h, lm), rtol=0, atol=0)
    # without a target: loads unchecked, still equal
    torch.testing.assert_close(load_heads(str(out))(h, lm), heads(h, lm), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("kw", "wrong"), [({"vocab_size": 64}, "vocab size"), ({"hidden_size": 48}, "hidden size")]
)
def test_medusa_load_onto_other_target(tmp_path, kw, wrong):
    model = tiny_model("llama")
    save_heads(MedusaHeads.for_target(model, num_heads=2), str(tmp_path))
    other = tiny_model("llama", **kw)
    theirs, ours = (kw.get("vocab_size", 96), 96) if "vocab_size" in kw else (kw["hidden_size"], 32)
    with pytest.raises(ValueError, match=wrong) as e:
        load_heads(str(tmp_path), other)
    assert str(ours) in str(e.value) and str(theirs) in str(e.value)
    assert "tiny-random-llama" in str(e.value)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_medusa_corrupt_weights(tmp_path, damage):
    model = tiny_model("llama")
    save_heads(MedusaHeads.for_target(model, num_heads=2), str(tmp_path))
    path = tmp_path / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(
        {"garbage": b"\x00not a safetensors file" * 10, "truncated": data[: len(data) // 2], "empty": b""}[
            damage
        ]
    )
    with pytest.raises(ValueError, match="corrupt"):
        load_heads(str(tmp_path), model)


def test_medusa_weights_of_other_shape(tmp_path):
    model = tiny_model("llama")
    save_heads(MedusaHeads.for_target(model, num_heads=2), str(tmp_path))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["num_heads"] = 3  # config and weights disagree
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="missing"):
        load_heads(str(tmp_path), model)


def test_medusa_missing_files(tmp_path):
    model = tiny_model("llama")
    with pytest.raises(FileNotFoundError):
        load_heads(str(tmp_path / "nowhere"), model)
    save_heads(MedusaHeads.for_target(model, num_heads=2), str(tmp_path / "a"))
    os.remove(tmp_path / "a" / "config.json")
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_heads(str(tmp_path / "a"), model)
    save_heads(MedusaHeads.for_target(model, num_heads=2), str(tmp_path / "b"))
    os.remove(tmp_path / "b" / "model.safetensors")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_heads(str(tmp_path / "b"), model)


def test_bad_config_files(tmp_path):
    model = tiny_model("llama")
    save_heads(MedusaHeads.for_target(model, num_heads=2), str(tmp_path))
    cfg_path = tmp_path / "config.json"
    good = json.loads(cfg_path.read_text())
    cfg_path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_heads(str(tmp_path), model)
    cfg_path.write_text(json.dumps({**good, "head_type": "hydra"}))
    with pytest.raises(ValueError, match="unknown head_type 'hydra'"):
        load_heads(str(tmp_path), model)
    cfg_path.write_text(json.dumps({**good, "num_hedas": 4}))
    with pytest.raises(ValueError, match="num_hedas"):
        load_heads(str(tmp_path), model)
    cfg_path.write_text(json.dumps({**good, "num_heads": 0}))
    with pytest.raises(ValueError, match="num_heads"):
        load_heads(str(tmp_path), model)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"num_heads": 0}, "num_heads must be >= 1"),
        ({"num_heads": -2}, "num_heads must be >= 1"),
        ({"num_layers": -1}, "num_layers must be >= 0"),
        ({"lm_head": "shared"}, "lm_head must be"),
        ({"hidden_size": -1}, "must be >= 0"),
        ({"vocab_size": -5}, "must be >= 0"),
    ],
)
def test_medusa_config_validation(kw, message):
    with pytest.raises(ValueError, match=message):
        MedusaConfig(**kw)


def test_config_dict_round_trip_and_registry():
    assert (REGISTRY["medusa"].config, REGISTRY["medusa"].module) == (MedusaConfig, MedusaHeads)
    cfg = MedusaConfig(hidden_size=32, vocab_size=96, num_heads=5, num_layers=0, lm_head="own")
    d = cfg.to_dict()
    assert d["head_type"] == "medusa" and "selfspec_version" in d
    assert MedusaConfig.from_dict(d) == cfg


def test_zero_layer_heads_are_the_target_head():
    model = tiny_model("llama")
    heads = MedusaHeads.for_target(model, num_heads=2, num_layers=0)
    h = torch.randn(4, 32)
    torch.testing.assert_close(heads(h, model.lm_head)[1], model.lm_head(h))
