"""How much does the adaptive tree (`infer.adaptive.Adapter`) give up against the best fixed shape, when
acceptance is noisy or drifts? Replays seeded acceptance streams through the adapter, with no model: at
each step a chain of depth d accepts each depth with probability α (a tree with α + ``--tree-boost``),
the step costs c(k) + draft plain steps (c: a measured verify-cost curve, k the nodes verified), and the
adapter sees only what `infer.generate` shows it (accepted length, nodes, depth drawn).

    python experiments/adaptive_replay.py --memory 4 8 16 32 --out results/smollm2-eagle31/adaptive-memory

Prints, per scenario, tokens per plain step of time for the adapter at each ``--memory`` (the adapter's
own default when the installed `Adaptive` has no such option), a fixed depth-D chain and a fixed tree,
and the adapter's share of plain (undrafted) steps. Writes ``OUT/replay.md`` and ``OUT/replay.json``.
The default costs are SmolLM2-135M-Instruct's in bf16 on 2 cores (verify k = 1..64 tokens after a
256-token prefix, results/smollm2-eagle31/more-steps/adaptive.md) and a 48-node depth-6 EAGLE-2 tree
whose propose costs 0.43 plain steps (its measured draft share there).
"""

import argparse
import dataclasses
import json
import os
import random
import statistics
import sys

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # experiments/ sits beside the packages

from infer.adaptive import Adapter, Adaptive  # noqa: E402
from infer.tree_choice import interpolate  # noqa: E402

SMOLLM2 = {1: 1.0, 2: 1.10, 4: 1.11, 8: 1.14, 16: 1.24, 32: 1.35, 64: 1.68}

# acceptance per draft depth as a function of the tokens emitted so far
SCENARIOS = {
    "α 0.5": lambda t: 0.5,
    "α 0.35": lambda t: 0.35,
    "α 0.2": lambda t: 0.2,
    "α 0.05 (useless)": lambda t: 0.05,
    "α 0.2 / 0.7, 40 tokens each": lambda t: 0.7 if (t // 40) % 2 else 0.2,
    "α 0 / 0.6, 60 tokens each": lambda t: 0.6 if (t // 60) % 2 else 0.0,
}


def replay(alpha_at, args, seed: int, memory: int | None, fixed: str | None = None) -> tuple[float, float]:
    """(tokens per plain step of time, share of plain steps) over ``args.tokens`` tokens."""
    c = interpolate(list(SMOLLM2), list(SMOLLM2.values()), 64)  # c(k), k = 1..64, linear between
    rng = random.Random(seed)
    opts = {"verify_s": c, "draft_s": args.draft}
    if memory is not None:
        opts["memory"] = memory
    adapter = Adapter(Adaptive(**opts), c, args.depth)
    tokens, time_, plain, steps = 0, 0.0, 0, 0
    while tokens < args.tokens:
        if fixed == "chain":
            depth, width = args.depth, 1
        elif fixed == "tree":
            depth, width = args.depth, None
        else:
            depth, width = adapter.shape()
        tree = depth > 0 and width is None
        nodes = 1 if depth == 0 else args.nodes if tree else depth + 1
        p = min(alpha_at(tokens) + (args.tree_boost if tree else 0.0), 0.95)
        accepted = 1 + next((j for j in range(depth) if rng.random() >= p), depth)
        # a chain drafts one node per level, the tree its whole frontier: per level, a chain costs the
        # tree's per-node draft times the EAGLE layer's fixed overhead (args.chain_overhead)
        per_level = args.draft / args.depth if tree else args.draft / (args.nodes - 1) * args.chain_overhead
        time_ += c[nodes - 1] + per_level * depth
        tokens, steps, plain = tokens + accepted, steps + 1, plain + (depth == 0)
        if fixed is None:
            adapter.observe(accepted, nodes, depth)
    return tokens / time_, plain / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--memory", type=int, nargs="*", default=[], help="adapter memories to compare (steps)")
    ap.add_argument("--tokens", type=int, default=2000, help="tokens per replay")
    ap.add_argument("--seeds", type=int, default=6, help="replays per scenario (seeds 0..N-1), averaged")
    ap.add_argument("--depth", type=int, default=6, help="the full tree's depth D")
    ap.add_argument("--nodes", type=int, default=48, help="the full tree's nodes")
    ap.add_argument("--draft", type=float, default=0.43, help="one full-tree propose, in plain steps")
    ap.add_argument(
        "--chain-overhead", type=float, default=1.6, help="chain draft per level / tree's per node"
    )
    ap.add_argument("--tree-boost", type=float, default=0.12, help="the tree's acceptance over the chain's")
    ap.add_argument("--out", default=None, help="folder for replay.md and replay.json")
    args = ap.parse_args()
    has_memory = "memory" in {f.name for f in dataclasses.fields(Adaptive)}
    memories = args.memory if has_memory and args.memory else [None]
    names = [f"adaptive (memory {m})" if m else "adaptive" for m in memories]
    rows = []
    for scenario, alpha_at in SCENARIOS.items():
        row = {"scenario": scenario}
        for label, fixed in (("fixed chain", "chain"), ("fixed tree", "tree")):
            row[label] = statistics.mean(replay(alpha_at, args, s, None, fixed)[0] for s in range(args.seeds))
        for name, m in zip(names, memories, strict=True):
            runs = [replay(alpha_at, args, s, m) for s in range(args.seeds)]
            row[name] = statistics.mean(r for r, _ in runs)
            row[name + " plain share"] = statistics.mean(p for _, p in runs)
        rows.append(row)
    head = ["scenario", "fixed chain", "fixed tree", *names]
    lines = [
        f"Command: `python experiments/adaptive_replay.py {' '.join(sys.argv[1:])}`",
        "",
        "Tokens per plain step of time (plain decoding: 1.00), mean of "
        f"{args.seeds} seeded replays of {args.tokens} tokens; (plain share of the adapter's steps).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for row in rows:
        cells = [row["scenario"], f"{row['fixed chain']:.2f}", f"{row['fixed tree']:.2f}"]
        cells += [f"{row[n]:.2f} ({row[n + ' plain share']:.0%})" for n in names]
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "replay.md"), "w", encoding="utf-8") as f:
            f.write(text)
        with open(os.path.join(args.out, "replay.json"), "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
