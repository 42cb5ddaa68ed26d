"""The one decoder layer of EAGLE-1/2 and EAGLE-3 drafts, and what both head types share around it.

Shared by `heads.eagle` and `heads.eagle3` (one implementation each; their config helpers are in
`heads.draft_config`): building the layer (`build_layer`:
a Llama layer or one of the target's own architecture, `build_draft_layer`), the additive causal mask,
the target's logit transform, and `DraftLayerMixin`: the RoPE module kept out of the module tree, the
layer's name for its cache argument, a draft step's default positions and mask and ``for_target``
(the cache-based training-time-test unroll through this layer is `heads.unroll.cached_unroll`).

The layer the serving engines know is a Llama decoder layer sized from the target.

``draft_layer`` (a recipe's ``heads.eagle.draft_layer`` / ``heads.eagle3.draft_layer``) picks the layer inside
`heads.eagle.EagleHead` and `heads.eagle3.Eagle3Head`:

- ``"llama"`` (the default for new heads): a transformers ``LlamaDecoderLayer`` and
  ``LlamaRotaryEmbedding`` built from a one-layer ``LlamaConfig`` sized from the target, as SpecForge and
  speculators build EAGLE-3 drafts. vLLM and SGLang rebuild exactly this layer for any target, so the
  heads are servable whatever the target's architecture (GPT-2, GPT-NeoX, Falcon, Cohere, Phi, Gemma-3,
  mixtures of experts, ...). The config is resolved once (`llama_layer_config`) and stored in the heads
  config as ``draft_layer_config``; `draft_llama_config` returns it, for exports.
- ``"target"``: a layer of the target's own architecture (`heads.draft_layer.build_draft_layer`), for targets
  whose engine has a native draft class.

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

import inspect
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from heads.graft import target_dims

DRAFT_LAYERS = ("llama", "target")
# What the decoder layer calls its KV-cache argument, newest transformers first.
CACHE_KWARGS = ("cache", "past_key_values", "past_key_value")
DEFAULT_ROPE_THETA = 10000.0
_NON_ARCH_KEYS = ("_name_or_path", "architectures", "transformers_version", "id2label", "label2id")
# Bounds on a recorded draft layer config read from a file, checked before anything is allocated.
_MAX_WIDTH_FACTOR = 16  # heads x head_dim <= 16 H
_MAX_FFN_FACTOR = 64  # intermediate_size <= 64 H


def target_config_object(target_config: dict[str, Any]):
    """The target's text config dict as its own transformers config class (for its attribute aliases,
    e.g. GPT-2's ``n_embd`` read as ``hidden_size``); a plain ``PretrainedConfig`` for a model type this
    transformers does not know (a remote-code model), which then must use the standard key names."""
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

    Built through `build_draft_layer` (a one-layer, 8-token ``LlamaForCausalLM`` whose layer 0 and
    rotary module are kept, initialised as Llama initialises them); ``input_layernorm`` is Identity.
    """
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


def target_config_dict(target: nn.Module) -> dict[str, Any]:
    """The target's text config as a dict, minus checkpoint-only keys (what ``target_config`` holds)."""
    return {k: v for k, v in target.config.get_text_config().to_dict().items() if k not in _NON_ARCH_KEYS}


# ---------------------------------------------------------------------------------------------- the layer of both head types


def causal_mask(
    attention_mask: Tensor | None, T: int, past_len: int, dtype: torch.dtype, device: torch.device
) -> Tensor:
    """[B or 1, 1, T, past_len + T] additive causal mask (0 allowed, ``finfo.min`` not); ``attention_mask``
    [B, past_len + T] (1 = real) also hides padded keys."""
    S = past_len + T
    q = torch.arange(T, device=device)[:, None] + past_len
    k = torch.arange(S, device=device)[None, :]
    allowed = (k <= q)[None, None]  # [1, 1, T, S]
    if attention_mask is not None:
        if attention_mask.shape[-1] != S:
            raise ValueError(f"attention_mask covers {attention_mask.shape[-1]} keys, expected {S}")
        allowed = allowed & attention_mask.bool()[:, None, None, :]
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(
        ~allowed, torch.finfo(dtype).min
    )


