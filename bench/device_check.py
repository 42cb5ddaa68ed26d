"""The device check (``scripts/gpu_check.py``): tree-verify cost, host syncs and greedy identity
on a Llama-style target of about 1B parameters built from its config (random weights: kernel timing does
not depend on them), in at most ~8 minutes on one GPU.

1. **identity** (fp32): `infer.generate`'s decoding loop (`infer.generate.speculative_generate`, the
   loop ``infer.generate`` runs) against ``target.generate`` on a few prompts, with an *oracle* draft
   (`OracleProposer`: the target's own greedy continuation, so drafts are accepted deep, each level with a
   wrong sibling in front so the accepted path is not the first nodes of the tree). Any difference fails;
   so does a mean accepted length below 2 (a correct verify accepts the oracle's drafts).
2. **syncs**: host synchronisations per decoding step, counted with ``torch.cuda.set_sync_debug_mode``
   (CUDA only; the oracle itself never synchronises).
3. **verify cost**: median time of one k-node tree verify forward (k = 1..64, the root included) after a
   cached context, with the registered tree attention (`infer.attention`, the default) and with the old
   path (stock sdpa with a 4D float mask, ``tree_attention=False``), against a 1-token decode forward of
   the stock model at the same context, as ``target.generate`` runs it. Stops early, and says so, when
   the time budget is spent.

``small=True`` runs the same code on a tiny config (CPU, seconds) so the suite runs it end to end.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import warnings
from dataclasses import asdict, dataclass, fields, replace

import torch
import transformers
from torch import Tensor

from bench.measure import first_difference, random_llama, sync, tie_margin
from bench.shapes import LLAMA_1B, LLAMA_SMALL
from heads.config import option, parse_cli
from heads.graft import TargetOutput, run_target_lean
from heads.io import atomic_text
from infer.cache import new_cache
from infer.draft import Proposer, root_only
from infer.generate import speculative_generate
from infer.runner import TreeRunner
from infer.tree import DraftTree, tree_buffers


@dataclass
class DeviceCheckOptions:
    """Tree-verify cost, host syncs and greedy identity of infer.generate on a ~1B random Llama."""

    out: str = option("gpu_check.json", help="where the JSON report is written")
    small: bool = option(False, help="a tiny config (CPU, seconds): the suite's end-to-end run")
    device: str | None = option(None, help="cuda, cpu, ... (default: cuda if available)")
    # Sizes, each >= 1; ``small``: its default under --small (`SMALL`).
    max_k: int = option(64, small=8, help="time tree verifies of k = 1..max_k nodes")
    context: int = option(512, small=32, help="cached context tokens before each timed verify")
    reps: int = option(20, small=2, help="timed forwards per (k, path), after 2 warm-ups")
    prompts: int = option(4, small=2, help="prompts for the greedy identity check")
    new_tokens: int = option(128, small=24, help="new tokens per identity prompt")
    depth: int = option(6, small=4, help="oracle draft depth (each level: the right token and a wrong one)")
    budget_s: float = option(420.0, help="stop the timing part after this many seconds in all")
    seed: int = option(0, help="seed of the random weights, prompts and contexts")

    def __post_init__(self) -> None:
        for name in SMALL:
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")


# The defaults --small changes (a value given explicitly, other than the full default, is kept).
SMALL = {f.name: f.metadata["small"] for f in fields(DeviceCheckOptions) if "small" in f.metadata}


class OracleProposer(Proposer):
    """Drafts the target's own greedy continuation ``ref`` [1, L] (from ``target.generate``), ``depth``
    levels deep. Level d holds two nodes, rank 0 a wrong token ((right + 1) mod V) and rank 1 the right
    one, so the accepted path skips a node at every level and `infer.cache.compact` really moves KV.
    The position is tracked on the host from the accepted lengths, so proposing never synchronises."""

    def __init__(self, ref: Tensor, depth: int, vocab: int) -> None:
        self.ref, self.depth, self.vocab = ref[0], depth, vocab
        self.pos = 0  # sequence index of the current root

    def start(self, prompt_ids: Tensor, out: TargetOutput) -> None:
        self.pos = prompt_ids.shape[1]

    def propose(self, root: Tensor, max_depth: int) -> DraftTree:
        d = min(self.depth, max_depth, self.ref.shape[0] - self.pos - 1)
        if d < 1:
            return root_only(root)
        paths = [p for k in range(1, d + 1) for p in ([1] * (k - 1) + [0], [1] * k)]
        right = self.ref[self.pos + 1 : self.pos + 1 + d]  # [d]
        topk = torch.stack([(right + 1) % self.vocab, right], dim=1)  # [d, 2]: rank 0 wrong, rank 1 right
        return tree_buffers(paths, root.device).draft(root, topk)

    def advance(self, tokens: Tensor, hidden: Tensor, aux: tuple[Tensor, ...]) -> None:
        self.pos += tokens.shape[0]


def _prompts(o: DeviceCheckOptions, vocab: int, device) -> list[Tensor]:
    g = torch.Generator().manual_seed(o.seed)
    lengths = [7 + 29 * i % 97 for i in range(o.prompts)]
    return [torch.randint(3, vocab, (1, n), generator=g).to(device) for n in lengths]


def identity(o: DeviceCheckOptions, target, device) -> list[dict]:
    """Greedy `speculative_generate` with the oracle vs ``target.generate`` per prompt (fp32 target)."""
    vocab = target.config.vocab_size
    rows = []
    for i, ids in enumerate(_prompts(o, vocab, device)):
        ref = target.generate(
            ids, do_sample=False, max_new_tokens=o.new_tokens, eos_token_id=None, pad_token_id=0
        )
        out = speculative_generate(
            target,
            OracleProposer(ref, o.depth, vocab),
            ids,
            max_new_tokens=o.new_tokens,
            do_sample=False,
            eos_token_id=[],
        )
        pos = first_difference(ref, out.sequences)
        row = {"prompt": i, "prompt_tokens": ids.shape[1], "identical": pos is None}
        row["tau"] = round(out.stats.mean_accepted_length, 3)
        if pos is not None:
            T, seq = ids.shape[1], out.sequences
            a = int(ref[0, pos]) if pos < ref.shape[1] else None
            b = int(seq[0, pos]) if pos < seq.shape[1] else None
            row["first_difference"] = pos - T
            ok = a is not None and b is not None and pos >= T
            row["logit_margin"] = tie_margin(target, ref, T, pos - T, a, b) if ok else None
        rows.append(row)
        print(f"identity prompt {i} ({ids.shape[1]} tokens): {row}", flush=True)
    return rows


def host_syncs(o: DeviceCheckOptions, target, device) -> dict:
    """Host synchronisations per decoding step of one greedy generation with the oracle (CUDA only)."""
    if device.type != "cuda":
        return {"measured": False, "why": f"sync debug mode exists on CUDA only (device: {device})"}
    ids = _prompts(o, target.config.vocab_size, device)[0]
    ref = target.generate(
        ids, do_sample=False, max_new_tokens=o.new_tokens, eos_token_id=None, pad_token_id=0
    )
    proposer = OracleProposer(ref, o.depth, target.config.vocab_size)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            out = speculative_generate(
                target, proposer, ids, max_new_tokens=o.new_tokens, do_sample=False, eos_token_id=[]
            )
        finally:
            torch.cuda.set_sync_debug_mode(0)
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    steps = len(out.stats.accepted_lengths)
    return {"measured": True, "syncs": syncs, "steps": steps, "per_step": round(syncs / max(steps, 1), 2)}


def _bfs_paths(n: int, width: int = 4) -> list[list[int]]:
    """The first ``n`` nodes of a ``width``-ary tree in breadth-first order (prefix-closed)."""
    paths: list[list[int]] = []
    frontier: list[list[int]] = [[]]
    while len(paths) < n:
        frontier = [p + [r] for p in frontier for r in range(width)]
        paths += frontier[: n - len(paths)]
    return paths


def _time(fn, reps: int, device) -> float:
    """Median milliseconds of ``fn()`` over ``reps`` calls after 2 warm-ups, device-synchronised."""
    times = []
    for r in range(reps + 2):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        if r >= 2:
            times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


@torch.inference_mode()
def verify_cost(o: DeviceCheckOptions, target, device, deadline: float) -> dict:
    """Per k: ms of a k-node verify (+ dropping the tree) for each path, and of a 1-token decode forward."""
    vocab = target.config.vocab_size
    g = torch.Generator().manual_seed(o.seed)
    ctx = torch.randint(3, vocab, (1, o.context), generator=g).to(device)
    keep_root = torch.zeros(1, dtype=torch.long, device=device)
    paths = {"tree_attention": {}, "float_mask": {"tree_attention": False}}
    rows, cut = [], None
    for k in range(1, o.max_k + 1):
        if time.perf_counter() > deadline:
            cut = k
            break
        tb = tree_buffers(_bfs_paths(k - 1), device) if k > 1 else None
        topk = torch.randint(3, vocab, (tb.max_depth, tb.topk), generator=g).to(device) if tb else None
        root = ctx[0, -1]
        tree = tb.draft(root, topk) if tb else root_only(root)
        row = {"k": k}
        for name, kw in paths.items():
            runner = TreeRunner(target, max_len=o.context + o.reps + 4, **kw)
            runner.prefill(ctx)

            def step(runner=runner, tree=tree) -> None:
                runner.verify(tree)
                runner.accept(keep_root)  # keep the root only: the context grows by one per call

            row[f"{name}_ms"] = round(_time(step, o.reps, device), 3)
        cache = new_cache()
        run_target_lean(target, ctx, cache=cache, use_cache=True)

        def decode1(cache=cache, one=ctx[:, -1:]) -> None:  # what target.generate runs per token
            run_target_lean(target, one, cache=cache, use_cache=True)

        row["decode1_ms"] = round(_time(decode1, o.reps, device), 3)
        for name in paths:
            row[f"{name}_vs_decode1"] = round(row[f"{name}_ms"] / row["decode1_ms"], 3)
        rows.append(row)
        print(f"verify k={k}: {row}", flush=True)
    return {"context": o.context, "reps": o.reps, "rows": rows, "cut_at_k": cut}


def check(o: DeviceCheckOptions) -> dict:
    """Run all three parts; returns the report (``ok``: identity held and drafts were accepted deep)."""
    if o.small:
        full = DeviceCheckOptions()
        o = replace(o, **{k: v for k, v in SMALL.items() if getattr(o, k) == getattr(full, k)})
    t0 = time.perf_counter()
    device = torch.device(o.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "options": asdict(o),
        "config": LLAMA_SMALL if o.small else LLAMA_1B,
    }
    fp32 = random_llama(LLAMA_SMALL if o.small else LLAMA_1B, device=device, seed=o.seed)
    report["params"] = sum(p.numel() for p in fp32.parameters())
    report["identity"] = identity(o, fp32, device)
    report["syncs"] = host_syncs(o, fp32, device)
    timing_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    timed = fp32.to(timing_dtype)  # in place: the fp32 checks are done
    report["verify_cost"] = {"dtype": str(timing_dtype), **verify_cost(o, timed, device, t0 + o.budget_s)}
    bad = [r for r in report["identity"] if not r["identical"]]
    shallow = [r for r in report["identity"] if r["tau"] < 2.0]
    report["failures"] = {
        "mismatched_prompts": [r["prompt"] for r in bad],
        "shallow_prompts": [r["prompt"] for r in shallow],
    }
    report["ok"] = not bad and not shallow
    report["elapsed_s"] = round(time.perf_counter() - t0, 1)
    return report


def main(argv: list[str] | None = None) -> int:
    """The script: parse options, run `check`, write the JSON report, print a summary; 1 on any failure."""
    o = parse_cli(DeviceCheckOptions, argv, prog="scripts/gpu_check.py")
    os.makedirs(os.path.dirname(os.path.abspath(o.out)), exist_ok=True)  # fail now, not after the run
    report = check(o)
    atomic_text(o.out, json.dumps(report, indent=2) + "\n")
    vc = report["verify_cost"]
    print(
        f"device {report['device']}, {report['params'] / 1e6:.2f}M params, {report['elapsed_s']} s; report: {o.out}"
    )
    print(
        f"verify cost ({vc['dtype']}, context {vc['context']}): k, tree_attention / decode1, float_mask / decode1"
    )
    for r in vc["rows"]:
        print(f"  {r['k']:3d}  {r['tree_attention_vs_decode1']:.2f}  {r['float_mask_vs_decode1']:.2f}")
    if vc["cut_at_k"]:
        print(f"  timing stopped at k={vc['cut_at_k']}: the {o.budget_s:.0f} s budget was spent")
    print(f"host syncs: {report['syncs']}")
    print("identity:", "ok" if report["ok"] else f"FAILED {report['failures']}")
    return 0 if report["ok"] else 1
