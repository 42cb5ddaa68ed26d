"""Cost against length: speculative decoding and plain decoding from 128 new tokens up to the target's
whole context (what ``scripts/bench_length.py`` runs; measured, never asserted).

    python scripts/bench_length.py --out results/length [--target demo-tiny] [--heads eagle]
        [--repeats 2] [--threads 1] [--train-steps 300]

On a demo target (``demo-tiny``, or ``demo`` for the full one) with heads trained here by
`bench.batch.train_heads` (a head type's name: its defaults and its own training loss) or heads given
as ``LABEL=DIR`` (trained by ``train/train_heads.py`` for that target; their saved tree or EAGLE-2
budget), for a short prompt (16 tokens) and a long one (half the context, demo texts concatenated), one greedy run of `infer.generate` and one
of ``target.generate`` each make every token up to the end of the context (EOS switched off; the
speculative run stops ``depth + 1`` short, so that every tree node's position is inside the context).
A streamer timestamps every ``put``: for `infer.generate` one put per verify step (its accepted tokens),
for ``target.generate`` one per decoding step. From one run's timeline:

- tokens/s at L new tokens = L / (time from the call to the put that reached L), prefill included:
  what a run with ``max_new_tokens=L`` would measure, up to that last step's truncation;
- per-step time against context length: the time between consecutive puts, at the context length
  (prompt + tokens so far) where the step began.

Each cell is the median over ``--repeats`` interleaved repeats. The greedy outputs are compared
(a mismatch is printed and recorded, never hidden). Writes ``bench_length.json``, ``bench_length.md``
and ``bench_length.png`` (per-step time and speedup against length) to ``--out``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import statistics
import time
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import infer
from bench.batch import corpus_ids, machine, self_text, train_heads
from heads import registry
from heads.io import atomic_text, atomic_write
from heads.targets import resolve


@dataclass
class BenchLengthOptions:
    """Tokens/s and per-step time of infer.generate and target.generate against sequence length."""

    out: str = field(default="results/length", metadata={"help": "output directory"})
    target: str = field(default="demo-tiny", metadata={"help": "demo-tiny or demo (the full demo target)"})
    heads: list[str] = field(
        default_factory=lambda: ["eagle"],
        metadata={
            "help": "medusa or eagle (heads trained here), or LABEL=DIR (trained heads of that target)"
        },
    )
    repeats: int = field(default=2, metadata={"help": "interleaved repeats (median reported)"})
    threads: int = field(default=1, metadata={"help": "torch CPU threads"})
    train_steps: int = field(default=300, metadata={"help": "Adam steps for the heads trained here"})
    short_prompt: int = field(default=16, metadata={"help": "tokens in the short prompt"})
    seed: int = field(default=0, metadata={"help": "seed of the training"})


class _Timeline:
    """A streamer that records (time, new tokens so far) at every ``put`` after the prompt's."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.marks: list[tuple[float, int]] = []
        self.prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        done = self.marks[-1][1] if self.marks else 0
        self.marks.append((time.perf_counter() - self.t0, done + value.numel()))

    def end(self) -> None:
        pass


def _run(fn, prompt: torch.Tensor, n: int) -> tuple[torch.Tensor, list[tuple[float, int]]]:
    line = _Timeline()
    seq = fn(prompt, n, line)
    return seq, line.marks


def _ways(target, spec):
    def plain(prompt, n, streamer):
        return target.generate(prompt, max_new_tokens=n, do_sample=False, pad_token_id=0, streamer=streamer)

    def speculative(prompt, n, streamer):
        # the fixed tree (no adaptation, no lookup): per-step cost against length, one tree throughout
        out = infer.generate(
            spec, prompt, max_new_tokens=n, do_sample=False, streamer=streamer, adaptive=False, lookup=0
        )
        return out.sequences

    return {"target.generate": plain, "infer.generate": speculative}


