"""EAGLE-3 draft head (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language
Models via Training-Time Test").

Differences from EAGLE-1/2 (`heads.eagle`): the draft reads *three* target layers instead of the last
one, predicts tokens rather than features (no regression loss), has its own final norm and its own
lm_head over a reduced draft vocabulary, and is trained on its own multi-step rollouts ("training-time
test", TTT) so that it sees at training time the inputs it gets at inference.

    g_k = fc(cat(a_low_k, a_mid_k, a_high_k))          fc: Linear(3H -> H, no bias); target features
    o_k = layer(x = g_k, attn input = cat(input_norm(embed(x_{k+1})), hidden_norm(g_k)) | pairs <= k)
    draft logits for x_{k+2} = lm_head(norm(o_k))       own norm and lm_head: [H -> draft_vocab]

**Aux layer ids** index the HF ``hidden_states`` tuple: id ``i`` is the *input* of decoder layer ``i``
(0 = the embedding output; ``L`` would be the final-normed output, which neither engine captures, and is
not allowed). vLLM's ``eagle_aux_hidden_state_layer_ids`` uses these numbers as-is (id k =
``hidden_states[k]``); SGLang captures the output of layer j = selfspec id j + 1, so selfspec id i is
SGLang id i - 1 >= -1; exporting converts. Both engines capture the three in increasing layer order, so
the ids must be distinct and strictly increasing, inside ``[0, L-1]`` (checked by `Eagle3Config`, one-line
``ValueError``). The default is EAGLE-3's ``(2, L//2, L-3)`` where that is strictly increasing (L >= 7),
else ``(0, L//2, L-1)`` (L = 3..6: (0,1,2), (0,2,3), (0,2,4), (0,3,5)). A 1- or 2-layer target has
fewer than 3 distinct layer inputs (fc is 3H -> H): its ids repeat ((0, 0, 0), (0, 1, 1)) with a
warning that no engine serves such heads; heads saved before ids were checked load with a warning.

**The layer** (``Eagle3Config.draft_layer``, see `heads.draft_layer`): a Llama decoder layer sized from
the target (``"llama"``, the default, as SpecForge and speculators build it), or one decoder layer of the
target's own architecture (``"target"``, built by `heads.eagle.build_draft_layer`, so RoPE, head_dim,
q/k norms, biases and soft-capping match; the layer needs a ``post_attention_layernorm``, which Cohere's
and Phi's parallel blocks lack). Its q/k/v (or Phi-3's fused qkv) projections are widened to take 2H,
and its ``input_layernorm`` is replaced by the fusion ``cat(input_norm(emb), hidden_norm(g))``; the
residual stream is the fused g. The three norms (``input_norm``, ``hidden_norm``, final ``norm``) are
copies of the layer's own post-attention norm. Embeddings: as `heads.eagle` (the target's embedding
module's output; Gemma's sqrt(H) scale is nearly cancelled by ``input_norm``, exactly so up to its eps).
The layer's attention kernel is `eagle3_attention` (plain softmax attention that also does the TTT
"diagonal" keys), used both in training and at inference, so the two compute the same function.

**Alignment** (the same as `heads.eagle`): pair k = (token x_{k+1}, feature g_k) sits at position id k
and predicts x_{k+2}. TTT step j >= 1 feeds, at pair k, the token x_{k+1+j} with the draft's own step
j-1 output o^{j-1}_k (pre-norm, not through fc) at position id k+j, and predicts x_{k+2+j}. Its query
attends to the step-0 keys of pairs 0..k (the real prefix) and to pair k's own keys at steps 1..j.
This is exactly what a chain of depth j+1 sees at inference (`infer.eagle_draft`): the root pair k is
committed in the draft cache with the real prefix, and the node at depth d sits at position k+d and
attends to the prefix and its ancestors. Step j at pair k is scored against the target distribution
at position k+1+j iff ``loss_mask[k+2+j]``.

**Draft vocabulary**: ``d2t`` [Vd] int64 with target_id = i + d2t[i] and ``t2d`` [V] bool (which target
ids are in the draft vocab), both buffers in the checkpoint, built by `build_vocab_map` from the
token frequencies under the loss mask (`count_tokens`). Without a draft vocab size they are the
identity. The checkpoint holds ``fc.*``, ``input_norm.*``, ``hidden_norm.*``, ``midlayer.*``,
``norm.*``, ``lm_head.*``, ``d2t``, ``t2d``; never the target's embedding or lm_head.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import inspect
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from heads.base import HeadConfig
from heads.draft_layer import target_embed_scale
from heads.eagle import (
    _CACHE_KWARGS,
    build_layer,
    causal_mask,
    check_target_arch,
    resolve_draft_layer,
    target_config_dict,
    validate_embed_scale,
    validate_target_config,
    with_legacy_draft_layer,
)
from heads.graft import TargetOutput
from heads.hub import HubMixin
from heads.registry import HeadType, LossInputs, Objective, register

ATTN_IMPLEMENTATION = "selfspec_eagle3"
_QKV_NAMES = ("q_proj", "k_proj", "v_proj", "qkv_proj")


# True while `Eagle3Config.from_dict` reads a config saved before aux ids were checked (see `check_aux_ids`).
_LEGACY_AUX_IDS = contextvars.ContextVar("selfspec_legacy_aux_ids", default=False)


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's ``(2, L//2, L-3)`` as ``hidden_states`` indices where it is strictly increasing (L >= 7),
    else ``(0, L//2, L-1)``: distinct for every L >= 3; L = 2: (0, 1, 1), L = 1: (0, 0, 0)."""
    if num_layers < 1:
        raise ValueError(f"the target needs at least one layer, got {num_layers}")
    L = num_layers
    ids = [2, L // 2, L - 3]
    if not ids[0] < ids[1] < ids[2]:
        ids = [0, L // 2, L - 1]
    return ids


def check_aux_ids(ids: list[int], L: int) -> None:
    """Raise ``ValueError`` (one line) unless ``ids`` are 3 distinct, strictly increasing inputs of layers of an
    L-layer target (0 <= id <= L-1). A target of fewer than 3 layers cannot have 3 distinct ones: there
    (and for heads saved before this check) a non-decreasing repeat only warns that no engine serves it."""
    bad = [i for i in ids if not 0 <= i < L]
    if bad:
        raise ValueError(
            f"aux_layer_ids {ids}: {bad} out of range; ids index HF hidden_states as "
            f"inputs of decoder layers, so 0 <= id <= {L - 1} for this {L}-layer target"
        )
    if ids[0] < ids[1] < ids[2]:
        return
    legacy = _LEGACY_AUX_IDS.get()
    if (L < 3 and ids == sorted(ids)) or legacy:
        why = (
            f"a {L}-layer target has no 3 distinct layer inputs" if L < 3 else "saved before ids were checked"
        )
        warnings.warn(
            f"aux_layer_ids {ids} are not strictly increasing ({why}): these EAGLE-3 heads run in "
            "infer.generate, but vLLM and SGLang capture distinct layers in increasing order and cannot serve them",
            stacklevel=4,
        )
        return
    raise ValueError(
        f"aux_layer_ids {ids} must be distinct and strictly increasing (low < mid < high): the engines "
        f"capture the layers in increasing order; e.g. {default_aux_layer_ids(L)} for this {L}-layer target"
    )


@contextlib.contextmanager
def _legacy_aux_ids():
    token = _LEGACY_AUX_IDS.set(True)
    try:
        yield
    finally:
        _LEGACY_AUX_IDS.reset(token)


@dataclass
class Eagle3Config(HeadConfig):
    """EAGLE-3 head config.

    target_config: the target's text config as a dict (as `heads.eagle.EagleConfig`).
    draft_layer, draft_layer_config: the draft decoder layer, as `heads.eagle.EagleConfig` (``"llama"``
        by default; a config.json without the key loads as ``"target"``).
    embed_scale: the target embedding module's scale, as `heads.eagle.EagleConfig` (recorded for exports).
    aux_layer_ids: three ``hidden_states`` indices (inputs of those decoder layers, low < mid < high,
        see `check_aux_ids`); None = `default_aux_layer_ids` (resolved as soon as ``target_config`` is
        known, and saved resolved).
    draft_vocab_size: size of the draft's own vocabulary; None (or the target's vocab size) = no mapping.
    ttt_steps: training-time-test unroll length K; step_weight: step j's loss weight is step_weight**j.
    noise: training-time augmentation of the target features, a + U(-noise, noise); 0 (default) disables
        it. EAGLE-3 relies on TTT instead, and its aux features are un-normed, of layer-dependent scale.
    """

    head_type: ClassVar[str] = "eagle3"
    target_config: dict[str, Any] = field(default_factory=dict)
    draft_layer: Literal["llama", "target"] = "llama"
    draft_layer_config: dict[str, Any] | None = None
    embed_scale: float | None = None
    aux_layer_ids: list[int] | None = None
    draft_vocab_size: int | None = None
    ttt_steps: int = 7
    step_weight: float = 0.8
    noise: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        validate_target_config(self.target_config)
        validate_embed_scale(self.embed_scale)
        resolve_draft_layer(self)
        if self.ttt_steps < 1:
            raise ValueError(f"ttt_steps must be >= 1, got {self.ttt_steps}")
        if not self.step_weight > 0:
            raise ValueError(f"step_weight must be > 0, got {self.step_weight}")
        if self.noise < 0:
            raise ValueError(f"noise must be >= 0 (0 disables it), got {self.noise}")
        if self.draft_vocab_size is not None:
            if self.draft_vocab_size < 1:
                raise ValueError(f"draft_vocab_size must be >= 1 or None, got {self.draft_vocab_size}")
            if self.vocab_size and self.draft_vocab_size > self.vocab_size:
                raise ValueError(
                    f"draft_vocab_size {self.draft_vocab_size} > the target's vocab size {self.vocab_size}"
                )
        if self.aux_layer_ids is not None:
            ids = list(self.aux_layer_ids)
            if len(ids) != 3 or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise ValueError(f"aux_layer_ids must be 3 ints (low, mid, high), got {self.aux_layer_ids}")
            self.aux_layer_ids = ids
        L = self.num_target_layers
        if L is None:
            return
        if self.aux_layer_ids is None:
            self.aux_layer_ids = default_aux_layer_ids(L)
        check_aux_ids(self.aux_layer_ids, L)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Eagle3Config:
        """As `HeadConfig.from_dict`. A config saved before ``draft_layer`` existed loads as ``"target"``,
        and its aux ids, saved before they were checked, only warn if they repeat or are out of order."""
        if "draft_layer" in d:
            return super().from_dict(d)
        with _legacy_aux_ids():
            return super().from_dict(with_legacy_draft_layer(d))

    @property
    def num_target_layers(self) -> int | None:
        for key in ("num_hidden_layers", "n_layer"):  # GPT-2's config says n_layer
            n = self.target_config.get(key)
            if n is not None:
                return int(n)
        return None

    @property
    def draft_vocab(self) -> int:
        """Rows of the draft lm_head: ``draft_vocab_size``, or the target's vocab size."""
        return self.draft_vocab_size or self.vocab_size

    def check_target(self, target: nn.Module) -> None:
        super().check_target(target)
        check_target_arch(self, target)
        from heads.graft import num_layers

        if self.num_target_layers is not None and num_layers(target) != self.num_target_layers:
            raise ValueError(
                f"eagle3 heads were trained on a {self.num_target_layers}-layer target "
                f"({self.base_model_name_or_path!r}) and read its layers {self.aux_layer_ids}; "
                f"this target has {num_layers(target)} layers"
            )


# ---------------------------------------------------------------------------------------------- vocab map


def count_tokens(input_ids: Tensor, loss_mask: Tensor, vocab_size: int) -> Tensor:
    """[V] int64 counts of the token ids at positions with ``loss_mask == 1`` (sum these over a dataset)."""
    ids = input_ids[loss_mask.bool()].reshape(-1).to(torch.long)
    return torch.bincount(ids.cpu(), minlength=vocab_size)[:vocab_size]


def build_vocab_map(token_counts: Tensor, draft_vocab_size: int | None) -> tuple[Tensor, Tensor]:
    """(d2t [Vd] int64, t2d [V] bool) for the ``draft_vocab_size`` most frequent target tokens.

    token_counts: [V] counts (e.g. `count_tokens` over the training data). Ties go to the lower id;
    unseen tokens fill the vocabulary last, by id. Draft ids follow target-id order, so
    ``target_id = i + d2t[i]`` with ``d2t`` non-decreasing and >= 0. None or V gives the identity.
    """
    V = token_counts.numel()
    Vd = V if draft_vocab_size is None else int(draft_vocab_size)
    if not 1 <= Vd <= V:
        raise ValueError(f"draft_vocab_size must be in [1, {V}], got {draft_vocab_size}")
    order = torch.sort(token_counts.reshape(-1).cpu(), descending=True, stable=True).indices
    chosen = order[:Vd].sort().values
    d2t = chosen - torch.arange(Vd)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[chosen] = True
    return d2t, t2d


# ---------------------------------------------------------------------------------------------- attention


def _grouped(x: Tensor, kv_heads: int) -> Tensor:
    """[B, h, T, D] -> [B, h_kv, G·T, D] (G = h / h_kv): query head h reads kv head h // G (GQA), so the
    G heads of a group share one matmul against the un-repeated keys/values."""
    B, h, T, D = x.shape
    return x.reshape(B, kv_heads, (h // kv_heads) * T, D)


def eagle3_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    softcap: float | None = None,
    eagle3_ttt: tuple[dict[int, tuple[Tensor, Tensor]], int] | None = None,
    **_: Any,
) -> tuple[Tensor, None]:
    """The draft layer's attention kernel (registered as ``"selfspec_eagle3"`` in transformers'
    ``AttentionInterface``; the layer's own q/k/v/o projections, q/k norms and RoPE run around it).

    query: [B, h, T, D]; key/value: [B, h_kv, S, D]; attention_mask: additive [B or 1, 1, T, S] or None.
    softmax(q·kᵀ·scaling, soft-capped, + mask) in fp32, as the architectures' eager kernels do. GQA
    groups the query heads per kv head (`_grouped`) instead of repeating the keys and values.

    eagle3_ttt = (store, j): TTT step j. ``store`` maps step -> (keys, values) [B, h_kv, T, D] of that
    step, aligned with the queries; this call stores its own keys under j. Then the keys are the step-0
    keys of every pair (masked by ``attention_mask``, the causal pair mask) plus, for query t, the keys
    of pair t itself at steps 1..j (one extra score per earlier step: no (K·T)² mask). Gradients flow
    through the stored keys into earlier steps; gradient checkpointing of the draft layer is therefore
    not supported (a recomputed step would see earlier steps' keys without their graph).
    """
    if scaling is None:
        scaling = module.head_dim**-0.5
    extra: list[tuple[Tensor, Tensor]] = []
    if eagle3_ttt is not None:
        store, step = eagle3_ttt
        store[step] = (key, value)
        key, value = store[0]
        extra = [store[i] for i in range(1, step + 1)]
    B, h, T, D = query.shape
    kv = key.shape[1]
    S = key.shape[2]
    q = _grouped(query, kv)  # [B, h_kv, G·T, D]
    scores = torch.matmul(q, key.transpose(2, 3)).view(B, h, T, S) * scaling  # [B, h, T, S]
    if extra:
        q5 = q.view(B, kv, h // kv, T, D)
        diag = torch.stack([(q5 * ke[:, :, None]).sum(-1) for ke, _ in extra], -1).view(B, h, T, -1)
        diag = diag * scaling  # [B, h, T, j]: query t against pair t's keys at steps 1..j
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
        if extra:
            diag = torch.tanh(diag / softcap) * softcap
    if attention_mask is not None:
        scores = scores + attention_mask
    if extra:
        scores = torch.cat([scores, diag], -1)  # [B, h, T, S + j]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    out = torch.matmul(_grouped(probs[..., :S], kv), value).view(B, kv, h // kv, T, D)
    for i, (_, ve) in enumerate(extra):
        out = out + probs[..., S + i].reshape(B, kv, h // kv, T, 1) * ve[:, :, None]
    return out.view(B, h, T, D).transpose(1, 2).contiguous(), None


def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, eagle3_attention)


# ---------------------------------------------------------------------------------------------- head


class _FusedInput(nn.Module):
    """Stands in for the layer's ``input_layernorm``: g -> cat(input_norm(emb), hidden_norm(g)) [.., 2H].

    The decoder layer calls its input norm with the residual stream only, so `Eagle3Head` hands the
    embedding over through ``self.emb`` for the duration of one layer call. The norms are the head's
    (kept out of this module's parameters so each is saved once, under ``input_norm``/``hidden_norm``).
    """

    def __init__(self, head: Eagle3Head) -> None:
        super().__init__()
        self.__dict__["head"] = head
        self.emb: Tensor | None = None

    def forward(self, g: Tensor) -> Tensor:
        assert self.emb is not None, "the fused input norm runs inside Eagle3Head.forward only"
        return torch.cat([self.head.input_norm(self.emb), self.head.hidden_norm(g)], dim=-1)


class Eagle3Head(HubMixin, nn.Module):
    """``fc`` + one widened decoder layer (Llama, or the target's own) + own norm and lm_head; see the
    module docstring."""

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        if config.hidden_size <= 0 or config.vocab_size <= 0 or not config.target_config:
            raise ValueError(
                "Eagle3Config needs the target's hidden_size, vocab_size and target_config "
                "(use Eagle3Head.for_target)"
            )
        self.config = config
        H, V, Vd = config.hidden_size, config.vocab_size, config.draft_vocab
        layer, rotary, layer_config = build_layer(config)
        norm = getattr(layer, "post_attention_layernorm", None)  # the layer's norm class, eps and init
        if not isinstance(norm, nn.Module):
            raise NotImplementedError(
                f"EAGLE-3 with the target's own {type(layer).__name__} (draft_layer: target) needs a "
                "post_attention_layernorm, which its parallel attention/MLP block lacks; use "
                "heads.options.draft_layer: llama"
            )
        _register_attention()
        layer_config._attn_implementation = ATTN_IMPLEMENTATION  # the layer's attention reads it per call
        self.layer_config = layer_config
        std = getattr(layer_config, "initializer_range", 0.02)
        attn = layer.self_attn
        widened = 0
        for name in _QKV_NAMES:
            old = getattr(attn, name, None)
            if isinstance(old, nn.Linear):
                new = nn.Linear(2 * H, old.out_features, bias=old.bias is not None)
                nn.init.normal_(new.weight, std=std)
                if new.bias is not None:
                    nn.init.zeros_(new.bias)
                setattr(attn, name, new)
                widened += 1
        if not widened:
            raise NotImplementedError(
                f"EAGLE-3: {type(attn).__name__} has none of {_QKV_NAMES} to widen to 2H inputs"
            )
        self.fc = nn.Linear(3 * H, H, bias=False)
        self.input_norm = copy.deepcopy(norm)
        self.hidden_norm = copy.deepcopy(norm)
        layer.input_layernorm = _FusedInput(self)
        self.midlayer = layer  # keys `midlayer.*`, as EAGLE-3 checkpoints name the layer
        self.norm = copy.deepcopy(norm)
        self.lm_head = nn.Linear(H, Vd, bias=False)
        nn.init.normal_(self.lm_head.weight, std=std)
        # until `set_vocab_map`: the first Vd target ids
        self.register_buffer("d2t", torch.zeros(Vd, dtype=torch.long))
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[:Vd] = True
        self.register_buffer("t2d", t2d)
        self.__dict__["rotary_emb"] = rotary  # out of the module tree, as in `heads.eagle.EagleHead`
        params = inspect.signature(layer.forward).parameters
        self._cache_kwarg = next(p for p in _CACHE_KWARGS if p in params)

    @classmethod
    def for_target(cls, target: nn.Module, **kwargs) -> Eagle3Head:
        """A fresh head for ``target``: its architecture and sizes, on its device and in its dtype."""
        from heads.graft import target_dims

        vocab, hidden = target_dims(target)
        name = getattr(target.config, "_name_or_path", None) or None
        kwargs.setdefault("embed_scale", target_embed_scale(target))
        head = cls(
            Eagle3Config(
                hidden_size=hidden,
                vocab_size=vocab,
                base_model_name_or_path=name,
                target_config=target_config_dict(target),
                **kwargs,
            )
        )
        p = target.get_output_embeddings().weight
        return head.to(device=p.device, dtype=p.dtype)

    @property
    def aux_layer_ids(self) -> tuple[int, ...]:
        return tuple(self.config.aux_layer_ids)

    def set_vocab_map(self, d2t: Tensor, t2d: Tensor) -> None:
        """Install a `build_vocab_map` result (checked for consistency) into the ``d2t``/``t2d`` buffers."""
        Vd, V = self.d2t.shape[0], self.t2d.shape[0]
        if d2t.shape != (Vd,) or t2d.shape != (V,):
            raise ValueError(f"vocab map shapes {tuple(d2t.shape)}, {tuple(t2d.shape)} != ({Vd},), ({V},)")
        ids = torch.arange(Vd) + d2t.cpu().long()
        if not torch.equal(ids, t2d.cpu().nonzero().view(-1)):
            raise ValueError("d2t and t2d disagree: t2d must mark exactly the ids arange(Vd) + d2t, sorted")
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def to_target_ids(self, draft_ids: Tensor) -> Tensor:
        """Draft-vocab ids -> target ids (``i + d2t[i]``)."""
        return draft_ids + self.d2t[draft_ids]

    def fuse(self, aux: Tensor | tuple[Tensor, ...]) -> Tensor:
        """Target features -> g: ``fc(cat(low, mid, high))``; aux is the 3 [.., H] tensors or one [.., 3H]."""
        if isinstance(aux, (tuple, list)):
            aux = torch.cat(list(aux), dim=-1)
        return self.fc(aux.to(self.fc.weight.dtype))

    def forward(
        self,
        input_ids: Tensor,
        features: Tensor,
        embed: nn.Module,
        position_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        cache=None,
        *,
        ttt_steps: int | None = None,
        rows: list[Tensor] | None = None,
    ) -> Tensor:
        """One draft step over T pairs, or (``ttt_steps=K``) a whole training-time-test unroll.

        features: [B, T, 3H] target aux features ``cat(low, mid, high)`` (fused through ``fc`` here) or
            [B, T, H] the draft's own outputs (used as the fused g as is), told apart by width.
        input_ids: [B, T] tokens x_{k+1} of the pairs; embed: the target's input embedding module.
        position_ids, attention_mask, cache: as `heads.eagle.EagleHead.forward`.
        Returns o: [B, T, H], pre-norm draft outputs (``logits(o)`` scores x_{k+2}).

        TTT (training): input_ids [B, N + K - 1] with input_ids[:, k] = x_{k+1} (step j reads
        input_ids[:, j : j + N]), features [B, N, 3H], attention_mask None or the [B, N] pair mask,
        no cache. Returns logits [K, B, N, draft_vocab] in the head's dtype (`eagle3_loss` upcasts the
        scored rows): step j at pair k predicts x_{k+2+j}. They are computed inside this call so that a
        DDP/DeepSpeed wrapper sees one forward. ``rows`` (training): K bool masks [B, n_j] (n_j <= N, the
        scored pairs of step j, `ttt_scored`); then only those rows go through the final norm and the
        lm_head, and the result is the packed [M, draft_vocab], step 0's rows first, each step's in
        (b, k) order (as `_target_rows` reads them): the norm is per row, so this is the same function
        on fewer rows.
        """
        if ttt_steps is not None:
            outs = self._ttt_outputs(input_ids, features, embed, attention_mask, ttt_steps)
            if rows is None:
                return self.lm_head(self.norm(torch.stack(outs)))
            if len(rows) != ttt_steps:
                raise ValueError(f"rows needs one mask per TTT step ({ttt_steps}), got {len(rows)}")
            picked = torch.cat([o[:, : r.shape[1]][r] for o, r in zip(outs, rows, strict=True)])
            return self.lm_head(self.norm(picked))
        B, T = input_ids.shape
        assert features.shape[:2] == (B, T), (input_ids.shape, features.shape)
        dtype = self.fc.weight.dtype
        past_len = cache.get_seq_length() if cache is not None else 0
        g = self._features(features)
        if position_ids is None:
            position_ids = (torch.arange(T, device=g.device) + past_len)[None]
        if attention_mask is None or attention_mask.dim() == 2:
            attention_mask = causal_mask(attention_mask, T, past_len, dtype, g.device)
        else:
            attention_mask = attention_mask.to(dtype)
        return self._layer(input_ids, g, embed, position_ids, attention_mask, cache=cache)

    def ttt_unroll(
        self,
        input_ids: Tensor,
        features: Tensor,
        embed: nn.Module,
        pair_mask: Tensor | None,
        steps: int,
    ) -> Tensor:
        """The TTT rollout (see `forward`): [K, B, N, H] pre-norm outputs o^j_k.

        Step 0 is the ordinary causal forward over the N pairs (token x_{k+1}, g_k) at positions k. Step
        j >= 1 runs the pairs (x_{k+1+j}, o^{j-1}_k) at positions k + j; `eagle3_attention` lets each
        attend to the step-0 keys of pairs <= k and to its own keys at steps 1..j. Memory O(K·N²).
        """
        return torch.stack(self._ttt_outputs(input_ids, features, embed, pair_mask, steps))

    def _ttt_outputs(
        self, input_ids: Tensor, features: Tensor, embed: nn.Module, pair_mask: Tensor | None, steps: int
    ) -> list[Tensor]:
        """`ttt_unroll` as a list of K [B, N, H] (no stacked copy)."""
        B, N = features.shape[:2]
        if input_ids.shape != (B, N + steps - 1):
            raise ValueError(
                f"TTT input_ids must be [B, N + K - 1] = {(B, N + steps - 1)}, got {input_ids.shape}"
            )
        dtype = self.fc.weight.dtype
        g = self._features(features)
        mask = causal_mask(pair_mask, N, 0, dtype, g.device)  # step-0 keys, for every step
        pos = torch.arange(N, device=g.device)[None]
        store: dict[int, tuple[Tensor, Tensor]] = {}
        outs = []
        for j in range(steps):
            g = self._layer(input_ids[:, j : j + N], g, embed, pos + j, mask, ttt=(store, j))
            outs.append(g)
        return outs

    def _features(self, features: Tensor) -> Tensor:
        H = self.config.hidden_size
        if features.shape[-1] == 3 * H:
            return self.fuse(features)
        if features.shape[-1] != H:
            raise ValueError(
                f"features must be [.., 3H] (target aux) or [.., H] (draft), got {features.shape}"
            )
        return features.to(self.fc.weight.dtype)

    def _layer(self, input_ids, g, embed, position_ids, attention_mask, cache=None, ttt=None) -> Tensor:
        if self.rotary_emb.inv_freq.device != g.device:
            self.rotary_emb.to(g.device)
        pos_emb = self.rotary_emb(g, position_ids)
        extra = {} if ttt is None else {"eagle3_ttt": ttt}
        fused = self.midlayer.input_layernorm
        fused.emb = embed(input_ids).to(g.dtype)
        try:
            return self.midlayer(
                g,
                attention_mask=attention_mask,
                position_ids=position_ids,
                position_embeddings=pos_emb,
                **{self._cache_kwarg: cache},
                **extra,
            )
        finally:
            fused.emb = None

    def logits(self, feats: Tensor, lm_head: nn.Module | None = None) -> Tensor:
        """feats: [..., H] pre-norm outputs -> float32 draft-vocab logits [..., Vd] (own norm and lm_head;
        ``lm_head`` is accepted for the proposer's EAGLE-1/2 call signature and ignored)."""
        return self.lm_head(self.norm(feats)).float()


# ---------------------------------------------------------------------------------------------- training


def eagle3_train_forward(
    head: nn.Module,
    target_out: TargetOutput,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    loss_mask: Tensor,
    target_logits: Tensor | None,
    embed: nn.Module,
) -> tuple[Tensor, dict[str, Tensor]]:
    """One training step's EAGLE-3 TTT loss from a (no-grad) target forward over the batch.

    head: an `Eagle3Head`, or the wrapper accelerate/DDP/DeepSpeed put around it (called once).
    target_out: `heads.graft.run_target(..., aux_layers=head.aux_layer_ids)` output; ``.aux`` is read.
    input_ids, attention_mask, loss_mask: [B, T] as ``train.data`` makes them.
    target_logits: [B, T, V] the target's (soft-capped) logits at every position (so the target must
        run with all logits kept); None = ``target_out.logits``.
    embed: the target's ``get_input_embeddings()``.

    Pairs k = 0..T-2 are (x_{k+1}, a_k + U(-noise, noise)); the unroll has ``ttt_steps`` steps (the
    tokens past the end of a row are padding, never scored, and reach no scored query). Only the scored
    rows of each step (`ttt_scored`) get draft logits, packed (`Eagle3Head.forward` with ``rows``).
    Returns what `eagle3_loss` returns for the full [K, B, N, Vd] logits.
    """
    inner = getattr(head, "module", head)
    cfg = inner.config
    K = cfg.ttt_steps
    B, T = input_ids.shape
    if len(target_out.aux) != 3:
        raise ValueError(
            f"target_out has {len(target_out.aux)} aux states; run the target with aux_layers={inner.aux_layer_ids}"
        )
    aux = torch.cat([a.detach() for a in target_out.aux], dim=-1)[:, :-1].to(inner.fc.weight.dtype)
    assert aux.shape[:2] == (B, T - 1), (aux.shape, input_ids.shape)
    if inner.training and cfg.noise > 0:
        aux = aux + (torch.rand_like(aux) * 2 - 1) * cfg.noise
    tokens = torch.cat([input_ids[:, 1:], input_ids[:, -1:].expand(B, K - 1)], dim=1)  # [B, T-1+K-1]
    pair_mask = None
    if attention_mask is not None:
        am = attention_mask.bool()
        pair_mask = am[:, :-1] & am[:, 1:]
    scored = ttt_scored(loss_mask, attention_mask, K)
    z = head(tokens, aux, embed, attention_mask=pair_mask, ttt_steps=K, rows=scored)  # [M, Vd]
    if target_logits is None:
        target_logits = target_out.logits
    return _packed_loss(z, scored, target_logits, inner.d2t, inner.t2d, cfg.step_weight)


def ttt_scored(loss_mask: Tensor, attention_mask: Tensor | None, steps: int) -> list[Tensor]:
    """Which pairs each TTT step scores: K bool masks [B, n_j], n_j = max(T - 2 - j, 0).

    Step j at pair k predicts token k+2+j; it is scored iff k+2+j <= T-1, ``loss_mask[k+2+j]`` and the
    tokens k..k+2+j are all real (``attention_mask``; None = all real).
    """
    lm = loss_mask.bool()
    real = attention_mask.bool() if attention_mask is not None else torch.ones_like(lm)
    T = lm.shape[1]
    run = real[:, :-1] & real[:, 1:]  # [B, N] tokens k, k+1 real
    out = []
    for j in range(steps):
        n = max(T - 2 - j, 0)
        run = run[:, :n] & real[:, 2 + j : 2 + j + n]
        out.append(run & lm[:, 2 + j : 2 + j + n])
    return out


def _target_rows(target_logits: Tensor, scored: list[Tensor], t2d: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The target side of the packed rows: (p [R, Vd] float32, index [M] into p, argmax [M] over the full
    vocab).

    Row r = step j at pair (b, k) reads target position (b, 1+j+k); p = softmax(target_logits[t2d]) is
    computed once for each of the R distinct positions, not once per step.
    """
    B, T, V = target_logits.shape
    flat = [b * T + 1 + j + k for j, s in enumerate(scored) for b, k in [s.nonzero(as_tuple=True)]]
    flat = torch.cat(flat) if flat else torch.zeros(0, dtype=torch.long, device=target_logits.device)
    pos, index = torch.unique(flat, return_inverse=True)
    with torch.no_grad():
        tl = target_logits.reshape(B * T, V)
        p = torch.softmax(tl.index_select(1, t2d.nonzero().view(-1))[pos].float(), dim=-1)  # [R, Vd]
        return p, index, tl.argmax(-1)[pos][index]


class _SoftCrossEntropy(torch.autograd.Function):
    """Weighted soft-label cross-entropy over row chunks.

    forward(z [M, Vd], p [R, Vd], index [M], w [M]) -> (Σ_r w_r CE_r, CE [M], argmax z [M]) with
    CE_r = -Σ_v p_{i_r,v} log softmax(z_r)_v = lse(z_r) Σ_v p_{i_r,v} - Σ_v p_{i_r,v} z_{r,v}, i = index;
    backward: dz_r = g w_r (softmax(z_r) Σ_v p_{i_r,v} - p_{i_r}). The same function and gradient as
    log_softmax + product + sum, but each chunk of rows (about 2 MB on CPU) is finished while it is in
    cache and neither the [M, Vd] log-probabilities nor the targets gathered to the M rows exist.
    """

    @staticmethod
    def _chunk(z: Tensor) -> int:
        return max(1, (1 << 19 if z.device.type == "cpu" else 1 << 28) // max(z.shape[1], 1))

    @staticmethod
    def forward(ctx, z: Tensor, p: Tensor, index: Tensor, w: Tensor):
        M, acc = z.shape[0], torch.promote_types(z.dtype, torch.float32)  # half-precision logits upcast
        ce = torch.empty(M, device=z.device, dtype=acc)
        lse = torch.empty(M, device=z.device, dtype=acc)
        top = torch.empty(M, dtype=torch.long, device=z.device)
        step = _SoftCrossEntropy._chunk(z)
        for s in range(0, M, step):
            zc, pc = z[s : s + step].to(acc), p.index_select(0, index[s : s + step])
            lse[s : s + step] = torch.logsumexp(zc, dim=-1)
            ce[s : s + step] = lse[s : s + step] * pc.sum(-1) - (pc * zc).sum(-1)
            top[s : s + step] = zc.argmax(-1)
        ctx.save_for_backward(z, p, index, w, lse)
        ctx.mark_non_differentiable(ce, top)
        return (ce * w).sum(), ce, top

    @staticmethod
    def backward(ctx, g: Tensor, *_):
        z, p, index, w, lse = ctx.saved_tensors
        grad = torch.empty_like(z)
        gw = w * g
        step = _SoftCrossEntropy._chunk(z)
        for s in range(0, z.shape[0], step):
            pc = p.index_select(0, index[s : s + step])
            sm = (
                (z[s : s + step].to(lse.dtype) - lse[s : s + step, None])
                .exp_()
                .mul_(pc.sum(-1, keepdim=True))
            )
            grad[s : s + step] = sm.sub_(pc).mul_(gw[s : s + step, None])
        return grad, None, None, None


def _packed_loss(
    z: Tensor, scored: list[Tensor], target_logits: Tensor, d2t: Tensor, t2d: Tensor, step_weight: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """`eagle3_loss` on packed rows: z [M, Vd] draft logits of the scored rows, steps in order, rows of
    step j in (b, k) order of ``scored[j]`` [B, n_j]. All steps share one cross-entropy pass
    (`_SoftCrossEntropy`); step j's CE mean becomes the row weight step_weight**j / M_j."""
    K = len(scored)
    counts = [int(s.sum()) for s in scored]
    p, index, target_top = _target_rows(target_logits, scored, t2d)
    n = torch.tensor(counts, device=z.device)
    weights = torch.tensor([step_weight**j / max(m, 1) for j, m in enumerate(counts)], device=z.device)
    total, ce, top = _SoftCrossEntropy.apply(z, p, index, torch.repeat_interleave(weights, n))
    with torch.no_grad():
        hit = ((top + d2t[top]) == target_top).float()
        per = torch.zeros(2, K, device=z.device)
        per.index_add_(
            1, torch.repeat_interleave(torch.arange(K, device=z.device), n), torch.stack([ce, hit])
        )
        count = n.float()
        loss_step, acc = per / count.clamp(min=1)
    metrics = {
        "loss": total.detach(),
        "loss_step": loss_step,
        "top1": acc,
        "count": count,
        "simulated_accept_length": 1 + torch.cumprod(acc, 0).sum(),
    }
    return total, metrics


def eagle3_loss(
    logits: Tensor,
    target_logits: Tensor,
    loss_mask: Tensor,
    d2t: Tensor,
    t2d: Tensor,
    step_weight: float = 0.8,
    attention_mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """EAGLE-3 TTT loss over an unroll.

    logits: [K, B, N, Vd] draft logits (any float dtype; scored rows are upcast), step j at pair k
        predicting token k+2+j (N = T - 1).
    target_logits: [B, T, V]; loss_mask, attention_mask: [B, T]; d2t [Vd], t2d [V]: the vocab map.

    Step j at pair k is scored iff k+2+j <= T-1, ``loss_mask[k+2+j]`` and tokens k..k+2+j are real.
    CE_j = mean over scored (k) of -Σ_v p(v) log softmax(ẑ)(v), p = softmax(target_logits[k+1+j][t2d])
    (the target distribution restricted to the draft vocab, renormalised); loss = Σ_j step_weight**j CE_j.
    metrics (detached): ``loss`` (scalar), ``loss_step``/``top1``/``count`` [K] (top-1: draft argmax mapped
    through d2t == the target's argmax over its full vocab; weight by ``count`` to combine batches) and
    ``simulated_accept_length`` = 1 + Σ_k Π_{j<=k} top1_j (τ of a chain, bonus token included).
    Training computes only the scored rows' logits (`eagle3_train_forward`); this is the same loss.
    """
    K, B, N, Vd = logits.shape
    T = target_logits.shape[1]
    assert N == T - 1 and loss_mask.shape == (B, T), (logits.shape, target_logits.shape, loss_mask.shape)
    scored = ttt_scored(loss_mask, attention_mask, K)
    z = torch.cat([logits[j, :, : s.shape[1]][s] for j, s in enumerate(scored)])
    return _packed_loss(z, scored, target_logits, d2t, t2d, step_weight)


def _objective_loss(heads: nn.Module, out: TargetOutput, batch: dict[str, Tensor], inputs: LossInputs):
    """`Objective.loss` for EAGLE-3: the TTT unroll against the target's logits at every position."""
    loss, m = eagle3_train_forward(
        heads, out, batch["input_ids"], batch["attention_mask"], batch["loss_mask"], out.logits, inputs.embed
    )
    return loss, {"loss": m["loss_step"], "top1": m["top1"], "count": m["count"]}


register(
    HeadType(
        name="eagle3",
        config=Eagle3Config,
        module=Eagle3Head,
        objective=Objective(
            position_name="step",
            positions=lambda cfg: cfg.ttt_steps,
            weights=lambda cfg, decay: [cfg.step_weight**k for k in range(cfg.ttt_steps)],
            target_kwargs=lambda cfg: {"aux_layers": tuple(cfg.aux_layer_ids), "all_logits": True},
            loss=_objective_loss,
        ),
        proposer="eagle",
        tree="dynamic",
    )
)
