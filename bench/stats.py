"""Aggregation of the benchmark's runs: τ, tokens/s, speedup with a percentile-bootstrap interval over
prompts, paired comparisons (``--vs``). Pure functions of `bench.methods.Run` lists."""

from __future__ import annotations

import math
import statistics
from collections import Counter

import torch

from bench.methods import Method, Run


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    i = (len(s) - 1) * q
    lo, hi = math.floor(i), math.ceil(i)
    return s[lo] + (s[hi] - s[lo]) * (i - lo)


BOOTSTRAP_REPS = 2000


def total_rate(runs: list[Run]) -> float:
    """Σ tokens / Σ seconds over ``runs``: the tokens/s of the whole prompt set."""
    return sum(r.new_tokens for r in runs) / sum(r.seconds for r in runs)


def _paired_bootstrap(
    columns: list[list[float]], stat, reps: int, seed: int, level: float
) -> list[float] | None:
    """Percentile bootstrap interval of ``stat(*sums)``, where each of ``columns`` holds one number per
    prompt and ``sums`` are their totals over a resample of prompts drawn with replacement (the same
    resample for every column, so each prompt's pair stays together). None for fewer than 2 prompts."""
    n = len(columns[0])
    if n < 2:
        return None
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n, (reps, n), generator=g)
    sums = [torch.tensor(c, dtype=torch.float64)[idx].sum(1) for c in columns]
    values = stat(*sums)
    lo, hi = torch.quantile(values, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64))
    return [float(lo), float(hi)]


def bootstrap_ratio_ci(
    runs: list[Run], base: list[Run], reps: int = BOOTSTRAP_REPS, seed: int = 0, level: float = 0.95
) -> list[float] | None:
    """Percentile bootstrap interval of the total-rate ratio (Σ tokens / Σ seconds of ``runs``) over
    (Σ tokens / Σ seconds of ``base``), resampling prompts with replacement and keeping each prompt's
    pair together (both ran on the same prompt, interleaved). None for fewer than 2 prompts.

    It covers prompt-to-prompt variation and the timing noise within this run, not a machine that is
    slower or faster in another run. Deterministic given ``seed``.
    """
    columns = [[float(getattr(r, k)) for r in rs] for rs in (runs, base) for k in ("new_tokens", "seconds")]
    return _paired_bootstrap(columns, lambda ta, sa, tb, sb: (ta / sa) / (tb / sb), reps, seed, level)


def bootstrap_tau_diff_ci(
    runs: list[Run], base: list[Run], reps: int = BOOTSTRAP_REPS, seed: int = 0, level: float = 0.95
) -> list[float] | None:
    """Percentile bootstrap interval of τ(runs) - τ(base), each the pooled τ (Σ tokens emitted by decode
    forwards / Σ decode forwards) of a resample of prompts, drawn with replacement and paired as in
    `bootstrap_ratio_ci`. It says whether one head's τ lead over another's on these prompts is more than
    prompt-to-prompt variation. None for fewer than 2 prompts or a run without decode steps."""
    if any(not r.steps for r in (*runs, *base)):  # None (not counted) or [] (prefill only): no τ
        return None
    columns = [[float(f(r.steps)) for r in rs] for rs in (runs, base) for f in (sum, len)]
    return _paired_bootstrap(columns, lambda ea, na, eb, nb: ea / na - eb / nb, reps, seed, level)


def compare(a: dict, b: dict, runs_a: list[Run], runs_b: list[Run]) -> dict:
    """Paired comparison of two methods on the same prompts (``--vs A:B``): the ratio of their total rates,
    its `bootstrap_ratio_ci`, on how many prompts A was faster, and τ A - τ B with its
    `bootstrap_tau_diff_ci`."""
    ratio = total_rate(runs_a) / total_rate(runs_b)
    wins = sum(
        x.new_tokens / x.seconds > y.new_tokens / y.seconds for x, y in zip(runs_a, runs_b, strict=True)
    )
    return {
        "a": a["method"],
        "b": b["method"],
        "ratio": ratio,
        "ci95": bootstrap_ratio_ci(runs_a, runs_b),
        "a_faster_on": wins,
        "n_prompts": len(runs_a),
        "tau_a": a["tau"],
        "tau_b": b["tau"],
        "tau_diff_ci95": bootstrap_tau_diff_ci(runs_a, runs_b),
    }


def summarise(method: Method, runs: list[Run], base: list[Run]) -> dict:
    """Aggregate one method's runs on one prompt set and mode against the plain runs (same prompts)."""
    steps = [s for r in runs if r.steps is not None for s in r.steps]
    have_steps = all(r.steps is not None for r in runs) and steps
    tps = [r.new_tokens / r.seconds for r in runs]
    base_tps = [r.new_tokens / r.seconds for r in base]
    total_speedup = total_rate(runs) / total_rate(base)
    per_prompt = [a / b for a, b in zip(tps, base_tps, strict=True)]
    tau = sum(steps) / len(steps) if have_steps else None
    # infer.generate adapts the tree by default: the sizes it verified, next to the fixed tree's size
    sizes = [n for r in runs for n in (r.tree_sizes or [])]
    split = None
    if all(r.total_s is not None and r.draft_s is not None and r.verify_s is not None for r in runs):
        d, v, t = (sum(getattr(r, k) for r in runs) for k in ("draft_s", "verify_s", "total_s"))
        split = {"draft": d, "verify": v, "bookkeeping": t - d - v, "total": t}
    return {
        "method": method.label,
        "kind": method.kind,
        "heads": method.heads,
        "head_type": method.head_type,
        "tree_size": method.tree_size,
        "tree": method.tree_desc,
        "tree_sizes_used": {
            "mean": sum(sizes) / len(sizes),
            "histogram": {str(k): v for k, v in sorted(Counter(sizes).items())},
            "steps_without_drafts": sum(n == 1 for n in sizes),
        }
        if sizes
        else None,
        "n_prompts": len(runs),
        "new_tokens": sum(r.new_tokens for r in runs),
        "seconds": sum(r.seconds for r in runs),
        "tau": tau,
        "tau_histogram": {str(k): v for k, v in sorted(Counter(steps).items())} if have_steps else None,
        "tau_quantiles": {f"p{int(q * 100)}": quantile(steps, q) for q in (0.1, 0.5, 0.9)}
        if have_steps
        else None,
        "tokens_per_s": {"median": statistics.median(tps), "min": min(tps), "max": max(tps)},
        "speedup": {
            "total": total_speedup,
            "median": statistics.median(per_prompt),
            "ci95": bootstrap_ratio_ci(runs, base),
        },
        "efficiency": total_speedup / tau if tau else None,
        "time_split_s": split,
        "peak_memory_mib": max(r.peak_mib for r in runs),
        "identical": None,
        "near_tie_flips": None,
        "per_prompt": [
            {
                "new_tokens": r.new_tokens,
                "seconds": r.seconds,
                "tau": (sum(r.steps) / len(r.steps)) if r.steps else None,
            }
            for r in runs
        ],
    }
