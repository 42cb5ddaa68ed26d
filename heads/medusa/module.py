"""`MedusaHeads`: K stacks of residual blocks over the target's last hidden state (see `heads.medusa`)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from heads.graft import target_dims
from heads.hub import HubMixin
from heads.medusa.config import MedusaConfig


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

    def features(self, hidden: Tensor, num_heads: int | None = None) -> Tensor:
        """hidden: [..., H] -> [K, ..., H], each head's transformed state before its lm_head (the first
        ``num_heads`` heads only, when given)."""
        return torch.stack([blk(hidden) for blk in self.blocks[:num_heads]])

    def forward(
        self, hidden: Tensor, lm_head: nn.Module | None = None, num_heads: int | None = None
    ) -> Tensor:
        """hidden: [..., H] (target's last post-norm state) -> logits [K, ..., V] (K = ``num_heads`` when
        given: the first heads only, as a draft of that depth needs)."""
        feats = self.features(hidden, num_heads)
        if self.lm_heads is not None:
            return torch.stack([head(f) for head, f in zip(self.lm_heads[:num_heads], feats, strict=True)])
        if lm_head is None:
            raise ValueError(
                "these Medusa heads reuse the target's lm_head; pass lm_head=target.get_output_embeddings()"
            )
        return lm_head(feats.to(lm_head.weight.dtype))
