"""Run the frozen target once over the training set and store what the heads read, for offline training.

    python scripts/dump_features.py --config configs/demo-eagle3.yaml --out features/demo-eagle3 [key=value ...]
    python train/train_heads.py --config configs/demo-eagle3.yaml features=offline features_dir=features/demo-eagle3

The training rows are tokenized exactly as `train/train_heads.py` does (same config, same order). Each
shard ``shard-NNNNN.safetensors`` holds ``shard_size`` consecutive rows, concatenated along tokens:

    input_ids, loss_mask   [N] int64        N = the shard's tokens; rows split by ``offsets`` [rows + 1]
    hidden                 [N, H]           last post-norm hidden state (Medusa, EAGLE-1/2)
    aux                    [N, 3H]          EAGLE-3: cat of hidden_states[i] for i in the head's aux_layer_ids
    logits                 [N, V]           EAGLE-3: the target's logits (its soft labels), in the target dtype

Shards are written to a temporary name and renamed, so a killed run resumes by skipping finished
shards. ``meta.json`` records the head type, aux layer ids, target and sizes; training checks it. The
disk size is printed before anything is computed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

META = "meta.json"


def feature_spec(cfg, target) -> dict:
    """What to store for ``cfg.heads.type``: ``{"hidden": bool, "aux_layer_ids": list | None, "logits": bool}``."""
    kind = cfg.heads.type
    if kind == "eagle3":
        from heads.eagle import target_config_dict
        from heads.eagle3 import Eagle3Config

        hc = Eagle3Config(target_config=target_config_dict(target), **cfg.heads.head_kwargs())
        return {"hidden": False, "aux_layer_ids": list(hc.aux_layer_ids), "logits": True}
    return {"hidden": True, "aux_layer_ids": None, "logits": False}


def dump(cfg, out: str, shard_size: int = 256, batch_size: int = 8) -> str:
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    from heads.graft import load_target, run_target, target_dims
    from train.config import resolve_demo
    from train.data import build_datasets, collate

    cfg = resolve_demo(cfg)
    name = cfg.target.name_or_path
    tok = AutoTokenizer.from_pretrained(os.path.expanduser(name), revision=cfg.target.revision)
    train_ds, _ = build_datasets(cfg.data, tok, seed=cfg.train.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    target = load_target(
        name,
        revision=cfg.target.revision,
        dtype=cfg.target.dtype,
        device=device,
        attn_implementation=cfg.target.attn_implementation,
    )
    spec = feature_spec(cfg, target)
    V, H = target_dims(target)
    dtype = next(target.parameters()).dtype
    n_rows = len(train_ds)
    n_tokens = sum(len(row["input_ids"]) for row in train_ds)
    width = (
        (H if spec["hidden"] else 0) + (3 * H if spec["aux_layer_ids"] else 0) + (V if spec["logits"] else 0)
    )
    size = n_tokens * (width * dtype.itemsize + 16)
    n_shards = math.ceil(n_rows / shard_size)
    print(
        f"{n_rows} rows, {n_tokens} tokens -> {n_shards} shards in {out}: about {size / 2**30:.2f} GiB "
        f"({width} values/token in {dtype})",
        flush=True,
    )
    os.makedirs(out, exist_ok=True)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    meta = {"head_type": cfg.heads.type, "target": name, "rows": n_rows, "shard_size": shard_size,
            "hidden_size": H, "vocab_size": V, "dtype": str(dtype), **spec}  # fmt: skip
    with open(os.path.join(out, META), "w") as f:
        json.dump(meta, f, indent=2)
    for s in range(n_shards):
        path = os.path.join(out, f"shard-{s:05d}.safetensors")
        if os.path.exists(path):
            continue  # finished by an earlier run
        rows = [train_ds[i] for i in range(s * shard_size, min((s + 1) * shard_size, n_rows))]
        parts: dict[str, list[torch.Tensor]] = {
            k: [] for k in ("input_ids", "loss_mask", "hidden", "aux", "logits")
        }
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
                if spec["logits"]:
                    parts["logits"].append(o.logits[i, :n].to(dtype).cpu())
        lengths = torch.tensor([len(x) for x in parts["input_ids"]])
        tensors = {k: torch.cat(v).contiguous() for k, v in parts.items() if v}
        tensors["offsets"] = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        tmp = path + ".tmp"
        save_file(tensors, tmp)
        os.replace(tmp, path)
        print(f"shard {s + 1}/{n_shards} written", flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    from train.config import load_config

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="the training recipe (target, data, heads.type)")
    p.add_argument("--out", required=True, help="directory for the shards (finished shards are skipped)")
    p.add_argument("--shard-size", type=int, default=256, help="rows per shard")
    p.add_argument("--batch-size", type=int, default=8, help="rows per target forward")
    p.add_argument("overrides", nargs="*", help="key=value overrides, as for train/train_heads.py")
    args = p.parse_args(argv)
    dump(load_config(args.config, args.overrides), args.out, args.shard_size, args.batch_size)


if __name__ == "__main__":
    main()
