"""Held-out per-position top-k accuracy of a head checkpoint (Medusa, EAGLE-1/2, EAGLE-3) and the τ it implies.

`eval_heads` is ``scripts/eval_heads.py`` (its options: `EvalOptions`); `infer.tune_tree` reads the
accuracies as the input of tree tuning.

Depth d (1-based) is the d-th draft token after the target's own next token:

- Medusa: head d-1 at position t scores token t+1+d (all heads read the target's state at t).
- EAGLE-1/2 and EAGLE-3: the draft is unrolled on its own features, as it drafts at inference: step 1
  reads the target's features, step j >= 2 reads the draft's step j-1 output at the same pair and
  attends to the real prefix plus its own earlier steps: the head's training-time-test unroll
  (``ttt_unroll``, one implementation for both EAGLE head types).

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

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from omegaconf import OmegaConf
from torch import Tensor, nn
from tqdm.auto import tqdm
from transformers import AutoTokenizer

from heads import gguf, load_heads, load_target, registry, targets
from heads.base import read_config, resolve_dir
from heads.card import TRAIN_CONFIG_NAME
from heads.graft import TargetOutput, run_target
from heads.io import atomic_text
from infer.settings import DEFAULTS, heads_defaults
from infer.tree import chain
from infer.tree_choice import empirical_accept_length, expected_accept_length

TOPK = 10


@dataclass
class EvalOptions:
    """Options of ``scripts/eval_heads.py`` (`eval_heads`)."""

    heads: str | None = field(default=None, metadata={"help": "head checkpoint directory or Hub id"})
    target: str | None = field(
        default=None, metadata={"help": "target model (default: the one the heads were trained on)"}
    )
    data: str | None = field(
        default=None,
        metadata={
            "help": "held-out JSONL/parquet/Hub id, or a run's train_config.yaml "
            "(default: the heads' own run's held-out rows)"
        },
    )
    max_examples: int = field(default=64, metadata={"help": "held-out rows to score"})
    max_length: int = field(default=256, metadata={"help": "tokens per row"})
    batch_size: int = field(default=4, metadata={"help": "rows per forward"})
    depth: int | None = field(
        default=None, metadata={"help": "draft depths to score (default: Medusa heads / EAGLE depth 6)"}
    )
    labels: str = field(default="target", metadata={"help": "target (greedy choice) or data (next token)"})
    dtype: str = field(default="bf16", metadata={"help": "target dtype"})
    output: str | None = field(
        default=None, metadata={"help": "JSON path (default: <heads>/eval_heads.json)"}
    )

    def __post_init__(self) -> None:
        if not self.heads:
            raise ValueError("--heads is required: a head checkpoint directory or Hub id")
        if self.labels not in ("target", "data"):
            raise ValueError(f"--labels must be 'target' or 'data', got {self.labels!r}")
        for key in ("max_examples", "max_length", "batch_size", "depth"):
            v = getattr(self, key)
            if v is not None and v < 1:
                raise ValueError(f"--{key.replace('_', '-')} must be >= 1, got {v}")


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


def _ranks(logits: Tensor, labels: Tensor, topk: int) -> Tensor:
    """logits: [..., V], labels: [...] (-1 = not a candidate) -> rank of the label, clipped to ``topk``."""
    safe = labels.clamp(min=0)
    own = logits.gather(-1, safe[..., None])
    rank = (logits > own).sum(-1)
    return torch.where(labels >= 0, rank.clamp(max=topk), torch.full_like(rank, topk))


def _static_logits(heads, target, batch, out: TargetOutput, depth: int) -> list[Tensor]:
    """Medusa-style heads: all heads read the target's last state at t; head d-1 scores token t+1+d."""
    dtype = next(heads.parameters()).dtype
    return list(heads(out.hidden.to(dtype), target.get_output_embeddings())[:depth])  # D x [B, T, V]


def _eagle_logits(heads, target, batch, out: TargetOutput, depth: int) -> list[Tensor]:
    """EAGLE-1/2/3: the draft unrolled on its own features (the head's ``ttt_unroll``), D x [B, T-1, V']."""
    ids, am = batch["input_ids"], batch["attention_mask"]
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    feats = torch.cat(out.aux, -1) if out.aux else out.hidden  # EAGLE-3: cat of the aux states
    tokens = torch.cat([ids[:, 1:], ids[:, -1:].expand(ids.shape[0], depth - 1)], 1)
    pair = (am[:, :-1] & am[:, 1:]).long()
    return list(heads.logits(heads.ttt_unroll(tokens, feats[:, :-1], embed, pair, depth), lm_head))


# How the heads of each proposer kind (`heads.registry.HeadType.proposer`) score every depth at once.
DRAFT_LOGITS: dict[str, Callable[..., list[Tensor]]] = {
    "static_tree": _static_logits,
    "eagle": _eagle_logits,
    "parallel": _eagle_logits,  # P-EAGLE heads scored as they train: unrolled on their own features
}


