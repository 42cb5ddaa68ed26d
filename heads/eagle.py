"""EAGLE-1/2 draft head (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty"; EAGLE-2: "Faster Inference of Language Models with Dynamic Draft Trees").

The draft is one decoder layer that runs autoregressively at the *feature* level. Its input at pair k
fuses the embedding of token x_{k+1} with the target's last post-norm hidden state f_k:

    z_k = fc(cat(embed(x_{k+1}), f_k))           fc: Linear(2H -> H, bias)
    f̂_{k+1} = layer(z_k | z_0..z_{k-1})          one decoder layer (``draft_layer``: Llama, or the target's)
    draft logits for x_{k+2} = softcap(scale · lm_head(f̂_{k+1}))   the target's frozen lm_head

Alignment convention (training and inference agree on it): pair k = (token x_{k+1}, feature f_k) sits
at position id k and attends causally to pairs 0..k. Its output f̂_{k+1} is regressed onto f_{k+1}, and
its logits are scored against token x_{k+2}, so pair k is trained iff ``loss_mask[k+2] == 1``.

**The layer** (``EagleConfig.draft_layer``, see `heads.draft_layer`): ``"llama"`` (the default) is a
transformers Llama decoder layer sized from the target, which vLLM and SGLang rebuild for any target;
``"target"`` (heads saved before the option existed) is a layer of the target's own architecture, built
from the target's own config class with ``num_hidden_layers=1`` (so rope_theta / rope scaling, head_dim,
qkv bias, q/k norms, attention scaling and soft-capping all match the target) and the architecture's
own decoder-layer and rotary-embedding classes, found generically through
``AutoModelForCausalLM.from_config``; no modeling file is copied. Either way, deviations from a plain
decoder layer:

- ``input_layernorm`` is replaced by ``nn.Identity()`` (EAGLE: no input norm on layer 0; its input
  ``fc(...)`` mixes a post-norm feature with an embedding and is not normed).
- the layer always uses full causal attention (``layer_types=["full_attention"]``, no sliding window):
  the draft's own prefix is attended in full, as in EAGLE's Llama-based draft.

Embeddings are taken from ``target.get_input_embeddings()`` called as a module, in training and at
inference alike: Gemma/Gemma2/Gemma-3 scale by sqrt(H) inside that embedding module
(``...ScaledWordEmbedding``, and their decoder does not scale again), so the draft sees the scaled
embedding, which is also what the target's decoder sees; Granite's ``embedding_multiplier`` is applied
in the decoder's forward, outside the module, so the draft sees the plain embedding. An engine whose
draft looks up the shared embedding *weight* must multiply Gemma's rows by sqrt(H) (as the module's
``embed_scale``, rounded to the weight dtype) to compute this function; for EAGLE-1 that factor can be
folded into ``fc``'s first H input columns at export. Draft logits apply the target's logit transform
(Gemma2's ``final_logit_softcapping``, Cohere's ``logit_scale``, Granite's ``1 / logits_scaling``) so
that draft and target distributions are the same function of a feature.

The attention kernel is the architecture's default from ``from_config`` (sdpa; eager for Gemma2, whose
attention soft-capping sdpa lacks); both take the 4D additive tree masks of `infer.eagle_draft`.
Training calls `eagle_train_forward` (shift, noise, loss); inference uses `infer.eagle_draft`.

The checkpoint holds ``fc.*`` and ``layers.0.*`` only (the SGLang/vLLM EAGLE-1 key layout); the
embedding and lm_head are the target's and are passed at call time.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from heads.base import HeadConfig
from heads.draft_layer import (
    DRAFT_LAYERS,
    build_llama_layer,
    check_llama_layer_config,
    draft_llama_config,
    llama_layer_config,
    target_config_object,
    target_embed_scale,
)
from heads.graft import TargetOutput
from heads.hub import HubMixin
from heads.registry import HeadType, LossInputs, Objective, register

# What the decoder layer calls its KV-cache argument, newest transformers first.
_CACHE_KWARGS = ("cache", "past_key_values", "past_key_value")
# Keys of a target config that describe the checkpoint rather than the architecture; dropped on save.
_NON_ARCH_KEYS = ("_name_or_path", "architectures", "transformers_version", "id2label", "label2id")


@dataclass
class EagleConfig(HeadConfig):
    """EAGLE-1/2 head config.

    target_config: the target's text config as a dict (``target.config.get_text_config().to_dict()``);
        the draft layer is rebuilt from it, so loading never needs the target itself.
    draft_layer: ``"llama"`` (default: a Llama decoder layer sized from the target, which the engines
        rebuild) or ``"target"`` (a layer of the target's own architecture); see `heads.draft_layer`.
        A config.json without the key (heads saved before it existed) loads as ``"target"``.
    draft_layer_config: the ``LlamaConfig`` keyword arguments of a ``"llama"`` layer, resolved from
        ``target_config`` by `heads.draft_layer.llama_layer_config` and saved (None for ``"target"``).
    embed_scale: the factor by which the target's embedding module scales its weight rows (Gemma:
        sqrt(H) in the weight dtype; 1.0 for most targets), measured from the target by `for_target`
        (`heads.draft_layer.target_embed_scale`) so that an export can fold it into ``fc`` without the
        target; None: not recorded (heads saved before the field existed). selfspec itself never reads it.
    bias: whether ``fc`` has a bias (EAGLE-1 checkpoints have one).
    w_reg, w_cls: weights of the SmoothL1 feature regression and of the soft-label cross-entropy.
    noise: training-time feature augmentation, f + U(-noise, noise); 0 disables it.
    """

    head_type: ClassVar[str] = "eagle"
    target_config: dict[str, Any] = field(default_factory=dict)
    draft_layer: Literal["llama", "target"] = "llama"
    draft_layer_config: dict[str, Any] | None = None
    embed_scale: float | None = None
    bias: bool = True
    w_reg: float = 1.0
    w_cls: float = 0.1
    noise: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        validate_target_config(self.target_config)
        validate_embed_scale(self.embed_scale)
        resolve_draft_layer(self)
        if self.w_reg < 0 or self.w_cls < 0:
            raise ValueError(f"loss weights must be >= 0, got w_reg={self.w_reg}, w_cls={self.w_cls}")
        if self.w_reg == 0 and self.w_cls == 0:
            raise ValueError("w_reg and w_cls are both 0: nothing to train")
        if self.noise < 0:
            raise ValueError(f"noise must be >= 0 (0 disables it), got {self.noise}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EagleConfig:
        """As `HeadConfig.from_dict`; a config without ``draft_layer`` (saved before it existed) is ``"target"``."""
        return super().from_dict(with_legacy_draft_layer(d))

    @property
    def model_type(self) -> str:
        return str(self.target_config.get("model_type", ""))

    def check_target(self, target: nn.Module) -> None:
        super().check_target(target)
        check_target_arch(self, target)


def with_legacy_draft_layer(d: dict[str, Any]) -> dict[str, Any]:
    """A saved EAGLE / EAGLE-3 config dict, with ``draft_layer: target`` where the key is missing
    (heads saved before ``draft_layer`` existed had the target's own layer)."""
    return d if "draft_layer" in d else {**d, "draft_layer": "target"}


def resolve_draft_layer(config: HeadConfig) -> None:
    """Validate ``config.draft_layer``; for ``"llama"`` resolve (or check) ``draft_layer_config`` once the
    target is known. Shared by `EagleConfig` and `heads.eagle3.Eagle3Config`."""
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


def check_target_arch(config: HeadConfig, target: nn.Module) -> None:
    """Raise ``ValueError`` if ``target`` is not of the architecture ``config.target_config`` describes."""
    mt = target.config.get_text_config().model_type
    want = config.target_config.get("model_type", "")
    if mt != want:
        raise ValueError(
            f"{config.head_type} heads were trained for a {want!r} target ({config.base_model_name_or_path!r}) "
            f"and do not fit target of architecture {mt!r}: heads fit only the target they were trained on"
        )


def target_config_dict(target: nn.Module) -> dict[str, Any]:
    """The target's text config as a dict, minus checkpoint-only keys (what ``target_config`` holds)."""
    return {k: v for k, v in target.config.get_text_config().to_dict().items() if k not in _NON_ARCH_KEYS}


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
    transformers releases before the rename.) `heads.draft_layer.build_llama_layer` calls this with a
    Llama config dict.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

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
            f"EAGLE heads: unknown target architecture {model_type!r}: {e}; use heads.options.draft_layer: llama"
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
        if not any(p in params for p in _CACHE_KWARGS):
            missing.append("cache")
        if missing:
            problem = f"its decoder layer {type(layers[0]).__name__}.forward does not take {missing}"
        elif not isinstance(getattr(layers[0], "input_layernorm", None), nn.Module):
            problem = f"its decoder layer {type(layers[0]).__name__} has no `input_layernorm`"
    if problem:
        raise NotImplementedError(
            f"a draft layer of the target's own {model_type!r} architecture ({type(model).__name__}) is not "
            f"supported: {problem}; use heads.options.draft_layer: llama (a Llama layer, for any target)"
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


def build_layer(config: HeadConfig) -> tuple[nn.Module, nn.Module, Any]:
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


class EagleHead(HubMixin, nn.Module):
    """``fc`` + one decoder layer (Llama, or the target's own); see the module docstring."""

    def __init__(self, config: EagleConfig) -> None:
        super().__init__()
        if config.hidden_size <= 0 or config.vocab_size <= 0 or not config.target_config:
            raise ValueError(
                "EagleConfig needs the target's hidden_size, vocab_size and target_config "
                "(use EagleHead.for_target)"
            )
        self.config = config
        H = config.hidden_size
        layer, rotary, layer_config = build_layer(config)
        self.layer_config = layer_config
        self.fc = nn.Linear(2 * H, H, bias=config.bias)
        self.layers = nn.ModuleList([layer])  # keys `layers.0.*`, as EAGLE-1 checkpoints name them
        # RoPE tables: kept out of the module tree so `.to(bfloat16)` never rounds inv_freq (its buffers are
        # non-persistent anyway, so nothing of it is saved); moved to the input's device on first use.
        self.__dict__["rotary_emb"] = rotary
        self.logit_scale, self.logit_softcap = target_logit_transform(config.target_config)
        params = inspect.signature(layer.forward).parameters
        self._cache_kwarg = next(p for p in _CACHE_KWARGS if p in params)

    @classmethod
    def for_target(cls, target: nn.Module, **kwargs) -> EagleHead:
        """A fresh head for ``target``: its architecture and sizes, on its device and in its dtype."""
        from heads.graft import target_dims

        vocab, hidden = target_dims(target)
        name = getattr(target.config, "_name_or_path", None) or None
        tcfg = target_config_dict(target)
        kwargs.setdefault("embed_scale", target_embed_scale(target))
        head = cls(
            EagleConfig(
                hidden_size=hidden,
                vocab_size=vocab,
                base_model_name_or_path=name,
                target_config=tcfg,
                **kwargs,
            )
        )
        p = target.get_output_embeddings().weight
        return head.to(device=p.device, dtype=p.dtype)

    def causal_mask(self, attention_mask: Tensor | None, T: int, past_len: int, dtype: torch.dtype) -> Tensor:
        """[B or 1, 1, T, past_len + T] additive causal mask; ``attention_mask`` [B, past_len + T] hides padding."""
        return causal_mask(attention_mask, T, past_len, dtype, self.fc.weight.device)

    def forward(
        self,
        input_ids: Tensor,
        features: Tensor,
        embed: nn.Module,
        position_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        cache=None,
    ) -> Tensor:
        """Predict the next features.

        input_ids: [B, T] tokens x_{k+1}; features: [B, T, H] target (or draft) features f_k — pair k
        combines the token *after* the position whose feature it carries.
        embed: the target's input embedding module (``target.get_input_embeddings()``).
        position_ids: [B or 1, T]; default ``past_len + arange(T)`` (pair k at position k).
        attention_mask: None (causal), a [B, past_len + T] 0/1 padding mask (causal + padding), or a
            4D additive mask [B, 1, T, past_len + T] used as given (tree drafting).
        cache: a transformers ``DynamicCache`` for the draft layer (extended in place) or None.
        Returns f̂: [B, T, H], the prediction of f_{k+1} at pair k.
        """
        B, T = input_ids.shape
        assert features.shape[:2] == (B, T), (input_ids.shape, features.shape)
        dtype = self.fc.weight.dtype
        past_len = cache.get_seq_length() if cache is not None else 0
        emb = embed(input_ids).to(dtype)
        h = self.fc(torch.cat([emb, features.to(dtype)], dim=-1))  # [B, T, H]
        if position_ids is None:
            position_ids = (torch.arange(T, device=h.device) + past_len)[None]
        if attention_mask is None or attention_mask.dim() == 2:
            attention_mask = self.causal_mask(attention_mask, T, past_len, dtype)
        else:
            attention_mask = attention_mask.to(dtype)
        if self.rotary_emb.inv_freq.device != h.device:
            self.rotary_emb.to(h.device)
        pos_emb = self.rotary_emb(h, position_ids)
        return self.layers[0](
            h,
            attention_mask=attention_mask,
            position_ids=position_ids,
            position_embeddings=pos_emb,
            **{self._cache_kwarg: cache},
        )

    def logits(self, feats: Tensor, lm_head: nn.Module) -> Tensor:
        """feats: [..., H] -> float32 logits [..., V] through the target's lm_head (and its scale, soft-cap)."""
        return soft_cap(
            lm_head(feats.to(lm_head.weight.dtype)).float() * self.logit_scale, self.logit_softcap
        )


def eagle_train_forward(
    head: nn.Module,
    target_out: TargetOutput,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    loss_mask: Tensor,
    lm_head: nn.Module,
    embed: nn.Module,
) -> tuple[Tensor, dict[str, Tensor]]:
    """One training step's EAGLE loss from a (no-grad) target forward over the batch.

    head: an `EagleHead`, or the wrapper accelerate/DDP/DeepSpeed put around it (the draft forward goes
        through the wrapper's ``__call__``, so gradient hooks fire; config and train/eval mode are read
        from the unwrapped ``.module``).
    target_out: `heads.graft.run_target` output; only ``.hidden`` [B, T, H] is read, so the target may
        run with ``logits_to_keep=1``.
    input_ids, attention_mask, loss_mask: [B, T] as ``train.data`` makes them (loss_mask[t] = 1 iff token
        t is a training label; attention_mask 1 = real token, or None).
    lm_head, embed: the target's ``get_output_embeddings()`` / ``get_input_embeddings()``.

    Pairs k = 0..T-2 are (x_{k+1}, f_k + U(-noise, noise)) at positions k (noise only in train mode);
    pair k is scored against the clean f_{k+1} and the target's distribution for x_{k+2}, iff
    ``loss_mask[k+2]`` and tokens k, k+1, k+2 are real (so pair T-2 is never scored). Returns
    `eagle_loss`'s ``(loss, metrics)`` with the config's ``w_reg``/``w_cls``.
    """
    inner = getattr(head, "module", head)
    cfg = inner.config
    f = target_out.hidden
    B, T = input_ids.shape
    assert f.shape[:2] == (B, T), (f.shape, input_ids.shape)
    feats_in = f[:, :-1].detach().to(inner.fc.weight.dtype)
    if inner.training and cfg.noise > 0:
        feats_in = feats_in + (torch.rand_like(feats_in) * 2 - 1) * cfg.noise
    pair_mask = None
    if attention_mask is not None:
        am = attention_mask.bool()
        pair_mask = am[:, :-1] & am[:, 1:]  # pair k needs tokens k and k+1 to be real
    pred = head(input_ids[:, 1:], feats_in, embed, attention_mask=pair_mask)  # [B, T-1, H]
    scored = torch.zeros_like(loss_mask[:, 1:], dtype=torch.bool)
    scored[:, :-1] = loss_mask[:, 2:].bool()
    if attention_mask is not None:
        scored[:, :-1] &= attention_mask[:, 2:].bool()
        scored &= pair_mask
    data_tokens = torch.cat([input_ids[:, 2:], input_ids[:, -1:]], dim=1)  # [B, T-1]: pair k's x_{k+2}
    return eagle_loss(
        pred,
        f[:, 1:].detach(),
        lm_head,
        scored,
        cfg.w_reg,
        cfg.w_cls,
        softcap=inner.logit_softcap,
        logit_scale=inner.logit_scale,
        data_tokens=data_tokens,
    )


def eagle_loss(
    pred_feats: Tensor,
    target_feats: Tensor,
    lm_head: nn.Module,
    loss_mask: Tensor,
    w_reg: float = 1.0,
    w_cls: float = 0.1,
    target_logits: Tensor | None = None,
    softcap: float | None = None,
    logit_scale: float = 1.0,
    data_tokens: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """EAGLE loss over aligned predictions.

    pred_feats: [B, T, H] f̂ (with gradient); target_feats: [B, T, H] the f it should equal.
    lm_head: the target's lm_head (draft logits, and target logits unless ``target_logits`` is given).
    loss_mask: [B, T] bool/0-1, positions to score. target_logits: optional [B, T, V] target logits
    aligned with ``target_feats`` (already scaled and soft-capped). softcap, logit_scale: the target's
    final-logit soft-cap and scale (`target_logit_transform`).

    loss = w_reg · mean_n SmoothL1(f̂_n, f_n) (mean over H) + w_cls · mean_n CE(softmax(z_n), log_softmax(ẑ_n))
    with z = target logits, ẑ = softcap(scale · lm_head(f̂)), over the N scored positions (0 if N = 0, still
    connected to the graph). metrics (detached scalars): ``loss``, ``loss_reg``, ``loss_cls``, ``top1``
    (fraction where argmax ẑ == argmax z) and ``count`` (N); weight by ``count`` to combine batches. With
    ``data_tokens`` ([B, T] ids aligned with the positions: the data's token each one predicts), also
    ``top1_data`` (fraction where argmax ẑ is that token).
    """
    valid = loss_mask.bool()
    pred = pred_feats[valid]  # [N, H]
    tgt = target_feats[valid].to(pred.dtype)
    n = pred.shape[0]
    denom = max(n, 1)
    reg = F.smooth_l1_loss(pred.float(), tgt.float(), reduction="none").mean(-1).sum() / denom
    draft_logits = soft_cap(lm_head(pred.to(lm_head.weight.dtype)).float() * logit_scale, softcap)  # [N, V]
    with torch.no_grad():
        if target_logits is not None:
            tl = target_logits[valid].float()
        else:
            tl = soft_cap(lm_head(tgt.to(lm_head.weight.dtype)).float() * logit_scale, softcap)
        tp = torch.softmax(tl, -1)
    cls = -(tp * torch.log_softmax(draft_logits, -1)).sum(-1).sum() / denom
    loss = w_reg * reg + w_cls * cls
    with torch.no_grad():
        top1 = (draft_logits.argmax(-1) == tl.argmax(-1)).float().sum() / denom
        top1_data = None
        if data_tokens is not None:
            top1_data = (draft_logits.argmax(-1) == data_tokens[valid]).float().sum() / denom
    metrics = {
        "loss": loss.detach(),
        "loss_reg": reg.detach(),
        "loss_cls": cls.detach(),
        "top1": top1,
        "count": torch.tensor(float(n), device=pred.device),
    }
    if top1_data is not None:
        metrics["top1_data"] = top1_data
    return loss, metrics


def _objective_loss(heads: nn.Module, out: TargetOutput, batch: dict[str, Tensor], inputs: LossInputs):
    """`Objective.loss` for EAGLE-1/2: `eagle_train_forward`, its metrics as [1] tensors."""
    loss, m = eagle_train_forward(
        heads,
        out,
        batch["input_ids"],
        batch["attention_mask"],
        batch["loss_mask"],
        inputs.lm_head,
        inputs.embed,
    )
    keys = ("loss", "top1", "count", "loss_reg", "loss_cls", "top1_data")
    return loss, {k: m[k].detach().float().reshape(1) for k in keys}


register(
    HeadType(
        name="eagle",
        config=EagleConfig,
        module=EagleHead,
        objective=Objective(
            position_name="step",
            positions=lambda cfg: 1,
            weights=lambda cfg, decay: [1.0],  # the position's loss already is w_reg * reg + w_cls * cls
            target_kwargs=lambda cfg: {},
            loss=_objective_loss,
        ),
        proposer="eagle",
        tree="dynamic",
    )
)
