"""The Medusa training loss (Cai et al. 2024, §2.1): head k's cross-entropy against token t+2+k,
weighted by ``decay**k``, from one frozen-target forward."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from heads.registry import LossInputs, Objective

IGNORE = -100  # label of a position that is not scored


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


def _objective_loss(heads: nn.Module, out: Any, batch: dict[str, Tensor], inputs: LossInputs):
    """`Objective.loss` for Medusa: the heads over the target's last post-norm states -> `medusa_loss`."""
    dtype = next(heads.parameters()).dtype
    logits = heads(out.hidden.to(dtype), inputs.lm_head)  # [K, B, T, V]
    return medusa_loss(
        logits, batch["input_ids"], batch["loss_mask"], getattr(heads, "module", heads).config.decay
    )


OBJECTIVE = Objective(
    position_name="head",
    positions=lambda cfg: cfg.num_heads,
    weights=lambda cfg: [cfg.decay**k for k in range(cfg.num_heads)],
    target_kwargs=lambda cfg: {},
    loss=_objective_loss,
    top1_vs="data",  # the heads learn the data's tokens (their loss reads input_ids as labels only)
)
