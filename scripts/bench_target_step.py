"""Cost of the target side of `infer.generate` on a random Llama: prefill and one tree-verify step.

    python scripts/bench_target_step.py [--lengths 512 1024 2048 4096] [--threads 1] [--out results/...]

1. **prefill**: time and peak memory of the prompt forward, the old way (`heads.graft.run_target`:
   logits at every position, all L+1 hidden states) against the lean one `infer` uses
   (`heads.graft.run_target_lean`: last-position logits, hooked states only). Each (way, length) runs
   in a fresh subprocess, so its peak RSS (``ru_maxrss``) minus the RSS after building the model and a
   16-token warm-up is the memory that prefill alone needed.
2. **verify**: the median time of one `infer.runner.TreeRunner.verify` + `accept` over a 16-node tree
   after a cached context of each length, for each way in ``VERIFY_WAYS`` (stock sdpa with a float
   mask, the registered tree attention, ...), against a plain 1-token decode forward of the stock
   model at the same length.

The model is random (timing does not depend on the weights): vocab 32000, hidden 384, 6 layers,
6 heads / 2 KV heads, fp32, ~35M parameters. Writes results.json and results.md under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

CONFIG = dict(
    vocab_size=32000,
    hidden_size=384,
    intermediate_size=1024,
    num_hidden_layers=6,
    num_attention_heads=6,
    num_key_value_heads=2,
    max_position_embeddings=8192,
)


def build(attn: str = "sdpa"):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**CONFIG), attn_implementation=attn)
    return model.eval().requires_grad_(False)


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def prefill_child(way: str, length: int, repeats: int) -> dict:
    """One (way, length) in this process: peak extra memory of the first prefill, then median time."""
    import torch

    from heads.graft import run_target, run_target_lean
    from infer.cache import new_cache

    model = build()
    fn = run_target if way == "full" else run_target_lean
    ids = torch.randint(3, CONFIG["vocab_size"], (1, length), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        fn(model, ids[:, :16], cache=new_cache(), use_cache=True)  # warm-up
        base = rss_mb()
        fn(model, ids, cache=new_cache(), use_cache=True)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            out = fn(model, ids, cache=new_cache(), use_cache=True)
            times.append(time.perf_counter() - t)
            del out
    return {"way": way, "length": length, "time_s": statistics.median(times), "peak_extra_mb": peak - base}


VERIFY_WAYS = {  # TreeRunner options per way of verifying
    "stock": dict(tree_attention=False),  # transformers' sdpa, a float 4D mask rebuilt per step, DynamicCache
    "tree_attention": dict(static=False),  # infer.attention: no K/V repeat, one mask buffer; DynamicCache
    "tree_attention_static": dict(),  # the default: the same with transformers' StaticCache
}


def verify_child(lengths: list[int], repeats: int) -> list[dict]:
    """Per context length: median (and min) ms of one 16-node verify + accept per way, and of a plain
    1-token decode forward of the stock model (what target.generate runs per token); the ways and
    the decode take turns in every round."""
    import torch

    from heads.graft import run_target_lean
    from infer.cache import new_cache
    from infer.runner import TreeRunner
    from infer.tree import tree_buffers

    model = build()
    tb = tree_buffers([[k] for k in range(6)] + [[0, k] for k in range(4)] + [[0, 0, k] for k in range(5)])
    tree = tb.draft(torch.tensor(5), torch.randint(3, 1000, (3, 8)))
    keep = torch.nonzero(tb.ancestors[tb.parents.shape[0] - 1]).flatten()  # a depth-3 path
    rows = []
    for length in lengths:
        ids = torch.randint(3, CONFIG["vocab_size"], (1, length), generator=torch.Generator().manual_seed(0))
        row = {"context": length, "tree_nodes": tb.parents.shape[0]}
        with torch.inference_mode():
            runners = {
                w: TreeRunner(model, max_len=length + 64 * repeats, **o) for w, o in VERIFY_WAYS.items()
            }
            for runner in runners.values():
                runner.prefill(ids)
            cache = new_cache()
            run_target_lean(model, ids, cache=cache, use_cache=True)
            times: dict[str, list[float]] = {w: [] for w in [*runners, "decode1"]}
            for k in range(repeats + 1):  # interleaved, so the machine's load drifts over all ways alike
                for way, runner in runners.items():
                    t = time.perf_counter()
                    runner.verify(tree)
                    runner.accept(keep)
                    times[way].append(time.perf_counter() - t)
                t = time.perf_counter()
                model(ids[:, k : k + 1], past_key_values=cache, use_cache=True)
                times["decode1"].append(time.perf_counter() - t)
        for way, ts in times.items():  # the first round is a warm-up
            name = way if way == "decode1" else f"verify_{way}"
            row[f"{name}_ms"] = 1000 * statistics.median(ts[1:])
            row[f"{name}_min_ms"] = 1000 * min(ts[1:])
        rows.append(row)
        print(row, file=sys.stderr, flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="results/target-step-cpu")
    ap.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)  # way length
    ap.add_argument("--verify-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(prefill_child(args.child[0], int(args.child[1]), args.repeats)))
        return
    if args.verify_child:
        print(json.dumps(verify_child(args.lengths, args.repeats)))
        return
    common = [sys.executable, os.path.abspath(__file__), "--threads", str(args.threads)]
    common += ["--repeats", str(args.repeats)]
    prefill = []
    for length in args.lengths:
        for way in ("full", "lean"):
            res = subprocess.run(
                [*common, "--child", way, str(length)], capture_output=True, text=True, check=True
            )
            prefill.append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(prefill[-1], flush=True)
    res = subprocess.run(
        [*common, "--verify-child", "--lengths", *map(str, args.lengths)],
        capture_output=True,
        text=True,
        check=True,
    )
    verify = json.loads(res.stdout.strip().splitlines()[-1])
    machine = (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {args.threads} thread(s)"
    )
    results = {"command": " ".join(sys.argv), "machine": machine, "config": CONFIG, "prefill": prefill}
    results["verify"] = verify
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    lines = [
        f"# target step on CPU\n\n`{results['command']}` ({machine}; random Llama {CONFIG}, fp32, sdpa)\n"
    ]
    lines += [
        "## prefill\n",
        "| prompt | full: s | full: peak MB | lean: s | lean: peak MB |",
        "|---|---|---|---|---|",
    ]
    by = {(r["way"], r["length"]): r for r in prefill}
    for length in args.lengths:
        f_, l_ = by["full", length], by["lean", length]
        lines.append(
            f"| {length} | {f_['time_s']:.3f} | {f_['peak_extra_mb']:.0f} | {l_['time_s']:.3f} | "
            f"{l_['peak_extra_mb']:.0f} |"
        )
    ways = list(VERIFY_WAYS)
    nodes = verify[0]["tree_nodes"]
    lines += [f"\n## one step after a cached context (median (min) ms; tree of {nodes} nodes)\n"]
    lines += ["| context | " + " | ".join(f"verify: {w}" for w in ways) + " | decode 1 token (stock) |"]
    lines += ["|---|" + "---|" * (len(ways) + 1)]
    for r in verify:
        cells = [f"{r[f'verify_{w}_ms']:.1f} ({r[f'verify_{w}_min_ms']:.1f})" for w in ways]
        cells.append(f"{r['decode1_ms']:.1f} ({r['decode1_min_ms']:.1f})")
        lines.append(f"| {r['context']} | " + " | ".join(cells) + " |")
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
