"""Medusa-2 joint training (``joint.enabled``): LoRA on the backbone through peft plus the Medusa heads.

Covers the loss (backbone term + heads_coef(step) · heads term, the schedules, self-distillation KL),
that only the LoRA weights and the heads train, the saved layout (heads + ``adapter/`` PEFT files, never
the backbone, in checkpoints too), greedy identity of `infer.load(base, heads=out)` against the adapted
model's own ``generate``, resume after a kill, clear errors, and (slow) 2-process DeepSpeed ZeRO-2.

Reuses the tiny random Llama + BPE tokenizer and the cyclic-words data of `tests/test_train.py`.
"""

from __future__ import annotations

import json
import math
import os
import types

import pytest
import test_train
import torch
import torch.nn.functional as F
from conftest import reset_accelerate
from test_train import (
    _kill_after_checkpoint,
    _metrics,
    _overrides,
    launch_zero2_two_processes,
)

from heads.medusa import medusa_loss
from train.config import JointConfig, load_config
from train.medusa2 import backbone_stats, medusa2_loss

tiny_target, tiny_data = test_train.tiny_target, test_train.tiny_data
_fresh_accelerate_state = test_train._fresh_accelerate_state

LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")


def _joint_overrides(target: str, data: str, out: str, **extra) -> list[str]:
    base = {
        "joint.enabled": "true",
        "joint.self_distill": "true",
        "joint.lora_r": 4,
        "joint.target_modules": "[" + ",".join(LORA_MODULES) + "]",
        "joint.heads_coef": 0.2,
        "joint.head_lr_multiplier": 4,
        "train.lr": 1e-2,
        "train.max_steps": 8,
    }
    return _overrides(target, data, out, **(base | extra))


# ---------------------------------------------------------------------------------------------- loss


@pytest.mark.parametrize(
    "schedule, expected",
    [
        ("constant", [1.0, 1.0, 0.2, 0.2, 0.2, 0.2, 0.2]),
        ("linear", [1.0, 1.0, 0.0, 0.05, 0.1, 0.2, 0.2]),
        ("sine", [1.0, 1.0, 0.0, 0.2 * math.sin(math.pi / 8), 0.2 * math.sin(math.pi / 4), 0.2, 0.2]),
    ],
)
def test_heads_coef_schedule(schedule, expected):
    # Steps 0-1: heads-only stage (the heads' loss alone, coefficient 1); then a 4-step warm-up to 0.2.
    jc = JointConfig(
        heads_coef=0.2, heads_coef_schedule=schedule, heads_coef_warmup_steps=4, heads_only_steps=2
    )
    got = [jc.heads_coef_at(s) for s in (0, 1, 2, 3, 4, 6, 100)]
    assert got == pytest.approx(expected)


def test_backbone_terms_and_composition():
    torch.manual_seed(0)
    B, T, V = 2, 6, 11
    logits = torch.randn(B, T, V, requires_grad=True)
    teacher = torch.randn(B, T, V)
    ids = torch.randint(0, V, (B, T))
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1]])  # row 0: tokens 2-4 are targets
    st = backbone_stats(logits, ids, mask, teacher)
    # Position t scores token t+1 where mask[t+1] == 1: row 0 -> t=1,2,3; row 1 -> t=0..4.
    assert st["count"].item() == 8
    pos = [(0, 1), (0, 2), (0, 3)] + [(1, t) for t in range(5)]
    ce = sum(F.cross_entropy(logits[b, t], ids[b, t + 1]) for b, t in pos)
    kl = sum(
        (
            F.softmax(teacher[b, t], -1)
            * (F.log_softmax(teacher[b, t], -1) - F.log_softmax(logits[b, t], -1))
        ).sum()
        for b, t in pos
    )  # KL(p_teacher || p_student), teacher first
    torch.testing.assert_close(st["ce_sum"], ce)
    torch.testing.assert_close(st["kl_sum"], kl)
    assert backbone_stats(teacher, ids, mask, teacher)["kl_sum"].abs().item() < 1e-5  # KL(p ‖ p) = 0
    # The joint loss: backbone term + heads_coef · Σ_k decay**k · CE_k; the heads-only stage is the heads' alone.
    head_logits = torch.randn(3, B, T, V)
    heads_loss, _ = medusa_loss(head_logits, ids, mask, decay=0.8)
    bb = st["kl_sum"] / st["count"]
    torch.testing.assert_close(medusa2_loss(bb, heads_loss, 0.2), bb + 0.2 * heads_loss)
    assert medusa2_loss(None, heads_loss, 1.0) is heads_loss
    with pytest.raises(ValueError, match="heads_coef must be >= 0"):
        medusa2_loss(bb, heads_loss, -0.1)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["joint.enabled=true", "joint.heads_coef=-0.5"], "joint.heads_coef must be >= 0, got -0.5"),
        (["joint.self_distill=true"], "joint.self_distill needs LoRA on the backbone (joint.enabled: true)"),
        (["joint.enabled=true", "heads.type=eagle"], "needs heads.type: medusa"),
        (
            ["joint.enabled=true", "joint.heads_coef_schedule=cosine"],
            "joint.heads_coef_schedule must be one of",
        ),
        (["joint.enabled=true", "joint.target_modules=[]"], "joint.target_modules is empty"),
        (["joint.enabled=true", "joint.head_lr_multiplier=0"], "joint.head_lr_multiplier must be > 0"),
        (["joint.enabled=true", "joint.lora_r=0"], "joint.lora_r must be >= 1"),
    ],
)
def test_config_errors(overrides, message):
    with pytest.raises(ValueError) as e:
        load_config(None, ["target.name_or_path=org/model", "data.path=org/data", *overrides])
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_refuses_zero3_and_an_adapted_target():
    from train.medusa2 import check_joint

    cfg = load_config(None, ["target.name_or_path=org/model", "data.path=org/data", "joint.enabled=true"])
    with pytest.raises(ValueError, match="not supported under DeepSpeed ZeRO-3"):
        check_joint(cfg, types.SimpleNamespace(zero_stage=3))
    check_joint(cfg, types.SimpleNamespace(zero_stage=2))
    cfg.target.adapter = "some/adapter"
    with pytest.raises(ValueError, match="target.adapter is 'some/adapter'"):
        check_joint(cfg, None)


