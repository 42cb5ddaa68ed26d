"""The EAGLE-3 training loss (Li et al. 2025, §3.3): the training-time-test unroll scored against the
target's distribution restricted to the draft vocabulary, from one frozen-target forward."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from heads.graft import TargetOutput
from heads.registry import LossInputs, Objective


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
        run with all logits kept); None = ``target_out.logits``, which offline features may store for the
        draft vocabulary only, [B, T, Vd] with the full-vocab argmax in ``target_out.top``.
    embed: the target's ``get_input_embeddings()``.

    Pairs k = 0..T-2 are (x_{k+1}, a_k + U(-noise, noise)); the unroll has ``ttt_steps`` steps (the
    tokens past the end of a row are padding, never scored, and reach no scored query). Only the scored
    rows of each step (`ttt_scored`) get draft logits, packed (`Eagle3Head.forward` with ``rows``).
    P-EAGLE (``parallel_draft`` = K): the same unroll with slots 1..K-1 fed the placeholders, so step j
    at pair k is slot j of the parallel block rooted at pair k, scored against the same target position.
    Returns what `eagle3_loss` returns for the full [K, B, N, Vd] logits.
    """
    inner = getattr(head, "module", head)
    cfg = inner.config
    K = cfg.unroll_steps  # TTT steps, or P-EAGLE's parallel slots
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
    top = None
    if target_logits is None:
        target_logits, top = target_out.logits, target_out.top
    return _packed_loss(z, scored, target_logits, inner.d2t, inner.t2d, cfg.step_weight, top)


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


def _target_rows(
    target_logits: Tensor, scored: list[Tensor], t2d: Tensor, top: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """The target side of the packed rows: (p [R, Vd] float32, index [M] into p, argmax [M] over the full
    vocab).

    Row r = step j at pair (b, k) reads target position (b, 1+j+k); p = softmax(target_logits[t2d]) is
    computed once for each of the R distinct positions, not once per step. ``target_logits`` is [B, T, V],
    or [B, T, Vd] already restricted to the draft vocab (columns in token-id order) with ``top`` [B, T]
    the argmax over the full vocab: p and the argmax only read those, so both forms give the same loss.
    """
    B, T, W = target_logits.shape
    cols = t2d.nonzero().view(-1)
    if W != t2d.numel() and (top is None or W != cols.numel()):
        raise ValueError(
            f"target logits have {W} columns: expected the vocabulary ({t2d.numel()}) or the draft "
            f"vocabulary ({cols.numel()}) with the full-vocab argmax"
        )
    flat = [b * T + 1 + j + k for j, s in enumerate(scored) for b, k in [s.nonzero(as_tuple=True)]]
    flat = torch.cat(flat) if flat else torch.zeros(0, dtype=torch.long, device=target_logits.device)
    pos, index = torch.unique(flat, return_inverse=True)
    with torch.no_grad():
        rows = target_logits.reshape(B * T, W)[pos]  # [R, W]
        if W == t2d.numel():
            row_top, rows = rows.argmax(-1), rows.index_select(1, cols)
        else:
            row_top = top.reshape(B * T)[pos]
        return torch.softmax(rows.float(), dim=-1), index, row_top[index]


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
    z: Tensor,
    scored: list[Tensor],
    target_logits: Tensor,
    d2t: Tensor,
    t2d: Tensor,
    step_weight: float,
    top: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """`eagle3_loss` on packed rows: z [M, Vd] draft logits of the scored rows, steps in order, rows of
    step j in (b, k) order of ``scored[j]`` [B, n_j]. All steps share one cross-entropy pass
    (`_SoftCrossEntropy`); step j's CE mean becomes the row weight step_weight**j / M_j."""
    K = len(scored)
    counts = [int(s.sum()) for s in scored]
    p, index, target_top = _target_rows(target_logits, scored, t2d, top)
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
        heads, out, batch["input_ids"], batch["attention_mask"], batch["loss_mask"], None, inputs.embed
    )
    return loss, {"loss": m["loss_step"], "top1": m["top1"], "count": m["count"]}


OBJECTIVE = Objective(
    position_name="step",
    positions=lambda cfg: cfg.unroll_steps,
    weights=lambda cfg: [cfg.step_weight**k for k in range(cfg.unroll_steps)],
    target_kwargs=lambda cfg: {"aux_layers": tuple(cfg.aux_layer_ids), "all_logits": True},
    loss=_objective_loss,
)
