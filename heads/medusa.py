"""Medusa heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple
Decoding Heads").

Head k (k = 0..K-1) reads the target's last post-norm hidden state h_t and predicts token t+2+k; the
target's own lm_head already predicts t+1. Each head is ``num_layers`` residual blocks
``h <- h + SiLU(W h + b)`` (separate modules, W and b zero-initialised so a fresh head equals the target's
next-token predictor) followed by logits from the target's frozen lm_head (``lm_head="target"``, the
cheap default) or from a trainable per-head copy of it (``lm_head="own"``).

Training loss (`medusa_loss`): the cross-entropy of head k against token t+2+k, masked to tokens whose
``loss_mask`` is 1 (assistant tokens), averaged per head over its valid positions, and summed over heads
with weight ``decay**k``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from heads.base import HeadConfig
from heads.hub import HubMixin
from heads.registry import HeadType, LossInputs, Objective, register

IGNORE = -100  # label of a position that is not scored


@dataclass
class MedusaConfig(HeadConfig):
    head_type: ClassVar[str] = "medusa"
    num_heads: int = 4
    num_layers: int = 1
    lm_head: Literal["target", "own"] = "target"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_heads < 1:
            raise ValueError(f"num_heads must be >= 1, got {self.num_heads}")
        if self.num_layers < 0:
            raise ValueError(f"num_layers must be >= 0, got {self.num_layers}")
        if self.lm_head not in ("target", "own"):
            raise ValueError(
                f"lm_head must be 'target' (reuse the frozen target lm_head) or 'own', got {self.lm_head!r}"
            )


class ResBlock(nn.Module):
    """h + SiLU(W h + b), with W = 0 and b = 0 at init so the block starts as the identity."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)  # SiLU(0) = 0; a default-initialised bias would shift h

    def forward(self, h: Tensor) -> Tensor:
        return h + nn.functional.silu(self.linear(h))


class MedusaHeads(HubMixin, nn.Module):
    """K Medusa heads. ``forward(hidden, lm_head) -> logits [K, *hidden.shape[:-1], V]``."""

    def __init__(self, config: MedusaConfig) -> None:
        super().__init__()
        if config.hidden_size <= 0 or config.vocab_size <= 0:
            raise ValueError(
                "MedusaConfig needs the target's hidden_size and vocab_size (use MedusaHeads.for_target)"
            )
        self.config = config
        H, V = config.hidden_size, config.vocab_size
        # One ModuleList per head: Medusa's `[ResBlock(h)] * L` shared a single module across layers.
        self.blocks = nn.ModuleList(
            nn.Sequential(*(ResBlock(H) for _ in range(config.num_layers))) for _ in range(config.num_heads)
        )
        self.lm_heads = (
            nn.ModuleList(nn.Linear(H, V, bias=False) for _ in range(config.num_heads))
            if config.lm_head == "own"
            else None
        )

    @classmethod
    def for_target(cls, target: nn.Module, **kwargs) -> MedusaHeads:
        """Fresh heads sized for ``target`` (own lm_heads start as copies of the target's), in its dtype/device."""
        from heads.graft import target_dims

        vocab, hidden = target_dims(target)
        name = getattr(target.config, "_name_or_path", None) or None
        heads = cls(
            MedusaConfig(hidden_size=hidden, vocab_size=vocab, base_model_name_or_path=name, **kwargs)
        )
        p = target.get_output_embeddings().weight
        if heads.lm_heads is not None:
            with torch.no_grad():
                for head in heads.lm_heads:
                    head.weight.copy_(p.float())
        return heads.to(device=p.device, dtype=p.dtype)

    def features(self, hidden: Tensor) -> Tensor:
        """hidden: [..., H] -> [K, ..., H], each head's transformed state before its lm_head."""
        return torch.stack([blk(hidden) for blk in self.blocks])

    def forward(self, hidden: Tensor, lm_head: nn.Module | None = None) -> Tensor:
        """hidden: [..., H] (target's last post-norm state) -> logits [K, ..., V]."""
        feats = self.features(hidden)
        if self.lm_heads is not None:
            return torch.stack([head(f) for head, f in zip(self.lm_heads, feats, strict=True)])
        if lm_head is None:
            raise ValueError(
                "these Medusa heads reuse the target's lm_head; pass lm_head=target.get_output_embeddings()"
            )
        return lm_head(feats.to(lm_head.weight.dtype))


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
    return medusa_loss(logits, batch["input_ids"], batch["loss_mask"], inputs.decay)


register(
    HeadType(
        name="medusa",
        config=MedusaConfig,
        module=MedusaHeads,
        objective=Objective(
            position_name="head",
            positions=lambda cfg: cfg.num_heads,
            weights=lambda cfg, decay: [decay**k for k in range(cfg.num_heads)],
            target_kwargs=lambda cfg: {},
            loss=_objective_loss,
            top1_vs="data",  # the heads learn the data's tokens (their loss reads input_ids as labels only)
        ),
        proposer="static_tree",
        tree="static",
        joint_training=True,  # Medusa-2 (`train.medusa2`)
    )
)
