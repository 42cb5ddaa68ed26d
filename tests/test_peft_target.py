"""Targets with a PEFT adapter: `load_target(..., adapter=, merge=)`, heads that record the adapter, and
`infer.load` bringing target + adapter + heads back in one call.

The adapters are LoRAs with random, non-zero A and B (``init_lora_weights=False``), so the adapted
model's logits differ clearly from the base's. Covered: logits of the loaded target (merged and not)
against the ``PeftModel`` the adapter was saved from; greedy identity of `infer.generate` against the
adapted model's own ``generate`` (Medusa heads fitted to the adapted model, both merge modes, two
architectures; EAGLE on one); heads recording the adapter and refusing a target without it, with
another one, or with one when they were trained without; clear errors for an adapter of another base
model, LoRA target modules the target lacks, missing paths; a short training run on an adapted target.
"""

from __future__ import annotations

import functools
import json
import os
import shutil

import pytest
import torch
from conftest import reset_accelerate, tiny_model
from test_train import tiny_data, tiny_target  # noqa: F401  (session fixtures: a tokenizer-equipped target)
from torch import nn

import infer
from heads import EagleHead, MedusaHeads, load_heads, load_target, run_target, save_heads
from heads.graft import adapter_info

pytestmark = pytest.mark.usefixtures("one_thread")

LORA_MODULES = {"llama": ["q_proj", "v_proj", "down_proj"], "qwen2": ["k_proj", "o_proj"], "gpt2": ["c_attn"]}
PROMPTS = [torch.tensor([[5, 17, 33, 9, 61]]), torch.tensor([[40, 3, 88, 12, 7, 70, 25, 19, 4, 50, 11]])]
NEW = 30


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Saves tiny bases and adapters once per module; returns paths keyed by what was saved."""
    root = tmp_path_factory.mktemp("peft-target")

    @functools.cache
    def base(arch: str, hidden: int = 32) -> str:
        path = str(root / f"base-{arch}-{hidden}")
        m = tiny_model(arch, hidden_size=hidden)
        m.generation_config.eos_token_id = None  # generations run to max_new_tokens
        m.save_pretrained(path)
        return path

    @functools.cache
    def adapter(arch: str, seed: int = 0, hidden: int = 32) -> str:
        """A LoRA on the tiny ``arch`` base, random A and B, saved with `save_pretrained`."""
        return save_adapter(str(root / f"lora-{arch}-{seed}-{hidden}"), arch, seed, hidden)

    return base, adapter


def save_adapter(path: str, arch: str, seed: int = 0, hidden: int = 32) -> str:
    from peft import LoraConfig, get_peft_model

    model = tiny_model(arch, hidden_size=hidden)
    torch.manual_seed(100 + seed)  # after tiny_model, which seeds itself: A and B depend on ``seed``
    lora = LoraConfig(
        r=4, lora_alpha=8, target_modules=LORA_MODULES[arch], init_lora_weights=False, task_type="CAUSAL_LM"
    )
    get_peft_model(model, lora).save_pretrained(path)
    return path


@functools.cache
def peft_reference(adapter: str, arch: str):
    """The adapted model as peft itself builds it (the tiny base + `PeftModel.from_pretrained`)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(tiny_model(arch), adapter).eval()


def greedy(model: nn.Module, i: int) -> torch.Tensor:
    return model.generate(PROMPTS[i], do_sample=False, max_new_tokens=NEW, pad_token_id=0)


def fitted_medusa(target: nn.Module, steps: int = 40) -> MedusaHeads:
    """Medusa heads (own lm_heads) fitted to the adapted target's greedy continuations of the prompts."""
    seqs = [greedy(target, i)[0] for i in range(len(PROMPTS))]
    with torch.no_grad():
        hidden = torch.cat([run_target(target, s[None]).hidden[0, :-2] for s in seqs])  # [N, H]
    K = 3
    labels = [torch.cat([torch.cat([s[2 + k :], s.new_full((k,), -100)]) for s in seqs]) for k in range(K)]
    torch.manual_seed(0)
    heads = MedusaHeads.for_target(target, num_heads=K, lm_head="own").train()
    heads.config.record_adapter(target)
    opt = torch.optim.Adam(heads.parameters(), lr=3e-2)
    with torch.enable_grad():
        for _ in range(steps):
            logits = heads(hidden)  # [K, N, V]
            loss = sum(nn.functional.cross_entropy(logits[k], labels[k], ignore_index=-100) for k in range(K))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return heads.eval().requires_grad_(False)


