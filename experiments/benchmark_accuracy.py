"""How well do heads predict the target on benchmark prompts, against their own held-out rows? Per-depth
top-k accuracy (`infer.head_accuracy`, as ``scripts/eval_heads.py`` scores it) on the target's own greedy
answers to the first ``--limit`` prompts of each benchmark set, next to the heads' held-out training rows.

    python experiments/benchmark_accuracy.py --heads A=DIR_A B=DIR_B --target smollm2-135m-instruct \\
        --sets mt-bench humaneval --limit 10 --new 160 --out OUT

The answers (``OUT/<set>.jsonl``, chat rows: the prompt and the target's answer, EOS kept) are scored, never
trained on: they are text derived from the benchmark prompts. Labels are the target's greedy choices, so the
accuracy is what greedy verification would accept with the true prefix. Writes ``OUT/<name>-<set>.json`` per
heads and set and prints one table row each; the last line printed is the JSON summary
(``OUT/summary.json``).
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # bench/ sits beside the packages

from bench.prompt_sets import BUILTIN  # noqa: E402
from heads import load_target, targets  # noqa: E402
from infer.head_accuracy import EvalOptions, eval_heads  # noqa: E402
from infer.prompts import render_prompt  # noqa: E402
from train.held_out import eval_batches  # noqa: E402


@torch.inference_mode()
def write_answers(target_name: str, dtype: str, sets: list[str], limit: int, new: int, out: str) -> dict:
    """``OUT/<set>.jsonl`` with the target's greedy answers (skipped when the file exists)."""
    from transformers import AutoTokenizer

    paths = {name: os.path.join(out, f"{name}.jsonl") for name in sets}
    if all(os.path.isfile(p) for p in paths.values()):
        return paths
    path = targets.resolve(target_name)
    model, tok = load_target(path, dtype=dtype), AutoTokenizer.from_pretrained(path)
    for name, file in paths.items():
        if os.path.isfile(file):
            continue
        lines = []
        for i, row in enumerate(BUILTIN[name]()[:limit]):
            ids = render_prompt(row, tok, f"{name} row {i}")
            full = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False
            )
            answer = tok.decode(full[0, ids.shape[1] :], skip_special_tokens=True)
            lines.append(
                json.dumps({"messages": [*row["messages"], {"role": "assistant", "content": answer}]})
            )
            print(f"{name} {i}: {full.shape[1] - ids.shape[1]} tokens", flush=True)
        with open(file + ".tmp", "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(file + ".tmp", file)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", nargs="+", required=True, help="NAME=DIR")
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--sets", nargs="+", default=["mt-bench", "humaneval"], choices=sorted(BUILTIN))
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--new", type=int, default=160, help="new tokens per answer")
    ap.add_argument("--max-length", type=int, default=384)
    ap.add_argument("--held-out", type=int, default=64, help="held-out training rows scored per heads")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    heads = dict(h.split("=", 1) for h in a.heads)
    data = write_answers(a.target, a.dtype, a.sets, a.limit, a.new, a.out)
    summary = {}
    print("| heads | text | scored | top-1 at depth 1..4 | top-10 at depth 1 | chain τ (joint ranks) |")
    print("|---|---|---|---|---|---|")
    for name, directory in heads.items():
        for text, path in {"held-out rows": None, **data}.items():
            n = a.held_out if path is None else a.limit
            opts = EvalOptions(
                heads=directory, target=a.target, data=path, max_examples=n, max_length=a.max_length,
                dtype=a.dtype, output=os.path.join(a.out, f"{name}-{text.replace(' ', '-')}.json"),
            )  # fmt: skip
            r = eval_heads(opts, eval_batches)
            top1 = [acc[0] for acc in r["topk_acc"][:4]]
            summary.setdefault(name, {})[text] = {
                "count": r["count"][0], "top1": top1, "top10_depth1": r["topk_acc"][0][-1],
                "chain_tau": r["chain_accept_length_empirical"],
            }  # fmt: skip
            print(
                f"| {name} | {text} | {r['count'][0]} | {' / '.join(f'{x:.3f}' for x in top1)} | "
                f"{r['topk_acc'][0][-1]:.3f} | {r['chain_accept_length_empirical']:.2f} |",
                flush=True,
            )
    with open(os.path.join(a.out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
