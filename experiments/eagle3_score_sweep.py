"""Greedy EAGLE trees accept exactly 3 drafts on most steps: does scoring the tree's nodes at a lower
temperature fix it? Greedy τ and the accepted-length histogram against the tree-score temperature and budget.

    python experiments/eagle3_score_sweep.py --heads eagle1=out/abl/eagle1 \\
        --heads eagle1-lr4e-3=out/abl/e1-lr4e-3 --heads eagle31-lr4e-3=out/abl/e31-lr4e-3 --prompts 16 \\
        --temps 1,0.5,0.3 --budgets 6/8/48,6/1/7,10/8/60 > results/eagle3-ablation/score_sweep.md

Feeds `results/eagle3-ablation/score_sweep.md` (the folder's README gives the heads and the answer). A
budget is depth/draft_top_k/total_tokens. The first ``--prompts`` rows of the demo's held-out code
prompts, 128 greedy tokens each, fp32, one thread. Every output is checked against target.generate.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # the packages sit beside this folder

import demo  # noqa: E402
import infer  # noqa: E402
from infer.prompts import read_prompts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", action="append", required=True, help="LABEL=DIR")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--temps", default="1,0.5")
    ap.add_argument("--budgets", default="6/8/48")
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows = [r["text"] for r in read_prompts(demo.ensure_demo_data(size="full")["prompts"])[: a.prompts]]
    print("| heads | depth / top-k / tokens | score temperature | τ | accepted length: share of steps | s |")
    print("|---|---|---|---|---|---|")
    plain = {}
    for spec in a.heads:
        label, _, path = spec.partition("=")
        m = infer.load(target="demo", heads=path, dtype="float32")
        base = m.settings
        for budget in a.budgets.split(","):
            depth, top_k, total = (int(x) for x in budget.split("/"))
            for t in (float(x) for x in a.temps.split(",")):
                m.settings = dataclasses.replace(base, greedy_score_temperature=t)
                hist, t0 = collections.Counter(), time.perf_counter()
                for i, text in enumerate(rows):
                    ids = m.tokenizer(text, return_tensors="pt").input_ids
                    out = infer.generate(m, ids, max_new_tokens=128, do_sample=False, depth=depth,
                                         draft_top_k=top_k, total_tokens=total, lookup=0)  # fmt: skip
                    if i not in plain:
                        plain[i] = m.target.generate(ids, max_new_tokens=128, do_sample=False)
                    assert torch.equal(out.sequences, plain[i]), f"greedy mismatch on prompt {i}"
                    hist.update(out.stats.accepted_lengths)
                n = sum(hist.values())
                tau = sum(k * v for k, v in hist.items()) / n
                shares = " ".join(f"{k}:{v / n:.2f}" for k, v in sorted(hist.items()))
                print(f"| {label} | {depth} / {top_k} / {total} | {t:g} | {tau:.2f} | {shares} | "
                      f"{time.perf_counter() - t0:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