def build_draft_layer(target_config: dict[str, Any]) -> tuple[nn.Module, nn.Module, Any]:
    """(decoder layer, rotary embedding, 1-layer config) of the target's architecture.

    A 1-layer, 8-token-vocab copy of the target's causal LM is instantiated from the target's config
    class (cheap: its embedding and lm_head are tiny) and its layer 0 and rotary module are kept; they
    come out initialised the way the architecture initialises them. Architectures whose decoder layer
    does not take ``(hidden_states, attention_mask, position_ids, cache, position_embeddings)`` with
    RoPE computed outside the layer (GPT-2, ...) raise ``NotImplementedError`` pointing to
    ``draft_layer: llama``. (The cache argument may also be called ``past_key_values``, as in
    transformers releases before the rename.) `build_llama_layer` calls this with a
    Llama config dict.
    """
    d = {k: v for k, v in target_config.items() if k not in _NON_ARCH_KEYS}
    model_type = d.pop("model_type", None)
    if not model_type:
        raise ValueError("target_config has no 'model_type'")
    d.update(num_hidden_layers=1, vocab_size=8, pad_token_id=None, tie_word_embeddings=False)
    if "layer_types" in d:
        d["layer_types"] = ["full_attention"]
    if "use_sliding_window" in d:
        d["use_sliding_window"] = False
    if "sliding_window" in d and "layer_types" not in d:
        d["sliding_window"] = None  # Mistral/Phi-3 pass it to the kernel directly; the draft attends in full
    try:
        cfg = AutoConfig.for_model(model_type, **d)
    except (ValueError, KeyError) as e:
        raise NotImplementedError(
            f"EAGLE heads: unknown target architecture {model_type!r}: {e}; use draft_layer: llama"
        ) from e
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    base = model.base_model
    layers = getattr(base, "layers", None)
    rotary = getattr(base, "rotary_emb", None)
    problem = None
    if not isinstance(layers, nn.ModuleList) or len(layers) != 1:
        problem = "its decoder has no `layers` list"
    elif rotary is None:
        problem = "its decoder computes no rotary embedding outside the layers (`rotary_emb`)"
    elif not isinstance(getattr(rotary, "inv_freq", None), torch.Tensor):
        problem = f"its {type(rotary).__name__} has per-layer-type RoPE tables (no single `inv_freq`)"
    else:
        params = inspect.signature(layers[0].forward).parameters
        missing = [p for p in ("attention_mask", "position_embeddings") if p not in params]
        if not any(p in params for p in CACHE_KWARGS):
            missing.append("cache")
        if missing:
            problem = f"its decoder layer {type(layers[0]).__name__}.forward does not take {missing}"
        elif not isinstance(getattr(layers[0], "input_layernorm", None), nn.Module):
            problem = f"its decoder layer {type(layers[0]).__name__} has no `input_layernorm`"
    if problem:
        raise NotImplementedError(
            f"a draft layer of the target's own {model_type!r} architecture ({type(model).__name__}) is not "
            f"supported: {problem}; use draft_layer: llama (a Llama layer, for any target)"
        )
    layer = layers[0]
    layer.input_layernorm = nn.Identity()
    return layer, rotary, cfg


def soft_cap(logits: Tensor, cap: float | None) -> Tensor:
    return logits if not cap else torch.tanh(logits / cap) * cap


def target_logit_transform(target_config: dict[str, Any]) -> tuple[float, float | None]:
    """(scale, soft-cap) the target applies to ``lm_head(h)``: logits = softcap(scale · lm_head(h)).

    Cohere multiplies by ``logit_scale``, Granite divides by ``logits_scaling``, Gemma2 soft-caps with
    ``final_logit_softcapping``; (1.0, None) for the rest.
    """
    tc = target_config_object(target_config)
    scale = float(getattr(tc, "logit_scale", None) or 1.0)
    if getattr(tc, "logits_scaling", None):
        scale /= float(tc.logits_scaling)
    return scale, getattr(tc, "final_logit_softcapping", None)


