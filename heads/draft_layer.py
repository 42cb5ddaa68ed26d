"""The EAGLE / EAGLE-3 draft layer that the serving engines know: a Llama decoder layer sized from the target.

``heads.options.draft_layer`` picks the decoder layer inside `heads.eagle.EagleHead` and
`heads.eagle3.Eagle3Head`:

- ``"llama"`` (the default for new heads): a transformers ``LlamaDecoderLayer`` and
  ``LlamaRotaryEmbedding`` built from a one-layer ``LlamaConfig`` sized from the target, as SpecForge and
  speculators build EAGLE-3 drafts. vLLM and SGLang rebuild exactly this layer for any target, so the
  heads are servable whatever the target's architecture (GPT-2, GPT-NeoX, Falcon, Cohere, Phi, Gemma-3,
  mixtures of experts, ...). The config is resolved once (`llama_layer_config`) and stored in the heads
  config as ``draft_layer_config``; `draft_llama_config` returns it, for exports.
- ``"target"``: a layer of the target's own architecture (`heads.eagle.build_draft_layer`), for targets
  whose engine has a native draft class. Heads saved before ``draft_layer`` existed load as ``"target"``.

Sizing, from the target's text config (read through its own config class, so GPT-2's ``n_embd`` /
``n_head`` and the like resolve): hidden size, attention heads, KV heads (Falcon: 1 for multi-query,
``num_kv_heads`` for the new decoder architecture), ``head_dim`` (explicit, also where it is not
hidden / heads), intermediate size (GPT-2 ``n_inner`` or 4H, Falcon ``ffn_hidden_size``; a mixture of
experts' dense ``intermediate_size``), the norm eps (RMSNorm eps, or the target's LayerNorm eps), and
``max_position_embeddings``. Always ``hidden_act="silu"``, no attention or MLP bias, RMSNorm.

RoPE: the draft is a fresh layer and needs only a well-defined RoPE that every engine rebuilds. It uses
the target's ``rope_parameters`` (theta and scaling type) where the target has RoPE — for Gemma-3's
per-layer-type parameters, those of its full-attention layers — and full rotary dimensions (a target's
``partial_rotary_factor`` is dropped; a ``longrope`` table sized for partial rotary falls back to plain
RoPE at the same theta). Targets without RoPE (GPT-2) get theta 10000.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

DRAFT_LAYERS = ("llama", "target")
DEFAULT_ROPE_THETA = 10000.0
_NON_ARCH_KEYS = ("_name_or_path", "architectures", "transformers_version", "id2label", "label2id")
# Bounds on a recorded draft layer config read from a file, checked before anything is allocated.
_MAX_WIDTH_FACTOR = 16  # heads x head_dim <= 16 H
_MAX_FFN_FACTOR = 64  # intermediate_size <= 64 H


def target_config_object(target_config: dict[str, Any]):
    """The target's text config dict as its own transformers config class (for its attribute aliases,
    e.g. GPT-2's ``n_embd`` read as ``hidden_size``); a plain ``PretrainedConfig`` for a model type this
    transformers does not know (a remote-code model), which then must use the standard key names."""
    from transformers import AutoConfig, PretrainedConfig

    d = {k: v for k, v in target_config.items() if k not in _NON_ARCH_KEYS}
    model_type = d.pop("model_type", None)
    if not model_type:
        raise ValueError("target_config has no 'model_type'")
    try:
        return AutoConfig.for_model(model_type, **d)
    except (ValueError, KeyError):
        return PretrainedConfig(**d)


def _kv_heads(tc, heads: int) -> int:
    if tc.model_type == "falcon":  # Falcon states its KV layout in three fields
        if getattr(tc, "new_decoder_architecture", False):
            return int(tc.num_kv_heads)
        return 1 if getattr(tc, "multi_query", False) else heads
    return int(getattr(tc, "num_key_value_heads", None) or heads)


def _intermediate(tc, hidden: int) -> int:
    for name in ("intermediate_size", "ffn_hidden_size", "n_inner"):
        v = getattr(tc, name, None)
        if v:
            return int(v)
    return 4 * hidden


def _norm_eps(tc) -> float:
    for name in ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"):
        v = getattr(tc, name, None)
        if v is not None:
            return float(v)
    return 1e-6


def _rope(tc) -> dict[str, Any]:
    """The draft's ``rope_parameters``: the target's (full-attention ones if per layer type), full rotary."""
    rp = getattr(tc, "rope_parameters", None)
    if not isinstance(rp, dict) or not rp:
        return {"rope_type": "default", "rope_theta": DEFAULT_ROPE_THETA}
    if "rope_theta" not in rp and all(isinstance(v, dict) for v in rp.values()):  # per layer type (Gemma-3)
        rp = rp.get("full_attention") or next(iter(rp.values()))
    rp = dict(rp)
    partial = float(rp.pop("partial_rotary_factor", 1.0) or 1.0)
    theta = float(rp.get("rope_theta", DEFAULT_ROPE_THETA))
    if rp.get("rope_type", "default") == "longrope" and partial != 1.0:
        return {"rope_type": "default", "rope_theta": theta}  # its per-dimension tables fit partial rotary
    rp.pop("type", None)
    return {**rp, "rope_type": rp.get("rope_type", "default"), "rope_theta": theta}


def llama_layer_config(target_config: dict[str, Any], vocab_size: int = 0) -> dict[str, Any]:
    """The one-layer ``LlamaConfig`` (as keyword arguments) of the draft layer for this target.

    target_config: the target's text config dict (``heads.eagle.target_config_dict``); vocab_size: the
    target's lm_head rows (0 = the config's ``vocab_size``), what the engines size the shared embedding by.
    See the module docstring for each size. Deterministic in its inputs; stored once in the heads config.
    """
    tc = target_config_object(target_config)
    try:
        hidden, heads = int(tc.hidden_size), int(tc.num_attention_heads)
    except AttributeError as e:
        raise ValueError(
            f"cannot size a Llama draft layer for this {tc.model_type!r} target config: {e}"
        ) from None
    head_dim = getattr(tc, "head_dim", None) or hidden // heads
    return {
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": _intermediate(tc, hidden),
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": _kv_heads(tc, heads),
        "head_dim": int(head_dim),
        "hidden_act": "silu",
        "rms_norm_eps": _norm_eps(tc),
        "rope_parameters": _rope(tc),
        "max_position_embeddings": int(getattr(tc, "max_position_embeddings", None) or 2048),
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": float(getattr(tc, "initializer_range", None) or 0.02),
        "vocab_size": int(vocab_size or tc.vocab_size),
        "tie_word_embeddings": False,
    }


def check_llama_layer_config(layer_config: Any, hidden_size: int) -> None:
    """Raise ``ValueError`` (one line) unless ``layer_config`` is a sane one-layer Llama config for width H."""
    if not isinstance(layer_config, dict) or layer_config.get("model_type") != "llama":
        raise ValueError("draft_layer_config must be a dict of a LlamaConfig (model_type 'llama')")
    ints = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")
    bad = [k for k in ints if not isinstance(layer_config.get(k), int) or layer_config[k] < 1]
    if bad:
        raise ValueError(f"draft_layer_config: {bad} must be positive ints")
    H = layer_config["hidden_size"]
    heads, kv, hd = (layer_config[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim"))
    problems = []
    if hidden_size and H != hidden_size:
        problems.append(f"hidden_size {H} != the heads' {hidden_size}")
    if layer_config.get("num_hidden_layers", 1) != 1:
        problems.append("num_hidden_layers must be 1")
    if heads % kv:
        problems.append(f"num_key_value_heads {kv} does not divide num_attention_heads {heads}")
    if heads * hd > _MAX_WIDTH_FACTOR * H or layer_config["intermediate_size"] > _MAX_FFN_FACTOR * H:
        problems.append("attention or MLP width out of bounds for the hidden size")
    if problems:
        raise ValueError("draft_layer_config: " + "; ".join(problems))


def draft_llama_config(config) -> dict[str, Any]:
    """The ``LlamaConfig`` keyword arguments of a ``draft_layer: llama`` head's layer (`EagleConfig` or
    `Eagle3Config`): exactly what `build_llama_layer` built, for exports that rebuild it in an engine.
    Raises ``ValueError`` for ``draft_layer: target`` heads."""
    if config.draft_layer != "llama":
        raise ValueError(
            f"these {config.head_type} heads have a {config.draft_layer!r} draft layer, not a Llama one"
        )
    if not config.draft_layer_config:
        raise ValueError("the heads config has no target_config yet: the draft layer is not sized")
    return dict(config.draft_layer_config)


def build_llama_layer(layer_config: dict[str, Any]) -> tuple[nn.Module, nn.Module, Any]:
    """(``LlamaDecoderLayer``, ``LlamaRotaryEmbedding``, its ``LlamaConfig``) from `llama_layer_config`'s dict.

    Built through `heads.eagle.build_draft_layer` (a one-layer, 8-token ``LlamaForCausalLM`` whose layer 0
    and rotary module are kept, initialised as Llama initialises them); ``input_layernorm`` is Identity.
    """
    from heads.eagle import build_draft_layer

    return build_draft_layer(layer_config)


def measure_embed_scale(embed: nn.Module) -> float | None:
    """The factor by which ``embed(ids)`` scales its weight rows (Gemma: sqrt(H); 1 for most), or None.

    An engine's Llama draft looks up the shared embedding *weight*; a target whose embedding module
    scales (Gemma's ``ScaledWordEmbedding``) feeds the draft ``scale * weight[ids]`` here, so an export
    must fold the factor in (EAGLE-1: into ``fc``'s embedding columns).
    """
    w = getattr(embed, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.device.type == "meta" or w.shape[0] == 0:
        return None
    ids = torch.arange(min(w.shape[0], 16), device=w.device)
    with torch.no_grad():
        out, rows = embed(ids).float(), w[ids].float()
    denom = float((rows * rows).sum())
    if denom == 0:
        return None
    scale = float((out * rows).sum()) / denom
    return scale if torch.allclose(out, rows * scale, rtol=1e-2, atol=1e-6) else None


def target_embed_scale(target: nn.Module) -> float | None:
    """``embed_scale`` for heads of ``target``: `measure_embed_scale` of its input embedding module, made
    exact where the module states its factor (Gemma's ``embed_scale``, which it multiplies in the weight
    dtype: sqrt(H) rounded to bf16 in a bf16 model) and the measurement agrees with it; None where the
    module's output is not a multiple of its weight rows."""
    embed = target.get_input_embeddings()
    scale = measure_embed_scale(embed)
    stated = getattr(embed, "embed_scale", None)
    w = getattr(embed, "weight", None)
    if scale is None or stated is None or not isinstance(w, torch.Tensor):
        return scale
    exact = float(torch.as_tensor(stated).to(w.dtype))
    return exact if abs(exact - scale) <= 1e-2 * abs(exact) else scale
