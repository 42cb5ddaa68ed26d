"""What acceptance would a speedup need on this machine? From the costs `scripts/tune_tree.py` measured
(an ``inference.json``'s ``tuning.profile``), no model run.

A speculative step of an EAGLE-2 tree of depth D and k draft tokens costs, in plain decoding steps,

    cost(D, k) = t_verify(k + 1 [+ m]) / t_verify(1) + t_draft(D) / t_verify(1)

(m: prompt lookup's chain, `infer.lookup`, when it is grafted on), and emits τ tokens, so the speedup over
`target.generate` is τ / cost: a speedup S needs τ >= S * cost, and no tree of depth D emits more than
D + 1 tokens a step. A chain that accepts each depth with probability α emits
τ = (1 - α^(D+1)) / (1 - α); the α printed is the one that reaches the needed τ (a tree reaches it with a
lower top-1, its siblings catching some misses, so this is what a chain-like head must hit).

    python experiments/speed_ceiling.py results/smollm2-eagle31/recipe-1200/inference.json \
        results/smollm2-first-run/inference.json --speedup 1.5 2 2.5 3 --out results/speed-ceiling

Writes ``OUT/ceiling.md`` and ``OUT/ceiling.json``.
"""

import argparse
import json
import os

TREES = ((3, 8), (3, 16), (4, 16), (4, 24), (5, 32), (6, 48), (7, 55))


def chain_alpha(tau: float, depth: int) -> float | None:
    """The per-depth acceptance α of a depth-``depth`` chain with expected tokens per step ``tau``
    (bonus token included); None when ``tau`` > depth + 1 (no tree of that depth emits so many)."""
    if tau > depth + 1:
        return None
    if tau <= 1:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(60):  # bisection: τ(α) rises with α
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(depth + 1)) < tau:
            lo = mid
        else:
            hi = mid
    return hi


def costs(profile: dict, depth: int, k: int, chain: int) -> float | None:
    steps = profile["step_s"]  # k = 1 .. len(steps)
    width = k + 1 + chain
    if width > len(steps):
        return None
    return steps[width - 1] / steps[0] + profile["draft_s_by_depth"][str(depth)] / steps[0]


def rows(profile: dict, speedups: list[float], chain: int) -> list[dict]:
    """One row per tree of `TREES` that ``profile`` (an inference.json's ``tuning.profile``) prices."""
    out = []
    for depth, k in TREES:
        if str(depth) not in profile["draft_s_by_depth"]:
            continue
        cost = costs(profile, depth, k, chain)
        if cost is None:  # wider than the measured profile
            continue
        need = {s: s * cost for s in speedups}
        out.append(dict(
            depth=depth, tokens=k, chain=chain, cost=cost, max_tau=depth + 1, max_speedup=(depth + 1) / cost,
            tau_needed={str(s): t for s, t in need.items()},
            alpha_needed={str(s): chain_alpha(t, depth) for s, t in need.items()},
        ))  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inference", nargs="+", help="inference.json files written by scripts/tune_tree.py")
    ap.add_argument("--speedup", type=float, nargs="+", default=[1.5, 2.0, 2.5, 3.0])
    ap.add_argument("--chain", type=int, nargs="+", default=[0, 8], help="lookup chain lengths to price")
    ap.add_argument("--out", default=None, help="folder for ceiling.md and ceiling.json")
    args = ap.parse_args()

    report, lines = {}, []
    head = " | ".join(f"{s}x: τ (α)" for s in args.speedup)
    for path in args.inference:
        with open(path) as f:
            tuning = json.load(f)["tuning"]
        step_ms = 1000 * tuning["profile"]["step_s"][0]
        lines += [f"## {path}", "", f"{tuning['machine']}, {tuning['dtype']}, {tuning['date'][:10]}; "
                  f"one plain step after a {tuning['profile']['prefix_len']}-token prefix: {step_ms:.1f} ms", "",
                  f"| depth | tokens | chain | cost (plain steps) | most τ | most speedup | {head} |",
                  "|" + "---|" * (6 + len(args.speedup))]  # fmt: skip
        report[path] = []
        for chain in args.chain:
            for r in rows(tuning["profile"], args.speedup, chain):
                report[path].append(r)
                cells = []
                for s in args.speedup:
                    a = r["alpha_needed"][str(s)]
                    cells.append(
                        f"{r['tau_needed'][str(s)]:.2f} ({a:.2f})" if a is not None else "out of reach"
                    )
                lines.append(f"| {r['depth']} | {r['tokens']} | {chain} | {r['cost']:.2f} | {r['max_tau']} | "
                             f"{r['max_speedup']:.2f}x | " + " | ".join(cells) + " |")  # fmt: skip
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "ceiling.md"), "w") as f:
            f.write(text)
        with open(os.path.join(args.out, "ceiling.json"), "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