def tokens_per_s(marks: list[tuple[float, int]], lengths: list[int]) -> dict[int, float]:
    """L -> L / (seconds until the put that reached L new tokens)."""
    out = {}
    for L in lengths:
        t = next((t for t, k in marks if k >= L), None)
        if t is not None:
            out[L] = L / t
    return out


def step_times(marks: list[tuple[float, int]], prompt_len: int) -> list[tuple[int, float]]:
    """[(context length where the step began, seconds of the step)] for every step after the first."""
    return [(prompt_len + k0, t1 - t0) for (t0, k0), (t1, _) in zip(marks, marks[1:], strict=False)]


def _lengths(limit: int) -> list[int]:
    out, L = [], 128
    while L < limit:
        out.append(L)
        L *= 2
    return out + [limit]


def measure(opts: BenchLengthOptions, target, specs: dict, prompts: dict) -> list[dict]:
    """One cell per (heads, prompt): tokens/s per length, speedups, per-step times, greedy identity."""
    ctx = target.config.max_position_embeddings
    cells = []
    for name, spec in specs.items():
        depth = spec.settings.depth
        for pname, prompt in prompts.items():
            T = prompt.shape[1]
            n_spec, n_plain = ctx - T - depth - 1, ctx - T
            lengths = _lengths(n_spec)
            runs: dict[str, list] = {"infer.generate": [], "target.generate": []}
            seqs = {}
            for _ in range(opts.repeats):
                for way, fn in _ways(target, spec).items():
                    seq, marks = _run(fn, prompt, n_spec if way == "infer.generate" else n_plain)
                    runs[way].append(marks)
                    seqs[way] = seq
            identical = bool(torch.equal(seqs["infer.generate"][0], seqs["target.generate"][0, : T + n_spec]))
            if not identical:
                print(f"MISMATCH: {name} {pname}: infer.generate differs from target.generate")
            cell = {
                "heads": name,
                "prompt": pname,
                "prompt_len": T,
                "new_tokens": n_spec,
                "identical": identical,
            }
            for way, all_marks in runs.items():
                per = [tokens_per_s(m, lengths) for m in all_marks]
                cell[way] = {
                    "tokens_per_s": {
                        L: statistics.median(p[L] for p in per) for L in lengths if all(L in p for p in per)
                    },
                    "steps": step_times(all_marks[-1], T),
                }
            tps_s, tps_t = cell["infer.generate"]["tokens_per_s"], cell["target.generate"]["tokens_per_s"]
            cell["speedup"] = {L: tps_s[L] / tps_t[L] for L in tps_s if L in tps_t}
            cells.append(cell)
    return cells


