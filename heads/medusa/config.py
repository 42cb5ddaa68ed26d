"""The Medusa head config (what ``config.json`` holds besides `heads.base.HeadConfig`'s fields) and its
block of a training recipe (``heads.medusa``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from heads.base import HeadConfig


@dataclass
class MedusaConfig(HeadConfig):
    """Medusa heads: ``num_heads`` heads, head k predicting token t+2+k from the target's last hidden state
    through ``num_layers`` residual blocks; ``lm_head``: ``"target"`` (the frozen target lm_head) or
    ``"own"`` (a trainable copy per head). ``decay``: training weighs head k's loss by decay**k."""

    head_type: ClassVar[str] = "medusa"
    num_heads: int = 4
    num_layers: int = 1
    lm_head: Literal["target", "own"] = "target"
    decay: float = 0.8

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
        if isinstance(self.decay, bool) or not 0 < self.decay <= 1:
            raise ValueError(f"decay must be in (0, 1] (head k's loss weight is decay**k), got {self.decay}")


@dataclass
class MedusaRecipe:
    """``heads.medusa`` in a training recipe: the `MedusaConfig` fields a run chooses (the target's sizes
    come from the target)."""

    num_heads: int = 4  # head k predicts token t+2+k
    num_layers: int = 1  # residual blocks per head
    lm_head: Literal["target", "own"] = (
        "target"  # target: reuse the frozen lm_head; own: a trainable copy per head
    )
    decay: float = 0.8  # head k's loss weight is decay**k

    def head_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `MedusaConfig`."""
        return dataclasses.asdict(self)
