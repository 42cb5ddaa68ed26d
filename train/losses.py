"""Training losses for the draft heads.

Medusa (Cai et al. 2024): head k (k = 0..K-1) reads the target's hidden state at position t and
predicts token t+2+k (the target's own lm_head predicts t+1). The loss is the cross-entropy of each
head against that token, masked to tokens whose ``loss_mask`` is 1 (assistant tokens), averaged per
head over its valid positions, and summed over heads with weight ``decay**k``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE = -100


def medusa_labels(input_ids: Tensor, loss_mask: Tensor, num_heads: int) -> Tensor:
    """[B, T] ids and loss mask -> [K, B, T] labels: ``labels[k, b, t] = input_ids[b, t+2+k]`` where
    ``t+2+k < T`` and ``loss_mask[b, t+2+k] == 1``, else ``IGNORE`` (-100)."""
    B, T = input_ids.shape
    labels = input_ids.new_full((num_heads, B, T), IGNORE)
    for k in range(num_heads):
        s = k + 2
        if T > s:
            labels[k, :, : T - s] = input_ids[:, s:].masked_fill(loss_mask[:, s:] == 0, IGNORE)
    return labels


def medusa_stats(
    head_logits: Tensor, input_ids: Tensor, loss_mask: Tensor, topk: int = 5
) -> dict[str, Tensor]:
    """Per-head, per-sequence sums: the building block of `medusa_loss` and of exact evaluation.

    head_logits: [K, B, T, V]; head k at position t scores token t+2+k.
    input_ids:   [B, T] token ids (the labels are the same ids, shifted).
    loss_mask:   [B, T] 1 where the token is a training target; 0 for prompt tokens and padding.

    Head k at position t (t = 0..T-3-k) is scored against ``input_ids[:, t+2+k]`` where
    ``loss_mask[:, t+2+k] == 1``; positions whose target would fall past T are not scored.

    Returns float tensors of shape [K, B]:
      ``loss_sum`` (sum of CE, with gradient), ``top1``/``topk`` (number of positions where the label is
      the argmax / in the top ``topk``) and ``count`` (number of scored positions).
    """
    K, B, T, V = head_logits.shape
    assert input_ids.shape == (B, T) and loss_mask.shape == (B, T), (
        head_logits.shape,
        input_ids.shape,
        loss_mask.shape,
    )
    labels = medusa_labels(input_ids, loss_mask, K)  # [K, B, T], IGNORE where not scored
    valid = labels != IGNORE
    # One cross-entropy over every (head, sequence, position) in the logits' own dtype, with the labels
    # shifted instead of the logits sliced: slicing and upcasting [K, B, T, V] logits per head costs more
    # than the lm_head matmul on CPU (zero-filled gradients of full size per head). The softmax still
    # accumulates in fp32 inside the kernel.
    ce = F.cross_entropy(
        head_logits.reshape(-1, V), labels.reshape(-1), ignore_index=IGNORE, reduction="none"
    )
    ce = ce.view(K, B, T).float()  # 0 where not scored
    with torch.no_grad():
        top = head_logits.topk(min(topk, V), dim=-1).indices  # [K, B, T, k]
        hit1 = (top[..., 0] == labels) & valid
        hitk = (top == labels[..., None]).any(-1) & valid
    return {
        "loss_sum": ce.sum(-1),
        "top1": hit1.sum(-1).float(),
        "topk": hitk.sum(-1).float(),
        "count": valid.sum(-1).float(),
    }


def medusa_loss(
    head_logits: Tensor, input_ids: Tensor, loss_mask: Tensor, decay: float = 0.8
) -> tuple[Tensor, dict[str, Tensor]]:
    """Medusa training loss.

    head_logits: [K, B, T, V] from `heads.medusa.MedusaHeads` (head k at t predicts token t+2+k).
    input_ids:   [B, T]; loss_mask: [B, T] (1 = the token at that position is a training target).

    loss = sum_k decay**k * CE_k, where CE_k is head k's cross-entropy averaged over the positions t
    with ``loss_mask[t+2+k] == 1`` and ``t+2+k < T`` (0 if there is none). Returns ``(loss, metrics)``;
    ``metrics`` holds detached float tensors of shape [K]: ``loss`` (CE_k), ``top1`` and ``top5``
    (accuracy over the scored positions) and ``count`` (number of scored positions), so they can be
    all-reduced (weight by ``count`` to combine batches or processes).
    """
    stats = medusa_stats(head_logits, input_ids, loss_mask, topk=5)
    count = stats["count"].sum(-1)  # [K]
    denom = count.clamp(min=1)
    per_head = stats["loss_sum"].sum(-1) / denom  # [K]
    K = head_logits.shape[0]
    weights = torch.tensor([decay**k for k in range(K)], dtype=per_head.dtype, device=per_head.device)
    loss = (weights * per_head).sum()
    metrics = {
        "loss": per_head.detach(),
        "top1": stats["top1"].sum(-1) / denom,
        "top5": stats["topk"].sum(-1) / denom,
        "count": count,
    }
    return loss, metrics


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
