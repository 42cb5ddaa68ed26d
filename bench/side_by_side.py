"""The demo's comparison: ``target.generate``, HF prompt lookup and the trained heads, side by side.

    python scripts/demo_generate.py --heads out/demo-medusa [--target demo] [--dtype fast] [--prompts 8]

(``scripts/demo_generate.py`` is a thin CLI over `main` here.) The target is the one the heads were trained
on unless ``--target`` names another. On held-out prompts: for a demo target, code the target and the
demo's head-training data never saw (`demo.ensure_demo_data`'s ``prompts``); for any other target,
MT-Bench's first turns (`bench.prompt_sets`). Greedy, fixed length,
all three run in one process, interleaved per prompt (A B C, B C A, ...) after a warm-up, in the fast
dtype (``--dtype fast``: bf16 where the hardware computes it natively, else fp32; `demo.precision`).
This is `bench.run.measure` with one prompt set and the greedy mode.

Printed: a table of tokens/s (median over prompts), speedup (total time against ``target.generate``),
τ (tokens per target decode forward, bonus token included) and efficiency (speedup / τ) per method; then
the exactness check:

- fp32: the heads' greedy output must be token-identical to ``target.generate`` in fp32 on every prompt
  (run again in fp32 when the timed dtype is bf16); any difference is a bug and exits with status 1;
- bf16 (in the timed run when that is bf16, else in an untimed bf16 run unless ``--no-bf16-check``): how
  many outputs were identical, and for each divergence the target's own logit margin between the two
  tokens at that point (a near-tie flip from rounding when it is within the tie tolerance,
  `bench.run.DEFAULT_TIE_TOL`; else a bug, status 1).

``--out DIR`` also writes results.json (the settings, the machine and every number printed).
Timings are this machine's; they are not asserted anywhere.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from dataclasses import asdict, dataclass

import torch
from tqdm.auto import tqdm

import demo
import infer
from bench.machine import machine_info
from bench.measure import PeakMemory
from bench.methods import Method
from bench.prompt_sets import comparison_rows, demo_size
from bench.report import SPEEDUP_DEFINITION, TAU_DEFINITION, fmt, write_text
from bench.run import DEFAULT_TIE_TOL, BenchmarkOptions, Session, _generate_all
from demo.precision import fast_precision
from heads import registry
from heads.config import option, parse_cli
from infer.prompts import render_prompt


@dataclass
class DemoGenerateOptions:
    """Side by side, greedy: target.generate, HF prompt lookup and infer.generate with trained heads."""

    heads: str | None = option(None, help="heads directory or Hub id (e.g. the demo run's output_dir)")
    target: str | None = option(
        None,
        help="target name, dir or Hub id (default: the one the heads were trained on); 'demo' / 'demo-tiny' = "
        "the demo targets",
    )
    dtype: str = option(
        "fast",
        help="the timed dtype: fast (bf16 where the hardware has native bf16, else fp32), bf16 or fp32; "
        "exactness is checked in fp32 either way",
    )
    prompts: int = option(8, help="number of held-out prompts")
    max_new_tokens: int = 128
    prompt_tokens: int = option(128, help="truncate prompts to their last N tokens")
    prompt_lookup: int = option(3, help="HF prompt_lookup_num_tokens of the baseline; 0: off")
    threads: int | None = option(None, help="torch CPU threads (default: all cores)")
    merge: bool = option(
        False,
        help="heads with a PEFT adapter (Medusa-2): merge it into the target weights (base-model speed)",
    )
    bf16_check: bool = option(
        True,
        help="when the timed dtype is fp32, also count identical outputs in bf16 (untimed), each divergence "
        "with the target's own logit margin",
    )
    out: str | None = option(None, help="directory for results.json (default: none)")

    def __post_init__(self) -> None:
        if not self.heads:
            raise ValueError("--heads is required (a heads directory or Hub id)")
        if self.prompts < 1 or self.max_new_tokens < 1 or self.prompt_tokens < 1:
            raise ValueError("--prompts, --max-new-tokens and --prompt-tokens must be >= 1")
        if self.prompt_lookup < 0:
            raise ValueError("--prompt-lookup must be >= 0")
        fast_precision(self.dtype)  # a bad value fails here, before any loading


def _session(o: DemoGenerateOptions, model, methods: list[Method], warmup: int, tie_tol: float) -> Session:
    bench = BenchmarkOptions(
        target=o.target, limit=o.prompts, max_new_tokens=o.max_new_tokens, modes="greedy", warmup=warmup
    )
    device = next(model.target.parameters()).device
    n_calls = (o.prompts + warmup) * len(methods)
    bar = tqdm(total=n_calls, desc="demo", unit="run", dynamic_ncols=True, leave=False)
    return Session(bench, model.target, model.tokenizer, methods, True, PeakMemory(device), tie_tol, bar)


def _methods(o: DemoGenerateOptions, model, label: str, with_lookup: bool) -> list[Method]:
    methods = [Method("target.generate", "plain")]
    if with_lookup and o.prompt_lookup > 0:
        n = o.prompt_lookup
        methods.append(
            Method(f"prompt lookup ({n})", "prompt_lookup", options={"prompt_lookup_num_tokens": n})
        )
    methods.append(Method(label, "heads", o.heads, model.heads.config.head_type, model=model))
    return methods


def _prompts(o: DemoGenerateOptions, size: str | None, tokenizer, device) -> tuple[str, list[torch.Tensor]]:
    path, rows = comparison_rows(size, o.prompts)
    encoded = [
        render_prompt(row, tokenizer, f"{path} row {i + 1}")[:, -o.prompt_tokens :].to(device)
        for i, row in enumerate(rows)
    ]
    return path, encoded


def _run(o: DemoGenerateOptions, dtype: torch.dtype, with_lookup: bool, warmup: int):
    """Load target + heads in ``dtype`` and measure; returns (rows by label, mismatches, tie tolerance,
    prompts path, heads label)."""
    size = demo_size(o.heads, o.target)
    target = demo.resolve(o.target) if o.target else None
    model = infer.load(target, heads=o.heads, dtype=dtype, merge=o.merge)
    label = f"heads ({model.heads.config.head_type}, {registry.of(model.heads).tree} tree)"
    if model.settings.lookup:  # infer.generate's default adds prompt lookup's chain to every tree
        label += f" + lookup ({model.settings.lookup})"
    device = next(model.target.parameters()).device
    path, encoded = _prompts(o, size, model.tokenizer, device)
    tie_tol = DEFAULT_TIE_TOL.get(dtype, 0.0)
    s = _session(o, model, _methods(o, model, label, with_lookup), warmup, tie_tol)
    results, mismatches, _ = _generate_all(s, {"held-out": encoded}, ["greedy"], ())
    return {r["method"]: r for r in results}, mismatches, tie_tol, path, label


def _table(rows: dict[str, dict], dtype_name: str) -> list[str]:
    lines = [
        f"| method ({dtype_name}, greedy) | tokens/s (median) | speedup | τ | efficiency |",
        "|---|---|---|---|---|",
    ]
    for label, r in rows.items():
        lines.append(
            f"| {label} | {r['tokens_per_s']['median']:.1f} | {r['speedup']['total']:.2f}x | "
            f"{fmt(r['tau'])} | {fmt(r['efficiency'])} |"
        )
    return lines


def _exactness_line(name: str, row: dict, mismatches: list[dict], label: str, tie_tol: float) -> str:
    found = [m for m in mismatches if m["method"] == label]
    n, same = row["n_prompts"], row["identical"]
    line = f"exactness ({name}): greedy output token-identical to target.generate: identical outputs {same}/{n} prompts"
    if not found:
        return line
    explained = sum(m["near_tie"] for m in found)
    margins = ", ".join(fmt(m["logit_margin"], ".3f") for m in found)
    return (
        f"{line}; {len(found)} diverged, {explained}/{len(found)} explained by the target's own logit margin "
        f"(margins {margins} vs tie tolerance {tie_tol})"
    )


def side_by_side(o: DemoGenerateOptions) -> tuple[list[dict], dict]:
    """Measure in the fast dtype, check exactness in fp32 and in bf16 (either one untimed if not the fast one).

    Returns (the heads' per-prompt rows in the exactness dtype fp32: ``identical``, ``tau``; the report)."""
    chosen = fast_precision(o.dtype)
    print(chosen.line, flush=True)
    rows, mismatches, tie_tol, path, label = _run(o, chosen.dtype, with_lookup=True, warmup=1)
    lines = [
        f"held-out prompts: {o.prompts} from {path}, {o.max_new_tokens} new tokens each (EOS ignored)",
        "",
    ]
    lines += _table(rows, chosen.name) + [""]
    checks = {chosen.name: (rows[label], mismatches, tie_tol)}
    if chosen.name != "fp32":  # the timed run was bf16: exactness in fp32 needs its own (untimed) run
        rows32, mm32, tol32, _, _ = _run(o, torch.float32, with_lookup=False, warmup=0)
        checks["fp32"] = (rows32[label], mm32, tol32)
    elif o.bf16_check:  # fp32 was faster here; users with native bf16 serve in bf16, so show its count too
        rows16, mm16, tol16, _, _ = _run(o, torch.bfloat16, with_lookup=False, warmup=0)
        checks["bf16"] = (rows16[label], mm16, tol16)
    for name in ("fp32", *(k for k in checks if k != "fp32")):
        row, mm, tol = checks[name]
        untimed = ", untimed" if name != chosen.name else ""
        lines.append(_exactness_line(name + untimed, row, mm, label, tol))
    print("\n" + "\n".join(lines), flush=True)
    row32, mm32, _ = checks["fp32"]
    bad = {
        i
        for i in range(row32["n_prompts"])
        if any(m["prompt_index"] == i and m["method"] == label for m in mm32)
    }
    per_prompt = [{**p, "identical": i not in bad} for i, p in enumerate(row32["per_prompt"])]
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["scripts/demo_generate.py", *sys.argv[1:]]),
        "machine": machine_info(torch.device("cuda" if torch.cuda.is_available() else "cpu")),
        "precision": {"name": chosen.name, "reason": chosen.reason},
        "options": asdict(o),
        "prompts_path": path,
        "tau_definition": TAU_DEFINITION,
        "speedup_definition": SPEEDUP_DEFINITION,
        "results": list(rows.values()),
        "exactness": {k: {"row": v[0], "mismatches": v[1], "tie_tolerance": v[2]} for k, v in checks.items()},
        "table": lines,
    }
    report["ok"] = all(m["near_tie"] for _, mm, _ in checks.values() for m in mm) and not bad
    if o.out:
        os.makedirs(o.out, exist_ok=True)
        write_text(os.path.join(o.out, "results.json"), json.dumps(report, indent=2, default=str) + "\n")
    return per_prompt, report


def main(argv: list[str] | None = None) -> list[dict]:
    o = parse_cli(DemoGenerateOptions, argv, prog="scripts/demo_generate.py")
    torch.set_num_threads(o.threads or os.cpu_count() or 1)
    try:
        per_prompt, report = side_by_side(o)
    except (ValueError, FileNotFoundError) as e:  # bad input: the message, not a traceback
        raise SystemExit(f"error: {e}") from None
    if not report["ok"]:
        print("error: a greedy divergence not explained by a near-tie (a bug): see above", file=sys.stderr)
        raise SystemExit(1)
    return per_prompt
