"""Side-by-side generation on the demo target: ``target.generate`` vs ``infer.generate`` with trained heads.

    python scripts/demo_generate.py --heads out/demo-medusa [--target demo] [--dtype auto] [--prompts 8]

(``scripts/demo_generate.py`` is a thin CLI over `main` here.) For each held-out prompt (code the target
never saw) both run greedy, interleaved (A B A B) after a warm-up, in one process. Prints per-prompt and
median tokens/s, the speedup (ratio of medians), the mean accepted length τ (tokens per verify forward,
bonus token included) and whether outputs are token-identical. Timings are this machine's; they are not
asserted anywhere.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field

import torch

import demo
import infer
from heads.config import parse_cli
from infer.prompts import read_prompts, render_prompt


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class DemoGenerateOptions:
    """Side-by-side generation: target.generate vs infer.generate with trained heads, greedy."""

    heads: str | None = field(
        default=None, metadata=_help("heads directory or Hub id (e.g. the demo run's output_dir)")
    )
    target: str = field(
        default="demo",
        metadata=_help("target dir or Hub id; 'demo' / 'demo-tiny' = the built-in demo target"),
    )
    dtype: str = field(
        default="auto",
        metadata=_help(
            "auto (as stored: fp32 for the demo target, where greedy output is exactly identical) or bf16 "
            "(cheaper verification on big models, docs/design.md §6; near-tie argmax can flip)"
        ),
    )
    prompts: int = field(default=8, metadata=_help("number of held-out prompts"))
    max_new_tokens: int = 128
    prompt_tokens: int = field(default=128, metadata=_help("truncate prompts to their last N tokens"))
    threads: int | None = field(default=None, metadata=_help("torch CPU threads (default: all cores)"))
    merge: bool = field(
        default=False,
        metadata=_help(
            "heads with a PEFT adapter (Medusa-2): merge it into the target weights (base-model speed)"
        ),
    )

    def __post_init__(self) -> None:
        if not self.heads:
            raise ValueError("--heads is required (a heads directory or Hub id)")
        if self.prompts < 1 or self.max_new_tokens < 1 or self.prompt_tokens < 1:
            raise ValueError("--prompts, --max-new-tokens and --prompt-tokens must be >= 1")


def side_by_side(o: DemoGenerateOptions) -> list[dict]:
    """Per prompt: tokens/s of both, τ and token identity (fixed-length greedy runs, EOS ignored)."""
    model = infer.load(demo.resolve(o.target), heads=o.heads, dtype=o.dtype, merge=o.merge)
    prompts_path = demo.ensure_demo_data(size=demo.NAMES.get(o.target, "full"))["prompts"]
    tok = model.tokenizer
    device = next(model.target.parameters()).device
    rows = read_prompts(prompts_path)[: o.prompts]
    encoded = [
        render_prompt(row, tok, f"{prompts_path} row {i + 1}")[:, -o.prompt_tokens :].to(device)
        for i, row in enumerate(rows)
    ]
    gen_kw = dict(max_new_tokens=o.max_new_tokens, eos_token_id=[])  # fixed length: compare like with like
    ref_kw = dict(
        do_sample=False, max_new_tokens=o.max_new_tokens, eos_token_id=None, pad_token_id=tok.pad_token_id
    )
    infer.generate(model, encoded[0], max_new_tokens=8)  # warm-up both paths
    model.target.generate(encoded[0], do_sample=False, max_new_tokens=8, pad_token_id=tok.pad_token_id)
    out_rows = []
    for i, ids in enumerate(encoded):
        t = time.perf_counter()
        ref = model.target.generate(ids, **ref_kw)
        t_ref = time.perf_counter() - t
        t = time.perf_counter()
        out = infer.generate(model, ids, **gen_kw)
        t_spec = time.perf_counter() - t
        n = out.stats.new_tokens
        row = {
            "target_tps": n / t_ref,
            "infer_tps": n / t_spec,
            "tau": out.stats.mean_accepted_length,
            "identical": torch.equal(ref, out.sequences),
        }
        out_rows.append(row)
        print(
            f"prompt {i}: target.generate {row['target_tps']:7.1f} tok/s | infer.generate {row['infer_tps']:7.1f} "
            f"tok/s | tau {row['tau']:.2f} | identical {row['identical']}",
            flush=True,
        )
    summary(o, out_rows, model.heads.config.head_type, device)
    return out_rows


def summary(o: DemoGenerateOptions, rows: list[dict], head_type: str, device) -> None:
    ref_tps = statistics.median(r["target_tps"] for r in rows)
    spec_tps = statistics.median(r["infer_tps"] for r in rows)
    tau = statistics.mean(r["tau"] for r in rows)
    same = sum(r["identical"] for r in rows)
    print("\n| | tokens/s (median) |\n|---|---|")
    print(
        f"| target.generate (greedy) | {ref_tps:.1f} |\n| infer.generate (greedy, {head_type}) | {spec_tps:.1f} |"
    )
    print(
        f"\nspeedup {spec_tps / ref_tps:.2f}x, mean accepted length tau = {tau:.2f} tokens per target forward "
        f"(bonus token included), identical outputs {same}/{len(rows)} prompts, dtype {o.dtype}, "
        f"{torch.get_num_threads()} threads on {device}"
    )
    if same < len(rows):
        print(
            "note: in bf16 a multi-token verify forward rounds differently from one-token decoding, so a near-tie "
            "argmax can flip; in fp32 outputs are identical (see tests/test_generate.py)"
        )


def main(argv: list[str] | None = None) -> list[dict]:
    o = parse_cli(DemoGenerateOptions, argv, prog="scripts/demo_generate.py")
    torch.set_num_threads(o.threads or os.cpu_count() or 1)
    try:
        return side_by_side(o)
    except (ValueError, FileNotFoundError) as e:  # bad input: the message, not a traceback
        raise SystemExit(f"error: {e}") from None
