"""The benchmark run: options (`BenchmarkOptions`, the command line of ``scripts/benchmark.py``), the
interleaved runs of every method on every prompt, the greedy check, and the report files.

    from bench import run
    report, status = run(["--target", "demo", "--heads", "medusa=out/demo-medusa", "--out", "out/bench"])
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm
from transformers import AutoTokenizer

import demo
from bench.machine import machine_info
from bench.measure import PeakMemory, first_difference, tie_margin, verify_cost
from bench.methods import (
    SAMPLE_TEMPERATURE,
    Method,
    Run,
    generation_config,
    heads_methods,
    parse_list,
)
from bench.prompt_sets import prompt_files
from bench.report import SCHEMA, SPEEDUP_DEFINITION, TAU_DEFINITION, fmt, markdown, plot, write_text
from bench.stats import compare, summarise
from heads import load_target, targets
from heads.config import option, parse_cli, repeatable
from infer.lookup import CorpusIndex
from infer.prompts import read_corpus, read_prompts, render_prompt
from infer.settings import TREE_LIMITS

DEFAULT_TIE_TOL = {torch.float32: 0.0, torch.float64: 0.0, torch.bfloat16: 0.25, torch.float16: 0.05}


@dataclass
class BenchmarkOptions:
    """Benchmark speculative decoding against plain decoding (see `bench`)."""

    target: str = option(
        "demo", help="a built-in name (demo, demo-tiny, smollm2-135m-instruct), a .gguf, a dir or Hub id"
    )
    heads: list[str] = repeatable(
        help="[LABEL=]DIR: heads checkpoint (dir or Hub id), repeatable; LABEL names it in the tables"
    )
    prompts: list[str] = repeatable(
        help="[NAME=]JSONL: prompt set (rows with 'text' or chat 'messages'), or built in: mt-bench, "
        "humaneval (bench/prompt_sets.py); repeatable. Default for the demo target: its held-out code "
        "prompts ('code') and a chat set built from other held-out prompts ('chat')"
    )
    limit: int = option(8, help="prompts per set (the first N rows)")
    max_new_tokens: int = option(128, help="new tokens per prompt (see --stop-at-eos)")
    stop_at_eos: bool = option(False, help="stop at EOS (default: fixed-length runs)")
    dtype: str = option(
        "bf16", help="target dtype: bf16 (default), fast (bf16 where native, else fp32), fp16, fp32 or auto"
    )
    device: str | None = option(None, help="cuda, cpu, ... (default: cuda if available)")
    modes: str = option("greedy,sample", help="comma list of greedy, sample (T=0.7)")
    prompt_lookup: int = option(3, help="HF prompt_lookup_num_tokens baseline; 0: off")
    warmup: int = option(1, help="untimed warm-up prompts per set and mode")
    tree: list[str] = repeatable(
        help="[LABEL:]LIST: Medusa trees: comma list of node counts, 'default' (the heads' saved tree or "
        "default_tree), JSON files of paths; LABEL: limits it to those heads; repeatable"
    )
    total_tokens: list[str] = repeatable(
        help="[LABEL:]LIST: EAGLE-2 tree sizes (root incl.): comma list or 'default'; repeatable"
    )
    depth: int | None = option(None, help="EAGLE-2 max draft depth")
    adaptive: str = option(
        "on",
        help="infer.generate's adaptive tree: on (its default), off (the fixed tree), both (a row each) or "
        "chains (a row with every lookup chain at full length beside the default's priced chains)",
    )
    draft_top_k: int | None = option(None, help="EAGLE-2 frontier width / children per node")
    lookup: str = option(
        "default",
        help="infer.generate's prompt-lookup branch: 'default' (its default) or a comma list of token "
        "counts, a row each (0: the heads' tree alone)",
    )
    corpus: str | None = option(
        None,
        help="JSONL of chat or text rows (the heads' training data): each heads row also runs with "
        "infer.generate's corpus chain (infer.load(corpus=)), '+corpus'",
    )
    verify_cost: str = option("1,2,4,8,16,32,64", help="k values to time a k-token verify; '' off")
    seed: int = option(0, help="sampling seed (per prompt: seed*1000 + index)")
    threads: int | None = option(None, help="torch CPU threads (default: all cores)")
    tie_tol: float | None = option(
        None, help="greedy near-tie tolerance in logits (default 0 in fp32, 0.25 in bf16, 0.05 in fp16)"
    )
    strict: bool = option(False, help="fail on any greedy mismatch, near-ties included")
    time_split: bool = option(
        True,
        help="ask infer.generate for the draft/verify/bookkeeping split (on GPU it synchronises per phase)",
    )
    vs: list[str] = repeatable(
        help="A:B: paired comparison of two method labels (repeatable), e.g. 'medusa-tuned:medusa': ratio of "
        "tokens/s with a bootstrap 95%% interval over prompts"
    )
    out: str = option("out/bench", help="output directory")

    def __post_init__(self) -> None:
        modes = parse_list(self.modes)
        if not modes or any(m not in ("greedy", "sample") for m in modes):
            raise ValueError(f"--modes must list greedy and/or sample, got {self.modes!r}")
        if self.limit < 1 or self.max_new_tokens < 1:
            raise ValueError("--limit and --max-new-tokens must be >= 1")
        if self.adaptive not in ("on", "off", "both", "chains"):
            raise ValueError(f"--adaptive must be on, off, both or chains, got {self.adaptive!r}")
        lookups, (lo, hi) = parse_list(self.lookup), TREE_LIMITS["lookup"]
        if not lookups or not all(v == "default" or (v.isdigit() and lo <= int(v) <= hi) for v in lookups):
            raise ValueError(
                f"--lookup takes 'default' or a comma list of ints in [{lo}, {hi}], got {self.lookup!r}"
            )


def parse_pairs(specs: list[str], labels: list[str]) -> list[tuple[str, str]]:
    """``--vs A:B`` values -> [(A, B)] of method labels of this run. A ``--heads`` label stands for the
    one method it became (``medusa`` for ``medusa [33 tok]``) when there is exactly one."""

    def resolve(name: str, spec: str) -> str:
        if name in labels:
            return name
        found = [x for x in labels if x.startswith(name + " [")]
        if len(found) == 1:
            return found[0]
        if found:
            raise ValueError(f"--vs {spec!r}: {name!r} is ambiguous, name one of {found}")
        raise ValueError(f"--vs {spec!r}: no method labelled {name!r}; methods: {labels}")

    pairs = []
    for spec in specs:
        a, sep, b = spec.partition(":")
        if not sep or not a or not b:
            raise ValueError(f"--vs takes LABEL_A:LABEL_B, got {spec!r}")
        pairs.append((resolve(a, spec), resolve(b, spec)))
    return pairs


def build_methods(
    options: BenchmarkOptions, target, extra: list[Method] | None, tokenizer=None
) -> list[Method]:
    """The plain baseline first, then prompt lookup (unless 0), the heads' methods and ``extra``."""
    heads_specs = []
    for spec in options.heads:
        label, _, path = spec.rpartition("=")
        heads_specs.append((label or os.path.basename(os.path.normpath(path)), path))
    methods = [Method("target.generate", "plain")]
    if options.prompt_lookup > 0:
        n = options.prompt_lookup
        methods.append(
            Method(f"prompt-lookup ({n})", "prompt_lookup", options={"prompt_lookup_num_tokens": n})
        )
    corpus = CorpusIndex(read_corpus(options.corpus, tokenizer)) if options.corpus else None
    methods += heads_methods(options, target, heads_specs, corpus)
    methods += extra or []
    dup = [k for k, v in Counter(m.label for m in methods).items() if v > 1]
    if dup:
        raise ValueError(
            f"two configurations are both labelled {dup}: give the --heads distinct LABEL=DIR names"
        )
    return methods


