"""Draft heads grafted onto a frozen target LM. One file per head type; see `heads.base` for save/load."""

from heads.base import REGISTRY, HeadConfig, load_heads, save_heads
from heads.graft import TargetOutput, freeze, load_target, run_target, target_dims
from heads.medusa import MedusaConfig, MedusaHeads

__all__ = [
    "REGISTRY",
    "HeadConfig",
    "MedusaConfig",
    "MedusaHeads",
    "TargetOutput",
    "freeze",
    "load_heads",
    "load_target",
    "run_target",
    "save_heads",
    "target_dims",
]
