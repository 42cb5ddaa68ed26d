"""The EAGLE-3 training-speed benchmark behind ``scripts/bench_eagle3_train.py``: its options, one
measurement per precision mode, and the markdown report (the measuring itself is `bench.eagle3_speed`).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from dataclasses import asdict, dataclass

import torch

from bench.eagle3_speed import (
    PARTS,
    bench_batch,
    demo_like_target,
    interleave,
    our_step,
    paired_ratios,
    part_split,
    reference_step,
)
from bench.machine import machine_info
from bench.measure import PeakMemory
from heads.config import option
from heads.eagle3 import Eagle3Head, build_vocab_map, count_tokens
from heads.io import atomic_text


@dataclass
class BenchOptions:
    """EAGLE-3 training step speed: per-part split and interleaved tokens/s vs the original trainer."""

    reference: str | None = option(None, help="checkout of SafeAILab/EAGLE (or its eagle/traineagle3)")
    ttt: str = option("7,4", help="our TTT lengths, comma-separated (the first is compared)")
    modes: str = option("fp32,bf16", help="precision modes, comma-separated: fp32, bf16")
    batch: int = 8
    length: int = 256
    draft_vocab: int = 2048
    rounds: int = 5
    split_steps: int = 2
    threads: int = 1
    out: str | None = option(None, help="directory for results.json and results.md")

    def __post_init__(self) -> None:
        try:
            self.ttt_steps()
        except ValueError:
            raise ValueError(f"--ttt must be comma-separated integers, got {self.ttt!r}") from None
        if bad := [m for m in self.mode_list() if m not in MODES]:
            raise ValueError(f"unknown modes {bad}; use {', '.join(MODES)}")

    def ttt_steps(self) -> list[int]:
        return [int(k) for k in self.ttt.split(",")]

    def mode_list(self) -> list[str]:
        return self.modes.split(",")


MODES = {"fp32": (torch.float32, None), "bf16": (torch.bfloat16, torch.bfloat16)}


def measure_mode(args: BenchOptions, mode: str, memory, reference: tuple | None = None) -> dict:
    dtype, amp = MODES[mode]
    target, note = demo_like_target(dtype)
    batch = bench_batch(args.batch, args.length, target.config.vocab_size)
    counts = count_tokens(batch["input_ids"], batch["loss_mask"], target.config.vocab_size)
    d2t, t2d = build_vocab_map(counts, args.draft_vocab)
    steps, heads, split = {}, {}, {}
    for k in args.ttt_steps():
        torch.manual_seed(0)
        head = Eagle3Head.for_target(target, draft_vocab_size=args.draft_vocab, ttt_steps=k).float().train()
        head.set_vocab_map(d2t, t2d)
        heads[k] = head
        split[f"ours K={k}"] = part_split(target, head, batch, steps=args.split_steps, amp=amp)
        steps[f"ours K={k}"] = our_step(target, head, amp=amp)
    info = {}
    if reference is not None:
        steps["original K=7"], info = reference_step(
            reference, target, heads[args.ttt_steps()[0]], 7, amp=amp
        )
    res = interleave(steps, batch, args.rounds, memory)
    ratios = {}
    if reference is not None:
        ratios = {
            n: {key: paired_ratios(res, n, "original K=7", key) for key in ("s", "cpu_s")}
            for n in steps
            if n.startswith("ours")
        }
    return {
        "target": note,
        "reference": info,
        "split": split,
        "interleaved": res,
        "ratio_vs_original": ratios,
    }


def markdown(report: dict) -> str:
    a = report["args"]
    lines = [
        f"# EAGLE-3 training step speed ({report['date']})",
        "",
        f"Machine: {report['machine']['summary']}.",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Batch {a['batch']} x {a['length']} tokens (random ids, loss mask off on the first 16), draft vocab "
        f"{a['draft_vocab']}, {a['rounds']} interleaved rounds, one process, {a['threads']} torch thread(s). "
        "Rounds alternate the order. tokens/s = target tokens per step / median wall seconds. Ratio = "
        "per-round (original seconds / ours), median [min-max], on wall and on process CPU time (less "
        "sensitive to other load on a shared machine): > 1 means ours is faster per target token.",
        "",
    ]
    for mode, r in report["modes"].items():
        lines += [f"## {mode}", "", f"Target: {r['target']}.", ""]
        if r["reference"]:
            lines += [
                f"Original trainer: `{r['reference']['checkout']}`; its target's logits vs ours: max |diff| "
                f"{r['reference']['target_logits_max_abs_diff']:.2e}.",
                "",
            ]
        lines += [
            "| step | median s (CPU s) | tokens/s | peak RSS MiB | ratio vs original K=7, wall | CPU |",
            "|---|---|---|---|---|---|",
        ]
        for name, x in r["interleaved"].items():
            q = r["ratio_vs_original"].get(name)
            qs = [
                f"{q[k]['median']:.2f}x [{q[k]['min']:.2f}-{q[k]['max']:.2f}]" if q else "-"
                for k in ("s", "cpu_s")
            ]
            lines.append(
                f"| {name} | {x['median_s']:.2f} ({x['median_cpu_s']:.2f}) | {x['tokens_per_s']:.0f} | "
                f"{x['peak_MiB']:.0f} | {qs[0]} | {qs[1]} |"
            )
        lines += [
            "",
            "Split of our step (seconds per step; MiB: outputs for the target parts, saved for backward "
            "for the draft parts):",
            "",
            "| part | " + " | ".join(r["split"]) + " |",
            "|---|" + "---|" * len(r["split"]),
        ]
        for p in (*PARTS, "total"):
            cells = []
            for s in r["split"].values():
                mib = s[p]["MiB"]
                cells.append(f"{s[p]['s']:.3f}" + (f" ({mib:.0f} MiB)" if mib is not None else ""))
            lines.append(f"| {p} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def run(args: BenchOptions, argv: list[str] | None = None, reference: tuple | None = None) -> dict:
    """Measure every mode, print the markdown report, write results.json/.md to ``args.out`` if set.
    ``reference``: (cnets, EConfig) of the original trainer (``--reference``), or None."""
    torch.set_num_threads(args.threads)
    memory = PeakMemory(torch.device("cpu"))
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python scripts/bench_eagle3_train.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine_info(torch.device("cpu")),
        "memory": memory.kind,
        "args": asdict(args) | {"ttt": args.ttt_steps()},
        "modes": {m: measure_mode(args, m, memory, reference) for m in args.mode_list()},
    }
    text = markdown(report)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        atomic_text(os.path.join(args.out, "results.json"), json.dumps(report, indent=1))
        atomic_text(os.path.join(args.out, "results.md"), text)
    return report
