"""Does ``compile=`` help on this CPU? (what ``scripts/bench_compile.py`` runs; measured, never asserted)

    python scripts/bench_compile.py --out results/compile [--heads medusa,eagle,eagle3] [--calls 3]
        [--max-new-tokens 64] [--threads 1] [--backend inductor]

On the demo-tiny target, greedy, for each head type (untrained heads, seeded: Medusa 3 heads on a
3-token chain, EAGLE-1/2 and EAGLE-3 on a depth-4, top-4, 16-token dynamic tree; the drafts are
mostly rejected, so this measures the cost of a step, not τ): on one 16-token prompt, an eager
warm-up call, the first call with ``compile=--backend`` (it compiles), then ``--calls`` pairs of an
eager and a compiled call, interleaved (the cores are shared: load changes hit both settings alike),
then one compiled call on a 24-token prompt (another length). Every call produces the same tokens
with and without compile (greedy identity with ``target.generate`` is checked per call), so the two
settings do the same steps. Per call: wall seconds (the first compiled call includes compiling),
tokens/s, identity, and the graphs dynamo compiled during the call, per step (the verify step, the
Medusa step ``medusa_topk``, the EAGLE step ``draft_step``: cache entries of their code objects); per
head type the medians and the per-pair compiled / eager ratio; at the end the graph breaks dynamo met (its counters). ``--cold``
(default) compiles into an empty inductor cache, so that the first call's time is a cold compile.
Writes ``bench_compile.json`` / ``bench_compile.md`` to ``--out``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field

import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import counters
from transformers import AutoModelForCausalLM

import infer
from bench.batch import machine
from heads import registry
from heads.io import atomic_text
from heads.targets import resolve
from infer.compiled import CompiledStep
from infer.draft import medusa_topk
from infer.eagle_draft import draft_step
from infer.tree import chain

STEPS = {"verify": CompiledStep._forward, "medusa_topk": medusa_topk, "draft_step": draft_step}
EAGLE_TREE = {"depth": 4, "draft_top_k": 4, "total_tokens": 16}


@dataclass
class BenchCompileOptions:
    """infer.generate with and without compile=, on the demo-tiny target."""

    out: str = field(default="results/compile", metadata={"help": "output directory"})
    heads: str = field(default="medusa,eagle,eagle3", metadata={"help": "head types, comma-separated"})
    calls: int = field(default=3, metadata={"help": "consecutive generate calls per setting"})
    max_new_tokens: int = field(default=64, metadata={"help": "new tokens per call"})
    threads: int = field(default=1, metadata={"help": "torch CPU threads"})
    backend: str = field(default="inductor", metadata={"help": "torch.compile backend"})
    cold: bool = field(default=True, metadata={"help": "compile into an empty inductor cache (a temporary "
                       "TORCHINDUCTOR_CACHE_DIR), so the first compiled call is a cold compile"})  # fmt: skip


def graphs() -> dict[str, int]:
    """Graphs compiled so far per step (dynamo's cache entries of each step's code object)."""
    return {name: len(_debug_get_cache_entry_list(fn)) for name, fn in STEPS.items()}


def spec_for(target, kind: str) -> tuple[infer.SpecModel, dict]:
    """Untrained seeded heads of head type ``kind`` and the tree options: a 3-token chain of 3 heads for a
    static tree, a llama draft layer on `EAGLE_TREE` for a dynamic one (the registry entry's ``tree``)."""
    torch.manual_seed(0)
    entry = registry.get(kind)
    if entry.tree == "static":
        return infer.SpecModel(target, entry.module.for_target(target, num_heads=3).eval(), tree=chain(3)), {}
    return infer.SpecModel(target, entry.module.for_target(target, draft_layer="llama").eval()), EAGLE_TREE


def timed_call(target, spec, tree: dict, prompt: torch.Tensor, n: int, compile) -> dict:
    before = graphs()
    t = time.perf_counter()
    # the fixed tree eager and compiled alike (a compiled call never adapts)
    out = infer.generate(
        spec, prompt, max_new_tokens=n, do_sample=False, compile=compile, adaptive=False, **tree
    )
    s = time.perf_counter() - t
    ref = target.generate(prompt, do_sample=False, max_new_tokens=n, pad_token_id=0)
    new = {k: v - before[k] for k, v in graphs().items()}
    return {"prompt_len": prompt.shape[1], "seconds": s, "tokens_per_s": out.stats.new_tokens / s,
            "tau": out.stats.mean_accepted_length, "identical": bool(torch.equal(out.sequences, ref)),
            "new_graphs": new}  # fmt: skip


def bench_kind(target, kind: str, opts: BenchCompileOptions) -> dict:
    """One eager warm-up call, the first compiled call (compiling), then ``calls`` pairs of an eager and a
    compiled call (interleaved, so that a change of load on shared cores hits both settings alike), then
    one compiled call at another prompt length -> rows and a summary."""
    spec, tree = spec_for(target, kind)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(4, target.config.vocab_size, (1, 16), generator=gen)
    other = torch.randint(4, target.config.vocab_size, (1, 24), generator=gen)
    n, rows = opts.max_new_tokens, []

    def call(compile, index: int, ids: torch.Tensor) -> dict:
        rows.append(
            {"compile": compile or "off", "call": index} | timed_call(target, spec, tree, ids, n, compile)
        )
        print(kind, rows[-1], flush=True)
        return rows[-1]

    call(False, 0, prompt)
    first = call(opts.backend, 0, prompt)
    pairs = [(call(False, i, prompt), call(opts.backend, i, prompt)) for i in range(1, opts.calls + 1)]
    call(opts.backend, opts.calls + 1, other)
    later = [r for r in rows if r["compile"] != "off"][1:]
    ratios = [c["tokens_per_s"] / e["tokens_per_s"] for e, c in pairs]
    summary = {"first_compiled_call_s": first["seconds"], "pairs": len(pairs),
               "eager_tokens_per_s": statistics.median(e["tokens_per_s"] for e, _ in pairs),
               "compiled_tokens_per_s": statistics.median(c["tokens_per_s"] for _, c in pairs),
               "paired_ratio_median": statistics.median(ratios),
               "paired_ratio_range": [min(ratios), max(ratios)],
               "recompiled_in_later_calls": {f"call {r['call']} (prompt {r['prompt_len']})": r["new_graphs"]
                                             for r in later},
               "graphs_first_call": first["new_graphs"]}  # fmt: skip
    return {"rows": rows, "summary": summary}


def markdown(report: dict) -> str:
    lines = ["# compile= on CPU (demo-tiny)", "", f"`{report['command']}`", "",
             f"{report['machine']}; {report['date']}; backend {report['backend']}, inductor cache "
             f"{'empty at the start (cold compile)' if report['options']['cold'] else 'as found'}", ""]  # fmt: skip
    for kind, res in report["heads"].items():
        s = res["summary"]
        lines += [f"## {kind}", "", "| compile | call | prompt | seconds | tokens/s | τ | identical | new graphs |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in res["rows"]:
            g = ", ".join(f"{k} {v}" for k, v in r["new_graphs"].items() if v) or "none"
            lines.append(f"| {r['compile']} | {r['call']} | {r['prompt_len']} | {r['seconds']:.2f} | "
                         f"{r['tokens_per_s']:.1f} | {r['tau']:.2f} | {r['identical']} | {g} |")  # fmt: skip
        lo, hi = s["paired_ratio_range"]
        lines += ["", f"first compiled call {s['first_compiled_call_s']:.1f} s; steady state (medians of the "
                  f"{s['pairs']} interleaved pairs) {s['compiled_tokens_per_s']:.1f} "
                  f"tokens/s compiled against {s['eager_tokens_per_s']:.1f} eager; compiled / eager per pair: "
                  f"median {s['paired_ratio_median']:.2f}x (range {lo:.2f}-{hi:.2f}x)", ""]  # fmt: skip
    lines += [f"graph breaks met by dynamo in all compiled steps: {report['graph_breaks']}", ""]
    return "\n".join(lines)


def bench_compile(opts: BenchCompileOptions, argv: list[str]) -> dict:
    kinds = [k.strip() for k in opts.heads.split(",") if k.strip()]
    bad = [k for k in kinds if k not in registry.REGISTRY]
    if bad or not kinds:
        known = ", ".join(sorted(registry.REGISTRY))
        raise ValueError(f"--heads takes {known} (comma-separated); got {opts.heads!r}")
    torch.set_num_threads(opts.threads)
    saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="inductor-cache-") as tmp:
        if opts.cold:  # inductor keeps compiled graphs on disk: a second run would skip most of the compiling
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = tmp
        try:
            report = _run(opts, argv, kinds)
        finally:
            if saved is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved
    os.makedirs(opts.out, exist_ok=True)
    text = markdown(report)
    atomic_text(os.path.join(opts.out, "bench_compile.json"), json.dumps(report, indent=1) + "\n")
    atomic_text(os.path.join(opts.out, "bench_compile.md"), text)
    print(text)
    return report


def _run(opts: BenchCompileOptions, argv: list[str], kinds: list[str]) -> dict:
    path = resolve("demo-tiny")
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval().requires_grad_(False)
    target.generation_config.eos_token_id = None
    counters.clear()
    report = {"command": "python scripts/bench_compile.py " + " ".join(argv), "machine": machine(),
              "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
              "torch": torch.__version__, "options": dataclasses.asdict(opts), "backend": opts.backend,
              "heads": {k: bench_kind(target, k, opts) for k in kinds}}  # fmt: skip
    report["graph_breaks"] = sum(counters["graph_break"].values())
    report["graph_break_reasons"] = [str(r)[:300] for r in counters["graph_break"]]
    return report
