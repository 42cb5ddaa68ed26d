"""Medusa-2 joint training (``joint.enabled``, Cai et al. 2024 §2.3): LoRA on the backbone plus the heads.

The LoRA-adapted backbone (peft) and the Medusa heads are prepared as one module (`JointModel`) so that
accelerate/DeepSpeed clip, step and checkpoint both; the base weights stay frozen. The outputs are the
heads (with ``target_adapter: adapter``) and ``adapter/`` (PEFT files, `save_adapter`). Checkpoints hold
only the trainable tensors (`drop_frozen_weights`, `checkpoint_kwargs`).

The loss (`joint_batch_loss`) is L_backbone + heads_coef(step) · Σ_k decay**k · L_k: `backbone_stats`
gives the backbone's own next-token terms, `medusa2_loss` combines them with the heads' `medusa_loss`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from heads.graft import run_target
from heads.io import atomic_dir
from heads.medusa import IGNORE, medusa_loss
from train.config import RunConfig
from train.run import DIR_MODE, Run, deepspeed_plugin


class JointModel(nn.Module):
    """The LoRA-adapted backbone (a peft ``PeftModel``) and the Medusa heads as one trainable module.

    ``config`` is the heads' config, so code that reads ``unwrap_model(run.heads).config`` works as for
    heads alone.
    """

    def __init__(self, backbone: nn.Module, heads: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.heads = heads

    @property
    def config(self):
        return self.heads.config

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, *, teacher: bool = False, backbone_grad: bool = True
    ) -> dict[str, Tensor | None]:
        """input_ids, attention_mask: [B, T] -> ``logits`` [B, T, V] of the adapted backbone (only the last
        position's without ``backbone_grad``, the heads-only stage), ``head_logits`` [K, B, T, V] read off its
        last post-norm state, and with ``teacher`` the original model's ``teacher_logits`` [B, T, V]
        (the same backbone under ``disable_adapter()``, no grad), else None."""
        teacher_logits = None
        if teacher:
            with torch.no_grad(), self.backbone.disable_adapter():
                teacher_logits = run_target(self.backbone, input_ids, attention_mask, use_cache=False).logits
        kwargs = {} if backbone_grad else {"logits_to_keep": 1}
        with torch.set_grad_enabled(backbone_grad and torch.is_grad_enabled()):
            out = run_target(self.backbone, input_ids, attention_mask, use_cache=False, **kwargs)
        dtype = next(self.heads.parameters()).dtype
        head_logits = self.heads(out.hidden.to(dtype), self.backbone.get_output_embeddings())
        return {"logits": out.logits, "head_logits": head_logits, "teacher_logits": teacher_logits}


def add_lora(target: nn.Module, cfg: Any, name: str = "target") -> nn.Module:
    """``peft.get_peft_model(target, LoraConfig(...))`` from the ``joint`` config, after checking that every
    ``target_modules`` entry names a module of ``target`` (peft skips missing ones when others match).
    LoRA weights are kept in fp32 on a bf16/fp16 backbone (peft's ``autocast_adapter_dtype``); only they
    are trainable, B = 0 at init so the adapted model starts equal to the original."""
    from peft import LoraConfig, get_peft_model  # heavy, and only Medusa-2 runs need it

    names = [n for n, _ in target.named_modules() if n]
    missing = [t for t in cfg.target_modules if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in target.named_modules() if isinstance(m, nn.Linear)})
        raise ValueError(
            f"joint.target_modules {missing} match no module of {name!r}; its linear layers are named "
            f"{linear[:12]}"
        )
    lora = LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(target, lora)


def check_joint(cfg: RunConfig, plugin) -> None:
    """Refuse the joint setups this trainer does not support, before anything is loaded."""
    if plugin is not None and plugin.zero_stage == 3:
        raise ValueError(
            "joint training (joint.enabled) is not supported under DeepSpeed ZeRO-3 (untested: the LoRA "
            "backbone would be partitioned and its adapter would have to be gathered to save); use ZeRO-2"
        )
    if getattr(cfg.target, "adapter", None):
        raise ValueError(
            f"joint training adds its own LoRA adapter, but target.adapter is {cfg.target.adapter!r}: "
            "merge that adapter into a model directory first (peft merge_and_unload), or train heads for "
            "it with joint.enabled: false"
        )


# ---------------------------------------------------------------------------------------------- loss


def backbone_stats(
    logits: Tensor, input_ids: Tensor, loss_mask: Tensor, teacher_logits: Tensor | None = None
):
    """The backbone's own next-token terms of Medusa-2 joint training, as sums over scored positions.

    logits:         [B, T, V] of the LoRA-adapted backbone; position t scores token t+1.
    input_ids:      [B, T]; loss_mask: [B, T] (1 = the token at that position is a training target).
    teacher_logits: [B, T, V] of the same backbone with its adapter disabled (the original target), or None.

    Position t (t = 0..T-2) is scored iff ``loss_mask[:, t+1] == 1`` (the positions the target's own
    lm_head answers for in the training data, i.e. where the heads are also trained). Returns 0-dim fp32
    tensors: ``ce_sum`` (Σ -log p_adapted(x_{t+1}), with gradient), ``count`` (scored positions) and, with
    ``teacher_logits``, ``kl_sum`` (with gradient) = Σ_t KL(p_original,t ‖ p_adapted,t)
    = Σ_t Σ_v p_o(v) (log p_o(v) - log p_a(v)).

    The KL is the forward one, teacher first (as Medusa-2's self-distillation, Cai et al. 2024 §2.3.2):
    it is the soft-label cross-entropy to the original distribution minus that distribution's entropy, so
    it is finite wherever p_original has mass and penalises the adapted model most for dropping tokens
    the original would produce — what must be preserved for the adapted model to stay a faithful
    stand-in for sampling from the original; the reverse KL would let it collapse onto one mode.
    """
    B, T, V = logits.shape
    assert input_ids.shape == (B, T) and loss_mask.shape == (B, T), (logits.shape, input_ids.shape)
    valid = loss_mask[:, 1:] != 0  # [B, T-1]
    labels = input_ids[:, 1:].masked_fill(~valid, IGNORE)
    ce = F.cross_entropy(
        logits[:, :-1].reshape(-1, V), labels.reshape(-1), ignore_index=IGNORE, reduction="sum"
    )
    out = {"ce_sum": ce.float(), "count": valid.sum().float()}
    if teacher_logits is not None:
        assert teacher_logits.shape == logits.shape, (teacher_logits.shape, logits.shape)
        # Only the scored rows: selecting first avoids [B, T, V] fp32 copies of unscored positions.
        log_p_a = F.log_softmax(logits[:, :-1][valid].float(), dim=-1)  # [N, V]
        log_p_o = F.log_softmax(teacher_logits[:, :-1][valid].float(), dim=-1)
        kl = F.kl_div(log_p_a, log_p_o, log_target=True, reduction="none").sum(-1)  # [N]
        out["kl_sum"] = kl.sum()
    return out


def medusa2_loss(backbone_loss: Tensor | None, heads_loss: Tensor, heads_coef: float) -> Tensor:
    """Medusa-2's joint objective (Cai et al. 2024 §2.3): ``L_backbone + heads_coef · L_heads``.

    backbone_loss: 0-dim, the adapted backbone's mean next-token term per scored position (KL to the
    original with self-distillation, else CE), or None in the heads-only stage.
    heads_loss: 0-dim, `medusa_loss` = Σ_k decay**k · CE_k.
    """
    if heads_coef < 0:
        raise ValueError(f"heads_coef must be >= 0, got {heads_coef}")
    if backbone_loss is None:
        return heads_loss
    return backbone_loss + heads_coef * heads_loss


def joint_batch_loss(run: Run, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
    """`train.objective.batch_loss` for Medusa-2: L_backbone + heads_coef(step) · Σ_k decay**k · L_k.

    The first ``joint.heads_only_steps`` steps train the heads alone. Under ``torch.no_grad()`` (eval) the
    original model always runs too, and the metrics carry the backbone's sums (``backbone_count``,
    ``backbone_ce_sum``, ``backbone_kl_sum``) for the held-out KL(p_original ‖ p_adapted) per token.
    """
    jc = run.cfg.joint
    ids, am, lm = batch["input_ids"], batch["attention_mask"], batch["loss_mask"]
    training = torch.is_grad_enabled()
    heads_only = training and run.step < jc.heads_only_steps
    teacher = not training or (jc.self_distill and not heads_only)
    out = run.heads(ids, am, teacher=teacher, backbone_grad=not heads_only)
    heads_loss, m = medusa_loss(out["head_logits"], ids, lm, run.head_config.decay)
    if heads_only:
        return medusa2_loss(None, heads_loss, 1.0), m
    bb = backbone_stats(out["logits"], ids, lm, out["teacher_logits"])
    term = bb["kl_sum"] if jc.self_distill else bb["ce_sum"]
    loss = medusa2_loss(term / bb["count"].clamp(min=1), heads_loss, jc.heads_coef_at(run.step))
    if not training:
        m = m | {f"backbone_{k}": v.detach() for k, v in bb.items()}
    return loss, m


# ---------------------------------------------------------------------------------------------- saving


def save_adapter(run: Run, directory: str) -> None:
    """Main process: the LoRA adapter's standard PEFT files (``adapter_config.json`` +
    ``adapter_model.safetensors``, no base weights) into ``directory``, written beside it and renamed."""
    backbone = run.accelerator.unwrap_model(run.heads).backbone
    with atomic_dir(directory, mode=DIR_MODE) as tmp:
        backbone.save_pretrained(tmp)


def drop_frozen_weights(models, weights, output_dir) -> None:
    """accelerate save_state pre-hook (no DeepSpeed): checkpoint only the trainable tensors (LoRA +
    heads), never the frozen backbone; `train.state.load_checkpoint` loads them with strict=False."""
    for i, model in enumerate(models):
        keep = {n for n, p in model.named_parameters() if p.requires_grad}
        weights[i] = {k: v for k, v in weights[i].items() if k in keep}


def checkpoint_kwargs(run: Run, load: bool) -> dict[str, Any]:
    """Extra save_state/load_state arguments: joint checkpoints hold the trainable weights only."""
    if not run.cfg.joint.enabled:
        return {}
    if deepspeed_plugin(run.accelerator) is not None:
        return {"load_module_strict": False} if load else {"exclude_frozen_parameters": True}
    return {"strict": False} if load else {}
