"""The EAGLE-3 head config, its aux layer ids (see `heads.eagle3`) and its block of a training recipe
(``heads.eagle3``: the EAGLE-3.1 variant and P-EAGLE named as such); the draft vocabulary map is
`heads.vocab`'s (re-exported here)."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from torch import nn

from heads.base import HeadConfig
from heads.draft_config import (
    check_target_arch,
    resolve_draft_layer,
    validate_embed_scale,
    validate_target_config,
)
from heads.graft import num_layers
from heads.vocab import build_vocab_map, check_draft_vocab_size, count_tokens

__all__ = [
    "VARIANTS",
    "Eagle3Config",
    "Eagle3Recipe",
    "PEagleRecipe",
    "build_vocab_map",
    "check_aux_ids",
    "count_tokens",
    "default_aux_layer_ids",
]

MAX_PARALLEL_DRAFT = 32  # P-EAGLE slots per forward: bounded before anything is sized from a config.json
# EAGLE-3 variant name -> (fc_norm, norm_output); "eagle3.1" has both (`Eagle3Config.variant`)
VARIANTS: dict[str, tuple[bool, bool]] = {
    "eagle3": (False, False),
    "eagle3.1": (True, True),
    "eagle3+fc_norm": (True, False),
    "eagle3+norm_output": (False, True),
}


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
    L-layer target (0 <= id <= L-1). A target of fewer than 3 layers cannot have 3 distinct ones: there a
    non-decreasing repeat only warns that no engine serves it."""
    bad = [i for i in ids if not 0 <= i < L]
    if bad:
        raise ValueError(
            f"aux_layer_ids {ids}: {bad} out of range; ids index HF hidden_states as "
            f"inputs of decoder layers, so 0 <= id <= {L - 1} for this {L}-layer target"
        )
    if ids[0] < ids[1] < ids[2]:
        return
    if L < 3 and ids == sorted(ids):
        warnings.warn(
            f"aux_layer_ids {ids} are not strictly increasing (a {L}-layer target has no 3 distinct layer "
            "inputs): these EAGLE-3 heads run in "
            "infer.generate, but vLLM and SGLang capture distinct layers in increasing order and cannot serve them",
            stacklevel=4,
        )
        return
    raise ValueError(
        f"aux_layer_ids {ids} must be distinct and strictly increasing (low < mid < high): the engines "
        f"capture the layers in increasing order; e.g. {default_aux_layer_ids(L)} for this {L}-layer target"
    )


@dataclass
class Eagle3Config(HeadConfig):
    """EAGLE-3 head config.

    target_config: the target's text config as a dict (as `heads.eagle.EagleConfig`).
    draft_layer, draft_layer_config: the draft decoder layer, as `heads.eagle.EagleConfig` (``"llama"``
        by default).
    embed_scale: the target embedding module's scale, as `heads.eagle.EagleConfig` (recorded for exports).
    aux_layer_ids: three ``hidden_states`` indices (inputs of those decoder layers, low < mid < high,
        see `check_aux_ids`); None = `default_aux_layer_ids` (resolved as soon as ``target_config`` is
        known, and saved resolved).
    draft_vocab_size: size of the draft's own vocabulary; None (or the target's vocab size) = no mapping.
    ttt_steps: training-time-test unroll length K; step_weight: step j's loss weight is step_weight**j.
    noise: training-time augmentation of the target features, a + U(-noise, noise); 0 (default) disables
        it. EAGLE-3 relies on TTT instead, and its aux features are un-normed, of layer-dependent scale.
    fc_norm: EAGLE-3.1's per-layer input norm: g = fc(cat(n_0(low), n_1(mid), n_2(high))) with three
        RMSNorms of the layer's norm class (weights ``fc_norm.{0,1,2}``), so the three target layers enter
        ``fc`` at one scale. False (default): EAGLE-3's fc(cat(low, mid, high)).
    norm_output: EAGLE-3.1's post-norm feedback: the draft's output is h = norm(o) (its final norm applied
        once), the logits are lm_head(h), and the next draft step (TTT step or tree depth) is fed h instead
        of the pre-norm o, so the fed-back feature keeps one scale across depths. False (default): EAGLE-3
        (o is fed back, logits = lm_head(norm(o))). Both True = EAGLE-3.1 (`variant`; a recipe says
        ``heads.eagle3.variant: eagle3.1``); the names are vLLM speculators' ``Eagle3SpeculatorConfig``
        fields, which SGLang/SpecForge share.
    parallel_draft: P-EAGLE parallel drafting over K = parallel_draft depths (0 = off, else 2..32): one
        draft forward proposes all K depths of a chain, its slots 1..K-1 fed the learned placeholders
        ``mask_embed`` / ``mask_hidden`` [H] instead of a drafted token and feature (see
        `heads.eagle3.module`; a recipe's ``heads.eagle3.p_eagle.depths``). Training scores slot j as TTT
        step j (the unroll length is K, and ``ttt_steps`` is not read); the proposer drafts at most K depths.
    lm_head_init: how training starts the draft's own lm_head [draft_vocab, H]: ``"random"`` (default,
        normal(0, initializer_range), as EAGLE-3's reference code) or ``"target"``: the target lm_head's
        rows of the draft vocabulary's tokens (`Eagle3Head.init_lm_head_from`, after the vocabulary map is
        built), so the draft starts reading its features in the target's own output space.
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
    fc_norm: bool = False
    norm_output: bool = False
    parallel_draft: int = 0
    lm_head_init: Literal["random", "target"] = "random"

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
        for name in ("fc_norm", "norm_output"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        pd = self.parallel_draft
        if isinstance(pd, bool) or not isinstance(pd, int) or not (pd == 0 or 2 <= pd <= MAX_PARALLEL_DRAFT):
            raise ValueError(
                f"parallel_draft must be 0 (off) or an int in [2, {MAX_PARALLEL_DRAFT}] (depths drafted in "
                f"one forward), got {pd!r}"
            )
        if self.lm_head_init not in ("random", "target"):
            raise ValueError(f"lm_head_init must be 'random' or 'target', got {self.lm_head_init!r}")
        check_draft_vocab_size(self.draft_vocab_size, self.vocab_size)
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

    @property
    def num_target_layers(self) -> int | None:
        for key in ("num_hidden_layers", "n_layer"):  # GPT-2's config says n_layer
            n = self.target_config.get(key)
            if n is not None:
                return int(n)
        return None

    @property
    def unroll_steps(self) -> int:
        """Depths the training loss scores: ``parallel_draft`` slots (P-EAGLE), else ``ttt_steps``."""
        return self.parallel_draft or self.ttt_steps

    @property
    def variant(self) -> str:
        """``"eagle3.1"`` when both EAGLE-3.1 options are on, ``"eagle3"`` when neither, else which one is
        (the keys of `VARIANTS`)."""
        return next(name for name, flags in VARIANTS.items() if flags == (self.fc_norm, self.norm_output))

    @property
    def draft_vocab(self) -> int:
        """Rows of the draft lm_head: ``draft_vocab_size``, or the target's vocab size."""
        return self.draft_vocab_size or self.vocab_size

    def check_target(self, target: nn.Module) -> None:
        super().check_target(target)
        check_target_arch(self, target)
        if self.num_target_layers is not None and num_layers(target) != self.num_target_layers:
            raise ValueError(
                f"eagle3 heads were trained on a {self.num_target_layers}-layer target "
                f"({self.base_model_name_or_path!r}) and read its layers {self.aux_layer_ids}; "
                f"this target has {num_layers(target)} layers"
            )


