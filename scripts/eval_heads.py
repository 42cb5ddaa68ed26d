"""Held-out per-position top-k accuracy of a head checkpoint (Medusa, EAGLE-1/2, EAGLE-3) and the τ it implies.

    python scripts/eval_heads.py --heads out/demo-medusa                 # data: the run's eval_path
    python scripts/eval_heads.py --heads out/demo-eagle --data held_out.jsonl --depth 6 --output acc.json

Depth d (1-based) is the d-th draft token after the target's own next token:

- Medusa: head d-1 at position t scores token t+1+d (all heads read the target's state at t).
- EAGLE-1/2 and EAGLE-3: the draft is unrolled on its own features, as it drafts at inference: step 1
  reads the target's features, step j >= 2 reads the draft's step j-1 output at the same pair and
  attends to the real prefix plus its own earlier steps (EAGLE-3's training-time-test unroll; for
  EAGLE-1/2 `unroll_eagle` builds the same attention with a KV cache and a 4D mask).

The *correct* token is the target's greedy choice at that position (``--labels target``, what greedy
verification accepts) or the data's next token (``--labels data``), scored where the data's loss mask
is 1. For every depth we record the rank r of the correct token among the draft's candidates
(r >= K = 10: not in the top 10), which gives

- ``topk_acc[d][k-1]`` = P(rank < k) for k = 1..10 (per-position top-k accuracy);
- ``rank_probs[d][r]`` = P(rank = r | depth d), the input of tree tuning (`infer.tree.greedy_nodes`);
- ``sim_accept_length`` = 1 + Σ_d Π_{j<=d} top1_j (a chain's τ, bonus token included, docs/design.md §7);
- ``chain_accept_length_empirical``: the same chain measured on the joint rank vectors (no
  independence assumption).

Writes JSON (``--output``, default ``<heads>/eval_heads.json``) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass

import torch
from torch import Tensor, nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TOPK = 10


@dataclass
class RankStats:
    """counts: [D, K+1] int64, counts[d, r] = scored positions whose correct token is at rank r at depth d+1
    (r = K: not in the top K). joint: [M, D] int64 ranks (clipped to K) of the positions scored at every
    depth, for measuring trees without assuming independence across depths."""

    counts: Tensor
    joint: Tensor

    @property
    def total(self) -> Tensor:
        return self.counts.sum(-1)

    def rank_probs(self) -> Tensor:
        """[D, K] float64, P(rank = r | depth)."""
        return self.counts[:, :-1].double() / self.total.clamp(min=1)[:, None].double()

    def topk_acc(self) -> Tensor:
        """[D, K] float64, P(rank < k) for k = 1..K."""
        return self.rank_probs().cumsum(-1)


def unroll_eagle(
    head: nn.Module, embed: nn.Module, input_ids: Tensor, feats: Tensor, attention_mask: Tensor, steps: int
) -> list[Tensor]:
    """Unroll an EAGLE draft on its own features over every position at once: ``steps`` x [B, N, H] outputs.

    input_ids, attention_mask: [B, T] (right padded, 1 = real); feats: [B, T, F] the target's features
    (last hidden state for EAGLE-1/2, cat of the aux states for EAGLE-3); N = T - 1 pairs.
    Step 0 runs the pairs k = (x_{k+1}, f_k) causally at positions k; step j >= 1 runs
    (x_{k+1+j}, o^{j-1}_k) at position k + j and attends to the step-0 keys of pairs <= k and to pair k's
    own keys at steps 1..j, the attention a tree path gets in `infer.eagle_draft.EagleProposer`. Output j at
    pair k predicts the feature whose logits score token k+2+j.
    """
    from infer.cache import new_cache

    B, T = input_ids.shape
    N = T - 1
    dtype = head.fc.weight.dtype
    am = attention_mask.bool()
    pair = am[:, :-1] & am[:, 1:]  # [B, N] pair k needs tokens k and k+1
    toks = torch.cat([input_ids[:, 1:], input_ids[:, -1:].expand(B, max(steps - 1, 0))], 1)  # [B, N+steps-1]
    cache = new_cache()
    out = head(toks[:, :N], feats[:, :-1], embed, attention_mask=pair.long(), cache=cache)
    outs = [out]
    k = torch.arange(N, device=input_ids.device)
    prefix = (k[None, :] <= k[:, None])[None] & pair[:, None, :]  # [B, N, N] step-0 keys
    eye = torch.eye(N, dtype=torch.bool, device=input_ids.device).expand(B, N, N)
    neg = torch.finfo(dtype).min
    for j in range(1, steps):
        allowed = torch.cat([prefix] + [eye] * j, 2)  # step 0, steps 1..j-1, this step
        mask = torch.zeros(allowed.shape, dtype=dtype, device=input_ids.device).masked_fill_(~allowed, neg)
        pos = (k + j)[None]
        out = head(
            toks[:, j : j + N], out, embed, position_ids=pos, attention_mask=mask[:, None], cache=cache
        )
        outs.append(out)
    return outs


def _ranks(logits: Tensor, labels: Tensor, topk: int) -> Tensor:
    """logits: [..., V], labels: [...] (-1 = not a candidate) -> rank of the label, clipped to ``topk``."""
    safe = labels.clamp(min=0)
    own = logits.gather(-1, safe[..., None])
    rank = (logits > own).sum(-1)
    return torch.where(labels >= 0, rank.clamp(max=topk), torch.full_like(rank, topk))


def draft_logits(heads: nn.Module, target: nn.Module, batch: dict[str, Tensor], depth: int):
    """(per-depth draft logits, target output): ``depth`` x [B, N, V'], entry t of depth d (1-based) scoring
    token t+1+d; N = T (Medusa) or T - 1 (EAGLE pairs); V' is the draft vocab for EAGLE-3."""
    from heads.graft import run_target

    ids, am = batch["input_ids"], batch["attention_mask"]
    kind = heads.config.head_type
    aux = tuple(heads.aux_layer_ids) if kind == "eagle3" else ()
    out = run_target(target, ids, am, aux_layers=aux)
    lm_head, embed = target.get_output_embeddings(), target.get_input_embeddings()
    if kind == "medusa":
        dtype = next(heads.parameters()).dtype
        logits = heads(out.hidden.to(dtype), lm_head)[:depth]  # [D, B, T, V]
        return list(logits), out
    if kind == "eagle":
        outs = unroll_eagle(heads, embed, ids, out.hidden, am, depth)
        return [heads.logits(o, lm_head) for o in outs], out
    if kind == "eagle3":  # reuse the TTT unroll the head trains with (`Eagle3Head.ttt_unroll`)
        tokens = torch.cat([ids[:, 1:], ids[:, -1:].expand(ids.shape[0], depth - 1)], 1)
        feats = torch.cat(out.aux, -1)[:, :-1]
        pair = (am[:, :-1] & am[:, 1:]).long()
        return list(heads(tokens, feats, embed, attention_mask=pair, ttt_steps=depth)), out
    raise ValueError(f"no evaluation for head type {kind!r}")


@torch.inference_mode()
def batch_ranks(
    heads: nn.Module, target: nn.Module, batch: dict[str, Tensor], depth: int, labels: str = "target"
) -> tuple[Tensor, Tensor]:
    """(ranks [D, B, N] clipped to TOPK, scored [D, B, N] bool) for one batch; see the module docstring."""
    ids, am, lm = batch["input_ids"], batch["attention_mask"].bool(), batch["loss_mask"].bool()
    per_depth, out = draft_logits(heads, target, batch, depth)
    B, T = ids.shape
    greedy = out.logits.argmax(-1)  # [B, T]: the target's choice for token t+1
    d2t = getattr(heads, "d2t", None)
    inverse = None
    if d2t is not None:  # target id -> draft id (-1 outside the draft vocab)
        inverse = torch.full((heads.config.vocab_size,), -1, dtype=torch.long, device=ids.device)
        inverse[torch.arange(d2t.shape[0], device=ids.device) + d2t] = torch.arange(
            d2t.shape[0], device=ids.device
        )
    ranks, scored = [], []
    for d, z in enumerate(per_depth):  # depth d+1: entry t scores token t+2+d
        N = z.shape[1]
        t = torch.arange(N, device=ids.device)
        src = t + 2 + d
        inside = src < T
        srcc = src.clamp(max=T - 1)
        # greedy[:, s - 1] is the target's choice for token s given the real prefix
        label = ids[:, srcc] if labels == "data" else greedy[:, srcc - 1]
        ok = inside[None] & am[:, srcc] & lm[:, srcc]
        if inverse is not None:
            label = inverse[label]
        ranks.append(_ranks(z.float(), label, TOPK))
        scored.append(ok)
    n = min(r.shape[1] for r in ranks)
    return torch.stack([r[:, :n] for r in ranks]), torch.stack([s[:, :n] for s in scored])


def evaluate_heads(
    heads: nn.Module,
    target: nn.Module,
    batches,
    depth: int,
    labels: str = "target",
    progress: bool = True,
) -> RankStats:
    """Accumulate `RankStats` over an iterable of collated batches (``input_ids``/``attention_mask``/``loss_mask``)."""
    from tqdm.auto import tqdm

    if labels not in ("target", "data"):
        raise ValueError(f"labels must be 'target' or 'data', got {labels!r}")
    counts = torch.zeros(depth, TOPK + 1, dtype=torch.long)
    joint = []
    device = next(target.parameters()).device
    for batch in tqdm(batches, desc="eval heads", disable=not progress):
        batch = {k: v.to(device) for k, v in batch.items()}
        r, s = batch_ranks(heads, target, batch, depth, labels)
        D = r.shape[0]
        one_hot = torch.zeros(*r.shape, TOPK + 1, dtype=torch.long, device=r.device)
        one_hot.scatter_(-1, r[..., None], 1)
        counts[:D] += (one_hot * s[..., None]).sum((1, 2)).cpu()
        every = s.all(0)  # [B, N] scored at every depth
        joint.append(r.permute(1, 2, 0)[every].cpu())
    if counts.sum() == 0:
        raise ValueError("no scored positions: the data has no loss-mask tokens far enough from the row ends")
    return RankStats(counts, torch.cat(joint) if joint else torch.zeros(0, depth, dtype=torch.long))


def summary(stats: RankStats) -> dict:
    from infer.tree import chain, empirical_accept_length
    from train.losses import simulated_accept_length

    top = stats.topk_acc()
    D = top.shape[0]
    return {
        "depth": D,
        "topk": TOPK,
        "count": stats.total.tolist(),
        "topk_acc": top.tolist(),
        "rank_probs": stats.rank_probs().tolist(),
        "sim_accept_length": float(simulated_accept_length(top[:, 0])),
        "chain_accept_length_empirical": empirical_accept_length(chain(D), stats.joint),
        "joint_positions": int(stats.joint.shape[0]),
    }


def table(result: dict) -> str:
    ks = (1, 2, 3, 5, 10)
    lines = ["depth  count   " + "  ".join(f"top{k:<3d}" for k in ks)]
    for d, row in enumerate(result["topk_acc"]):
        lines.append(f"{d + 1:>5d} {result['count'][d]:>6d}   " + "  ".join(f"{row[k - 1]:.3f} " for k in ks))
    lines.append(
        f"simulated chain τ (independent depths) {result['sim_accept_length']:.3f}; "
        f"measured on joint ranks {result['chain_accept_length_empirical']:.3f}"
    )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- loading


def default_data(heads_dir: str) -> str | None:
    """The held-out set the heads were evaluated on in training (``train_config.yaml`` next to them)."""
    path = os.path.join(heads_dir, "train_config.yaml")
    if not os.path.isfile(path):
        return None
    from omegaconf import OmegaConf

    return OmegaConf.select(OmegaConf.load(path), "data.eval_path", default=None)


def load_batches(data: str, tokenizer, max_examples: int, max_length: int, batch_size: int) -> list:
    """Tokenized, collated batches of the first ``max_examples`` rows of ``data`` (a local file or Hub id)."""
    from train.data import DataConfig, _head, _load, collate, tokenize_dataset

    cfg = DataConfig(path=data, max_length=max_length)
    ds, _ = _load(data, "train")
    ds = tokenize_dataset(_head(ds, max_examples), tokenizer, cfg, data)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    rows = [ds[i] for i in range(len(ds))]
    return [collate(rows[i : i + batch_size], pad_token_id=pad) for i in range(0, len(rows), batch_size)]


def load_all(heads_path: str, target_path: str | None, dtype: str):
    """(heads, target, tokenizer): the target defaults to the heads' ``base_model_name_or_path``."""
    from transformers import AutoTokenizer

    from heads import load_heads, load_target
    from heads.base import read_config, resolve_dir
    from heads.graft import resolve_demo_target

    directory = resolve_dir(heads_path)
    name = target_path or read_config(directory).get("base_model_name_or_path")
    if not name:
        raise ValueError(f"{directory}/config.json names no target; pass --target")
    name = resolve_demo_target(name)  # demo / demo-tiny: the built demo target (its tokenizer too)
    target = load_target(name, dtype=dtype)
    heads = load_heads(directory, target)
    p = next(target.parameters())
    heads = heads.to(device=p.device, dtype=p.dtype).eval()
    return heads, target, AutoTokenizer.from_pretrained(os.path.expanduser(name)), directory


def default_depth(heads: nn.Module) -> int:
    kind = heads.config.head_type
    return heads.config.num_heads if kind == "medusa" else 6


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--heads", required=True, help="head checkpoint directory or Hub id")
    p.add_argument(
        "--target", default=None, help="target model (default: the heads' base_model_name_or_path)"
    )
    p.add_argument(
        "--data", default=None, help="held-out JSONL/parquet/Hub id (default: the run's eval_path)"
    )
    p.add_argument("--max-examples", type=int, default=64)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument(
        "--depth", type=int, default=None, help="draft depths to score (default: Medusa heads / 6)"
    )
    p.add_argument("--labels", choices=("target", "data"), default="target")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--output", default=None, help="JSON path (default: <heads>/eval_heads.json)")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> tuple[dict, RankStats]:
    """Load, evaluate and summarise; returns (result dict, rank stats)."""
    heads, target, tokenizer, directory = load_all(args.heads, args.target, args.dtype)
    depth = args.depth or default_depth(heads)
    if heads.config.head_type == "medusa" and depth > heads.config.num_heads:
        raise ValueError(f"--depth {depth} > the {heads.config.num_heads} Medusa heads")
    data = args.data or default_data(directory)
    if not data:
        raise ValueError(f"no --data given and {directory} has no train_config.yaml with data.eval_path")
    batches = load_batches(data, tokenizer, args.max_examples, args.max_length, args.batch_size)
    stats = evaluate_heads(heads, target, batches, depth, args.labels)
    result = {
        "heads": directory,
        "head_type": heads.config.head_type,
        "target": getattr(target.config, "_name_or_path", None),
        "data": data,
        "labels": args.labels,
        "dtype": str(next(target.parameters()).dtype),
        **summary(stats),
    }
    return result, stats


def main(argv: list[str] | None = None) -> dict:
    from heads.io import atomic_text

    args = parse_args(argv)
    result, _ = run(args)
    print(table(result))
    out = args.output or os.path.join(result["heads"], "eval_heads.json")
    text = json.dumps(result, indent=2) + "\n"
    atomic_text(out, text)
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