@dataclass
class Session:
    """What every run of one benchmark shares."""

    options: BenchmarkOptions
    target: object
    tokenizer: object
    methods: list[Method]
    timing: bool
    mem: PeakMemory
    tie_tol: float
    bar: object


def _interleaved(s: Session, ids_list: list[torch.Tensor], gc, where: str) -> dict[str, list[Run]]:
    """Warm-up, then every method on every prompt, the order rotated per prompt (A B C, B C A, ...) so
    no method always runs first. Fixed-length runs must produce exactly ``max_new_tokens``."""
    o = s.options
    for ids in ids_list[: o.warmup]:
        for m in s.methods:
            m.run(s.target, ids, gc, o.seed, s.timing, s.mem)
            s.bar.update()
    runs: dict[str, list[Run]] = {m.label: [] for m in s.methods}
    for i, ids in enumerate(ids_list):
        k = i % len(s.methods)
        for m in s.methods[k:] + s.methods[:k]:
            r = m.run(s.target, ids, gc, o.seed * 1000 + i, s.timing, s.mem)
            if not o.stop_at_eos and r.new_tokens != o.max_new_tokens:
                raise RuntimeError(
                    f"{m.label} generated {r.new_tokens} tokens, not --max-new-tokens {o.max_new_tokens} "
                    f"({where} prompt {i}): the runs would not be comparable (EOS not disabled?)"
                )
            runs[m.label].append(r)
            s.bar.update()
    return runs