def build_layer(config: Any) -> tuple[nn.Module, nn.Module, Any]:
    """The (layer, rotary, layer config) ``config.draft_layer`` names, checked against ``hidden_size``."""
    if config.draft_layer == "llama":
        layer, rotary, layer_config = build_llama_layer(draft_llama_config(config))
    else:
        layer, rotary, layer_config = build_draft_layer(config.target_config)
    if layer_config.hidden_size != config.hidden_size:
        raise ValueError(
            f"the draft layer's hidden_size {layer_config.hidden_size} != the heads' hidden_size {config.hidden_size}"
        )
    return layer, rotary, layer_config


class DraftLayerMixin:
    """What `heads.eagle.EagleHead` and `heads.eagle3.Eagle3Head` share around their one decoder layer."""

    config: Any
    _cache_kwarg: str

    def _new_layer(self, config: Any) -> tuple[nn.Module, nn.Module, Any]:
        """Keep ``config`` (sized for a target, else a ``ValueError``) and build its layer (`build_layer`)."""
        if config.hidden_size <= 0 or config.vocab_size <= 0 or not config.target_config:
            raise ValueError(
                f"{type(config).__name__} needs the target's hidden_size, vocab_size and target_config "
                f"(use {type(self).__name__}.for_target)"
            )
        self.config = config
        return build_layer(config)

    def _attach_layer(self, layer: nn.Module, rotary: nn.Module) -> None:
        """Keep ``rotary`` and note what ``layer.forward`` calls its cache argument (`CACHE_KWARGS`)."""
        # RoPE tables: kept out of the module tree so `.to(bfloat16)` never rounds inv_freq (its buffers are
        # non-persistent anyway, so nothing of it is saved); moved to the input's device on first use.
        self.__dict__["rotary_emb"] = rotary
        params = inspect.signature(layer.forward).parameters
        self._cache_kwarg = next(p for p in CACHE_KWARGS if p in params)

    @classmethod
    def _new_for_target(cls, config_cls: type, target: nn.Module, **kwargs: Any) -> nn.Module:
        """A fresh head of ``config_cls`` for ``target``: its architecture, sizes and embedding scale, on its
        device and in its dtype (``for_target`` of both head types)."""
        vocab, hidden = target_dims(target)
        name = getattr(target.config, "_name_or_path", None) or None
        kwargs.setdefault("embed_scale", target_embed_scale(target))
        config = config_cls(
            hidden_size=hidden,
            vocab_size=vocab,
            base_model_name_or_path=name,
            target_config=target_config_dict(target),
            **kwargs,
        )
        p = target.get_output_embeddings().weight
        return cls(config).to(device=p.device, dtype=p.dtype)  # type: ignore[call-arg]

    @staticmethod
    def _step_inputs(
        T: int, cache, position_ids: Tensor | None, attention_mask: Tensor | None, dtype: torch.dtype, device
    ) -> tuple[Tensor, Tensor]:
        """(position_ids [B or 1, T], additive mask [B or 1, 1, T, past_len + T]) of one draft step over T
        pairs after the ``cache``'s past_len: ``past_len + arange(T)`` and `causal_mask` (with a 2D padding
        mask) unless given; a 4D mask is used as given (tree drafting)."""
        past_len = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = (torch.arange(T, device=device) + past_len)[None]
        if attention_mask is None or attention_mask.dim() == 2:
            attention_mask = causal_mask(attention_mask, T, past_len, dtype, device)
        else:
            attention_mask = attention_mask.to(dtype)
        return position_ids, attention_mask

    def _call_layer(
        self, layer: nn.Module, h: Tensor, position_ids: Tensor, attention_mask: Tensor, cache, **extra: Any
    ) -> Tensor:
        """``layer(h)`` with RoPE of ``position_ids`` computed outside it, as the decoder layers take it."""
        rotary = self.__dict__["rotary_emb"]
        if rotary.inv_freq.device != h.device:
            rotary.to(h.device)
        return layer(
            h,
            attention_mask=attention_mask,
            position_ids=position_ids,
            position_embeddings=rotary(h, position_ids),
            **{self._cache_kwarg: cache},
            **extra,
        )