def test_missing_lora_modules_are_a_one_line_error(tiny_target, tiny_data, tmp_path):
    from train import train_heads

    bad = _joint_overrides(
        tiny_target, tiny_data, str(tmp_path / "run"), **{"joint.target_modules": "[q_proj,qkv]"}
    )
    with pytest.raises(SystemExit) as e:
        train_heads.main(bad)
    text = str(e.value.code)
    assert (
        "joint.target_modules ['qkv'] match no module" in text and "'gate_proj'" in text and "\n" not in text
    )


# ---------------------------------------------------------------------------------------------- the model


def test_only_lora_and_heads_train_and_init_matches_the_original(tiny_target, tiny_data, tmp_path):
    """LoRA B = 0 at init: the adapted model is the original (KL 0); without self-distillation the backbone
    term is the plain next-token CE of the target; a backward reaches LoRA and heads only."""
    from heads.graft import load_target
    from train import train_heads

    run = train_heads.setup(load_config(None, _joint_overrides(tiny_target, tiny_data, str(tmp_path / "a"))))
    model = run.accelerator.unwrap_model(run.heads)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    lora = {n for n in trainable if ".lora_" in n}
    assert len(lora) == 2 * len(LORA_MODULES) * 2  # A and B, 4 modules, 2 layers
    assert trainable == lora | {f"heads.{n}" for n, _ in model.heads.named_parameters()}
    frozen = [p for n, p in model.backbone.named_parameters() if ".lora_" not in n]
    assert len(frozen) == len(list(load_target(tiny_target).parameters()))  # every base weight, frozen
    assert not any(p.requires_grad for p in frozen)
    groups = (
        run.optimizer.optimizer.param_groups
        if hasattr(run.optimizer, "optimizer")
        else run.optimizer.param_groups
    )
    assert [g["initial_lr"] for g in groups] == pytest.approx([1e-2, 4e-2])  # heads: lr x head_lr_multiplier

    batch = next(iter(run.eval_dl))
    with torch.no_grad():
        _, m = train_heads.joint_batch_loss(run, batch)
    assert m["backbone_count"] > 0 and abs(m["backbone_kl_sum"].item()) < 1e-5 * m["backbone_count"].item()
    # The backbone CE equals the target's own next-token CE on the scored positions.
    target = load_target(tiny_target)
    with torch.no_grad():
        ref = target(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    want = backbone_stats(ref, batch["input_ids"], batch["loss_mask"])["ce_sum"]
    torch.testing.assert_close(m["backbone_ce_sum"], want, rtol=1e-5, atol=1e-4)

    run.cfg.joint.self_distill = False  # the backbone term is then that CE, with gradient
    loss, _ = train_heads.joint_batch_loss(run, batch)
    loss.backward()
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    assert with_grad == trainable
    assert all(model.get_parameter(n).grad.abs().sum() > 0 for n in with_grad if "lora_B" in n)


def _greedy_matches_adapted_model(out: str, target_path: str) -> None:
    """infer.load(base, heads=out) picks up out/adapter; its greedy output equals the adapted model's own
    generate (a PeftModel loaded independently), which differs from the base model's logits."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    import infer

    model = infer.load(target_path, heads=out)
    base = AutoModelForCausalLM.from_pretrained(target_path)
    adapted = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(target_path), os.path.join(out, "adapter")
    )
    ids = torch.randint(3, 300, (1, 6), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert not torch.allclose(adapted(ids).logits, base(ids).logits, atol=1e-4)  # the LoRA changed it
    got = infer.generate(model, ids, max_new_tokens=16, do_sample=False)
    want = adapted.generate(ids, max_new_tokens=16, do_sample=False)
    assert torch.equal(got.sequences, want)


def test_joint_run_saves_heads_and_adapter_and_decodes_like_the_adapted_model(
    tiny_target, tiny_data, tmp_path
):
    from safetensors.torch import load_file

    from train import train_heads

    out = str(tmp_path / "run")
    ev = train_heads.main(_joint_overrides(tiny_target, tiny_data, out, **{"train.save_every": 4}))
    assert {"config.json", "model.safetensors", "adapter", "eval_results.json"} <= set(os.listdir(out))
    assert "best" not in os.listdir(out)
    assert sorted(f for f in os.listdir(os.path.join(out, "adapter")) if not f.endswith(".md")) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    adapter = load_file(os.path.join(out, "adapter", "adapter_model.safetensors"))
    assert adapter and all("lora_" in k for k in adapter)  # only LoRA tensors, no base weight
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["target_adapter"] == "adapter"
    # Checkpoints hold the trainable tensors only (LoRA + heads), not the frozen backbone.
    ckpt = load_file(os.path.join(out, "checkpoints", "step-8", "model.safetensors"))
    assert ckpt and all(".lora_" in k or k.startswith("heads.") for k in ckpt)
    # The held-out KL of the adapted model to the original is reported, and is small but not 0.
    assert 0 < ev["backbone_kl"] < 0.5 and ev["backbone_ce"] > 0
    assert any("eval/backbone_kl" in r for r in _metrics(out))
    _greedy_matches_adapted_model(out, tiny_target)


def test_joint_resume_after_kill_matches_uninterrupted_run(tiny_target, tiny_data, tmp_path, monkeypatch):
    """Two stages (1 heads-only step, then joint with a linear heads_coef warm-up): kill after the step-2
    checkpoint, resume, and end with the same heads and the same LoRA adapter as an uninterrupted run."""
    from safetensors.torch import load_file

    from train import train_heads

    common = {"train.max_steps": 4, "train.save_every": 2, "train.eval_every": 2, "train.log_every": 1,
              "joint.heads_only_steps": 1, "joint.heads_coef_schedule": "linear",
              "joint.heads_coef_warmup_steps": 2}  # fmt: skip
    full, killed = str(tmp_path / "full"), str(tmp_path / "killed")
    train_heads.main(_joint_overrides(tiny_target, tiny_data, full, **common))
    reset_accelerate()
    _kill_after_checkpoint(monkeypatch, train_heads, at_step=2)
    with pytest.raises(KeyboardInterrupt):
        train_heads.main(_joint_overrides(tiny_target, tiny_data, killed, **common))
    monkeypatch.undo()
    reset_accelerate()
    train_heads.main(["--resume", *_joint_overrides(tiny_target, tiny_data, killed, **common)])
    assert [r["step"] for r in _metrics(killed) if "train/loss" in r] == [1, 2, 3, 4]
    for name in ("model.safetensors", "adapter/adapter_model.safetensors"):
        a, b = load_file(os.path.join(full, name)), load_file(os.path.join(killed, name))
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    lora_b = [
        v
        for k, v in load_file(os.path.join(full, "adapter/adapter_model.safetensors")).items()
        if "lora_B" in k
    ]
    assert any(v.abs().sum() > 0 for v in lora_b)  # the joint stage trained the adapter


# ---------------------------------------------------------------------------------------------- multi-process


@pytest.mark.slow
def test_joint_deepspeed_zero2_two_processes(tiny_target, tiny_data, tmp_path):
    """Medusa-2 under `accelerate launch` with DeepSpeed ZeRO-2, 2 CPU processes, bf16: it trains, saves
    heads + adapter (checkpoints without the frozen backbone), and the result decodes like the adapted model."""
    out = str(tmp_path / "run")
    overrides = _joint_overrides(tiny_target, tiny_data, out, **{"train.max_steps": 4, "train.save_every": 2,
                                                                 "train.mixed_precision": "bf16"})  # fmt: skip
    proc = launch_zero2_two_processes(overrides, port=29537)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    assert "2 process(es)" in log and "DeepSpeed ZeRO-2" in log and "Medusa-2" in log, log[-3000:]
    step = os.path.join(out, "checkpoints", "step-4", "pytorch_model")
    states = [f for f in os.listdir(step) if f.endswith("model_states.pt")]
    assert states
    module = torch.load(os.path.join(step, states[0]), weights_only=False, map_location="cpu")["module"]
    assert module and all(".lora_" in k or k.startswith("heads.") for k in module)  # no frozen weights
    assert os.path.isfile(os.path.join(out, "adapter", "adapter_model.safetensors"))
    with open(os.path.join(out, "eval_results.json")) as f:
        assert json.load(f)["backbone_kl"] > 0
    _greedy_matches_adapted_model(out, tiny_target)
