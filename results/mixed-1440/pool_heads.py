"""Issue 16: head-type difference averaged over training seeds, from one ``scripts/tree_ceiling.py``
results.json (ceiling9.sh). For each setting, τ A - τ B where A and B each stand for the mean of their
seeds' heads on the same contexts:

    Δ = (Σ_s a_s / |A| - Σ_s b_s / |B|) / contexts,  a_s, b_s = accepted drafts summed over a prompt's contexts,

with a 95% percentile bootstrap over prompts (each prompt's columns resampled together). This averages
out the run-to-run noise of training that a single pair of heads carries.

    PYTHONPATH=$PWD .venv/bin/python results/mixed-1440/pool_heads.py DIR/results.json \
        eagle31,eagle31-s1 eagle1,eagle1-s1
"""

import json
import sys

from bench.stats import BOOTSTRAP_REPS, _paired_bootstrap


def pooled(raw: dict, a: list[str], b: list[str]) -> tuple[float, list[float], int]:
    counts = [float(c) for c in raw["contexts"]]
    per = {k: [sum(v) for v in vs] for k, vs in raw["values"].items()}
    ma = [sum(x) / len(a) for x in zip(*(per[k] for k in a), strict=True)]
    mb = [sum(x) / len(b) for x in zip(*(per[k] for k in b), strict=True)]
    ci = _paired_bootstrap([ma, mb, counts], lambda x, y, n: (x - y) / n, BOOTSTRAP_REPS, 0, 0.95)
    ahead = sum(1 for x, y in zip(ma, mb, strict=True) if x > y)
    return (sum(ma) - sum(mb)) / sum(counts), ci, ahead


def main(argv: list[str]) -> None:
    if len(argv) != 3:
        sys.exit("usage: pool_heads.py RESULTS.json A1,A2,... B1,B2,...")
    report = json.load(open(argv[0]))
    a, b = argv[1].split(","), argv[2].split(",")
    for key, raw in report["raw"].items():
        missing = [k for k in a + b if k not in raw["values"]]
        if missing:
            sys.exit(f"{argv[0]}: no heads labelled {missing} in {key!r}")
        d, ci, ahead = pooled(raw, a, b)
        print(f"{key}: mean({argv[1]}) - mean({argv[2]}) = {d:+.3f} [{ci[0]:+.3f} to {ci[1]:+.3f}], "
              f"ahead on {ahead}/{len(raw['contexts'])} prompts")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
