"""Batched speculative decoding against one-by-one and plain decoding (what ``scripts/bench_batch.py`` runs).

    python scripts/bench_batch.py --out results/batch [--batches 1 4 8] [--max-new-tokens 64]
        [--repeats 3] [--threads 1] [--heads medusa eagle] [--train-steps 300]

On the demo-tiny target (built and cached on first use, as `infer.load("demo-tiny")` does) with heads
trained here for ``--train-steps`` full-batch AdamW steps on the target's own greedy continuations of
the demo corpus through each head type's own training loss (`train_heads`), for each batch
size B (the first B of the demo prompts, different lengths, left-padded) and mode (greedy; sampled
with the target's generation config at temperature 1), four ways of producing ``--max-new-tokens`` new
tokens for every prompt (EOS switched off, so every row makes exactly that many):

- ``spec batch``: one `infer.generate` call on the padded batch;
- ``spec 1x1``: `infer.generate` on each prompt alone, one after another;
- ``target batch``: ``target.generate`` on the padded batch (plain decoding);
- ``target 1x1``: ``target.generate`` on each prompt alone.

Per cell: total new tokens / wall seconds, the median over ``--repeats`` interleaved repeats, and for
spec the total τ (tokens per row-step, bonus included) and the per-row τ of the last repeat. Greedy
rows are compared with ``target.generate`` of the prompt alone; a mismatch is printed (never hidden).
Writes ``bench_batch.json`` and ``bench_batch.md`` (with the command and the machine) to ``--out``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

import infer
from heads import registry, run_target
from heads.io import atomic_text
from heads.registry import LossInputs
from heads.targets import resolve


@dataclass
class BenchBatchOptions:
    """Batched speculative decoding against one-by-one and target.generate, on the demo-tiny target."""

    out: str = field(default="results/batch", metadata={"help": "output directory"})
    batches: list[int] = field(default_factory=lambda: [1, 4, 8], metadata={"help": "batch sizes"})
    max_new_tokens: int = field(default=64, metadata={"help": "new tokens per row"})
    repeats: int = field(default=3, metadata={"help": "interleaved repeats (median reported)"})
    threads: int = field(default=1, metadata={"help": "torch CPU threads"})
    heads: list[str] = field(default_factory=lambda: ["medusa", "eagle"], metadata={"help": "medusa, eagle"})
    train_steps: int = field(default=300, metadata={"help": "Adam steps for the heads trained here"})
    seed: int = field(default=0, metadata={"help": "seed of the training and of sampling"})
    data: str | None = field(
        default=None,
        metadata={"help": "demo corpus dir (train.jsonl, prompts.jsonl); default: next to the target's"},
    )


def corpus_ids(tokenizer, path: str, n: int, length: int) -> list[torch.Tensor]:
    """The first ``length`` tokens of the first ``n`` texts of a demo jsonl file."""
    with open(path) as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()]
    return [torch.tensor(tokenizer(t)["input_ids"][:length]) for t in texts[:n]]


def self_text(target, tokenizer, data_dir: str) -> torch.Tensor:
    """[n, 96] the target's greedy continuations of 16-token starts of the training texts."""
    starts = torch.stack(
        [p for p in corpus_ids(tokenizer, f"{data_dir}/train.jsonl", 64, 16) if len(p) == 16]
    )
    with torch.no_grad():
        return target.generate(starts, max_new_tokens=80, do_sample=False, pad_token_id=0)


