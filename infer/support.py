"""Which targets tree verification is exact on, and a one-line refusal for the others.

Tree verification (docs/design.md §4) gives every node the logits of its own root-to-node path only if
the model's attention takes (1) the 4D additive mask as given and (2) each node's position from
``position_ids``. Measured on transformers 5.24 (``tests/test_tree_exact.py`` checks every node of
random trees against a cache-free forward):

- ALiBi models compute the bias inside the model, not from ``position_ids``: MPT from the key's slot
  index in the cache (a node at slot past + i gets past + i, not past + depth: logits off by up to
  0.05 on a 2-layer random model), Bloom and Falcon(alibi=True) from a 2D padding mask's cumsum (a 4D
  mask crashes them). No mask or position id can give a node its true key positions, so they are
  refused.
- Recurrent layers (Mamba, RWKV, linear attention, hybrids: transformers' ``_is_stateful``) carry one
  state through the tokens in order: a tree has no order, and rejected drafts cannot be rolled back.
- Layer types other than full and sliding-window attention (chunked attention, ...) would need their
  own mask; `infer.tree.attention_mask` builds only those two.
- Attention implementations other than eager / sdpa (flash attention, paged, hub kernels) do not apply
  an arbitrary 4D mask.
"""

from __future__ import annotations

from torch import nn

from heads.graft import unwrap_peft

TREE_ATTENTION = ("eager", "sdpa")  # attention implementations that apply a 4D additive mask as given
_LAYER_TYPES = {"full_attention", "sliding_attention", "moe", "mlp"}  # moe/mlp: no attention at all
# Layers whose state runs through the tokens in order. transformers >= 5.25 marks Mamba / Mamba-2 / GDN
# layers "linear_attention" (older releases called them "mamba" and set the model's _is_stateful).
_RECURRENT_LAYER_TYPES = {"linear_attention", "mamba", "hybrid", "hybrid_sliding", "conv"}
_ALWAYS_ALIBI = {"bloom", "mpt"}  # their transformers code adds ALiBi unconditionally


def _attn_implementation(model: nn.Module) -> str | None:
    cfg = model.config
    impl = getattr(cfg.get_text_config(), "_attn_implementation", None)
    return impl if impl is not None else getattr(cfg, "_attn_implementation", None)


def unsupported_reason(model: nn.Module) -> str | None:
    """Why tree verification would not be exact on ``model`` (a transformers causal LM or a PeftModel
    around one), or None when it is supported."""
    base = unwrap_peft(model)
    cfg = base.config.get_text_config()
    kind = getattr(cfg, "model_type", None) or type(base).__name__
    attn_cfg = getattr(cfg, "attn_config", None)
    alibi = (
        kind in _ALWAYS_ALIBI
        or getattr(cfg, "alibi", False) is True
        or getattr(attn_cfg, "alibi", False) is True
        or getattr(cfg, "position_embedding_type", None) == "alibi"
    )
    if alibi:
        return (
            f"{kind} uses ALiBi position biases computed inside the model from key slots or a 2D padding "
            "mask, not from position_ids; tree verification cannot give each node its true position"
        )
    layer_types = set(getattr(cfg, "layer_types", None) or ())
    if getattr(base, "_is_stateful", False) or layer_types & _RECURRENT_LAYER_TYPES:
        return (
            f"{kind} has recurrent (state-space / linear-attention) layers whose state runs through the "
            "tokens in order; a tree cannot be verified in one forward nor rejected drafts rolled back"
        )
    other = sorted(layer_types - _LAYER_TYPES)
    if getattr(cfg, "attention_chunk_size", None) is not None:
        other = sorted({*other, "chunked_attention"})
    if other:
        return (
            f"{kind} has layer types {other}; tree masks are built for full and sliding-window attention only"
        )
    impl = _attn_implementation(base)
    if impl is not None and impl not in TREE_ATTENTION:
        return (
            f"attn_implementation={impl!r} cannot apply a tree attention mask; load the target with "
            f"one of {', '.join(TREE_ATTENTION)}"
        )
    return None


def check_attn_implementation(name: str | None) -> None:
    """Refuse an ``attn_implementation`` that cannot apply a tree mask before any weight is loaded."""
    if name is not None and name not in TREE_ATTENTION:
        raise ValueError(
            f"attn_implementation={name!r} cannot apply a tree attention mask; use one of "
            f"{', '.join(TREE_ATTENTION)} (or None for the model's default)"
        )


def check_target(model: nn.Module) -> None:
    """Raise a one-line ``ValueError`` when tree verification would not be exact on ``model``."""
    reason = unsupported_reason(model)
    if reason is not None:
        name = getattr(getattr(model, "config", None), "_name_or_path", None) or type(model).__name__
        raise ValueError(f"selfspec cannot verify draft trees on target {name!r}: {reason}")
