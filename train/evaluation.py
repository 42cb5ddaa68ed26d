"""The held-out eval of a training run: loss, per-position top-1 against the data and against the target,
the simulated acceptance length τ, and the *measured* τ of greedy `infer.generate` on a few held-out
prompts (what serving will see).

Two accuracies per draft position k:

- ``top1_vs_data``: the draft's argmax equals the data's token (Medusa head k at position t: token t+2+k).
- ``top1_vs_target``: the draft's argmax equals the *target's* argmax for that token (Medusa: the target's
  prediction at position t+1+k), which is what greedy verification accepts. EAGLE and EAGLE-3 train
  against the target's distributions, so their accuracy is this one.

``sim_accept_length`` = 1 + Σ_k Π_{j<=k} top1_j of the vs-target accuracies (`train.losses.
simulated_accept_length`; of the vs-data ones only for Medusa-2 joint training, whose target changes). It
treats positions as independent and a chain as the draft, so it is only an estimate; ``measured_accept_
length`` runs the real tree drafting and verification (`measure_tau`).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from torch import Tensor

import infer
from heads import registry
from infer.generate import context_length
from train.losses import simulated_accept_length
from train.objective import batch_loss, loss_inputs, position_name, position_weights, target_forward
from train.run import deepspeed_plugin, outside_zero3_init


def _keep_rows(run, batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """Under several processes, accelerate pads the last eval batch with rows from the start of the set;
    zero their loss mask so every held-out row counts once (`gather_for_metrics` says which are real)."""
    acc = run.accelerator
    if acc.num_processes == 1:
        return batch
    B = batch["input_ids"].shape[0]
    mine = torch.arange(B, device=batch["input_ids"].device) + acc.process_index * B
    keep = torch.isin(mine, acc.gather_for_metrics(mine))
    return {**batch, "loss_mask": batch["loss_mask"] * keep[:, None].to(batch["loss_mask"].dtype)}


def target_tokens(target_logits: Tensor) -> Tensor:
    """[B, T, V] target logits (position s predicts token s+1) -> [B, T]: at s >= 1, the target's greedy
    choice for token s (its argmax at s-1); position 0, never a label, repeats the first choice."""
    choice = target_logits.argmax(-1)  # [B, T]: the target's pick for token s+1
    return torch.cat([choice[:, :1], choice[:, :-1]], dim=1)


def eval_batch(run, batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """One held-out batch's metrics ([K] tensors, ``count`` included) with the accuracies named by what
    they compare with (the head type's `heads.registry.Objective.top1_vs`). A loss scored against the
    data, on a frozen target, is also scored against the target: the same loss with the target's greedy
    tokens as the labels (one lm_head over the batch's hidden states where the forward kept no logits).
    Medusa-2's target moves, so its accuracy is only against the data."""
    objective = registry.get(run.head_config.head_type).objective
    basis = objective.top1_vs
    if basis == "target" or run.cfg.joint.enabled:
        _, m = batch_loss(run, batch)
        m = dict(m)
        m[f"top1_vs_{basis}"] = m.pop("top1")
        if "top5" in m:
            m[f"top5_vs_{basis}"] = m.pop("top5")
        if "top1_data" in m:  # EAGLE-1/2 also reports its accuracy against the data
            m["top1_vs_data"] = m.pop("top1_data")
        return m
    out = target_forward(run, batch)
    inputs = loss_inputs(run)
    _, m = objective.loss(run.heads, out, batch, inputs)
    T = batch["input_ids"].shape[1]
    logits = out.logits
    if logits is None or logits.shape[1] != T:  # argmax-equal to the (soft-capped) logits of the forward
        logits = run.lm_head(out.hidden.to(run.lm_head.weight.dtype))
    _, vs_target = objective.loss(run.heads, out, {**batch, "input_ids": target_tokens(logits)}, inputs)
    metrics = {
        "loss": m["loss"],
        "count": m["count"],
        "top1_vs_target": vs_target["top1"],
        "top1_vs_data": m["top1"],
    }
    if "top5" in m:
        metrics["top5_vs_data"] = m["top5"]
    return metrics


@torch.no_grad()
def evaluate(run) -> dict[str, Any]:
    """Held-out loss, per-position accuracies and the simulated acceptance length τ, exact across processes.

    Every metric is averaged over the scored positions of the whole held-out set (count-weighted sums,
    reduced over processes); ``loss`` = Σ_k w_k · loss_k with `position_weights`. ``top1`` is the
    accuracy the simulated τ uses (``top1_vs_target`` where there is one, module docstring), kept under
    that name for the model card; ``sim_accept_length_vs_target`` / ``_vs_data`` are τ from each.
    """
    run.heads.eval()
    names: list[str] | None = None
    totals = None  # [M, K] float64: count, then count-weighted sums of every other metric
    bb_totals = None  # Medusa-2: the adapted backbone's own next-token sums (`train.medusa2`)
    for batch in run.eval_dl:
        m = eval_batch(run, _keep_rows(run, batch))
        bb = {k: m.pop(k).double().view(1) for k in list(m) if k.startswith("backbone_")}  # Medusa-2
        bb_totals = bb if bb_totals is None else {k: bb_totals[k] + v for k, v in bb.items()}
        names = names or ["count", *(k for k in m if k != "count")]
        count = m["count"].double()
        rows = torch.stack([count] + [m[k].double() * count for k in names[1:]])
        totals = rows if totals is None else totals + rows
    run.heads.train()
    totals = run.accelerator.reduce(totals, reduction="sum").cpu()
    n = totals[0].clamp(min=1)
    avg = {k: totals[i] / n for i, k in enumerate(names) if i > 0}
    weights = torch.tensor(position_weights(run), dtype=torch.float64)
    ev: dict[str, Any] = {"loss": float((weights * avg["loss"]).sum()), "head_loss": avg["loss"].tolist()}
    for basis in ("target", "data"):
        if f"top1_vs_{basis}" in avg:
            ev[f"sim_accept_length_vs_{basis}"] = float(simulated_accept_length(avg[f"top1_vs_{basis}"]))
    basis = "target" if "top1_vs_target" in avg else "data"
    ev["sim_accept_length"] = ev[f"sim_accept_length_vs_{basis}"]
    ev["top1"] = avg[f"top1_vs_{basis}"].tolist()
    ev["count"] = totals[0].long().tolist()
    if bb_totals:  # Medusa-2 only ({} for heads on a frozen target)
        bb = {k: float(run.accelerator.reduce(v, reduction="sum")) for k, v in bb_totals.items()}
        n_bb = max(bb["backbone_count"], 1.0)
        ev |= {"backbone_ce": bb["backbone_ce_sum"] / n_bb, "backbone_kl": bb["backbone_kl_sum"] / n_bb}
    return ev | {k: v.tolist() for k, v in avg.items() if k != "loss"}


def eval_metrics(run, ev: dict[str, Any]) -> dict[str, float]:
    """The logged names: eval/loss, eval/sim_accept_length_vs_{target,data}, eval/measured_accept_length,
    and per position eval/{head,step}{k}_{loss,top1_vs_target,top1_vs_data,top5_vs_data,...}."""
    out = {"eval/loss": ev["loss"]}
    out |= {f"eval/{k}": v for k, v in ev.items() if k.startswith("sim_accept_length_vs_")}
    if "measured_accept_length" in ev:
        out["eval/measured_accept_length"] = ev["measured_accept_length"]
    out |= {f"eval/{k}": v for k, v in ev.items() if k.startswith("backbone_")}  # Medusa-2
    pos = position_name(run)
    for name, values in ev.items():
        if isinstance(values, list) and name not in ("count", "top1"):  # top1: an alias (`evaluate`)
            key = "loss" if name == "head_loss" else name
            out |= {f"eval/{pos}{k}_{key}": v for k, v in enumerate(values)}
    return out


def accuracy_table(ev: dict[str, Any], pos: str = "head") -> str:
    """Per position: what it predicts (pair t predicts t+2+k), loss, top-1 vs the target and vs the data
    (where measured), top-5 vs the data (Medusa); then the simulated and measured τ."""
    cols = [c for c in ("top1_vs_target", "top1_vs_data", "top5_vs_data") if ev.get(c)]
    if not cols:  # an eval_results.json written before the accuracies were named
        cols = ["top1"]
    header = {
        "top1_vs_target": "top-1 (target)",
        "top1_vs_data": "top-1 (data)",
        "top5_vs_data": "top-5 (data)",
    }
    lines = [
        f"{pos:>4}  predicts   loss    " + "".join(f"{header.get(c, c):<16}" for c in cols) + "positions"
    ]
    for k, (loss, n) in enumerate(zip(ev["head_loss"], ev["count"], strict=True)):
        accs = "".join(f"{100 * ev[c][k]:5.1f}%{'':10}" for c in cols)
        lines.append(f"{k:>4}  t+{k + 2:<7}  {loss:6.3f}  {accs}{n:>9}")
    for basis in ("target", "data"):
        if f"sim_accept_length_vs_{basis}" in ev:
            lines.append(
                f"simulated acceptance length τ (top-1 vs the {basis}) = 1 + Σ_k Π_(j<=k) top1_j = "
                f"{ev[f'sim_accept_length_vs_{basis}']:.3f}"
            )
    if "measured_accept_length" in ev:
        lines.append(f"measured acceptance length τ = {ev['measured_accept_length']:.3f} ({describe(ev)})")
    return "\n".join(lines)


def describe(ev: dict[str, Any]) -> str:
    """One line for the measured τ's settings: prompts, tokens, tree."""
    s = ev.get("measured_tau") or {}
    return (
        f"greedy infer.generate on {s.get('prompts')} held-out prompts x {s.get('max_new_tokens')} new "
        f"tokens, {s.get('tree')}"
    )


# ---------------------------------------------------------------------------------------------- measured τ


def eval_prompts(dataset, n: int, prompt_tokens: int) -> list[Tensor]:
    """The first ``n`` held-out rows as [1, P] prompts: a chat row's tokens before its first training label
    (its conversation up to the first assistant answer, rendered with the chat template by `train.data`);
    a text row (labels from its second token on) its first ``prompt_tokens`` tokens (at most half the row,
    so something is left to generate). Rows whose prompt would be empty are skipped."""
    prompts = []
    for i in range(len(dataset)):
        if len(prompts) == n:
            break
        row = dataset[i]
        ids = torch.as_tensor(row["input_ids"], dtype=torch.long).view(-1)
        labels = torch.as_tensor(row["loss_mask"]).view(-1)[1:].nonzero()
        first = int(labels[0]) + 1 if len(labels) else len(ids)
        P = first if first >= 2 else min(prompt_tokens, len(ids) // 2)
        if P >= 1:
            prompts.append(ids[:P].view(1, -1))
    return prompts


def _draft_settings(model) -> str:
    """The tree the measurement drafts with, in words (the heads' defaults or their tuned settings)."""
    proposer = model.proposer()
    if registry.of(model.heads).tree == "dynamic":
        return (
            f"EAGLE-2 dynamic tree depth {proposer.depth}, draft_top_k {proposer.top_k}, "
            f"total_tokens {proposer.total_tokens}"
        )
    tree = getattr(proposer, "tree", None)
    return f"the heads' default static tree ({len(tree)} nodes)" if tree is not None else "the default tree"


def _prompt_source(run) -> str:
    ecfg = run.cfg.eval
    if run.tau_prompts is not None:
        name = os.path.basename(ecfg.measured_tau_prompts_file)
        return f"{name} rows {ecfg.measured_tau_prompts_skip} on (whole text rows; chat: up to the answer)"
    return (
        "the first held-out rows (chat: up to the first assistant answer; text: "
        f"the first {ecfg.measured_tau_prompt_tokens} tokens)"
    )


def measure_tau(run) -> dict[str, Any] | None:
    """The measured acceptance length τ: greedy `infer.generate` with the current heads on the first
    ``eval.measured_tau_prompts`` held-out prompts (`eval_prompts`), pooled as Σ accepted tokens / Σ verify
    steps over all prompts (the bonus token counted, as `GenerationStats.mean_accepted_length`).

    Every process gathers the heads' state dict (`accelerator.get_state_dict`, so ZeRO-3's partitioned
    parameters are whole); the main process alone loads it into a fresh copy of the heads in the target's
    dtype, in eval mode, and generates; the result reaches every process through a sum-reduce, so they
    all select the same best heads. The global RNG states (CPU and CUDA) are restored afterwards, so a
    resumed run stays bit-identical. None when off (``eval.measured_tau_prompts: 0``), for Medusa-2 (the
    target is the one being trained), or with no usable prompt.
    """
    ecfg, acc = run.cfg.eval, run.accelerator
    if ecfg.measured_tau_prompts == 0 or run.cfg.joint.enabled:
        return None
    acc.wait_for_everyone()
    state = acc.get_state_dict(run.heads)  # every process: ZeRO-3 gathers the shards
    sums = torch.zeros(3, dtype=torch.float64, device=acc.device)  # accepted tokens, verify steps, prompts
    settings, t0 = "", time.time()
    if acc.is_main_process:
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        # its init draws from the RNG; outside zero.Init, because a draft layer built by transformers would
        # be partitioned there, a collective the other processes never join (a hang under ZeRO-3)
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            with outside_zero3_init(deepspeed_plugin(acc)):
                heads = registry.get(run.head_config.head_type).module(run.head_config)
            heads.load_state_dict(state)
            p = next(run.target.parameters())
            model = infer.SpecModel(run.target, heads.to(device=p.device, dtype=p.dtype).eval())
            settings = _draft_settings(model)
            prompts = run.tau_prompts
            if prompts is None:
                prompts = eval_prompts(
                    run.eval_dl.dataset, ecfg.measured_tau_prompts, ecfg.measured_tau_prompt_tokens
                )
            ctx = context_length(run.target.config) or 1 << 30
            for ids in prompts:
                new_tokens = min(ecfg.measured_tau_new_tokens, ctx - ids.shape[1])  # a short context caps it
                if new_tokens < 1:
                    continue
                out = infer.generate(  # the heads' τ on their tree, not what adaptation or lookup add
                    model,
                    ids.to(p.device),
                    max_new_tokens=new_tokens,
                    do_sample=False,
                    adaptive=False,
                    lookup=0,
                )
                steps = out.stats.accepted_lengths
                sums += torch.tensor([sum(steps), len(steps), 1.0], dtype=torch.float64, device=acc.device)
    sums = acc.reduce(sums, reduction="sum").cpu()
    if sums[1] == 0:
        return None
    return {
        "measured_accept_length": float(sums[0] / sums[1]),
        "measured_tau": {
            "prompts": int(sums[2]),
            "max_new_tokens": ecfg.measured_tau_new_tokens,  # fewer where prompt + this exceeds the context
            "decoding": "greedy",
            "tree": settings or "see the main process's log",
            "prompt_source": _prompt_source(run),
        },
        "_seconds": time.time() - t0,  # printed, not logged: timings are not part of the run's results
    }