def _mismatch(
    s: Session, set_name: str, i: int, label: str, ids: torch.Tensor, ref: Run, got: Run
) -> dict | None:
    """The first greedy difference of ``got`` from the baseline ``ref`` on prompt ``i`` (None if equal),
    with the target's logit margin there: within ``tie_tol`` it is a near-tie flip from rounding, else a bug."""
    pos = first_difference(ref.sequences, got.sequences)
    if pos is None:
        return None
    T = ids.shape[1]
    new_pos = pos - T
    a = int(ref.sequences[0, pos]) if pos < ref.sequences.shape[1] else None
    b = int(got.sequences[0, pos]) if pos < got.sequences.shape[1] else None
    ok = a is not None and b is not None and new_pos >= 0
    margin = tie_margin(s.target, ref.sequences, T, new_pos, a, b) if ok else None
    near = margin is not None and margin <= s.tie_tol
    tok = s.tokenizer
    mm = {
        "prompt_set": set_name,
        "prompt_index": i,
        "method": label,
        "position": new_pos,
        "expected": a,
        "got": b,
        "logit_margin": margin,
        "near_tie": near,
        "prompt_tail": tok.decode(ids[0, -40:]),
    }
    verdict = f"near-tie flip from rounding ({s.target.dtype})" if near else "a BUG"
    print(
        f"\n*** GREEDY MISMATCH *** {set_name} prompt {i}, {label}: outputs differ from target.generate at new "
        f"token {new_pos} (target {a} {tok.decode([a]) if a is not None else ''!r}, got {b} "
        f"{tok.decode([b]) if b is not None else ''!r}); target logit margin {fmt(margin, '.4f')} "
        f"{'<=' if near else '>'} tie tolerance {s.tie_tol} -> {verdict}\n    prompt ends: {mm['prompt_tail']!r}",
        file=sys.stderr,
        flush=True,
    )
    return mm


def measure(s: Session, prompts: dict[str, list[torch.Tensor]], modes: list[str], pairs=()):
    """The interleaved runs and their summaries; returns (result rows, greedy mismatches, comparisons of
    the ``pairs`` of method labels)."""
    o = s.options
    results, mismatches, comparisons = [], [], []
    for mode in modes:
        gc = generation_config(
            s.target,
            s.tokenizer,
            sampling=mode == "sample",
            max_new_tokens=o.max_new_tokens,
            stop_at_eos=o.stop_at_eos,
        )
        for set_name, ids_list in prompts.items():
            runs = _interleaved(s, ids_list, gc, f"{set_name}, {mode}")
            base = runs[s.methods[0].label]
            rows = {}
            for m in s.methods:
                row = {"prompt_set": set_name, "mode": mode, **summarise(m, runs[m.label], base)}
                if mode == "greedy" and m.kind != "plain":
                    found = [
                        _mismatch(s, set_name, i, m.label, ids_list[i], ref, got)
                        for i, (ref, got) in enumerate(zip(base, runs[m.label], strict=True))
                    ]
                    found = [x for x in found if x is not None]
                    row["identical"] = len(ids_list) - len(found)
                    row["near_tie_flips"] = sum(x["near_tie"] for x in found)
                    mismatches += found
                results.append(row)
                rows[m.label] = row
            for a, b in pairs:
                comparisons.append(
                    {"prompt_set": set_name, "mode": mode, **compare(rows[a], rows[b], runs[a], runs[b])}
                )
    return results, mismatches, comparisons


def _settings(o: BenchmarkOptions, target_path: str, is_demo: bool, target, modes, tie_tol, timing) -> dict:
    return {
        "target": o.target if is_demo or targets.is_builtin(o.target) else target_path,
        "target_path": target_path,
        "dtype": str(target.dtype).replace("torch.", ""),
        "max_new_tokens": o.max_new_tokens,
        "stop_at_eos": o.stop_at_eos,
        "modes": modes,
        "sample_temperature": SAMPLE_TEMPERATURE,
        "limit": o.limit,
        "warmup": o.warmup,
        "seed": o.seed,
        "prompt_lookup_num_tokens": o.prompt_lookup,
        "tie_tolerance": tie_tol,
        "timing_split_available": timing,
    }


