"""Side-by-side generation on the demo target: `target.generate` vs `infer.generate` with trained heads.

    python scripts/demo_generate.py --heads out/demo-medusa [--target demo] [--dtype auto] [--prompts 8]

For each held-out prompt (code the target never saw) both run greedy, interleaved (A B A B) after a
warm-up, in one process. Prints per-prompt and median tokens/s, the speedup (ratio of medians), the
mean accepted length τ (tokens per verify forward, bonus token included) and whether outputs are
token-identical. Timings are this machine's; they are not asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import infer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--heads", required=True, help="heads directory or Hub id (e.g. the demo run's output_dir)"
    )
    ap.add_argument(
        "--target",
        default="demo",
        help="target dir or Hub id; 'demo' / 'demo-tiny' = the built-in demo target",
    )
    ap.add_argument(
        "--dtype",
        default="auto",
        help="auto (as stored: fp32 for the demo target, where greedy output is exactly identical) or bf16 (cheaper verification on big models, docs/design.md §6; near-tie argmax can flip)",
    )
    ap.add_argument("--prompts", type=int, default=8, help="number of held-out prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=128, help="truncate prompts to their last N tokens")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    ap.add_argument(
        "--merge",
        action="store_true",
        help="heads with a PEFT adapter (Medusa-2): merge it into the target weights (base-model speed)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads or os.cpu_count() or 1)

    from train import demo

    target = args.target
    size = {"demo": "full", "demo-tiny": "tiny"}.get(target)
    if size:
        target = demo.ensure_demo_target(size)
    prompts_path = demo.ensure_demo_data(size=size or "full")["prompts"]
    model = infer.load(target, heads=args.heads, dtype=args.dtype, merge=args.merge)
    tok = model.tokenizer
    with open(prompts_path) as f:
        texts = [json.loads(line)["text"] for line in f][: args.prompts]
    if not texts:
        raise SystemExit(f"error: no prompts in {prompts_path}")
    device = next(model.target.parameters()).device
    encoded = [tok(t, return_tensors="pt").input_ids[:, -args.prompt_tokens :].to(device) for t in texts]

    gen_kw = dict(max_new_tokens=args.max_new_tokens, eos_token_id=[])  # fixed length: compare like with like
    infer.generate(model, encoded[0], max_new_tokens=8)  # warm-up both paths
    model.target.generate(encoded[0], do_sample=False, max_new_tokens=8, pad_token_id=tok.pad_token_id)

    rows = []
    for i, ids in enumerate(encoded):
        t = time.perf_counter()
        ref = model.target.generate(
            ids,
            do_sample=False,
            max_new_tokens=args.max_new_tokens,
            eos_token_id=None,
            pad_token_id=tok.pad_token_id,
        )
        t_ref = time.perf_counter() - t
        t = time.perf_counter()
        out = infer.generate(model, ids, **gen_kw)
        t_spec = time.perf_counter() - t
        n = out.stats.new_tokens
        same = torch.equal(ref, out.sequences)
        rows.append((n / t_ref, n / t_spec, out.stats.mean_accepted_length, same))
        print(
            f"prompt {i}: target.generate {n / t_ref:7.1f} tok/s | infer.generate {n / t_spec:7.1f} tok/s | "
            f"tau {out.stats.mean_accepted_length:.2f} | identical {same}",
            flush=True,
        )

    ref_tps = statistics.median(r[0] for r in rows)
    spec_tps = statistics.median(r[1] for r in rows)
    tau = statistics.mean(r[2] for r in rows)
    same = sum(r[3] for r in rows)
    print("\n| | tokens/s (median) |\n|---|---|")
    print(
        f"| target.generate (greedy) | {ref_tps:.1f} |\n| infer.generate (greedy, {model.heads.config.head_type}) | {spec_tps:.1f} |"
    )
    print(
        f"\nspeedup {spec_tps / ref_tps:.2f}x, mean accepted length tau = {tau:.2f} tokens per target forward "
        f"(bonus token included), identical outputs {same}/{len(rows)} prompts, dtype {args.dtype}, "
        f"{torch.get_num_threads()} threads on {device}"
    )
    if same < len(rows):
        print(
            "note: in bf16 a multi-token verify forward rounds differently from one-token decoding, so a near-tie "
            "argmax can flip; in fp32 outputs are identical (see tests/test_generate.py)"
        )


if __name__ == "__main__":
    main()
