"""Config helpers shared by `heads.eagle.EagleConfig` and `heads.eagle3.Eagle3Config`: the target's
config they store, the draft layer they name (`heads.draft_layer`), the embedding scale they record."""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from heads.draft_layer import DRAFT_LAYERS, check_llama_layer_config, llama_layer_config, target_config_dict

__all__ = [
    "check_target_arch",
    "resolve_draft_layer",
    "target_config_dict",
    "validate_embed_scale",
    "validate_target_config",
]


def resolve_draft_layer(config: Any) -> None:
    """Validate ``config.draft_layer``; for ``"llama"`` resolve (or check) ``draft_layer_config`` once the
    target is known. Shared by `heads.eagle.EagleConfig` and `heads.eagle3.Eagle3Config`."""
    if config.draft_layer not in DRAFT_LAYERS:
        raise ValueError(f"draft_layer must be one of {list(DRAFT_LAYERS)}, got {config.draft_layer!r}")
    if config.draft_layer == "target":
        if config.draft_layer_config is not None:
            raise ValueError(
                "draft_layer_config is only for draft_layer: llama (target layers use target_config)"
            )
        return
    if config.draft_layer_config is None:
        if config.target_config:
            config.draft_layer_config = llama_layer_config(config.target_config, config.vocab_size)
        return
    check_llama_layer_config(config.draft_layer_config, config.hidden_size)


def validate_target_config(target_config: Any) -> None:
    """Raise ``ValueError`` unless ``target_config`` is a dict with a ``model_type`` (or empty: not set yet)."""
    if not isinstance(target_config, dict):
        raise ValueError(f"target_config must be a dict (the target's config), got {type(target_config)}")
    if target_config and "model_type" not in target_config:
        raise ValueError("target_config has no 'model_type': pass target.config.get_text_config().to_dict()")


def validate_embed_scale(scale: Any) -> None:
    """Raise ``ValueError`` unless ``scale`` (a config's ``embed_scale``) is None or a positive finite number."""
    if scale is None:
        return
    if (
        isinstance(scale, bool)
        or not isinstance(scale, (int, float))
        or not math.isfinite(scale)
        or scale <= 0
    ):
        raise ValueError(f"embed_scale must be a positive finite number or None, got {str(scale)[:60]!r}")


def check_target_arch(config: Any, target: nn.Module) -> None:
    """Raise ``ValueError`` if ``target`` is not of the architecture ``config.target_config`` describes."""
    mt = target.config.get_text_config().model_type
    want = config.target_config.get("model_type", "")
    if mt != want:
        raise ValueError(
            f"{config.head_type} heads were trained for a {want!r} target ({config.base_model_name_or_path!r}) "
            f"and do not fit target of architecture {mt!r}: heads fit only the target they were trained on"
        )
