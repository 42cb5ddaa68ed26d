"""Does a reduced draft vocabulary (d2t) make EAGLE-1/2 cheaper per step at the same τ?

    OMP_NUM_THREADS=1 python experiments/d2t_cost.py --target demo --full out/d2t/demo-full \\
        --reduced out/d2t/demo-d2t [more reduced heads ...] --json results/d2t/demo.json

Feeds `results/d2t/` (its README has the training commands of the heads and the answer). Three
measurements, one process, one torch thread, fp32:

1. ``head``: the draft's lm_head + log_softmax + top-k of one tree depth (the frontier, [1, K, H] ->
   top-K of [1, K, V or Vd]), the fastest-of-interleaved-repeats timing of `infer.cost.timings`;
   for the root ([1, H]) too.
2. ``speed``: `bench.profile.speed` (target.generate and both heads, interleaved rounds over the
   demo's held-out prompts, greedy; τ, speedup, efficiency, greedy identity).
3. ``split``: `bench.profile.split_table` (ms per decode step in draft / verify / ...).

Both heads run the same tree (their config's defaults). Writes the JSON given by ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # bench/ sits beside the packages

from bench.machine import machine_info  # noqa: E402
from bench.profile import ProfileOptions, setup, speed, split_table  # noqa: E402
from heads.io import atomic_text  # noqa: E402
from infer.cost import timings  # noqa: E402


def head_cost(model, K: int, repeats: int = 200) -> dict:
    """Seconds (min, median) of the lm_head + log_softmax + top-k at one depth ([1, K, H]) and at the root."""
    head, lm_head = model.heads, model.target.get_output_embeddings()
    H = head.config.hidden_size
    g = torch.Generator().manual_seed(0)
    frontier, root = torch.randn(1, K, H, generator=g), torch.randn(1, H, generator=g)

    def depth_step():
        torch.log_softmax(head.logits(frontier, lm_head), -1).topk(K, dim=-1)

    def root_step():
        torch.log_softmax(head.logits(root, lm_head), -1).topk(K)

    def layer_step():  # the draft layer's own forward over the frontier, for scale
        head.layers[0].mlp(frontier)

    with torch.inference_mode():
        t = timings(
            {"depth": depth_step, "root": root_step, "mlp": layer_step}, repeats, 20, torch.device("cpu")
        )
    return {k: {"min_ms": 1e3 * min(v), "median_ms": 1e3 * statistics.median(v)} for k, v in t.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="demo")
    p.add_argument("--full", required=True)
    p.add_argument("--reduced", required=True, nargs="+", help="one or more reduced-vocab heads dirs")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", required=True)
    a = p.parse_args()
    torch.set_num_threads(1)
    o = ProfileOptions(
        heads=[a.full, *a.reduced],
        target=a.target,
        dtype="fp32",
        prompts=a.prompts,
        max_new_tokens=a.max_new_tokens,
        repeats=a.repeats,
        threads=1,
    )
    s = setup(o)
    s.names = ["target.generate"] + [
        f"eagle {'d2t Vd' if m.heads.reduced_vocab else 'V'}={m.heads.config.draft_vocab}" for m in s.models
    ]
    K = 8  # the default draft_top_k
    print("\n## lm_head + log_softmax + top-k (ms, min / median of interleaved repeats)\n")
    cost = {}
    for n, m in zip(s.names[1:], s.models, strict=True):
        cost[n] = head_cost(m, K)
        print(
            f"| {n} | "
            + " | ".join(f"{k} {v['min_ms']:.3f} / {v['median_ms']:.3f}" for k, v in cost[n].items())
        )
    results = {
        "args": vars(a),
        "machine": machine_info(torch.device("cpu"))["summary"] + ", fp32",
        "head_cost_K8": cost,
        "speed": speed(o, s),
        "split": split_table(s),
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    atomic_text(a.json, json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
