"""The Medusa head config (what ``config.json`` holds besides `heads.base.HeadConfig`'s fields)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from heads.base import HeadConfig


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
