"""What keeps EAGLE's efficiency under 0.7 as the target grows: what does one speculative step cost against one
plain decode step, and what share of it is the draft?

    OMP_NUM_THREADS=1 python experiments/draft_share_scaling.py --repeats 3 --new-tokens 32 \\
        [--shapes demo small 0.5b 1b] [--threads 1] [--out results/draft-share-scaling]

Efficiency (speedup / τ) does not depend on the weights: with ``s`` decode steps for ``n`` tokens,
τ = n / s, speedup = t_plain / t_spec, so speedup / τ = (t_plain / n) / (t_spec / s) = the time of one
plain decode token over the time of one speculative step (draft + verify + bookkeeping). It is fixed by
the shapes (target size, tree size, draft size), so random targets of real models' shapes and random
heads measure it without training anything: the EAGLE-2 tree is the same size whatever the heads
propose (depth 6, top-k 8, 48 tokens with the root, the library's defaults). Only the KV cache grows
more slowly than in a real run (random heads have τ about 1), which favours neither side much at a
128-token prompt.

Per shape: random Llama target (bf16 where the CPU has native bf16, else fp32), random EAGLE-3.1 heads
(fc_norm + norm_output, the recipe's draft vocabulary size) and P-EAGLE heads (4 depths in one forward),
``target.generate`` and ``infer.generate(timing=True)`` interleaved, each repeated; medians. Writes
``results.json`` and ``results.md`` to ``--out`` (default: `results/draft-share-scaling/`, whose README
gives the answer).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # bench/ sits beside the packages

import infer  # noqa: E402
from bench.machine import machine_info  # noqa: E402
from demo.precision import fast_precision  # noqa: E402
from demo.spec import SPECS  # noqa: E402
from heads import Eagle3Head  # noqa: E402
from heads.io import atomic_text  # noqa: E402


def _llama(layers: int, hidden: int, inter: int, heads: int, kv: int, vocab: int) -> dict:
    return dict(num_hidden_layers=layers, hidden_size=hidden, intermediate_size=inter, num_attention_heads=heads,
                num_key_value_heads=kv, vocab_size=vocab)  # fmt: skip


_DEMO = SPECS["full"]
_DEMO_FIELDS = ("num_layers", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "vocab_size")
# name: (Llama config fields, draft vocabulary size): the demo target's own spec, then the layer count /
# width / vocabulary of public models (a Llama with their numbers, random weights).
SHAPES: dict[str, tuple[dict, int]] = {
    "demo": (_llama(*(getattr(_DEMO, k) for k in _DEMO_FIELDS)), 2048),
    "small": (_llama(12, 512, 1536, 8, 4, 32000), 8192),
    "0.5b": (_llama(24, 896, 4864, 14, 2, 151936), 32000),  # Qwen2.5-0.5B's numbers
    "1b": (_llama(16, 2048, 8192, 32, 8, 128256), 32000),  # Llama-3.2-1B's numbers
}
HEADS = {
    "EAGLE-3.1": dict(fc_norm=True, norm_output=True),
    "P-EAGLE (K 4)": dict(fc_norm=True, norm_output=True, parallel_draft=4),
}


def _plain(target, ids, n: int) -> float:
    t0 = time.perf_counter()
    target.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    return time.perf_counter() - t0


def _prefill(target, ids) -> float:
    t0 = time.perf_counter()
    target(input_ids=ids, use_cache=True)
    return time.perf_counter() - t0


def measure(name: str, new_tokens: int, repeats: int, dtype: torch.dtype) -> dict:
    fields, draft_vocab = SHAPES[name]
    torch.manual_seed(0)
    cfg = LlamaConfig(**fields, max_position_embeddings=1024, bos_token_id=None, eos_token_id=None)
    target = LlamaForCausalLM(cfg).to(dtype).eval()
    models = {
        label: infer.SpecModel(
            target, Eagle3Head.for_target(target, draft_vocab_size=draft_vocab, **kw).eval()
        )
        for label, kw in HEADS.items()
    }
    ids = torch.randint(0, cfg.vocab_size, (1, 128), generator=torch.Generator().manual_seed(1))
    params = sum(p.numel() for p in target.parameters())
    with torch.inference_mode():
        _plain(target, ids, 4)  # warm-up
        for m in models.values():
            infer.generate(m, ids, max_new_tokens=8, do_sample=False, lookup=0)
        plain, prefill, runs = [], [], {label: [] for label in models}
        for _ in range(repeats):  # interleaved, so drift in the machine's speed hits every method alike
            plain.append(_plain(target, ids, new_tokens))
            prefill.append(_prefill(target, ids))
            for label, m in models.items():
                out = infer.generate(
                    m, ids, max_new_tokens=new_tokens, do_sample=False, timing=True, lookup=0
                )
                runs[label].append(out.stats)
    # plain decode token: (generate - prefill) / (n - 1), the first token coming with the prefill
    t_token = (statistics.median(plain) - statistics.median(prefill)) / (new_tokens - 1)
    row = {"shape": name, "params_M": round(params / 1e6, 1), "draft_vocab": draft_vocab, **fields,
           "plain_decode_ms": 1000 * t_token, "heads": {}}  # fmt: skip
    for label, stats in runs.items():
        steps = [len(s.accepted_lengths) for s in stats]
        # decode_s: after the prefill; draft_time_s also holds the proposer's start on the prompt (one
        # draft forward per generation, against one per depth per step)
        step_s = [s.decode_s / n for s, n in zip(stats, steps, strict=True)]
        draft_s = [s.draft_time_s / n for s, n in zip(stats, steps, strict=True)]
        step = statistics.median(step_s)
        row["heads"][label] = {
            "step_ms": 1000 * step,
            "draft_ms": 1000 * statistics.median(draft_s),
            "draft_share": statistics.median(d / t for d, t in zip(draft_s, step_s, strict=True)),
            "efficiency": t_token / step,
            "tau": statistics.median(s.mean_accepted_length for s in stats),
            "draft_params_M": round(sum(p.numel() for p in models[label].heads.parameters()) / 1e6, 1),
        }
        print(f"{name} {label}: {row['heads'][label]}", flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=os.path.join(ROOT, "results", "draft-share-scaling"))
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    prec = fast_precision()
    dtype_name, why = prec.name, prec.reason
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    rows = [measure(s, a.new_tokens, a.repeats, dtype) for s in a.shapes]
    machine = machine_info(torch.device("cpu"))
    lines = [
        "# One speculative step against one plain decode step, by target shape",
        "",
        f"`{' '.join(['python', 'experiments/draft_share_scaling.py', *sys.argv[1:]])}` ({machine['summary']}; "
        f"{dtype_name}: {why}); random weights, 128-token prompt, {a.new_tokens} new tokens, median of "
        f"{a.repeats} interleaved repeats; EAGLE trees: the library's defaults.",
        "",
        "| shape | target params | draft params | plain decode ms | heads | step ms | draft ms | draft share "
        "| efficiency (plain decode / step) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for label, h in r["heads"].items():
            desc = f"{r['shape']} ({r['num_hidden_layers']}L x {r['hidden_size']}, V {r['vocab_size']})"
            lines.append(
                f"| {desc} | {r['params_M']}M | {h['draft_params_M']}M | {r['plain_decode_ms']:.1f} | {label} "
                f"| {h['step_ms']:.1f} | {h['draft_ms']:.1f} | {h['draft_share']:.0%} "
                f"| {h['efficiency']:.2f} |"
            )
    os.makedirs(a.out, exist_ok=True)
    atomic_text(os.path.join(a.out, "results.json"), json.dumps({"machine": machine, "rows": rows}, indent=2))
    atomic_text(os.path.join(a.out, "results.md"), "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
