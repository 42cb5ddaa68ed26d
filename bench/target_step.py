"""Cost of the target side of `infer.generate` on a random Llama: prefill and one tree-verify step.

    python scripts/bench_target_step.py [--lengths 512 1024 2048 4096] [--threads 1] [--out results/...]

(``scripts/bench_target_step.py`` is a thin CLI over `main` here.)

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

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

import torch

from bench.measure import random_llama
from bench.shapes import LLAMA_35M
from heads.config import option, parse_cli, repeatable
from heads.graft import run_target, run_target_lean
from heads.io import atomic_text
from infer.cache import new_cache
from infer.runner import TreeRunner
from infer.tree import tree_buffers


@dataclass
class TargetStepOptions:
    """Cost of the target side of infer.generate on a random Llama: prefill and one tree-verify step."""

    lengths: list[int] = field(
        default_factory=lambda: [512, 1024, 2048, 4096], metadata={"help": "context lengths"}
    )
    repeats: int = option(3, help="timed repetitions per measurement")
    threads: int = option(1, help="torch CPU threads")
    out: str = option("results/target-step-cpu", help="output directory")
    child: list[str] = repeatable(help="internal: WAY LENGTH of one prefill child")
    verify_child: bool = option(False, help="internal: run the verify measurements here")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def prefill_child(way: str, length: int, repeats: int) -> dict:
    """One (way, length) in this process: peak extra memory of the first prefill, then median time."""
    model = random_llama(LLAMA_35M)
    fn = run_target if way == "full" else run_target_lean
    ids = torch.randint(3, LLAMA_35M["vocab_size"], (1, length), generator=torch.Generator().manual_seed(0))
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
    model = random_llama(LLAMA_35M)
    tb = tree_buffers([[k] for k in range(6)] + [[0, k] for k in range(4)] + [[0, 0, k] for k in range(5)])
    tree = tb.draft(torch.tensor(5), torch.randint(3, 1000, (3, 8)))
    keep = torch.nonzero(tb.ancestors[tb.parents.shape[0] - 1]).flatten()  # a depth-3 path
    rows = []
    for length in lengths:
        ids = torch.randint(
            3, LLAMA_35M["vocab_size"], (1, length), generator=torch.Generator().manual_seed(0)
        )
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
                run_target_lean(model, ids[:, k : k + 1], cache=cache, use_cache=True)
                times["decode1"].append(time.perf_counter() - t)
        for way, ts in times.items():  # the first round is a warm-up
            name = way if way == "decode1" else f"verify_{way}"
            row[f"{name}_ms"] = 1000 * statistics.median(ts[1:])
            row[f"{name}_min_ms"] = 1000 * min(ts[1:])
        rows.append(row)
        print(row, file=sys.stderr, flush=True)
    return rows


def _markdown(results: dict, lengths: list[int]) -> str:
    machine, prefill, verify = results["machine"], results["prefill"], results["verify"]
    lines = [
        f"# target step on CPU\n\n`{results['command']}` ({machine}; random Llama {LLAMA_35M}, fp32, sdpa)\n"
    ]
    lines += [
        "## prefill\n",
        "| prompt | full: s | full: peak MB | lean: s | lean: peak MB |",
        "|---|---|---|---|---|",
    ]
    by = {(r["way"], r["length"]): r for r in prefill}
    for length in lengths:
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
    return "\n".join(lines) + "\n"


def _child_json(cmd: list[str]) -> object:
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    """The script: each prefill (way, length) in a fresh subprocess (its own peak RSS), the verify
    measurements in one more, then results.json and results.md under ``--out``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    o = parse_cli(TargetStepOptions, argv, prog="scripts/bench_target_step.py")
    torch.set_num_threads(o.threads)
    if o.child:
        print(json.dumps(prefill_child(o.child[0], int(o.child[1]), o.repeats)))
        return
    if o.verify_child:
        print(json.dumps(verify_child(o.lengths, o.repeats)))
        return
    common = [sys.executable, "-m", "bench.target_step", "--threads", str(o.threads)]
    common += ["--repeats", str(o.repeats)]
    prefill = []
    for length in o.lengths:
        for way in ("full", "lean"):
            prefill.append(_child_json([*common, "--child", way, str(length)]))
            print(prefill[-1], flush=True)
    verify = _child_json([*common, "--verify-child", "--lengths", *map(str, o.lengths)])
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {o.threads} thread(s)"
    command = " ".join(["scripts/bench_target_step.py", *argv])
    results = {
        "command": command,
        "machine": machine,
        "config": LLAMA_35M,
        "prefill": prefill,
        "verify": verify,
    }
    os.makedirs(o.out, exist_ok=True)
    atomic_text(os.path.join(o.out, "results.json"), json.dumps(results, indent=1))
    md = _markdown(results, o.lengths)
    atomic_text(os.path.join(o.out, "results.md"), md)
    print(md)


if __name__ == "__main__":  # the measuring subprocesses of `main`
    main()
