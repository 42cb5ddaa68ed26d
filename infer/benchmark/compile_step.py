"""Does ``compile=`` help on this CPU? (what ``scripts/bench_compile.py`` runs; measured, never asserted)

    python scripts/bench_compile.py --out results/compile [--calls 3] [--max-new-tokens 64] [--threads 1]

On the demo-tiny target with 3 untrained Medusa heads on a 3-token chain tree (the drafts are mostly
rejected: this measures the cost of a step, not τ), greedy: ``--calls`` consecutive `infer.generate`
calls on one prompt without compile, then ``--calls`` with ``compile=True`` (inductor). Per call: wall
seconds (the first compiled call includes compiling), tokens/s, greedy identity with ``target.generate``;
and the graph breaks inside the compiled step (``torch._dynamo.explain`` of `infer.runner.CompiledStep`).
Writes ``bench_compile.json`` / ``bench_compile.md`` to ``--out``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import time
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForCausalLM

import infer
from heads import MedusaHeads
from heads.graft import resolve_demo_target
from heads.io import atomic_text
from infer.attention import ATTN_IMPLEMENTATION, attention_implementation
from infer.benchmark.batch import machine
from infer.runner import CompiledStep, TreeRunner
from infer.tree import chain


@dataclass
class BenchCompileOptions:
    """infer.generate with and without compile=True, on the demo-tiny target."""

    out: str = field(default="results/compile", metadata={"help": "output directory"})
    calls: int = field(default=3, metadata={"help": "consecutive generate calls per setting"})
    max_new_tokens: int = field(default=64, metadata={"help": "new tokens per call"})
    threads: int = field(default=1, metadata={"help": "torch CPU threads"})


def graph_breaks(target, prompt: torch.Tensor) -> dict:
    """Graphs and graph breaks of one 4-node verify forward under dynamo (`torch._dynamo.explain`)."""
    runner = TreeRunner(target, (), max_len=prompt.shape[1] + 8)
    runner.prefill(prompt)
    step = CompiledStep(target, (), runner.cache, "eager")
    try:
        mask = runner.mask(torch.ones(4, 4, dtype=torch.bool).tril(), runner.past)
        with attention_implementation(target, ATTN_IMPLEMENTATION):
            ex = torch._dynamo.explain(step._forward)(
                prompt[:, :4], mask, runner.past + torch.arange(4)[None]
            )
    finally:
        step.close()
    return {"graphs": ex.graph_count, "breaks": ex.graph_break_count,
            "reasons": [str(r.reason)[:300] for r in ex.break_reasons]}  # fmt: skip


def bench_compile(opts: BenchCompileOptions, argv: list[str]) -> dict:
    torch.set_num_threads(opts.threads)
    path = resolve_demo_target("demo-tiny")
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval().requires_grad_(False)
    target.generation_config.eos_token_id = None
    torch.manual_seed(0)
    spec = infer.SpecModel(target, MedusaHeads.for_target(target, num_heads=3).eval(), tree=chain(3))
    prompt = torch.randint(4, target.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    ref = target.generate(prompt, do_sample=False, max_new_tokens=opts.max_new_tokens, pad_token_id=0)
    rows = []
    for compile in (False, True):
        for i in range(opts.calls):
            t = time.perf_counter()
            out = infer.generate(
                spec, prompt, max_new_tokens=opts.max_new_tokens, do_sample=False, compile=compile
            )
            s = time.perf_counter() - t
            rows.append({"compile": compile, "call": i, "seconds": s, "tokens_per_s": opts.max_new_tokens / s,
                         "identical": bool(torch.equal(out.sequences, ref))})  # fmt: skip
            print(rows[-1], flush=True)
    report = {"command": "python scripts/bench_compile.py " + " ".join(argv), "machine": machine(),
              "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
              "torch": torch.__version__, "calls": rows, "graph_breaks": graph_breaks(target, prompt)}  # fmt: skip
    report |= {k: v for k, v in dataclasses.asdict(opts).items() if k != "out"}
    lines = ["# compile= on CPU (demo-tiny)", "", f"`{report['command']}`", "", f"{report['machine']}; {report['date']}",
             "", "| compile | call | seconds | tokens/s | identical |", "|---|---|---|---|---|"]  # fmt: skip
    lines += [f"| {r['compile']} | {r['call']} | {r['seconds']:.2f} | {r['tokens_per_s']:.1f} | {r['identical']} |"
              for r in rows]  # fmt: skip
    g = report["graph_breaks"]
    lines += ["", f"verify step under dynamo: {g['graphs']} graph(s), {g['breaks']} graph break(s)", ""]
    os.makedirs(opts.out, exist_ok=True)
    atomic_text(os.path.join(opts.out, "bench_compile.json"), json.dumps(report, indent=1) + "\n")
    atomic_text(os.path.join(opts.out, "bench_compile.md"), "\n".join(lines) + "\n")
    print("\n".join(lines))
    return report
