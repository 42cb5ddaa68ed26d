"""Batch-1 greedy `infer.generate` on a tiny random sliding-window (or eager) target: time per verify step.

    python scripts/bench_batch1_sliding.py [--arch mistral] [--attn sdpa] [--window 16] [--new-tokens 256]
        [--prompt 32] [--repeats 3] [--threads 1] [--layouts] [--out results/static-batch1/NAME.json]

Builds the target from a config (random weights, fp32, seed 0) and random Medusa heads (seed 1, the
default tree: drafts mostly rejected, so every step verifies a full tree), generates greedily and
checks the output against ``target.generate`` (exits 1 on a mismatch). Reports the fastest of
``--repeats`` runs (a shared machine only adds time): total and verify seconds, verify seconds per
step, tokens/s, and ``target.generate``'s tokens/s. Run it at two commits to compare code versions.

``--layouts``: instead, time ``--new-tokens`` verify + accept steps (the default tree, the root
accepted) of `infer.runner.TreeRunner` against `PreviousLayout` in one process, interleaved
``--repeats`` times, so that a shared machine's load hits both alike. Measured, never asserted.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch
import transformers as tf

import infer
from heads import MedusaHeads
from heads.io import atomic_text
from infer.cache import new_cache
from infer.runner import TreeRunner
from infer.tree import DraftTree, attention_mask, default_tree, tree_buffers


def build(arch: str, attn: str, window: int | None, context: int) -> torch.nn.Module:
    """A small random target: 4 layers, hidden 128, 4 query heads and 2 KV heads, vocab 512."""
    common = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
                  bos_token_id=1, eos_token_id=None, pad_token_id=0)  # fmt: skip
    configs = {"mistral": tf.MistralConfig, "llama": tf.LlamaConfig, "gemma2": tf.Gemma2Config}
    cfg = configs[arch](**common, **({"sliding_window": window} if arch != "llama" else {}))
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32)
    model.generation_config.eos_token_id = None
    return model.eval().requires_grad_(False)


class PreviousLayout(TreeRunner):
    """The batch-1 layout sliding-window and eager targets had before: a growing ``DynamicCache``
    (every verify re-allocates each layer's KV by concatenation) and a float mask built anew per step
    (`infer.tree.attention_mask`). For this comparison only."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cache, self.static = new_cache(), False

    def _mask(self, tree: DraftTree, q_pos: torch.Tensor):
        return attention_mask(tree.ancestors, tree.depth, self.past, self.target.dtype, self.text_cfg)


def layouts(target, a) -> dict:
    """ms per verify + accept step of each layout: the fastest and all of ``a.repeats`` interleaved runs."""
    tb = tree_buffers(default_tree(4), torch.device("cpu"))
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 512, (1, a.prompt), generator=g)
    trees = [DraftTree(torch.randint(3, 512, tb.parents.shape, generator=g), tb.parents, tb.depth,
                       tb.ancestors, tb.retrieve, tb.sib_before) for _ in range(a.new_tokens)]  # fmt: skip
    keep = torch.tensor([0])

    def run(cls) -> float:
        runner = cls(target, max_len=a.prompt + a.new_tokens)
        runner.prefill(ids)
        t0 = time.perf_counter()
        for tree in trees:
            runner.verify(tree)
            runner.accept(keep)
        return 1e3 * (time.perf_counter() - t0) / len(trees)

    ms: dict[str, list[float]] = {"static (this code)": [], "previous (DynamicCache + per-step mask)": []}
    with torch.inference_mode():
        for _ in range(a.repeats):
            for times, cls in zip(ms.values(), (TreeRunner, PreviousLayout), strict=True):
                times.append(run(cls))
    return {"tree_nodes": int(tb.parents.shape[0]), "ms_per_step_fastest": {k: min(v) for k, v in ms.items()},
            "ms_per_step_all": ms}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", default="mistral", choices=["mistral", "llama", "gemma2"])
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--layouts", action="store_true")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    target = build(a.arch, a.attn, a.window, 2 * (a.prompt + a.new_tokens) + 64)
    head = {
        "command": "python scripts/bench_batch1_sliding.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": f"{platform.machine()}, torch {torch.__version__}, transformers {tf.__version__}, "
        f"{a.threads} thread(s)",
        "args": vars(a),
    }
    if a.layouts:
        return _report({**head, **layouts(target, a)}, a.out)
    torch.manual_seed(1)
    heads = MedusaHeads.for_target(target, num_heads=4)
    with torch.no_grad():
        for w in heads.parameters():
            torch.nn.init.normal_(w, std=0.5)
    spec = infer.SpecModel(target, heads.eval())
    ids = torch.randint(3, 512, (1, a.prompt), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        ref = target.generate(ids, do_sample=False, max_new_tokens=a.new_tokens, pad_token_id=0)
        base_s, runs = [], []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            target.generate(ids, do_sample=False, max_new_tokens=a.new_tokens, pad_token_id=0)
            base_s.append(time.perf_counter() - t0)
            out = infer.generate(spec, ids, max_new_tokens=a.new_tokens, do_sample=False, timing=True)
            if not torch.equal(out.sequences, ref):
                print("MISMATCH: infer.generate differs from target.generate", file=sys.stderr)
                sys.exit(1)
            runs.append(out.stats)
    best = min(runs, key=lambda s: s.total_time_s)
    steps = len(best.accepted_lengths)
    return _report({
        **head,
        "greedy_identical": True,
        "steps": steps,
        "mean_accepted_length": best.mean_accepted_length,
        "total_s": best.total_time_s,
        "verify_s": best.verify_time_s,
        "verify_ms_per_step": 1e3 * best.verify_time_s / steps,
        "tokens_per_s": a.new_tokens / best.total_time_s,
        "target_generate_tokens_per_s": a.new_tokens / min(base_s),
        "all_total_s": [s.total_time_s for s in runs],
    }, a.out)  # fmt: skip


def _report(result: dict, out: str | None) -> dict:
    print(json.dumps(result, indent=1))
    if out:
        atomic_text(out, json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