def _load_prompts(
    o: BenchmarkOptions, sets: dict[str, str], tokenizer, device
) -> dict[str, list[torch.Tensor]]:
    return {
        name: [
            render_prompt(row, tokenizer, f"{path} row {i + 1}").to(device)
            for i, row in enumerate(read_prompts(path)[: o.limit])
        ]
        for name, path in sets.items()
    }


def _generate_all(s: Session, prompts, modes, pairs):
    """`measure` with the target's own EOS cleared for fixed-length runs (transformers fills a None
    eos_token_id from the model's generation_config), restored afterwards."""
    saved_eos = s.target.generation_config.eos_token_id
    if not s.options.stop_at_eos:
        s.target.generation_config.eos_token_id = None
    try:
        return measure(s, prompts, modes, pairs)
    finally:
        s.target.generation_config.eos_token_id = saved_eos
        s.bar.close()


def benchmark(
    o: BenchmarkOptions, extra_methods: list[Method] | None = None, command: str = ""
) -> tuple[dict, int]:
    """Run the benchmark; writes results.json, results.md and speedup_vs_tree.png into ``o.out``.
    Returns (report, exit status: 1 on a greedy mismatch that is not a near-tie, or any with ``strict``)."""
    torch.set_num_threads(o.threads or os.cpu_count() or 1)
    modes = parse_list(o.modes)
    target_path, size = targets.resolve(o.target), demo.NAMES.get(o.target)
    device = torch.device(o.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    os.makedirs(o.out, exist_ok=True)
    sets = prompt_files(o.prompts, size, o.out)  # a missing prompt package fails here, before the load
    target = load_target(target_path, dtype=o.dtype, device=device)
    target.to(device)
    tokenizer = AutoTokenizer.from_pretrained(target_path)
    prompts = _load_prompts(o, sets, tokenizer, device)
    methods = build_methods(o, target, extra_methods, tokenizer)
    pairs = parse_pairs(o.vs, [m.label for m in methods])
    timing = o.time_split  # infer.generate takes timing= through its **options
    tie_tol = o.tie_tol if o.tie_tol is not None else DEFAULT_TIE_TOL.get(target.dtype, 0.0)
    n_calls = len(modes) * sum(len(p) + min(o.warmup, len(p)) for p in prompts.values()) * len(methods)
    bar = tqdm(total=n_calls, desc="benchmark", unit="run", dynamic_ncols=True)
    s = Session(o, target, tokenizer, methods, timing, PeakMemory(device), tie_tol, bar)
    results, mismatches, comparisons = _generate_all(s, prompts, modes, pairs)
    ks = [int(k) for k in parse_list(o.verify_cost)]
    report = {
        "schema": SCHEMA,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "machine": machine_info(device),
        "settings": _settings(o, target_path, bool(size), target, modes, tie_tol, timing),
        "tau_definition": TAU_DEFINITION,
        "speedup_definition": SPEEDUP_DEFINITION,
        "peak_memory_kind": s.mem.kind,
        "prompt_sets": {name: {"path": path, "n": len(prompts[name])} for name, path in sets.items()},
        "verify_cost": verify_cost(target, ks) if ks else None,
        "results": results,
        "comparisons": comparisons,
        "mismatches": mismatches,
    }
    bugs = [m for m in mismatches if not m["near_tie"] or o.strict]
    report["ok"] = not bugs
    write_text(os.path.join(o.out, "results.json"), json.dumps(report, indent=2) + "\n")
    write_text(os.path.join(o.out, "results.md"), markdown(report))
    plot(report, os.path.join(o.out, "speedup_vs_tree.png"))
    return report, 0 if not bugs else 1


def run(argv: list[str] | None = None, extra_methods: list[Method] | None = None) -> tuple[dict, int]:
    """`benchmark` with the options parsed from ``argv`` (the script's command line; None: sys.argv).
    ``extra_methods`` are appended (for tests)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    options = parse_cli(BenchmarkOptions, argv, prog="scripts/benchmark.py")
    return benchmark(options, extra_methods, " ".join(["scripts/benchmark.py", *argv]))


def main(argv: list[str] | None = None) -> int:
    """The script: run, print results.md, report greedy mismatches; returns the exit status (2: bad input)."""
    try:
        report, status = run(argv)
    except (ValueError, FileNotFoundError) as e:  # bad input: a clear message, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(markdown(report))  # what results.md holds
    if status:
        n = sum(1 for m in report["mismatches"] if not m["near_tie"])
        print(
            f"error: {len(report['mismatches'])} greedy mismatch(es) against target.generate "
            f"({n} not explained by a near-tie); see above and results.json 'mismatches'",
            file=sys.stderr,
        )
    return status