def _binned(steps: list[tuple[int, float]], width: int) -> tuple[list[float], list[float]]:
    """Median step time per bin of ``width`` context positions."""
    bins: dict[int, list[float]] = {}
    for c, s in steps:
        bins.setdefault(c // width, []).append(s)
    keys = sorted(bins)
    return [(k + 0.5) * width for k in keys], [1e3 * statistics.median(bins[k]) for k in keys]


def plot(cells: list[dict], path: str, title: str) -> None:
    import matplotlib  # heavy, and only this function needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    width = max(8, max(c["prompt_len"] + c["new_tokens"] for c in cells) // 32)
    for c in cells:
        for way, style in (("infer.generate", "-"), ("target.generate", "--")):
            x, y = _binned(c[way]["steps"], width)
            ax1.plot(x, y, style, label=f"{way} ({c['heads']}, {c['prompt']} prompt)")
        Ls = sorted(int(L) for L in c["speedup"])
        ax2.plot(Ls, [c["speedup"][L] for L in Ls], "o-", label=f"{c['heads']}, {c['prompt']} prompt")
    ax1.set(xlabel="context length (tokens)", ylabel=f"per-step time, ms (median per {width} positions)",
            title="per-step time")  # fmt: skip
    ax2.set(xlabel="new tokens", ylabel="speedup (tokens/s over target.generate)", xscale="log",
            title="speedup against length")  # fmt: skip
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


def markdown(report: dict) -> str:
    heads = ", ".join(
        h.replace("=", " from ") if "=" in h else f"{h} trained here for {report['train_steps']} steps"
        for h in report["heads"]
    )
    lines = [f"# Cost against length ({report['target']})", "", f"`{report['command']}`", "",
             f"{report['machine']}; {report['date']}; greedy, fp32, EOS off; median of {report['repeats']} "
             f"interleaved repeats; heads {heads}; context "
             f"{report['context']}.", ""]  # fmt: skip
    for c in report["cells"]:
        lines += [f"## {c['heads']}, {c['prompt']} prompt ({c['prompt_len']} tokens), identical: {c['identical']}",
                  "", "| new tokens | infer.generate tok/s | target.generate tok/s | speedup |", "|---|---|---|---|"]  # fmt: skip
        s, t = c["infer.generate"]["tokens_per_s"], c["target.generate"]["tokens_per_s"]
        lines += [f"| {L} | {s[L]:.1f} | {t[L]:.1f} | {c['speedup'][L]:.2f}x |" for L in c["speedup"]]
        ratio = c["end_over_256"]
        lines += ["", "speedup at the end of the context / at 256 new tokens: "
                  + ("n/a (the run makes no more than 256 tokens)" if ratio is None else f"{ratio:.2f}"), ""]  # fmt: skip
    return "\n".join(lines) + "\n"


def bench_length(opts: BenchLengthOptions, argv: list[str]) -> dict:
    """``scripts/bench_length.py``: train the heads, measure, write the report and the plot."""
    if opts.target not in ("demo-tiny", "demo"):
        raise SystemExit(f"--target must be demo-tiny or demo, got {opts.target!r}")
    if unknown := [h for h in opts.heads if h not in registry.REGISTRY and "=" not in h]:
        raise SystemExit(
            f"unknown --heads {unknown}: choose from {sorted(registry.REGISTRY)} or give LABEL=DIR"
        )
    if missing := [h for h in opts.heads if "=" in h and not os.path.isdir(h.split("=", 1)[1])]:
        raise SystemExit(f"--heads {missing}: no such heads directory")
    torch.set_num_threads(opts.threads)
    torch.manual_seed(opts.seed)
    path = resolve(opts.target)
    data_dir = os.path.join(os.path.dirname(path), os.path.basename(path).replace("target", "data"))
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval().requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(path)
    target.generation_config.eos_token_id = None  # every run goes to the end of the context
    specs = {}
    for name, path_ in (h.split("=", 1) for h in opts.heads if "=" in h):
        specs[name] = infer.load(target, heads=path_)
    if trained := [h for h in opts.heads if "=" not in h]:
        seqs = self_text(target, tokenizer, data_dir)
        for name in trained:
            with torch.enable_grad():
                specs[name] = infer.SpecModel(target, train_heads(target, seqs, opts.train_steps, name))
    ctx = target.config.max_position_embeddings
    texts = corpus_ids(tokenizer, f"{data_dir}/prompts.jsonl", 64, ctx)
    long = torch.cat(texts)[: ctx // 2]
    prompts = {"short": texts[0][: opts.short_prompt][None], "long": long[None]}
    cells = measure(opts, target, specs, prompts)
    for c in cells:  # does the speedup hold to the context's end? (its ratio to the speedup at 256 tokens)
        end = max(c["speedup"])
        c["end_over_256"] = (
            c["speedup"][end] / c["speedup"][256] if 256 in c["speedup"] and end > 256 else None
        )
    report = {
        "command": "python scripts/bench_length.py " + " ".join(argv),
        "machine": machine(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "context": ctx,
        "cells": cells,
    } | {k: v for k, v in dataclasses.asdict(opts).items() if k != "out"}
    os.makedirs(opts.out, exist_ok=True)
    atomic_text(os.path.join(opts.out, "bench_length.json"), json.dumps(report, indent=1) + "\n")
    atomic_text(os.path.join(opts.out, "bench_length.md"), markdown(report))
    plot(cells, os.path.join(opts.out, "bench_length.png"), f"{opts.target}: {report['machine']}")
    print(markdown(report))
    return report
