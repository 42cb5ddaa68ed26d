"""Offline target features: run the frozen target once over the training set, store what the heads read,
and train from the stored rows (``train/train_heads.py --features DIR``).

    python scripts/dump_features.py --config configs/demo-eagle3.yaml --out features/demo-eagle3 [key=value ...]
    python train/train_heads.py --config configs/demo-eagle3.yaml --features features/demo-eagle3

The training rows are tokenized exactly as training does (same config, same order). Each shard
``shard-NNNNN.safetensors`` holds ``shard_size`` consecutive rows, concatenated along tokens:

    input_ids, loss_mask   [N] int64        N = the shard's tokens; rows split by ``offsets`` [rows + 1]
    hidden                 [N, H]           last post-norm hidden state (heads that read no aux layers)
    aux                    [N, 3H]          EAGLE-3: cat of hidden_states[i] for i in the head's aux_layer_ids
    logits                 [N, V]           EAGLE-3: the target's logits (its soft labels), in the target dtype;
                           [N, Vd]          with a draft vocabulary only its columns (``meta["logit_columns"]``),
    top                    [N] int64        and then the argmax of the full logits (all the loss reads of them)

What is stored follows the head type's `heads.registry.Objective.target_kwargs` (its aux layers, and
whether its loss reads the logits at every position). Shards are written to a temporary name and renamed
(`heads.io.atomic_write`), so a killed run resumes by skipping finished shards. ``meta.json`` records
the head type, aux layer ids, target and sizes; `FeatureShards` checks it, and training checks that its
draft vocabulary is the one the logits were kept for. The disk size is printed before anything is computed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor
from transformers import AutoTokenizer

from heads import registry
from heads.eagle import target_config_dict
from heads.graft import load_target, run_target, target_dims
from heads.io import atomic_text, atomic_write
from heads.vocab import build_vocab_map, label_counts
from train.config import RunConfig, resolve_demo
from train.data import build_datasets, collate

META = "meta.json"


class FeatureShards(torch.utils.data.Dataset):
    """The rows of a `dump` directory: dicts of ``input_ids``/``loss_mask`` [n] and the stored target
    outputs ``hidden`` [n, H] / ``aux`` [n, 3H] / ``logits`` [n, V or Vd] (+ ``top`` [n]), read lazily per
    row."""

    def __init__(self, directory: str, head_type: str) -> None:
        path = os.path.join(directory, META)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path} is missing: write the features with scripts/dump_features.py")
        with open(path) as f:
            self.meta = json.load(f)
        if self.meta["head_type"] != head_type:
            raise ValueError(
                f"{directory} holds features for {self.meta['head_type']!r} heads, not {head_type!r}"
            )
        n_shards = math.ceil(self.meta["rows"] / self.meta["shard_size"])
        self.shards = [os.path.join(directory, f"shard-{s:05d}.safetensors") for s in range(n_shards)]
        missing = [p for p in self.shards if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(
                f"{len(missing)} feature shards missing (first {missing[0]}): rerun the dump"
            )

    def __len__(self) -> int:
        return self.meta["rows"]

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(f"row {i} of {len(self)}")
        s, r = divmod(i, self.meta["shard_size"])
        with safe_open(self.shards[s], framework="pt") as f:
            a, b = f.get_slice("offsets")[r : r + 2].tolist()
            return {k: f.get_slice(k)[a:b] for k in f.keys() if k != "offsets"}


def collate_features(rows: list[dict[str, Tensor]], pad_token_id: int) -> dict[str, Tensor]:
    """`train.data.collate` for `FeatureShards` rows: the same ids and masks, plus the features right-padded
    with zeros to [B, T, ...] (padded positions are never scored nor attended)."""
    batch = collate(rows, pad_token_id=pad_token_id)
    for key in ("hidden", "aux", "logits", "top"):
        if key in rows[0]:
            batch[key] = torch.nn.utils.rnn.pad_sequence([r[key] for r in rows], batch_first=True)
    return batch


# ---------------------------------------------------------------------------------------------- dumping


@dataclass
class DumpOptions(RunConfig):
    """The training recipe (``--config``, ``key=value``) plus where and how to write the features."""

    out: str = field(default="", metadata={"help": "directory for the shards (finished shards are skipped)"})
    shard_size: int = field(default=256, metadata={"help": "rows per shard"})
    batch_size: int = field(default=8, metadata={"help": "rows per target forward"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.out:
            raise ValueError("--out is required: the directory for the feature shards")
        for name in ("shard_size", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")

    def run_config(self) -> RunConfig:
        return RunConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(RunConfig)})


def feature_spec(cfg: RunConfig, target) -> dict[str, Any]:
    """What to store for ``cfg.heads.type``: ``{"hidden": bool, "aux_layer_ids": list | None, "logits": bool,
    "draft_vocab_size": int | None}``, from its objective's target forward (a head type that reads aux layers
    reads them instead of the last hidden state; one with a draft vocabulary reads only its logit columns)."""
    entry = registry.get(cfg.heads.type)
    V, H = target_dims(target)
    sizes = {"hidden_size": H, "vocab_size": V, "target_config": target_config_dict(target)}
    names = {f.name for f in dataclasses.fields(entry.config)}
    head_config = entry.config(**{k: v for k, v in sizes.items() if k in names}, **cfg.heads.head_kwargs())
    wanted = entry.objective.target_kwargs(head_config)
    aux = list(wanted.get("aux_layers", ())) or None
    logits = bool(wanted.get("all_logits", False))
    draft_vocab = getattr(head_config, "draft_vocab_size", None) if logits else None
    return {"hidden": aux is None, "aux_layer_ids": aux, "logits": logits, "draft_vocab_size": draft_vocab}


def _shard_tensors(
    target, rows: list[dict], spec: dict[str, Any], pad_id: int, batch_size: int, cols: Tensor | None
):
    """One shard's tensors (module docstring) from its ``rows``, ``batch_size`` rows per target forward;
    ``cols``: the logit columns kept (None = all)."""
    device = next(target.parameters()).device
    dtype = next(target.parameters()).dtype
    keys = ("input_ids", "loss_mask", "hidden", "aux", "logits", "top")
    parts: dict[str, list[Tensor]] = {k: [] for k in keys}
    if cols is not None:
        cols = cols.to(device)
    for b in range(0, len(rows), batch_size):
        batch = collate(rows[b : b + batch_size], pad_token_id=pad_id)
        with torch.no_grad():
            o = run_target(
                target,
                batch["input_ids"].to(device),
                batch["attention_mask"].to(device),
                aux_layers=spec["aux_layer_ids"] or (),
                use_cache=False,
            )
        for i, n in enumerate(batch["attention_mask"].sum(-1).tolist()):
            parts["input_ids"].append(batch["input_ids"][i, :n])
            parts["loss_mask"].append(batch["loss_mask"][i, :n])
            if spec["hidden"]:
                parts["hidden"].append(o.hidden[i, :n].cpu())
            if spec["aux_layer_ids"]:
                parts["aux"].append(torch.cat([a[i, :n] for a in o.aux], -1).cpu())
            if spec["logits"] and cols is None:
                parts["logits"].append(o.logits[i, :n].to(dtype).cpu())
            elif spec["logits"]:
                parts["logits"].append(o.logits[i, :n].index_select(-1, cols).to(dtype).cpu())
                parts["top"].append(o.logits[i, :n].argmax(-1).cpu())
    lengths = torch.tensor([len(x) for x in parts["input_ids"]])
    tensors = {k: torch.cat(v).contiguous() for k, v in parts.items() if v}
    tensors["offsets"] = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    return tensors


def dump(cfg: RunConfig, out: str, shard_size: int = 256, batch_size: int = 8) -> str:
    """Write the features of ``cfg``'s training set to ``out`` (module docstring); returns ``out``."""
    cfg = resolve_demo(cfg)
    name = cfg.target.name_or_path
    tok = AutoTokenizer.from_pretrained(os.path.expanduser(name), revision=cfg.target.revision)
    train_ds, _ = build_datasets(cfg.data, tok, seed=cfg.train.seed)
    target = load_target(
        name,
        revision=cfg.target.revision,
        dtype=cfg.target.dtype,
        device="cuda" if torch.cuda.is_available() else "cpu",
        attn_implementation=cfg.target.attn_implementation,
    )
    spec = feature_spec(cfg, target)
    V, H = target_dims(target)
    cols = None
    if spec["draft_vocab_size"] is not None:  # the columns training's draft vocabulary will read
        cols = build_vocab_map(label_counts(train_ds, V), spec["draft_vocab_size"])[1].nonzero().view(-1)
    dtype = next(target.parameters()).dtype
    n_rows = len(train_ds)
    n_tokens = sum(len(row["input_ids"]) for row in train_ds)
    n_logits = (V if cols is None else cols.numel()) if spec["logits"] else 0
    width = (H if spec["hidden"] else 0) + (3 * H if spec["aux_layer_ids"] else 0) + n_logits
    n_shards = math.ceil(n_rows / shard_size)
    print(
        f"{n_rows} rows, {n_tokens} tokens -> {n_shards} shards in {out}: about "
        f"{n_tokens * (width * dtype.itemsize + 16 + (8 if cols is not None else 0)) / 2**30:.2f} GiB "
        f"({width} values/token in {dtype})",
        flush=True,
    )
    os.makedirs(out, exist_ok=True)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    meta = {"head_type": cfg.heads.type, "target": name, "rows": n_rows, "shard_size": shard_size,
            "hidden_size": H, "vocab_size": V, "dtype": str(dtype), **spec,
            "logit_columns": None if cols is None else cols.tolist()}  # fmt: skip
    atomic_text(os.path.join(out, META), json.dumps(meta, indent=2))
    for s in range(n_shards):
        path = os.path.join(out, f"shard-{s:05d}.safetensors")
        if os.path.exists(path):
            continue  # finished by an earlier run
        rows = [train_ds[i] for i in range(s * shard_size, min((s + 1) * shard_size, n_rows))]
        tensors = _shard_tensors(target, rows, spec, pad_id, batch_size, cols)
        atomic_write(path, lambda p, t=tensors: save_file(t, p))
        print(f"shard {s + 1}/{n_shards} written", flush=True)
    return out


def dump_main(opts: DumpOptions) -> str:
    """``scripts/dump_features.py``: `dump` with the parsed options."""
    return dump(opts.run_config(), opts.out, opts.shard_size, opts.batch_size)
