"""Issue 16: head-type difference averaged over training seeds, from one ``scripts/tree_ceiling.py``
results.json (ceiling9.sh). For each setting, τ A - τ B where A and B each stand for the mean of their
seeds' heads on the same contexts:

    Δ = (Σ_s a_s / |A| - Σ_s b_s / |B|) / contexts,  a_s, b_s = accepted drafts summed over a prompt's contexts,

with a 95% percentile bootstrap over prompts (each prompt's columns resampled together). This averages
out the run-to-run noise of training that a single pair of heads carries.

    PYTHONPATH=$PWD .venv/bin/python results/mixed-1440/pool_heads.py DIR/results.json \
        eagle31,eagle31-s1 eagle1,eagle1-s1

Several results files (``A/results.json,B/results.json``) are merged only where they scored the same
contexts: every setting must have the same prompts and context counts, every label that appears in more
than one file must have the same per-prompt values there (a head retrained bit for bit on a rebuilt
target, scored again, is that proof), at least one label must be shared, and otherwise it exits 1.
"""

import json
import sys

from infer.benchmark.stats import BOOTSTRAP_REPS, _paired_bootstrap


def pooled(raw: dict, a: list[str], b: list[str]) -> tuple[float, list[float], int]:
    counts = [float(c) for c in raw["contexts"]]
    per = {k: [sum(v) for v in vs] for k, vs in raw["values"].items()}
    ma = [sum(x) / len(a) for x in zip(*(per[k] for k in a), strict=True)]
    mb = [sum(x) / len(b) for x in zip(*(per[k] for k in b), strict=True)]
    ci = _paired_bootstrap([ma, mb, counts], lambda x, y, n: (x - y) / n, BOOTSTRAP_REPS, 0, 0.95)
    ahead = sum(1 for x, y in zip(ma, mb, strict=True) if x > y)
    return (sum(ma) - sum(mb)) / sum(counts), ci, ahead


def merged(paths: list[str]) -> dict:
    """The ``raw`` sections of several results.json files as one, if they scored the same contexts."""
    reports = [json.load(open(p)) for p in paths]
    raw = {key: {"contexts": v["contexts"], "values": dict(v["values"])} for key, v in reports[0]["raw"].items()}
    for path, rep in zip(paths[1:], reports[1:], strict=True):
        if set(rep["raw"]) != set(raw):
            sys.exit(f"{path}: settings {sorted(rep['raw'])} differ from {paths[0]}'s {sorted(raw)}")
        for key, v in rep["raw"].items():
            if v["contexts"] != raw[key]["contexts"]:
                sys.exit(f"{path}: {key!r} has other contexts per prompt than {paths[0]}")
            shared = set(v["values"]) & set(raw[key]["values"])
            if not shared:
                sys.exit(f"{path}: no head label in common with the files before it, so nothing shows the contexts are the same")
            for k in sorted(shared):
                if v["values"][k] != raw[key]["values"][k]:
                    sys.exit(f"{path}: {k!r} in {key!r} differs from the same label before it: not the same contexts (or not the same head)")
            raw[key]["values"].update(v["values"])
            print(f"{key}: {path} merged; identical per-prompt values of {sorted(shared)}")
    return raw


def main(argv: list[str]) -> None:
    if len(argv) != 3:
        sys.exit("usage: pool_heads.py RESULTS.json[,RESULTS.json...] A1,A2,... B1,B2,...")
    report = {"raw": merged(argv[0].split(","))}
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
