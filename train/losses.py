"""Training metrics shared by every head type, and Medusa-2's backbone terms.

Each head type's own loss lives with the head (`heads.registry.Objective`, e.g. `heads.medusa.medusa_loss`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from heads.medusa import IGNORE


def simulated_accept_length(top1: Tensor) -> Tensor:
    """τ of a chain draft from per-position top-1 accuracies: ``1 + Σ_k Π_{j<=k} top1_j``.

    top1: [K], position k's top-1 accuracy (Medusa head k, EAGLE TTT step k). The product treats the
    positions' hits as independent, so this estimates the acceptance length of a greedy chain of K
    drafts, counting the bonus token (τ = tokens per target forward, docs/design.md §7).
    """
    return 1 + torch.cumprod(top1.double(), 0).sum()


# ---------------------------------------------------------------------------------------------- Medusa-2


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