@dataclass
class PEagleRecipe:
    """``heads.eagle3.p_eagle``: P-EAGLE parallel drafting (`Eagle3Config.parallel_draft`)."""

    depths: int = 8  # depths drafted in one forward; training unrolls this many steps

    def __post_init__(self) -> None:
        d = self.depths
        if isinstance(d, bool) or not isinstance(d, int) or not 2 <= d <= MAX_PARALLEL_DRAFT:
            raise ValueError(
                f"heads.eagle3.p_eagle.depths must be an int in [2, {MAX_PARALLEL_DRAFT}] (depths drafted in one "
                f"forward; p_eagle: null drafts one depth per forward), got {d!r}"
            )


@dataclass
class Eagle3Recipe:
    """``heads.eagle3`` in a training recipe: the `Eagle3Config` fields a run chooses (the target's sizes and
    config come from the target), with EAGLE-3.1 as ``variant: eagle3.1`` (`VARIANTS`: ``fc_norm`` and
    ``norm_output`` on) and P-EAGLE as the ``p_eagle`` section (``parallel_draft`` = its ``depths``)."""

    variant: Literal["eagle3", "eagle3.1", "eagle3+fc_norm", "eagle3+norm_output"] = "eagle3"
    p_eagle: PEagleRecipe | None = None  # P-EAGLE: all depths of a chain in one draft forward; null = off
    draft_layer: Literal["llama", "target"] = "llama"  # llama: served by vLLM/SGLang for any target
    draft_vocab_size: int | None = None  # draft lm_head rows (most frequent training labels); null = all
    aux_layer_ids: list[int] | None = None  # hidden_states indices fused; null = (2, L//2, L-3)
    ttt_steps: int = 7  # training-time-test unroll (not read with p_eagle)
    step_weight: float = 0.8  # step j's loss weight is step_weight**j
    noise: float = 0.0  # feature noise U(-noise, noise); 0 = off
    lm_head_init: Literal["random", "target"] = "random"  # target: start from the target's lm_head rows

    def head_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `Eagle3Config`: ``variant`` as ``fc_norm``/``norm_output``, ``p_eagle`` as
        ``parallel_draft``."""
        kwargs = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fc_norm, norm_output = VARIANTS[kwargs.pop("variant")]
        p_eagle = kwargs.pop("p_eagle")
        parallel = p_eagle.depths if p_eagle is not None else 0
        return kwargs | {"fc_norm": fc_norm, "norm_output": norm_output, "parallel_draft": parallel}
