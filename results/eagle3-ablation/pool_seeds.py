"""τ A - τ B pooled over several benchmark runs of the same prompts with different sampling seeds
(`scripts/benchmark.py --seed s`), with a paired bootstrap interval over prompts that keeps each
prompt's runs together (a cluster bootstrap: the seeds of one prompt are not independent prompts).

    python results/eagle3-ablation/pool_seeds.py eagle31 eagle1 DIR [DIR ...] > pooled.md

Each DIR holds a benchmark's results.json. Per prompt and method, decode forwards are recovered from
the reported τ as (new_tokens - 1) / τ (the prefill token is not counted in τ), and summed over runs.
"""

import json
import sys

from bench.stats import BOOTSTRAP_REPS, _paired_bootstrap


def main(a: str, b: str, dirs: list[str]) -> None:
    runs = [json.load(open(f"{d}/results.json")) for d in dirs]
    print(f"Pooled over {len(dirs)} runs: {', '.join(dirs)}\n")
    print(
        "| prompts | mode | prompts x runs | τ " + a + " | τ " + b + " | τ A - τ B [95% cluster bootstrap] |"
    )
    print("|---|---|---|---|---|---|")
    keys = sorted({(r["prompt_set"], r["mode"]) for r in runs[0]["results"]})
    for ps, mode in keys:
        cols = {}
        for name in (a, b):
            emitted, steps = None, None
            for run in runs:
                (res,) = [
                    r
                    for r in run["results"]
                    if r["prompt_set"] == ps and r["mode"] == mode and r["method"].split(" [")[0] == name
                ]
                e = [p["new_tokens"] - 1 for p in res["per_prompt"]]
                n = [(p["new_tokens"] - 1) / p["tau"] for p in res["per_prompt"]]
                emitted = e if emitted is None else [x + y for x, y in zip(emitted, e, strict=True)]
                steps = n if steps is None else [x + y for x, y in zip(steps, n, strict=True)]
            cols[name] = (emitted, steps)
        (ea, na), (eb, nb) = cols[a], cols[b]
        ci = _paired_bootstrap(
            [ea, na, eb, nb], lambda ea, na, eb, nb: ea / na - eb / nb, BOOTSTRAP_REPS, 0, 0.95
        )
        ta, tb = sum(ea) / sum(na), sum(eb) / sum(nb)
        print(
            f"| {ps} | {mode} | {len(ea)} x {len(runs)} | {ta:.2f} | {tb:.2f} | "
            f"{ta - tb:+.2f} [{ci[0]:+.2f} to {ci[1]:+.2f}] |"
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
