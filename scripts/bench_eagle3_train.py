"""EAGLE-3 training speed on the demo target: per-part split and interleaved tokens/s vs the original trainer.

    python scripts/bench_eagle3_train.py [--reference PATH/TO/EAGLE] [--ttt 7,4] [--modes fp32,bf16] \
        [--batch 8] [--length 256] [--rounds 5] [--threads 1] [--out results/eagle3-train-speed]

Ours is `train.train_heads.batch_loss` + backward + AdamW on the demo target (or, when it is not built,
a random model with its config). ``--reference`` points at a checkout of SafeAILab/EAGLE (its
``eagle/traineagle3`` model code is imported from there, never copied); without it only ours is
reported. Modes: ``fp32`` (target and heads fp32) and ``bf16`` (target bf16, forward under bf16
autocast, fp32 master weights, for both trainers). The logic is in `train.eagle3_speed`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from benchmark import PeakMemory, machine_info  # noqa: E402  (scripts/benchmark.py)

from heads.eagle3 import Eagle3Head, build_vocab_map, count_tokens  # noqa: E402
from train.eagle3_speed import (  # noqa: E402
    PARTS,
    bench_batch,
    demo_like_target,
    interleave,
    our_step,
    paired_ratios,
    part_split,
    reference_step,
)

MODES = {"fp32": (torch.float32, None), "bf16": (torch.bfloat16, torch.bfloat16)}


def measure_mode(args, mode: str, memory) -> dict:
    dtype, amp = MODES[mode]
    target, note = demo_like_target(dtype)
    batch = bench_batch(args.batch, args.length, target.config.vocab_size)
    counts = count_tokens(batch["input_ids"], batch["loss_mask"], target.config.vocab_size)
    d2t, t2d = build_vocab_map(counts, args.draft_vocab)
    steps, heads, split = {}, {}, {}
    for k in args.ttt:
        torch.manual_seed(0)
        head = Eagle3Head.for_target(target, draft_vocab_size=args.draft_vocab, ttt_steps=k).float().train()
        head.set_vocab_map(d2t, t2d)
        heads[k] = head
        split[f"ours K={k}"] = part_split(target, head, batch, steps=args.split_steps, amp=amp)
        steps[f"ours K={k}"] = our_step(target, head, amp=amp)
    info = {}
    if args.reference:
        steps["original K=7"], info = reference_step(args.reference, target, heads[args.ttt[0]], 7, amp=amp)
    res = interleave(steps, batch, args.rounds, memory)
    ratios = {}
    if args.reference:
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


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reference", default=None, help="checkout of SafeAILab/EAGLE (or its eagle/traineagle3)")
    p.add_argument("--ttt", default="7,4", help="our TTT lengths, comma-separated (the first is compared)")
    p.add_argument("--modes", default="fp32,bf16")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--draft-vocab", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--split-steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="directory for results.json and results.md")
    args = p.parse_args(argv)
    args.ttt = [int(k) for k in args.ttt.split(",")]
    modes = args.modes.split(",")
    if bad := [m for m in modes if m not in MODES]:
        p.error(f"unknown modes {bad}; use {', '.join(MODES)}")
    torch.set_num_threads(args.threads)
    memory = PeakMemory(torch.device("cpu"))
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python scripts/bench_eagle3_train.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine_info(torch.device("cpu")),
        "memory": memory.kind,
        "args": vars(args),
        "modes": {m: measure_mode(args, m, memory) for m in modes},
    }
    text = markdown(report)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(report, f, indent=1)
        with open(os.path.join(args.out, "results.md"), "w") as f:
            f.write(text)
    return report


if __name__ == "__main__":
    main()
