"""The benchmark's outputs: the markdown table (results.md) and the speedup/τ plot (speedup_vs_tree.png)."""

from __future__ import annotations

import os

from bench.methods import SAMPLE_TEMPERATURE
from heads.io import atomic_write

SCHEMA = "selfspec-benchmark/1"
TAU_DEFINITION = (
    "tokens emitted per target decode forward (verify step), bonus token included, pooled over all "
    "steps of all prompts; the prefill forward and its token are excluded; plain decoding has tau = 1"
)
SPEEDUP_DEFINITION = (
    "ratio to target.generate on the same prompts in the same run: 'total' = sum of plain seconds / sum "
    "of method seconds (equal token counts unless --stop-at-eos, so the tokens/s ratio); 'median' = "
    "median over prompts of (method tokens/s) / (plain tokens/s)"
)


def fmt(x, spec: str = ".2f", na: str = "n/a") -> str:
    return na if x is None else format(x, spec)


def _ci(d: dict) -> str:
    ci = d.get("ci95")
    return f" [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else ""


def _tau_diff(c: dict) -> str:
    if c["tau_a"] is None or c["tau_b"] is None:
        return "n/a"
    ci = c.get("tau_diff_ci95")
    return f"{c['tau_a'] - c['tau_b']:+.2f}" + (f" [{ci[0]:+.2f} to {ci[1]:+.2f}]" if ci else "")


def _tree(r: dict) -> str:
    """The method's tree (the largest: infer.generate adapts it by default) and the tokens verified per
    step, mean over steps, with the steps that verified the root alone."""
    used = r.get("tree_sizes_used")
    if not used:
        return r["tree"] or "-"
    return f"{r['tree']}; {used['mean']:.1f} verified/step, {used['steps_without_drafts']} undrafted"