def train_heads(target, seqs: torch.Tensor, steps: int, head_type: str) -> nn.Module:
    """Fresh heads of ``head_type`` (its defaults: Medusa 4 heads on the target's lm_head, EAGLE one Llama
    draft layer) trained on ``seqs`` [n, T] for ``steps`` full-batch AdamW steps through the head type's
    own training objective (`heads.registry.Objective`: the loss `train` optimises)."""
    entry = registry.get(head_type)
    heads = entry.module.for_target(target).train()
    kwargs = entry.objective.target_kwargs(heads.config)
    kwargs.pop("all_logits", None)  # run_target always returns every position's logits
    with torch.no_grad():
        out = run_target(target, seqs, **kwargs)
    ones = torch.ones_like(seqs)
    batch = {"input_ids": seqs, "attention_mask": ones, "loss_mask": ones}
    inputs = LossInputs(lm_head=target.get_output_embeddings(), embed=target.get_input_embeddings())
    opt = torch.optim.AdamW(heads.parameters(), lr=3e-3)
    for _ in range(steps):
        loss, _ = entry.objective.loss(heads, out, batch, inputs)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return heads.eval().requires_grad_(False)


def left_padded(rows: list[torch.Tensor], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, T - len(r) :], mask[i, T - len(r) :] = r, 1
    return ids, mask


def run_cell(way: str, spec, target, rows, n: int, sampling: bool, seed: int) -> dict:
    """One timed run of one way on the given prompts -> {tokens, seconds, tau, row_tau, outputs}."""
    g = torch.Generator().manual_seed(seed)
    # the fixed tree in every way: a batch never adapts nor looks up, so the one-by-one calls must not either
    kw = {"max_new_tokens": n, "do_sample": sampling, "adaptive": False, "lookup": 0}
    pad = target.generation_config.pad_token_id or 0
    outs, taus, acc = [], [], []
    t0 = time.perf_counter()
    if way.endswith("batch"):
        ids, mask = left_padded(rows, pad)
        if way.startswith("spec"):
            out = infer.generate(spec, ids, attention_mask=mask, generator=g, **kw)
            seq, stats = out.sequences, out.stats
            taus = [r.mean_accepted_length for r in stats.rows] or [stats.mean_accepted_length]
            acc = stats.accepted_lengths
        else:
            torch.manual_seed(seed)
            seq = target.generate(ids, attention_mask=mask, pad_token_id=pad, **kw)
        outs = [s[ids.shape[1] :].tolist() for s in seq]
    else:
        for r in rows:
            if way.startswith("spec"):
                out = infer.generate(spec, r[None], generator=g, **kw)
                outs.append(out.sequences[0, len(r) :].tolist())
                taus.append(out.stats.mean_accepted_length)
                acc += out.stats.accepted_lengths
            else:
                torch.manual_seed(seed)
                outs.append(target.generate(r[None], pad_token_id=pad, **kw)[0, len(r) :].tolist())
    seconds = time.perf_counter() - t0
    return {"tokens": sum(len(o) for o in outs), "seconds": seconds, "outputs": outs, "row_tau": taus,
            "tau": sum(acc) / len(acc) if acc else None}  # fmt: skip


WAYS = ("spec batch", "spec 1x1", "target batch", "target 1x1")


def measure(opts: BenchBatchOptions, target, specs: dict, prompts: list[torch.Tensor]) -> list[dict]:
    """Every (heads, mode, batch) cell, the four ways interleaved per repeat (rotated)."""
    cells, mismatches = [], 0
    for name, spec in specs.items():
        for mode in ("greedy", "sampled"):
            for B in opts.batches:
                rows, runs = prompts[:B], {w: [] for w in WAYS}
                run_cell("spec batch", spec, target, rows, 8, mode == "sampled", 0)  # warm-up
                for rep in range(opts.repeats):
                    for w in WAYS[rep % 4 :] + WAYS[: rep % 4]:
                        runs[w].append(run_cell(w, spec, target, rows, opts.max_new_tokens, mode == "sampled",
                                                opts.seed + rep))  # fmt: skip
                if mode == "greedy":  # every greedy way must give target.generate's rows
                    ref = runs["target 1x1"][0]["outputs"]
                    for w in WAYS:
                        bad = [i for i, o in enumerate(runs[w][-1]["outputs"]) if o != ref[i]]
                        if bad:
                            mismatches += 1
                            print(f"MISMATCH {name} greedy B={B} {w}: rows {bad} differ from target 1x1")
                cell = {"heads": name, "mode": mode, "batch": B}
                for w in WAYS:
                    rates = [r["tokens"] / r["seconds"] for r in runs[w]]
                    cell[w] = {"tokens_per_s": statistics.median(rates), "runs_tokens_per_s": rates,
                               "tau": runs[w][-1]["tau"], "row_tau": runs[w][-1]["row_tau"]}  # fmt: skip
                cells.append(cell)
                print(json.dumps({k: (v if not isinstance(v, dict) else round(v["tokens_per_s"], 1))
                                  for k, v in cell.items()}), flush=True)  # fmt: skip
    if mismatches:
        print(f"{mismatches} greedy mismatches (see above)")
    return cells


