"""One model step of training: the frozen target's forward and the head type's loss on it.

Everything that depends on the head type comes from its `heads.registry` entry (`Objective`): how many
draft positions K it scores (Medusa head k, EAGLE-3 TTT step k; EAGLE-1/2 has one), their loss weights,
the target forward it needs, and the loss. The loop, evaluation, checkpoints and logging only see
``(loss, metrics)``.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor

from heads import registry
from heads.graft import TargetOutput, run_target, unwrap_peft
from heads.registry import LossInputs
from train.medusa2 import joint_batch_loss
from train.run import Run


def num_positions(cfg: Any) -> int:
    """K, the draft positions scored per pair (the head type's `heads.registry.Objective.positions`)."""
    return registry.get(cfg.head_type).objective.positions(cfg)


def position_weights(run: Run) -> list[float]:
    """Weight of each position's loss in the total (what `batch_loss` sums)."""
    cfg = run.head_config
    return registry.get(cfg.head_type).objective.weights(cfg)


def position_name(run: Run) -> str:
    return registry.get(run.head_config.head_type).objective.position_name


def target_forward(run: Run, batch: dict[str, Tensor]) -> TargetOutput:
    """The frozen target over the batch (no grad): `heads.graft.TargetOutput`. EAGLE-3 reads its aux layers
    and all its logits; the others only the last hidden state, so the target skips the full logits.
    A batch of offline features (`train.features.collate_features`) already carries them."""
    if "hidden" in batch or "aux" in batch:
        aux = tuple(batch["aux"].chunk(3, dim=-1)) if "aux" in batch else ()
        return TargetOutput(
            logits=batch.get("logits"), hidden=batch.get("hidden"), aux=aux, top=batch.get("top")
        )

    kwargs: dict[str, Any] = {"use_cache": False}
    kwargs |= registry.get(run.head_config.head_type).objective.target_kwargs(run.head_config)
    all_logits = kwargs.pop("all_logits", False)
    if not all_logits and "logits_to_keep" in inspect.signature(unwrap_peft(run.target).forward).parameters:
        kwargs["logits_to_keep"] = 1  # a PeftModel's forward is (*args, **kwargs): ask the model inside
    with torch.no_grad():
        return run_target(run.target, batch["input_ids"], batch["attention_mask"], **kwargs)


def loss_inputs(run: Run) -> LossInputs:
    return LossInputs(lm_head=run.lm_head, embed=run.target.get_input_embeddings())


def batch_loss(run: Run, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
    """Target forward + heads + loss for one batch.

    Returns ``(loss, metrics)``: ``loss`` a scalar with gradient; ``metrics`` detached [K] tensors, one
    entry per draft position: ``count`` (scored positions) and averages over them: ``loss`` (that
    position's loss, unweighted), ``top1`` (+ ``top5`` for Medusa, ``loss_reg``/``loss_cls`` for EAGLE).
    """
    if run.cfg.joint.enabled:
        return joint_batch_loss(run, batch)
    out = target_forward(run, batch)
    return registry.get(run.head_config.head_type).objective.loss(run.heads, out, batch, loss_inputs(run))