def draft_logits(heads: nn.Module, target: nn.Module, batch: dict[str, Tensor], depth: int):
    """(per-depth draft logits, target output): ``depth`` x [B, N, V'], entry t of depth d (1-based) scoring
    token t+1+d; N = T (Medusa) or T - 1 (EAGLE pairs); V' is the draft vocab for EAGLE-3."""
    entry = registry.of(heads)
    name = entry.proposer_for(heads.config)
    unroll = DRAFT_LOGITS.get(name)
    if unroll is None:
        raise ValueError(f"no evaluation for {entry.name} heads (proposer {name!r})")
    aux = tuple(getattr(heads, "aux_layer_ids", ()) or ())
    out = run_target(target, batch["input_ids"], batch["attention_mask"], aux_layers=aux)
    return unroll(heads, target, batch, out, depth), out


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
    top = stats.topk_acc()
    D = top.shape[0]
    return {
        "depth": D,
        "topk": TOPK,
        "count": stats.total.tolist(),
        "topk_acc": top.tolist(),
        "rank_probs": stats.rank_probs().tolist(),
        "sim_accept_length": expected_accept_length(chain(D), top[:, :1]),  # 1 + Σ_d Π_{j<=d} top1_j
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
    """The held-out set the heads were evaluated on in training, from the ``train_config.yaml`` next to
    them: its ``data.eval_path``, else that config file itself, which the loaders read as the run's
    seeded held-out split of ``data.path`` (`train.data.held_out`). None without a run config."""
    path = os.path.join(heads_dir, TRAIN_CONFIG_NAME)
    if not os.path.isfile(path):
        return None
    cfg = OmegaConf.load(path)
    return OmegaConf.select(cfg, "data.eval_path", default=None) or (
        path if OmegaConf.select(cfg, "data.path", default=None) else None
    )


def held_out_prompts(load_batches: BatchLoader, data: str, tokenizer, n: int, skip: int) -> list[Tensor]:
    """Prompts [1, T] of held-out rows ``skip .. skip+n-1`` read through ``load_batches``: each row's tokens
    before its first label (a chat row: up to its first answer; a row labelled from the start: its first
    32 tokens, as training's measured τ cuts text rows)."""
    rows = load_batches(data, tokenizer, skip + n, 1024, 1)[skip:]
    if not rows:
        raise ValueError(f"{data} has no held-out rows after the first {skip}")
    prompts = []
    for b in rows:
        labels = b["loss_mask"][0].nonzero()
        first = int(labels[0]) if len(labels) else b["input_ids"].shape[1]
        prompts.append(b["input_ids"][:, : first if first >= 2 else 32])
    return prompts


# Reads held-out rows of training-format data as collated batches: ``(data, tokenizer, max_examples,
# max_length, batch_size) -> [{"input_ids", "attention_mask", "loss_mask"}]``. The scripts pass
# `train.held_out.eval_batches` (training-format data is train's business; infer never imports train).
BatchLoader = Callable[[str, Any, int, int, int], list]


def load_all(heads_path: str, target_path: str | None, dtype: str):
    """(heads, target, tokenizer): the target defaults to the one the heads recorded (`heads.gguf.target_name`:
    their ``base_model_name_or_path``, or the built-in name of the GGUF release they were trained on)."""
    directory = resolve_dir(heads_path)
    name = target_path or gguf.target_name(read_config(directory))
    if not name:
        raise ValueError(f"{directory}/config.json names no target; pass --target")
    name = targets.resolve(name)  # a built-in name or GGUF file: its checkpoint (its tokenizer too)
    target = load_target(name, dtype=dtype)
    heads = load_heads(directory, target)
    p = next(target.parameters())
    heads = heads.to(device=p.device, dtype=p.dtype).eval()
    return heads, target, AutoTokenizer.from_pretrained(os.path.expanduser(name)), directory


def default_depth(heads: nn.Module) -> int:
    """The depths worth scoring: every Medusa head (static trees), the depth these dynamic-tree heads
    draft by default (EAGLE-2's 6; a P-EAGLE head's K, `infer.settings.heads_defaults`)."""
    static = registry.of(heads).tree == "static"
    return heads.config.num_heads if static else heads_defaults(heads.config).get("depth", DEFAULTS.depth)


def run(opts: EvalOptions, load_batches: BatchLoader) -> tuple[dict, RankStats]:
    """Load, evaluate and summarise; returns (result dict, rank stats). ``load_batches``: `BatchLoader`."""
    heads, target, tokenizer, directory = load_all(opts.heads, opts.target, opts.dtype)
    depth = opts.depth or default_depth(heads)
    if registry.of(heads).tree == "static" and depth > heads.config.num_heads:
        raise ValueError(f"--depth {depth} > the {heads.config.num_heads} Medusa heads")
    data = opts.data or default_data(directory)
    if not data:
        raise ValueError(f"no --data, and no {TRAIN_CONFIG_NAME} in {directory} names its run's data")
    batches = load_batches(data, tokenizer, opts.max_examples, opts.max_length, opts.batch_size)
    stats = evaluate_heads(heads, target, batches, depth, opts.labels)
    result = {
        "heads": directory,
        "head_type": heads.config.head_type,
        "target": getattr(target.config, "_name_or_path", None),
        "data": data,
        "labels": opts.labels,
        "dtype": str(next(target.parameters()).dtype),
        **summary(stats),
    }
    return result, stats


def eval_heads(opts: EvalOptions, load_batches: BatchLoader) -> dict:
    """``scripts/eval_heads.py``: evaluate, print the table, write the JSON; returns the result."""
    result, _ = run(opts, load_batches)
    print(table(result))
    out = opts.output or os.path.join(result["heads"], "eval_heads.json")
    atomic_text(out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return result
