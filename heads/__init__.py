"""Draft heads grafted onto a frozen target LM. One file per head type; see `heads.base` for save/load."""

from heads.base import HeadConfig, load_heads, save_heads
from heads.convert import EXPORT_FORMATS, export_heads, import_heads
from heads.eagle import EagleConfig, EagleHead, eagle_loss, eagle_train_forward
from heads.eagle3 import (
    Eagle3Config,
    Eagle3Head,
    build_vocab_map,
    count_tokens,
    eagle3_loss,
    eagle3_train_forward,
)
from heads.graft import TargetOutput, freeze, load_target, run_target, target_dims
from heads.hub import HubMixin, push_heads_dir
from heads.medusa import MedusaConfig, MedusaHeads
from heads.registry import REGISTRY, HeadType

__all__ = [
    "EXPORT_FORMATS",
    "REGISTRY",
    "Eagle3Config",
    "Eagle3Head",
    "EagleConfig",
    "EagleHead",
    "HeadConfig",
    "HeadType",
    "HubMixin",
    "MedusaConfig",
    "MedusaHeads",
    "TargetOutput",
    "build_vocab_map",
    "count_tokens",
    "eagle3_loss",
    "eagle3_train_forward",
    "eagle_loss",
    "eagle_train_forward",
    "export_heads",
    "freeze",
    "import_heads",
    "load_heads",
    "load_target",
    "push_heads_dir",
    "run_target",
    "save_heads",
    "target_dims",
]
