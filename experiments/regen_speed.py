"""Where does `scripts/regenerate_data.py`'s time go on a real model, and does dropping finished rows from a
batch speed it up? Regeneration speed, before and after, interleaved: ``before`` = batches of consecutive
prompts, each one ``target.generate`` call (`train.regen_generate.generate_batch`); ``after`` = batches
planned by prompt length (`train.regen_generate.batch_plan`) decoded by `greedy_decode` below (a decoding
loop that drops rows from the batch as they end; measured, not shipped: see results/regen-speed/README.md).

    python experiments/regen_speed.py MODEL_DIR --n 16 --batch 8 --new 64 --reps 2 --dtype bf16

Prompts: the first ``n`` MT-Bench first turns (bench/data, round-robin over categories), or the first user turns
of ``--prompts`` (e.g. scripts/make_prompts.py output), rendered with the chat template. Prints tok/s per run (new
tokens, eos excluded, over wall time) and whether the outputs are identical; the last line printed is the JSON
record kept as `results/regen-speed/run*.json`.
"""

import argparse
import json
import os
import platform
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # bench/ sits beside the packages

from bench.prompt_sets import mt_bench_rows  # noqa: E402
from infer.prompts import read_prompts  # noqa: E402
from train.regen_generate import batch_plan, eos_ids, generate_batch, left_pad  # noqa: E402


@torch.inference_mode()
def greedy_decode(
    model: torch.nn.Module,
    prompts: list,
    *,
    max_new_tokens: int,
    eos: list,
    pad_id: int,
) -> list:
    """Greedy continuation of each prompt (eos excluded), as ``target.generate`` would decode it, with the
    rows that have ended removed from the batch.

    A prefill forward on the left-padded prompts [B, L], then one forward per new token on the live rows
    only: when rows end (eos, or ``max_new_tokens`` reached) the KV cache, attention mask [B', L + t] and
    position ids are cut to the remaining B' rows (``Cache.batch_select_indices``), so a long answer does
    not keep finished rows computing. Position ids are ``cumsum(mask) - 1`` (1 on padding), as
    ``generate`` computes them; the next token is ``argmax`` of the last position's logits. One host sync
    per step (the new tokens, to find the rows that ended).
    """
    device = next(model.parameters()).device
    input_ids, mask = (t.to(device) for t in left_pad(prompts, pad_id))
    position = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    out = model(
        input_ids=input_ids, attention_mask=mask, position_ids=position, use_cache=True, logits_to_keep=1
    )
    cache, nxt = out.past_key_values, position[:, -1:] + 1  # nxt: [B', 1]
    token = out.logits[:, -1].argmax(-1)  # [B']
    results: list = [[] for _ in prompts]
    live = list(range(len(prompts)))  # live[j]: the prompt of batch row j
    stop = set(int(e) for e in eos)
    while True:
        keep = []
        for j, t in enumerate(token.tolist()):
            if t in stop:
                continue
            results[live[j]].append(t)
            if len(results[live[j]]) < max_new_tokens:
                keep.append(j)
        if not keep:
            return results
        if len(keep) < len(live):
            idx = torch.as_tensor(keep, device=device)
            cache.batch_select_indices(idx)
            mask, nxt, token = mask[idx], nxt[idx], token[idx]
            live = [live[j] for j in keep]
        mask = torch.cat([mask, mask.new_ones(len(live), 1)], dim=1)
        out = model(
            input_ids=token[:, None],
            attention_mask=mask,
            position_ids=nxt,
            past_key_values=cache,
            use_cache=True,
        )
        cache, nxt = out.past_key_values, nxt + 1
        token = out.logits[:, -1].argmax(-1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompts", default=None, help="JSONL of chat rows (default: MT-Bench first turns)")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    a = p.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype).eval().requires_grad_(False)
    tok = AutoTokenizer.from_pretrained(a.model)
    prompts = [
        tok(
            tok.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        )["input_ids"]
        for r in (read_prompts(a.prompts) if a.prompts else mt_bench_rows())[: a.n]
    ]
    eos = eos_ids(model, tok)
    kw = dict(
        max_new_tokens=a.new, eos=eos, pad_id=tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    )

    def run_batches(fn, batches):
        out = [None] * len(prompts)
        for idx in batches:
            for i, o in zip(idx, fn(model, [prompts[i] for i in idx], **kw), strict=True):
                out[i] = o
        return out

    consecutive = [list(range(k, min(a.n, k + a.batch))) for k in range(0, a.n, a.batch)]
    planned = batch_plan([len(p) for p in prompts], a.batch)
    fns = {
        "before": lambda: run_batches(generate_batch, consecutive),
        "after": lambda: run_batches(greedy_decode, planned),
    }
    runs = {name: [] for name in fns}
    outs = {}
    with torch.inference_mode():
        greedy_decode(model, prompts[:2], **{**kw, "max_new_tokens": 4})  # warm-up
        for rep in range(a.reps):
            for name, fn in list(fns.items())[:: 1 if rep % 2 == 0 else -1]:
                t0 = time.perf_counter()
                out = fn()
                dt = time.perf_counter() - t0
                n = sum(len(o) for o in out)
                runs[name].append({"seconds": round(dt, 2), "new_tokens": n, "tok_s": round(n / dt, 1)})
                outs[name] = out
                print(name, runs[name][-1], flush=True)
    print(
        json.dumps(
            {
                "machine": platform.processor() or platform.machine(),
                "threads": torch.get_num_threads(),
                "dtype": a.dtype,
                "prompts": a.n,
                "max_new_tokens": a.new,
                "prompt_tokens": [len(p) for p in prompts],
                "runs": runs,
                "identical": outs["before"] == outs["after"],
                "rows_differing": [
                    i for i, (x, y) in enumerate(zip(outs["before"], outs["after"], strict=True)) if x != y
                ],
                "lengths": [len(o) for o in outs["after"]],
                "batch": a.batch,
                "batches_before": consecutive,
                "batches_after": planned,
            }
        )
    )


if __name__ == "__main__":
    main()