def markdown(report: dict) -> str:
    lines = [
        "# Batched speculative decoding, total tokens/s (demo-tiny target)",
        "",
        f"Command: `{report['command']}`  ",
        f"Machine: {report['machine']}  ",
        f"Date: {report['date']}; {report['max_new_tokens']} new tokens per row, EOS off; median of "
        f"{report['repeats']} interleaved repeats; heads trained here for {report['train_steps']} steps.",
        "",
        "| heads | mode | B | spec batch | spec 1x1 | target batch | target 1x1 | batch / 1x1 (spec) "
        "| spec batch / target batch | τ (batch) | τ per row |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in report["cells"]:
        r = {w: c[w]["tokens_per_s"] for w in WAYS}
        row_tau = ", ".join(f"{t:.2f}" for t in c["spec batch"]["row_tau"])
        lines.append(
            f"| {c['heads']} | {c['mode']} | {c['batch']} | {r['spec batch']:.1f} | {r['spec 1x1']:.1f} "
            f"| {r['target batch']:.1f} | {r['target 1x1']:.1f} | {r['spec batch'] / r['spec 1x1']:.2f}x "
            f"| {r['spec batch'] / r['target batch']:.2f}x | {c['spec batch']['tau']:.2f} | {row_tau} |"
        )
    return "\n".join(lines) + "\n"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} logical CPUs (shared with other jobs), torch {torch.__version__} "
            f"with {torch.get_num_threads()} thread(s), Python {platform.python_version()}")  # fmt: skip


def bench_batch(opts: BenchBatchOptions, argv: list[str]) -> dict:
    """``scripts/bench_batch.py``: train the heads, measure every cell, write and print the report."""
    torch.set_num_threads(opts.threads)
    torch.manual_seed(opts.seed)
    path = resolve("demo-tiny")
    data_dir = opts.data or os.path.join(
        os.path.dirname(path), os.path.basename(path).replace("target", "data")
    )
    if not all(os.path.isfile(os.path.join(data_dir, f)) for f in ("train.jsonl", "prompts.jsonl")):
        raise SystemExit(f"no demo corpus (train.jsonl, prompts.jsonl) in {data_dir}: pass --data DIR")
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval().requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(path)
    target.generation_config.eos_token_id = None  # every row makes exactly max_new_tokens
    seqs = self_text(target, tokenizer, data_dir)
    specs = {}
    for name in opts.heads:
        with torch.enable_grad():
            specs[name] = infer.SpecModel(target, train_heads(target, seqs, opts.train_steps, name))
    prompts = corpus_ids(tokenizer, f"{data_dir}/prompts.jsonl", max(opts.batches), 64)
    cells = measure(opts, target, specs, prompts)
    report = {
        "command": "python scripts/bench_batch.py " + " ".join(argv),
        "machine": machine(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "prompt_lengths": [len(p) for p in prompts],
        "cells": cells,
    } | {k: v for k, v in dataclasses.asdict(opts).items() if k != "out"}
    os.makedirs(opts.out, exist_ok=True)
    atomic_text(os.path.join(opts.out, "bench_batch.json"), json.dumps(report, indent=1) + "\n")
    atomic_text(os.path.join(opts.out, "bench_batch.md"), markdown(report))
    print(markdown(report))
    return report
