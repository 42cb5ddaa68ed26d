"""Where the time of one `infer.generate` step goes, and the speedup over `target.generate`.

    python scripts/profile_generate.py --heads out/demo-medusa out/demo-eagle [--dtype bf16] \
        [--prompts 8] [--max-new-tokens 128] [--repeats 3] [--sample] [--threads N] [--cprofile]

Two measurements, on the demo target's held-out prompts, in one process:

1. **Speed**, interleaved (target.generate, heads 1, heads 2, ..., then again) after a warm-up and
   repeated ``--repeats`` times; per configuration the median tokens/s over all prompt runs, the
   speedup (ratio of medians to target.generate), τ and efficiency = speedup / τ. Greedy outputs
   are compared with target.generate (in bf16 a near-tie argmax can flip, see README).
2. **Split** of the decode steps into: draft (the proposer's propose/advance), mask (building the
   4D tree mask, or updating the tree-attention mask buffer), verify (the target forward), accept
   (the acceptance rule), compact (KV cache compaction) and other (the loop's own bookkeeping: the
   host sync, emitting, streaming and, when sampling, the warped softmax over the tree's logits). It
   is measured by wrapping the functions `infer.generate.speculative_generate` and its
   `infer.runner.TreeRunner` call with wall-clock timers (CUDA-synchronised on GPU), so it needs no
   change to the loop; the wrapped run is separate from the speed run, whose timings stay unperturbed.

``--cprofile`` additionally prints the top functions by own time (cProfile) for each head.
The machine's other load shows up directly in the numbers: repeat and read the medians.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import importlib
import io
import json
import os
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import infer  # noqa: E402

G = importlib.import_module("infer.generate")  # the module (``infer.generate`` is also the function)
R = importlib.import_module("infer.runner")  # the target side of the loop (forwards, masks, cache)

SECTIONS = ("draft", "mask", "verify", "accept", "compact", "other")


class Split:
    """Accumulates wall-clock seconds per section by wrapping callables."""

    def __init__(self, device: torch.device) -> None:
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.t = dict.fromkeys(SECTIONS, 0.0)
        self.in_prefill = False  # the first target forward of a generate call is the prefill

    def wrap(self, section: str, fn):
        def timed(*args, **kwargs):
            if section == "verify" and self.in_prefill:
                self.in_prefill = False
                return fn(*args, **kwargs)
            self.sync()
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self.sync()
            self.t[section] += time.perf_counter() - t0
            return out

        return timed


@contextlib.contextmanager
def split_timers(split: Split, model: infer.SpecModel):
    """Wrap the names `speculative_generate` and its `TreeRunner` look up in their modules, and the
    proposer's methods."""
    names = {
        (R, "run_target_lean"): "verify",
        (R, "attention_mask"): "mask",  # float masks (eager targets, sliding windows)
        (R.TreeMask, "__call__"): "mask",  # the tree-attention mask buffer (sdpa targets)
        (R, "compact"): "compact",
        (G, "accept_greedy"): "accept",
        (G, "accept_exact"): "accept",
        (G, "accept_typical"): "accept",
    }
    saved = {(mod, n): getattr(mod, n) for mod, n in names}  # a renamed function fails here, loudly
    orig_proposer = model.proposer

    def proposer(*a, **kw):
        p = orig_proposer(*a, **kw)  # called once per generate, before the prefill
        split.in_prefill = True
        p.propose = split.wrap("draft", p.propose)
        p.advance = split.wrap("draft", p.advance)
        return p

    try:
        for (mod, n), fn in saved.items():
            setattr(mod, n, split.wrap(names[mod, n], fn))
        model.proposer = proposer
        yield
    finally:
        for (mod, n), fn in saved.items():
            setattr(mod, n, fn)
        model.proposer = orig_proposer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", nargs="+", required=True, help="heads directories (e.g. out/demo-medusa)")
    ap.add_argument("--target", default="demo", help="target dir; 'demo' = the built-in full demo target")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=128, help="truncate prompts to their last N tokens")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds over all prompts")
    ap.add_argument(
        "--sample", action="store_true", help="T=0.7 sampling (top-k/top-p off) instead of greedy"
    )
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    ap.add_argument("--attn", default=None, help="attn_implementation (sdpa, eager); default: the model's")
    ap.add_argument("--cprofile", action="store_true", help="print cProfile's top functions per head")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads or os.cpu_count() or 1)

    from train import demo

    target = demo.ensure_demo_target("full") if args.target == "demo" else args.target
    prompts_path = demo.ensure_demo_data("full")["prompts"]
    models = [
        infer.load(target, heads=h, dtype=args.dtype, attn_implementation=args.attn) for h in args.heads
    ]
    # one target shared by all heads, so target.generate and every head run the same weights
    for m in models[1:]:
        m.target = models[0].target
    tok, tgt = models[0].tokenizer, models[0].target
    device = next(tgt.parameters()).device
    with open(prompts_path) as f:
        texts = [json.loads(line)["text"] for line in f][: args.prompts]
    encoded = [tok(t, return_tensors="pt").input_ids[:, -args.prompt_tokens :].to(device) for t in texts]
    sample = (
        dict(do_sample=True, temperature=0.7, top_k=0, top_p=1.0) if args.sample else dict(do_sample=False)
    )
    gen = dict(max_new_tokens=args.max_new_tokens, eos_token_id=[], **sample)
    ref_kw = dict(
        max_new_tokens=args.max_new_tokens, eos_token_id=None, pad_token_id=tok.pad_token_id, **sample
    )

    def run_ref(ids):
        return tgt.generate(ids, **ref_kw)

    def run_spec(m, ids):
        return infer.generate(m, ids, **gen)

    for m in models:  # warm-up
        run_spec(m, encoded[0])
    run_ref(encoded[0])

    names = ["target.generate"] + [m.heads.config.head_type for m in models]
    tps = {n: [] for n in names}
    taus = {n: [] for n in names[1:]}
    same = {n: 0 for n in names[1:]}
    for _ in range(args.repeats):
        for ids in encoded:
            t = time.perf_counter()
            ref = run_ref(ids)
            tps[names[0]].append((ref.shape[1] - ids.shape[1]) / (time.perf_counter() - t))
            for n, m in zip(names[1:], models, strict=True):
                t = time.perf_counter()
                out = run_spec(m, ids)
                tps[n].append(out.stats.new_tokens / (time.perf_counter() - t))
                taus[n].append(out.stats.mean_accepted_length)
                same[n] += torch.equal(ref, out.sequences)

    ref_tps = statistics.median(tps[names[0]])
    runs = args.repeats * len(encoded)
    mode = "T=0.7 sampling" if args.sample else "greedy"
    print(
        f"\n## speed: {mode}, dtype {args.dtype}, {torch.get_num_threads()} threads, "
        f"{len(encoded)} prompts x {args.repeats} interleaved rounds, {args.max_new_tokens} new tokens\n"
    )
    print(
        "| config | tokens/s median (min-max) | speedup | τ | efficiency | identical |\n|---|---|---|---|---|---|"
    )
    results = {"args": vars(args), "speed": {}, "split": {}}
    for n in names:
        med = statistics.median(tps[n])
        row = {"tokens_per_s": med, "min": min(tps[n]), "max": max(tps[n]), "speedup": med / ref_tps}
        if n in taus:
            tau = statistics.mean(taus[n])
            row.update(tau=tau, efficiency=row["speedup"] / tau)
            if not args.sample:  # sampled runs draw from other random streams: equality means nothing
                row["identical"] = f"{same[n]}/{runs}"
        results["speed"][n] = row
        print(
            f"| {n} | {med:.1f} ({row['min']:.1f}-{row['max']:.1f}) | {row['speedup']:.2f}x | "
            f"{row.get('tau', 1.0):.2f} | {row.get('efficiency', 1.0):.2f} | {row.get('identical', '-')} |"
        )

    print("\n## split of the decode loop (ms per step, % of the generate call)\n")
    print("| heads | steps | " + " | ".join(SECTIONS) + " | prefill | total ms/step |")
    print("|---|---|" + "---|" * (len(SECTIONS) + 2))
    for n, m in zip(names[1:], models, strict=True):
        split = Split(device)
        steps, total, prefill = 0, 0.0, 0.0
        with split_timers(split, m):
            for ids in encoded:
                t = time.perf_counter()
                out = run_spec(m, ids)
                total += time.perf_counter() - t
                steps += len(out.stats.accepted_lengths)
                prefill += out.stats.prefill_s
        decode = total - prefill
        split.t["other"] = decode - sum(v for k, v in split.t.items() if k != "other")
        cells = [f"{1e3 * split.t[s] / steps:.2f} ({100 * split.t[s] / total:.0f}%)" for s in SECTIONS]
        print(
            f"| {n} | {steps} | "
            + " | ".join(cells)
            + f" | {100 * prefill / total:.0f}% | {1e3 * decode / steps:.2f} |"
        )
        results["split"][n] = {"steps": steps, "total_s": total, "prefill_s": prefill, **split.t}

    if args.cprofile:
        for n, m in zip(names[1:], models, strict=True):
            prof = cProfile.Profile()
            prof.enable()
            for ids in encoded:
                run_spec(m, ids)
            prof.disable()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
            print(f"\n## cProfile {n} (top 25 by own time)\n{s.getvalue()}")

    if args.json:  # atomic: a reader never sees half a file
        tmp = f"{args.json}.tmp"
        with open(tmp, "w") as f:
            json.dump(results, f, indent=1)
        os.replace(tmp, args.json)


if __name__ == "__main__":
    main()
