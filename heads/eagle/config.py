"""The EAGLE-1/2 head config (what ``config.json`` holds besides `heads.base.HeadConfig`'s fields) and its
block of a training recipe (``heads.eagle``)."""

from __future__ import annotations

import dataclasses
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
from heads.vocab import check_draft_vocab_size


@dataclass
class EagleConfig(HeadConfig):
    """EAGLE-1/2 head config.

    target_config: the target's text config as a dict (``target.config.get_text_config().to_dict()``);
        the draft layer is rebuilt from it, so loading never needs the target itself.
    draft_layer: ``"llama"`` (default: a Llama decoder layer sized from the target, which the engines
        rebuild) or ``"target"`` (a layer of the target's own architecture); see `heads.draft_layer`.
    draft_layer_config: the ``LlamaConfig`` keyword arguments of a ``"llama"`` layer, resolved from
        ``target_config`` by `heads.draft_layer.llama_layer_config` and saved (None for ``"target"``).
    embed_scale: the factor by which the target's embedding module scales its weight rows (Gemma:
        sqrt(H) in the weight dtype; 1.0 for most targets), measured from the target by `for_target`
        (`heads.draft_layer.target_embed_scale`) so that an export can fold it into ``fc`` without the
        target; None: not recorded (heads saved before the field existed). selfspec itself never reads it.
    bias: whether ``fc`` has a bias (EAGLE-1 checkpoints have one).
    w_reg, w_cls: weights of the SmoothL1 feature regression and of the soft-label cross-entropy.
    noise: training-time feature augmentation, f + U(-noise, noise); 0 disables it.
    draft_vocab_size: Vd, the draft's reduced vocabulary (`heads.vocab`, FR-Spec / EAGLE-3's d2t): the draft
        logits are the target lm_head's rows of the Vd most frequent training labels only, and drafting takes
        top-k over those. None (and 0 or the target's vocab size, both saved as None): the full vocabulary,
        no ``d2t``/``t2d`` in the checkpoint (the layout heads had before the option).
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
    draft_vocab_size: int | None = None

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
        n = self.draft_vocab_size
        if (n == 0 and not isinstance(n, bool)) or (self.vocab_size and n == self.vocab_size):
            self.draft_vocab_size = None  # the full vocabulary: no map, the pre-option checkpoint layout
        check_draft_vocab_size(self.draft_vocab_size, self.vocab_size)

    @property
    def draft_vocab(self) -> int:
        """Tokens the draft scores: ``draft_vocab_size``, or the target's vocab size."""
        return self.draft_vocab_size or self.vocab_size

    @property
    def model_type(self) -> str:
        return str(self.target_config.get("model_type", ""))

    def check_target(self, target: nn.Module) -> None:
        super().check_target(target)
        check_target_arch(self, target)


@dataclass
class EagleRecipe:
    """``heads.eagle`` in a training recipe: the `EagleConfig` fields a run chooses (the target's sizes and
    config come from the target)."""

    draft_layer: Literal["llama", "target"] = "llama"  # llama: served by vLLM/SGLang for any target
    bias: bool = True  # fc has a bias (EAGLE-1 checkpoints); vLLM's EAGLE-1 draft has none
    w_reg: float = 1.0  # weight of the SmoothL1 regression onto the target's next feature
    w_cls: float = 0.1  # weight of the soft-label CE against the target's next-token distribution
    noise: float = 0.1  # training-time feature noise U(-noise, noise); 0 = off
    draft_vocab_size: int | None = None  # a reduced draft vocabulary (d2t); null = the target's

    def head_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `EagleConfig`."""
        return dataclasses.asdict(self)
