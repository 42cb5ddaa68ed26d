"""GPU check for infer.generate: greedy identity, host syncs per step, sampling smoke test, timing.

    python scripts/gpu_check.py --out gpu_check.json          # on a CUDA machine (falls back to CPU)

1. Greedy identity with `target.generate` on tiny random configs of 7 architectures, fp32 (eager and
   sdpa) and bf16, with random and briefly trained Medusa heads and three tree shapes.
2. Host syncs per decoding step, counted by torch.cuda.set_sync_debug_mode("warn").
3. Exact rejection sampling and typical acceptance run on the device.
4. Wall clock of target.generate vs infer.generate on a mid-size random Llama (bf16) with heads
   trained for a few seconds on its own greedy output; tokens/s and τ measured side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from conftest import ARCHS, tiny_model  # noqa: E402

import infer  # noqa: E402
from heads import MedusaHeads, run_target  # noqa: E402


def train_heads_on_own_output(target, heads, steps: int, seq: int, device, vocab: int) -> None:
    """Fit heads to the target's own greedy continuations (self-distillation, a few seconds)."""
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, vocab, (16, 4), generator=g).to(device)
    with torch.no_grad():
        data = target.generate(
            prompts, do_sample=False, max_new_tokens=seq, pad_token_id=0, eos_token_id=None
        )
        hidden = run_target(target, data).hidden.float()
    heads.float().train().requires_grad_(True)
    opt = torch.optim.AdamW(heads.parameters(), lr=3e-3)
    lm = target.get_output_embeddings()
    for _ in range(steps):
        feats = heads.features(hidden)  # [K, B, T, H]
        loss = 0.0
        for k in range(heads.config.num_heads):
            logits = torch.nn.functional.linear(feats[k, :, : -(k + 2)], lm.weight.float())
            loss = loss + torch.nn.functional.cross_entropy(logits.flatten(0, 1), data[:, k + 2 :].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    heads.eval().requires_grad_(False)


def identity(device, results) -> None:
    trees = {
        "default": None,
        "chain": infer.chain(3),
        "wide": [[0], [1], [2], [3], [0, 0], [1, 0], [0, 0, 0]],
    }
    for arch in ARCHS:
        for dtype, attn in ((torch.float32, "eager"), (torch.float32, "sdpa"), (torch.bfloat16, "sdpa")):
            target = tiny_model(arch, dtype=dtype, attn=attn, hidden_size=64).to(device)
            for trained in (False, True):
                torch.manual_seed(1)
                heads = MedusaHeads.for_target(target, num_heads=3)
                if trained:
                    train_heads_on_own_output(target, heads, 150, 48, device, 96)
                else:
                    for p in heads.parameters():
                        torch.nn.init.normal_(p, std=0.3)
                model = infer.SpecModel(target, heads.to(dtype))
                for tname, tree in trees.items():
                    same, taus = 0, []
                    for seed in range(3):
                        ids = torch.randint(
                            3, 96, (1, 5 + 3 * seed), generator=torch.Generator().manual_seed(seed)
                        ).to(device)
                        ref = target.generate(
                            ids, do_sample=False, max_new_tokens=40, pad_token_id=0, eos_token_id=None
                        )
                        out = infer.generate(model, ids, max_new_tokens=40, eos_token_id=[], tree=tree)
                        same += int(torch.equal(ref, out.sequences))
                        taus.append(out.stats.mean_accepted_length)
                    key = f"{arch}/{str(dtype)[6:]}/{attn}/{'trained' if trained else 'random'}/{tname}"
                    results["identity"][key] = {"identical": f"{same}/3", "tau": round(sum(taus) / 3, 2)}
                    print(key, results["identity"][key], flush=True)


def syncs_and_sampling(device, results) -> None:
    target = tiny_model("llama", hidden_size=64).to(device)
    heads = MedusaHeads.for_target(target, num_heads=3)
    train_heads_on_own_output(target, heads, 150, 48, device, 96)
    model = infer.SpecModel(target, heads)
    ids = torch.randint(3, 96, (1, 8)).to(device)
    for mode, kw in (
        ("greedy", {}),
        ("exact", {"do_sample": True, "temperature": 0.7, "top_p": 0.9}),
        ("typical", {"do_sample": True, "acceptance": "typical"}),
    ):
        infer.generate(model, ids, max_new_tokens=8, eos_token_id=[], **kw)  # warm-up
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("warn")
            out = infer.generate(model, ids, max_new_tokens=64, eos_token_id=[], **kw)
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode(0)
        syncs = sum("synchroniz" in str(w.message) for w in caught)
        steps = len(out.stats.accepted_lengths)
        results["syncs"][mode] = {
            "syncs": syncs,
            "steps": steps,
            "per_step": round(syncs / max(steps, 1), 2),
            "tau": round(out.stats.mean_accepted_length, 2),
            "new_tokens": out.stats.new_tokens,
        }
        print(mode, results["syncs"][mode], flush=True)


def timing(device, results) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=2048,
    )
    target = LlamaForCausalLM(cfg).to(device=device, dtype=torch.bfloat16).eval().requires_grad_(False)
    heads = MedusaHeads.for_target(target, num_heads=4)
    train_heads_on_own_output(target, heads, 200, 96, device, 32000)
    model = infer.SpecModel(target, heads.to(torch.bfloat16))
    ids = torch.randint(3, 32000, (1, 64), generator=torch.Generator().manual_seed(0)).to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(2):  # warm-up
        target.generate(ids, do_sample=False, max_new_tokens=16, pad_token_id=0)
        infer.generate(model, ids, max_new_tokens=16)
    rows = {"target.generate": [], "infer.generate": []}
    tau = []
    for _ in range(3):  # interleaved A B A B
        sync()
        t = time.perf_counter()
        ref = target.generate(ids, do_sample=False, max_new_tokens=128, pad_token_id=0, eos_token_id=None)
        sync()
        rows["target.generate"].append(128 / (time.perf_counter() - t))
        t = time.perf_counter()
        out = infer.generate(model, ids, max_new_tokens=128, eos_token_id=[])
        sync()
        rows["infer.generate"].append(128 / (time.perf_counter() - t))
        tau.append(out.stats.mean_accepted_length)
        results["timing_identical"] = bool(torch.equal(ref, out.sequences))
    med = {k: sorted(v)[1] for k, v in rows.items()}
    results["timing"] = {
        "model": "random Llama 16x2048 bf16, heads fitted 200 steps to its own greedy output",
        "tokens_per_s": med,
        "speedup": round(med["infer.generate"] / med["target.generate"], 2),
        "tau": round(sum(tau) / len(tau), 2),
    }
    print(results["timing"], flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument("--skip-timing", action="store_true")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    results = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "identity": {},
        "syncs": {},
    }
    import transformers

    results["transformers"] = transformers.__version__
    identity(device, results)
    syncs_and_sampling(device, results)
    if not args.skip_timing:
        timing(device, results)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    bad = [k for k, v in results["identity"].items() if "float32" in k and v["identical"] != "3/3"]
    print("fp32 identity failures:", bad or "none")


if __name__ == "__main__":
    main()
