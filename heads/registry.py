"""The head-type registry: one `HeadType` entry names everything that differs between draft methods.

``train``, ``infer``, the scripts, the model card and the exports ask `get(head_type)` instead of
branching on the head type. A head type's files register its entry at import (`register`); importing
`heads` imports every built-in head type. Adding a method = its files + one ``register(HeadType(...))``
(docs/design.md §13 has a worked example).

What an entry carries:

- ``config`` / ``module``: the `heads.base.HeadConfig` subclass saved as ``config.json``, and the
  ``nn.Module`` built from it (``module(config)``; ``module.for_target(target, **options)`` for a new one).
- ``objective``: how training turns one frozen-target forward into a loss (`Objective`).
- ``proposer``: the name of the `infer` proposer that drafts with these heads (``"static_tree"`` for
  Medusa's fixed rank tree, ``"eagle"`` for EAGLE-2 dynamic trees, ``"parallel"`` for P-EAGLE's one
  forward per step), or a function of the heads' config giving that name (`HeadType.proposer_for`), so
  an entry whose options change how it drafts picks the proposer itself. `heads` never imports `infer`;
  `infer` keeps the name -> class table.
- ``tree``: what a tuned inference setting holds for these heads: ``"static"`` (rank paths) or
  ``"dynamic"`` (an EAGLE-2 budget: total_tokens, depth, draft_top_k).
- ``draft_defaults``: ``fn(config) -> dict`` of `infer.InferSettings` fields that depend on the heads'
  config (P-EAGLE heads draft their K depths: ``{"depth": K}``), under any settings saved with the heads;
  None: the library's defaults.
- ``exports``: export format name -> `ExportFormat` (the mapping to an engine's layout; `heads.convert`).
- ``export_notes``: format name -> why this head type does not export to it (said in the refusal).
- ``unserved``: (target ``model_type``, format name) -> why no engine serves this head type's export
  for such a target (read from the engines' model classes; `heads.engine_export` refuses these pairs).
- ``detect``: ``fn(raw_config) -> format name or None``: which of this method's foreign layouts a
  ``config.json`` without selfspec's ``head_type`` is (`heads.convert.detect_format` asks every entry);
  ``import_state``: ``fn(directory, raw_config, target) -> module`` reads such a checkpoint, or None.
- ``title``, ``tags``, ``predicts``: the model card's name of the method, its Hub tags, and what draft
  position k predicts (a row label of the card's accuracy table, `heads.card`).
- ``joint_training``: whether Medusa-2 joint training (`train.medusa2`: a LoRA on the target trained
  with the heads) applies: the heads map the target's last hidden state and lm_head to [K, B, T, V]
  logits that `heads.medusa.medusa_loss` scores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn


@dataclass(frozen=True)
class LossInputs:
    """What a head type's loss may read besides the heads, the target forward and the batch.

    lm_head / embed: the target's ``get_output_embeddings()`` / ``get_input_embeddings()``.
    """

    lm_head: nn.Module
    embed: nn.Module


@dataclass(frozen=True)
class Objective:
    """How training computes a head type's loss and metrics from one frozen-target forward.

    position_name: what one draft position is called in logs (``"head"`` for Medusa, ``"step"`` else).
    positions(config) -> K: the draft positions scored per batch (metrics are [K] tensors).
    weights(config) -> [K] floats: the weight of each position's loss in the total.
    target_kwargs(config) -> kwargs for `heads.graft.run_target` (e.g. ``aux_layers``), plus
        ``"all_logits": True`` when the loss reads the target's logits at every position.
    loss(heads, target_out, batch, inputs) -> ``(loss, metrics)``: ``loss`` a scalar with gradient;
        ``metrics`` detached [K] tensors ``count`` (scored positions) and averages ``loss``, ``top1``
        (and any extra per-position metric of the head type). ``batch`` holds ``input_ids``,
        ``attention_mask``, ``loss_mask`` [B, T] as `train.data` makes them.
    top1_vs: what the loss's ``top1`` compares the draft with: ``"target"`` (the target's own predictions,
        as EAGLE's losses are computed against the target) or ``"data"`` (the data's tokens, Medusa's).
        A ``"data"`` loss must read ``batch["input_ids"]`` only as labels (its inputs come from the target
        forward): the held-out eval then also scores it against the target by passing the target's greedy
        tokens as the labels (`train.evaluation.eval_batch`).
    """

    position_name: str
    positions: Callable[[Any], int]
    weights: Callable[[Any], list[float]]
    target_kwargs: Callable[[Any], dict[str, Any]]
    loss: Callable[[nn.Module, Any, dict[str, Tensor], LossInputs], tuple[Tensor, dict[str, Tensor]]]
    top1_vs: str = "target"

    def __post_init__(self) -> None:
        if self.top1_vs not in ("target", "data"):
            raise ValueError(f"Objective.top1_vs must be 'target' or 'data', got {self.top1_vs!r}")


@dataclass(frozen=True)
class ExportInputs:
    """What an export may need besides the heads' state and config dict.

    target_lm_head: the target's lm_head weight [V, H] in the heads' dtype (checked against their sizes),
    or None; target: the target model or None; speculative_tokens: the proposal length a format records.
    """

    target_lm_head: Tensor | None = None
    target: nn.Module | None = None
    speculative_tokens: int = 3


@dataclass(frozen=True)
class Exported:
    """One exported checkpoint: ``config.json``'s dict, the tensors, the weights file name, and
    ``pickle_copy``: a name under which the tensors are also written with ``torch.save`` (for a loader
    that reads only that file), or None."""

    config: dict[str, Any]
    state: dict[str, Tensor]
    weights_name: str = "model.safetensors"
    pickle_copy: str | None = None


def _never(cfg: dict[str, Any]) -> bool:
    return False


@dataclass(frozen=True)
class ExportFormat:
    """An export of one head type to one engine format.

    write(state, cfg, inputs) -> `Exported`: ``state`` the heads' detached tensors, ``cfg`` their
        ``config.json`` dict, ``inputs`` an `ExportInputs`.
    needs_lm_head(cfg): the format must hold the target's lm_head (so the target must be loaded).
    needs_embed_scale(cfg): the export needs the target's embedding scale, which these heads do not record.
    """

    write: Callable[[dict[str, Tensor], dict[str, Any], ExportInputs], Exported]
    needs_lm_head: Callable[[dict[str, Any]], bool] = _never
    needs_embed_scale: Callable[[dict[str, Any]], bool] = _never


@dataclass(frozen=True)
class HeadType:
    name: str
    config: type
    module: type[nn.Module]
    objective: Objective
    proposer: str | Callable[[Any], str]
    tree: str
    exports: dict[str, ExportFormat] = field(default_factory=dict)
    import_state: Callable[..., nn.Module] | None = None
    detect: Callable[[dict[str, Any]], str | None] | None = None
    export_notes: dict[str, str] = field(default_factory=dict)
    unserved: dict[tuple[str, str], str] = field(default_factory=dict)
    title: str = ""
    tags: tuple[str, ...] = ()
    predicts: Callable[[int], str] | None = None
    joint_training: bool = False
    draft_defaults: Callable[[Any], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.tree not in ("static", "dynamic"):
            raise ValueError(f"HeadType {self.name!r}: tree must be 'static' or 'dynamic', got {self.tree!r}")
        if getattr(self.config, "head_type", None) != self.name:
            raise ValueError(f"HeadType {self.name!r}: config class has head_type {self.config.head_type!r}")

    def proposer_for(self, config) -> str:
        """The name of the proposer that drafts with heads of this ``config``."""
        return self.proposer(config) if callable(self.proposer) else self.proposer


REGISTRY: dict[str, HeadType] = {}


def register(entry: HeadType) -> HeadType:
    REGISTRY[entry.name] = entry
    return entry


def get(head_type: str, what: str = "head_type") -> HeadType:
    """The entry for ``head_type``; a ``ValueError`` naming the known ones if there is none."""
    entry = REGISTRY.get(head_type) if isinstance(head_type, str) else None
    if entry is None:
        raise ValueError(f"unknown {what} {str(head_type)[:40]!r}; known head types: {sorted(REGISTRY)}")
    return entry


def of(heads: nn.Module) -> HeadType:
    """The entry of a heads module (or a wrapper with ``.module``, as accelerate/DeepSpeed make)."""
    inner = getattr(heads, "module", heads)
    return get(inner.config.head_type)
