"""Is one row of a finished benchmark run faster than another beyond prompt-to-prompt variation? Reads a
`scripts/benchmark.py` results.json and, for each pair of method labels, in every prompt set and mode
where both ran, prints the ratio of their total tokens/s with the benchmark's paired bootstrap interval
over prompts (`bench.stats.compare`, what ``--vs`` reports) and on how many prompts A was
faster. The rows ran interleaved on the same prompts, so the pairs stay paired.

    python experiments/paired_ratios.py out/bench/results.json \\
        "eagle31 [8 tok]:eagle31 [8 tok] unpriced" --out results/smollm2-chain-price/paired.md

Each pair is ``A:B`` (labels as in results.md; a label may hold spaces, so quote the pair). Writes a
Markdown table to ``--out`` when given.
"""

import argparse
import json
import os
import sys

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # experiments/ sits beside the packages

from bench.methods import Run  # noqa: E402
from bench.report import write_text  # noqa: E402
from bench.stats import compare  # noqa: E402


def runs(row: dict) -> list[Run]:
    return [Run(None, p["new_tokens"], p["seconds"], None, 0.0) for p in row["per_prompt"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a scripts/benchmark.py results.json")
    ap.add_argument("pairs", nargs="+", help="A:B method labels")
    ap.add_argument("--out", help="write the table here (Markdown)")
    args = ap.parse_args()
    with open(args.results) as f:
        report = json.load(f)
    rows = {(r["prompt_set"], r["mode"], r["method"]): r for r in report["results"]}
    lines = [
        f"Paired ratios from `{args.results}` ({report['date']}; command: `{report['command']}`).",
        "",
        "| prompts | mode | A | B | tokens/s A / B | 95% interval | A faster on |",
        "|---|---|---|---|---|---|---|",
    ]
    for pair in args.pairs:
        a, sep, b = pair.partition(":")
        if not sep:
            raise SystemExit(f"{pair!r}: expected A:B")
        cells = sorted(
            {(s, m) for s, m, label in rows if label == a} & {(s, m) for s, m, label in rows if label == b}
        )
        if not cells:
            raise SystemExit(f"{pair!r}: no prompt set and mode where both {a!r} and {b!r} ran")
        for s, m in cells:
            c = compare(rows[s, m, a], rows[s, m, b], runs(rows[s, m, a]), runs(rows[s, m, b]))
            (lo, hi), n = c["ci95"], c["n_prompts"]
            lines.append(
                f"| {s} | {m} | {a} | {b} | {c['ratio']:.2f}x | {lo:.2f}-{hi:.2f} | {c['a_faster_on']}/{n} |"
            )
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        write_text(args.out, text)


if __name__ == "__main__":
    main()