def markdown(report: dict) -> str:
    lines = [
        f"# selfspec benchmark ({report['date']})",
        "",
        f"Machine: {report['machine']['summary']}. Target: {report['settings']['target']} "
        f"({report['settings']['dtype']}). {report['settings']['max_new_tokens']} new tokens per prompt"
        f"{'' if report['settings']['stop_at_eos'] else ' (EOS ignored: fixed length)'}; sample = T "
        f"{SAMPLE_TEMPERATURE}.",
        "",
        f"Command: `{report['command']}`",
        "",
        f"τ: {TAU_DEFINITION}. Speedup: {SPEEDUP_DEFINITION}. Efficiency = speedup (total) / τ. "
        f"Peak memory: {report['peak_memory_kind']}. Time split: draft / verify / bookkeeping seconds "
        "summed over prompts (n/a: not reported by this infer.generate). [a-b]: 95% bootstrap interval "
        "over prompts (paired with target.generate on each prompt; it does not cover run-to-run drift). "
        "Tree: the heads' tree; infer.generate adapts it per step by default (its tokens verified per step, "
        "mean, and steps without drafts); 'fixed': the same tree every step (--adaptive off).",
        "",
        "| prompts | mode | method | tree | τ (p10/p50/p90) | tok/s median (min-max) | speedup total | "
        "speedup median | efficiency | draft/verify/other s | peak MiB | identical |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        q = r["tau_quantiles"]
        tau = fmt(r["tau"]) + (f" ({q['p10']:.0f}/{q['p50']:.0f}/{q['p90']:.0f})" if q else "")
        t = r["tokens_per_s"]
        split = r["time_split_s"]
        split_s = (
            "/".join(f"{split[k]:.1f}" for k in ("draft", "verify", "bookkeeping"))
            + f" ({100 * split['draft'] / split['total']:.0f}% draft)"
            if split
            else "n/a"
        )
        ident = "-" if r["identical"] is None else f"{r['identical']}/{r['n_prompts']}"
        if r["near_tie_flips"]:
            ident += f" ({r['near_tie_flips']} near-tie)"
        lines.append(
            f"| {r['prompt_set']} | {r['mode']} | {r['method']} | {_tree(r)} | {tau} | "
            f"{t['median']:.1f} ({t['min']:.1f}-{t['max']:.1f}) | {r['speedup']['total']:.2f}x{_ci(r['speedup'])} | "
            f"{r['speedup']['median']:.2f}x | {fmt(r['efficiency'])} | {split_s} | "
            f"{r['peak_memory_mib']:.0f} | {ident} |"
        )
    if report.get("comparisons"):
        lines += [
            "",
            "Paired comparisons (`--vs A:B`): tokens/s of A over B on the same prompts, with the 95% "
            "bootstrap interval over prompts, on how many prompts A was faster, and τ A - τ B with its 95% "
            "bootstrap interval over prompts:",
            "",
            "| prompts | mode | A | B | A / B | A faster on | τ A / τ B | τ A - τ B |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for c in report["comparisons"]:
            lines.append(
                f"| {c['prompt_set']} | {c['mode']} | {c['a']} | {c['b']} | {c['ratio']:.3f}{_ci(c)} | "
                f"{c['a_faster_on']}/{c['n_prompts']} | {fmt(c['tau_a'])} / {fmt(c['tau_b'])} | {_tau_diff(c)} |"
            )
    if report.get("verify_cost"):
        vc = report["verify_cost"]
        ks = list(vc["ms"])
        lines += [
            "",
            f"Verify cost on this machine: one target forward over k new tokens after a "
            f"{vc['prefix_tokens']}-token prefix, median of {vc['repetitions']}, ratio to k={ks[0]}:",
            "",
            "| k | " + " | ".join(ks) + " |",
            "|---|" + "---|" * len(ks),
            "| ms | " + " | ".join(f"{vc['ms'][k]:.2f}" for k in ks) + " |",
            "| ratio | " + " | ".join(f"{vc['ratio_to_k1'][k]:.2f}" for k in ks) + " |",
        ]
    if report["mismatches"]:
        lines += ["", "Greedy mismatches against target.generate:", ""]
        for m in report["mismatches"]:
            lines.append(
                f"- {m['prompt_set']} prompt {m['prompt_index']}, {m['method']}: first difference at new token "
                f"{m['position']} (target {m['expected']}, got {m['got']}), logit margin "
                f"{fmt(m['logit_margin'], '.3f')} -> {'near-tie (rounding)' if m['near_tie'] else 'BUG'}"
            )
    return "\n".join(lines) + "\n"


def plot(report: dict, path: str) -> None:
    """Speedup (top) and τ (bottom) against tree size, one column per prompt set."""
    import matplotlib  # heavy, and only the plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(report["prompt_sets"])
    fig, axes = plt.subplots(2, len(sets), figsize=(5.5 * len(sets), 7), squeeze=False)
    names = sorted({r["heads"] for r in report["results"] if r["kind"] == "heads"})
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    colors = {n: cmap(i % cmap.N) for i, n in enumerate(names)}
    for col, name in enumerate(sets):
        rows = [r for r in report["results"] if r["prompt_set"] == name]
        lines: dict[tuple[str, str], list[dict]] = {}
        for r in rows:
            if r["kind"] == "heads" and r["tree_size"] is not None:
                lines.setdefault((r["heads"], r["mode"]), []).append(r)
        for (heads, mode), rs in sorted(lines.items()):
            rs = sorted(rs, key=lambda r: r["tree_size"])
            x = [r["tree_size"] for r in rs]
            style = "-o" if mode == "greedy" else "--s"
            kw = {"color": colors[heads], "label": f"{heads} ({mode})"}  # one colour per heads, all panels
            axes[0][col].plot(x, [r["speedup"]["total"] for r in rs], style, **kw)
            axes[1][col].plot(x, [r["tau"] for r in rs], style, **kw)
        for r in rows:
            if r["kind"] == "prompt_lookup":
                axes[0][col].axhline(
                    r["speedup"]["total"],
                    color="grey",
                    ls=":" if r["mode"] == "greedy" else "-.",
                    lw=1,
                    label=f"prompt lookup ({r['mode']})",
                )
        axes[0][col].axhline(1.0, color="black", lw=0.8)
        axes[0][col].set_title(f"{name}: speedup over target.generate")
        axes[1][col].set_title(f"{name}: τ (tokens per verify, bonus incl.)")
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xlabel("tree size (tokens verified per step, root incl.)")
            ax.grid(alpha=0.3)
    # One legend beside the panels: per-panel legends cover the data once there are many methods.
    legend: dict[str, object] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    if legend:
        fig.legend(
            list(legend.values()), list(legend), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8
        )
    fig.suptitle(
        f"{report['settings']['target']} ({report['settings']['dtype']}), {report['machine']['summary']}",
        fontsize=9,
    )
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png", bbox_inches="tight"))
    plt.close(fig)


def write_text(path: str, text: str) -> None:
    """``text`` to ``path`` in UTF-8 (the tables hold τ), atomically (`heads.io.atomic_write`), its folder
    made if missing."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    atomic_write(path, write)
