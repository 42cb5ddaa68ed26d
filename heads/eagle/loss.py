"""The EAGLE-1/2 training loss (Li et al. 2024, §4): SmoothL1 feature regression + soft-label
cross-entropy of the draft's logits against the target's, from one frozen-target forward."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from heads.draft_layer import soft_cap
from heads.graft import TargetOutput
from heads.registry import LossInputs, Objective


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
    `eagle_loss`'s ``(loss, metrics)`` with the config's ``w_reg``/``w_cls`` (and the head's draft
    vocabulary, if it has one).
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
        vocab=(inner.d2t, inner.t2d) if inner.reduced_vocab else None,
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
    vocab: tuple[Tensor, Tensor] | None = None,
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

    vocab: (d2t [Vd], t2d [V]) of a reduced draft vocabulary (`heads.vocab`), as EAGLE-3's loss: ẑ [N, Vd]
    uses only the lm_head rows of the draft vocabulary and the CE's target is the target distribution
    renormalised over it, p = softmax(z[:, t2d]); top-1 maps argmax ẑ through d2t and compares it with
    the target's argmax over its full vocabulary (so a target choice outside the draft vocabulary is a miss).
    """
    valid = loss_mask.bool()
    pred = pred_feats[valid]  # [N, H]
    tgt = target_feats[valid].to(pred.dtype)
    n = pred.shape[0]
    denom = max(n, 1)
    reg = F.smooth_l1_loss(pred.float(), tgt.float(), reduction="none").mean(-1).sum() / denom
    x = pred.to(lm_head.weight.dtype)
    if vocab is None:
        z = lm_head(x)  # [N, V]
    else:  # only the draft vocabulary's rows: [N, Vd]
        ids = torch.arange(vocab[0].shape[0], device=x.device) + vocab[0]
        bias = getattr(lm_head, "bias", None)
        z = F.linear(x, lm_head.weight.index_select(0, ids), None if bias is None else bias.index_select(0, ids))
    draft_logits = soft_cap(z.float() * logit_scale, softcap)
    with torch.no_grad():
        if target_logits is not None:
            tl = target_logits[valid].float()
        else:
            tl = soft_cap(lm_head(tgt.to(lm_head.weight.dtype)).float() * logit_scale, softcap)
        tp = torch.softmax(tl if vocab is None else tl[:, vocab[1]], -1)
    cls = -(tp * torch.log_softmax(draft_logits, -1)).sum(-1).sum() / denom
    loss = w_reg * reg + w_cls * cls
    with torch.no_grad():
        guess = draft_logits.argmax(-1)
        if vocab is not None:
            guess = guess + vocab[0][guess]  # draft ids -> target ids
        top1 = (guess == tl.argmax(-1)).float().sum() / denom
        top1_data = None
        if data_tokens is not None:
            top1_data = (guess == data_tokens[valid]).float().sum() / denom
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


OBJECTIVE = Objective(
    position_name="step",
    positions=lambda cfg: 1,
    weights=lambda cfg: [1.0],  # the position's loss already is w_reg * reg + w_cls * cls
    target_kwargs=lambda cfg: {},
    loss=_objective_loss,
)
