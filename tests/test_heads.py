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


# ---------------------------------------------------------------------------------------------- a new head type


def test_a_new_head_type_is_its_files_and_one_registry_entry(tmp_path):
    """docs/design.md §13's worked example, as written there: a toy head type (K linear heads over the
    target's last hidden state, logits through the target's lm_head) is one config, one module, one loss
    and one ``register(HeadType(...))``. Nothing else is edited, and it trains (the loss path training
    takes: ``registry.get(...).objective``), saves and loads (`load_heads` asks the registry), and drafts
    with the static-tree proposer its entry names, losslessly."""
    from dataclasses import dataclass
    from typing import ClassVar

    import torch.nn.functional as F

    from heads import registry
    from heads.base import HeadConfig
    from heads.registry import HeadType, LossInputs, Objective
    from infer.draft import MedusaProposer
    from infer.generate import speculative_generate

    @dataclass
    class ToyConfig(HeadConfig):
        head_type: ClassVar[str] = "toy"
        num_heads: int = 2

    class ToyHeads(nn.Module):
        def __init__(self, config: ToyConfig) -> None:
            super().__init__()
            self.config, self.lm_heads = config, None  # the static-tree proposer's interface (Medusa's)
            H = config.hidden_size
            self.blocks = nn.ModuleList(nn.Linear(H, H) for _ in range(config.num_heads))

        def forward(self, hidden, lm_head, num_heads=None):  # [..., H] -> [K, ..., V]: head k predicts t+2+k
            return lm_head(torch.stack([b(hidden) for b in self.blocks[:num_heads]]))

    def toy_loss(heads, out, batch, inputs: LossInputs):
        logits, ids, mask = heads(out.hidden, inputs.lm_head), batch["input_ids"], batch["loss_mask"]
        losses, top1, count = [], [], []
        for k in range(heads.config.num_heads):
            z, y = logits[k, :, : -(k + 2)], ids[:, k + 2 :].masked_fill(mask[:, k + 2 :] == 0, -100)
            losses.append(F.cross_entropy(z.flatten(0, 1), y.flatten(), ignore_index=-100))
            top1.append(((z.argmax(-1) == y) & (y >= 0)).sum() / (y >= 0).sum().clamp(min=1))
            count.append((y >= 0).sum().float())
        loss = torch.stack(losses).sum()
        return loss, {"loss": torch.stack(losses).detach(), "top1": torch.stack(top1), "count": torch.stack(count)}

    registry.register(
        HeadType(
            name="toy",
            config=ToyConfig,
            module=ToyHeads,
            objective=Objective(
                position_name="head",
                positions=lambda cfg: cfg.num_heads,
                weights=lambda cfg: [1.0] * cfg.num_heads,
                target_kwargs=lambda cfg: {},
                loss=toy_loss,
            ),
            proposer="static_tree",
            tree="static",
        )
    )
    try:
        target = tiny_model("llama")
        vocab, hidden = target_dims(target)
        torch.manual_seed(0)
        heads = ToyHeads(ToyConfig(hidden_size=hidden, vocab_size=vocab))
        ids = _ids()
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}
        # one optimizer step through the registry, as train.train_heads' batch_loss computes it
        objective = registry.get(heads.config.head_type).objective
        out = run_target(target, ids, batch["attention_mask"], **objective.target_kwargs(heads.config))
        inputs = LossInputs(lm_head=target.get_output_embeddings(), embed=target.get_input_embeddings())
        loss, metrics = objective.loss(heads, out, batch, inputs)
        assert {k: v.shape for k, v in metrics.items()} == {k: (2,) for k in ("loss", "top1", "count")}
        before = heads.blocks[0].weight.detach().clone()
        opt = torch.optim.SGD(heads.parameters(), lr=0.1)
        loss.backward()
        opt.step()
        assert not torch.equal(heads.blocks[0].weight, before)
        assert objective.loss(heads, out, batch, inputs)[0] < loss  # the step lowered the loss
        # heads-only save and load: the registry finds the toy type from config.json
        save_heads(heads, str(tmp_path / "toy"))
        back = load_heads(str(tmp_path / "toy"), target)
        assert type(back) is ToyHeads and all(
            torch.equal(a, b) for a, b in zip(back.state_dict().values(), heads.state_dict().values(), strict=True)
        )
        # drafting with the proposer the entry names ("static_tree": Medusa's rank-path trees)
        assert registry.get("toy").proposer == "static_tree"
        proposer = MedusaProposer(back, target.get_output_embeddings(), [[0], [1], [0, 0]])
        prompt = ids[:1, :5]
        got = speculative_generate(target, proposer, prompt, max_new_tokens=12, do_sample=False)
        ref = target.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
        assert torch.equal(got.sequences, ref)
    finally:
        del registry.REGISTRY["toy"]