# ------------------------------------------------------------------------------------------ loading


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("merge", [False, True], ids=["peft", "merged"])
def test_adapted_target_logits_match_peft(store, arch, merge):
    base, adapter = store
    target = load_target(base(arch), adapter=adapter(arch), merge=merge)
    ref = peft_reference(adapter(arch), arch)
    plain = load_target(base(arch))
    ids = torch.randint(3, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want, orig = run_target(target, ids).logits, ref(ids).logits, plain(ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert (got - orig).abs().max() > 0.05  # the adapter really changes the target
    assert type(target).__name__.startswith("PeftModel") != merge  # merged: a plain transformers model
    assert not any(p.requires_grad for p in target.parameters()) and not target.training
    info = adapter_info(target)
    assert info["name_or_path"] == adapter(arch) and info["merged"] == merge and len(info["sha256"]) == 64
    assert adapter_info(plain) is None


# ------------------------------------------------------------------------------------ greedy identity


@pytest.mark.parametrize(
    "arch,merge",
    [("llama", False), ("llama", True), ("qwen2", False)],
    ids=["llama-peft", "llama-merged", "qwen2-peft"],
)
def test_greedy_identity_medusa_on_adapted_target(store, arch, merge):
    base, adapter = store
    target = load_target(base(arch), adapter=adapter(arch), merge=merge)
    model = infer.SpecModel(target, fitted_medusa(target))
    accepted = []
    for i in range(len(PROMPTS)):
        out = infer.generate(model, PROMPTS[i], max_new_tokens=NEW, adaptive=False)  # the fixed tree's τ
        assert out.sequences.tolist() == greedy(target, i).tolist()
        accepted.append(out.stats.mean_accepted_length)
    # Heads fitted to the adapted model draft most of its tokens; drafts are really being accepted.
    assert min(accepted) > 1.5, accepted
    # The adapter changes the continuation: the base model's greedy output is another sequence.
    assert any(greedy(load_target(base(arch)), i).tolist() != greedy(target, i).tolist() for i in range(2))


def test_greedy_identity_eagle_on_adapted_target(store):
    base, adapter = store
    target = load_target(base("llama"), adapter=adapter("llama"))
    torch.manual_seed(0)
    head = EagleHead.for_target(target)
    head.config.record_adapter(target)
    model = infer.SpecModel(target, head.eval())
    for i in range(len(PROMPTS)):
        out = infer.generate(model, PROMPTS[i], max_new_tokens=NEW, depth=3, draft_top_k=4, total_tokens=12)
        assert out.sequences.tolist() == greedy(target, i).tolist()


# --------------------------------------------------------------------------- heads record the adapter


def test_infer_load_brings_the_recorded_adapter(store, tmp_path):
    base, adapter = store
    target = load_target(base("llama"), adapter=adapter("llama"))
    heads = fitted_medusa(target, steps=10)
    assert heads.config.target_adapter == adapter("llama") and heads.config.target_adapter_sha256
    save_heads(heads, str(tmp_path / "heads"))
    with open(tmp_path / "heads" / "config.json") as f:
        saved = json.load(f)
    assert saved["target_adapter"] == adapter("llama") and saved["target_adapter_sha256"]

    # The recorded path is outside the heads directory: a checkpoint's config never sends the loader
    # there; adapter= names the adapter, and its weights are checked against the record.
    with pytest.raises(ValueError, match=r"target_adapter .* is an absolute path.*pass adapter="):
        infer.load(base("llama"), str(tmp_path / "heads"))
    for merge in (False, True):
        model = infer.load(base("llama"), str(tmp_path / "heads"), merge=merge, adapter=adapter("llama"))
        assert adapter_info(model.target)["merged"] == merge
        out = infer.generate(model, PROMPTS[1], max_new_tokens=NEW)
        assert out.sequences.tolist() == greedy(model.target, 1).tolist()
        assert out.sequences.tolist() == greedy(target, 1).tolist()
    # The adapter moved (heads copied to another machine): adapter= gives its new place.
    moved = shutil.move(adapter("llama"), tmp_path / "lora-elsewhere")
    try:
        model = infer.load(base("llama"), str(tmp_path / "heads"), adapter=str(moved))  # same weights: fine
        assert infer.generate(model, PROMPTS[0], max_new_tokens=NEW).sequences.tolist() == (
            greedy(target, 0).tolist()
        )
    finally:
        shutil.move(moved, adapter("llama"))


def test_adapter_saved_inside_the_heads_dir(store, tmp_path):
    """Medusa-2's layout: the LoRA in ``<heads>/adapter``, recorded as the relative ``"adapter"``; the
    checkpoint moves as a whole (here: copied elsewhere and the original deleted)."""
    base, adapter = store
    target = load_target(base("llama"), adapter=adapter("llama"))
    heads = fitted_medusa(target, steps=10)
    heads.config.target_adapter, heads.config.target_adapter_sha256 = "adapter", None
    first = tmp_path / "first"
    save_heads(heads, str(first))
    shutil.copytree(adapter("llama"), first / "adapter")
    moved = tmp_path / "moved"
    shutil.copytree(first, moved)
    shutil.rmtree(first)

    model = infer.load(base("llama"), str(moved))
    assert adapter_info(model.target)["name_or_path"] == str(moved / "adapter")
    assert (
        infer.generate(model, PROMPTS[0], max_new_tokens=NEW).sequences.tolist() == greedy(target, 0).tolist()
    )
    # load_heads fills the hash from the adapter it holds, so a target loaded with the same weights from
    # another path passes and a target with other LoRA weights is refused.
    assert load_heads(str(moved), target).config.target_adapter_sha256 == adapter_info(target)["sha256"]
    other = load_target(base("llama"), adapter=adapter("llama", seed=1))
    with pytest.raises(ValueError, match="another adapter"):
        load_heads(str(moved), other)
    # An explicit adapter= wins over the recorded one (and is then checked against it).
    with pytest.raises(ValueError, match="another adapter"):
        infer.load(base("llama"), str(moved), adapter=adapter("llama", seed=1))
    shutil.rmtree(moved / "adapter")
    with pytest.raises(FileNotFoundError, match="'adapter' is not found in"):
        infer.load(base("llama"), str(moved))


def test_heads_and_target_must_agree_on_the_adapter(store, tmp_path):
    base, adapter = store
    plain = load_target(base("llama"))
    adapted = load_target(base("llama"), adapter=adapter("llama"), merge=True)
    with_adapter = MedusaHeads.for_target(adapted, num_heads=2)
    with_adapter.config.record_adapter(adapted)
    without = MedusaHeads.for_target(plain, num_heads=2)
    without.config.record_adapter(plain)
    assert without.config.target_adapter is None

    with pytest.raises(ValueError, match="with the PEFT adapter .* but the target has no adapter"):
        infer.SpecModel(plain, with_adapter)
    with pytest.raises(
        ValueError, match="carries the PEFT adapter .* trained on the plain '.*base-llama-32'"
    ):
        infer.SpecModel(adapted, without)
    other = load_target(base("llama"), adapter=adapter("llama", seed=1), merge=True)
    with pytest.raises(ValueError, match="another adapter"):
        infer.SpecModel(other, with_adapter)
    # The same adapter weights under another path are the same adapter.
    copy = shutil.copytree(adapter("llama"), tmp_path / "copy")
    infer.SpecModel(load_target(base("llama"), adapter=str(copy)), with_adapter)
    # Same through save/load: onto a plain target, and infer.load with no adapter recorded.
    save_heads(with_adapter, str(tmp_path / "a"))
    save_heads(without, str(tmp_path / "b"))
    with pytest.raises(ValueError, match="but the target has no adapter"):
        load_heads(str(tmp_path / "a"), plain)
    with pytest.raises(ValueError, match="trained on the plain"):
        infer.load(base("llama"), str(tmp_path / "b"), adapter=adapter("llama"))
    # Heads saved before adapters were recorded (no target_adapter keys) still load onto a plain target.
    cfg_path = tmp_path / "b" / "config.json"
    old = {k: v for k, v in json.loads(cfg_path.read_text()).items() if not k.startswith("target_adapter")}
    cfg_path.write_text(json.dumps(old))
    assert load_heads(str(tmp_path / "b"), plain).config.target_adapter is None


def test_user_built_peft_model_counts_as_adapted(store):
    """A ``PeftModel`` built outside `load_target` (as Medusa-2 training does) carries an adapter of unknown
    origin: heads that recorded an adapter accept it; heads trained on the plain target do not."""
    from peft import LoraConfig, get_peft_model

    base, _ = store
    peft_model = get_peft_model(load_target(base("llama")), LoraConfig(r=2, target_modules=["q_proj"]))
    assert adapter_info(peft_model) == {"name_or_path": None, "sha256": None, "merged": False}
    heads = MedusaHeads.for_target(peft_model, num_heads=2)
    with pytest.raises(ValueError, match="'a PeftModel' but these medusa heads were trained on the plain"):
        infer.SpecModel(peft_model, heads)
    heads.config.target_adapter = "adapter"
    infer.SpecModel(peft_model, heads)


# ------------------------------------------------------------------------------------------ bad input


def test_adapter_for_another_base_model(store):
    base, adapter = store
    with pytest.raises(
        ValueError, match="does not fit target .*base-llama-32.*another base model.*size mismatch"
    ):
        load_target(base("llama"), adapter=adapter("llama", hidden=64))


def test_lora_target_modules_missing_from_the_target(store, tmp_path):
    base, adapter = store
    # A GPT-2 adapter (c_attn) onto a Llama: names the wanted modules and some real ones.
    with pytest.raises(
        ValueError, match=r"wraps modules \['c_attn'\] that target .* does not have .*'q_proj'"
    ):
        load_target(base("llama"), adapter=adapter("gpt2"))
    # A hand-edited adapter config naming a module that no architecture has.
    bad = shutil.copytree(adapter("llama"), tmp_path / "bad")
    cfg = json.loads((bad / "adapter_config.json").read_text())
    cfg["target_modules"] = ["nope_proj"]
    (bad / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"wraps modules \['nope_proj'\].*'down_proj'"):
        load_target(base("llama"), adapter=str(bad))
    # Some modules exist: peft wraps those and would drop the other weights silently.
    cfg["target_modules"] = ["q_proj", "nope_proj"]
    (bad / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"wraps modules \['down_proj', 'v_proj'\] that target"):
        load_target(base("llama"), adapter=str(bad))


def test_missing_adapter_paths(store, tmp_path):
    base, _ = store
    with pytest.raises(FileNotFoundError, match="adapter directory not found: .*nowhere"):
        load_target(base("llama"), adapter=str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="adapter_config.json is missing"):
        load_target(base("llama"), adapter=str(tmp_path / "empty"))
    with pytest.raises(OSError, match="could not load the PEFT adapter config of 'org/no-such-lora'"):
        load_target(base("llama"), adapter="org/no-such-lora")  # tests run offline: nothing is fetched
    with pytest.raises(ValueError, match="merge=True needs an adapter"):
        load_target(base("llama"), merge=True)
    with pytest.raises(ValueError, match="apply when the target is a name or path"):
        infer.load(load_target(base("llama")), MedusaHeads.for_target(tiny_model("llama")), adapter="x/y")


def test_target_config_keys():
    from train.config import load_config

    cfg = load_config(
        None,
        [
            "target.name_or_path=org/model",
            "data.path=org/data",
            "target.adapter=org/lora",
            "target.merge=true",
            "target.adapter_revision=v1",
        ],
    )
    assert (cfg.target.adapter, cfg.target.merge, cfg.target.adapter_revision) == ("org/lora", True, "v1")
    with pytest.raises(ValueError, match="need target.adapter"):
        load_config(None, ["target.name_or_path=org/model", "data.path=org/data", "target.merge=true"])


# ------------------------------------------------------------------------------------------ training


def test_train_heads_on_adapted_target_records_the_adapter(request, tmp_path):
    from peft import LoraConfig, get_peft_model
    from test_train import _overrides
    from transformers import AutoModelForCausalLM

    from train import train_heads
    from train.config import load_config

    target_dir, data = request.getfixturevalue("tiny_target"), request.getfixturevalue("tiny_data")
    torch.manual_seed(3)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(AutoModelForCausalLM.from_pretrained(target_dir), lora).save_pretrained(tmp_path / "lora")

    out = str(tmp_path / "run")
    extra = {"target.adapter": str(tmp_path / "lora"), "train.max_steps": 4}
    try:
        run = train_heads.start(load_config(None, _overrides(target_dir, data, out, **extra)))
        assert adapter_info(run.target)["name_or_path"] == str(tmp_path / "lora")
        batch = next(iter(run.eval_dl))
        assert train_heads.target_forward(run, batch).logits.shape[1] == 1  # logits_to_keep got through
        train_heads.finish(run)
    finally:
        reset_accelerate()
    with open(os.path.join(out, "config.json")) as f:
        saved = json.load(f)
    assert saved["target_adapter"] == str(tmp_path / "lora") and len(saved["target_adapter_sha256"]) == 64
    model = infer.load(
        target_dir, out, adapter=str(tmp_path / "lora")
    )  # a local adapter: named by the caller
    assert adapter_info(model.target)["sha256"] == saved["target_adapter_sha256"]
    with pytest.raises(ValueError, match="but the target has no adapter"):
        load_heads(out, load_target(target_dir))
