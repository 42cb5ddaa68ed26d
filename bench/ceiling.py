"""How close a draft's trees come to the best tree of their size: the expected τ of each head's tree on
fixed contexts, next to the largest expected τ any draft could reach with a tree of that size and depth.

Under exact verification of deterministic drafts (`infer.verify.accept_exact`: multi-draft recursive
rejection sampling, SpecInfer / EAGLE), child x_j of an accepted node v is accepted with probability
p_v(x_j) exactly: it is tried with the residual r_j(x_j) = p_v(x_j) / (1 - Σ_{i<j} p_v(x_i)) after
all earlier siblings were rejected, which happens with probability 1 - Σ_{i<j} p_v(x_i). So node i of
a tree is accepted with the product of the target's probabilities along its path, and

    E[drafts accepted | tree, context] = Σ_{i ≠ root} Π_{j ∈ path(i), j ≠ root} p_{parent(j)}(x_j)

(`expected_accepted`), a function of one verify forward with no sampling noise. Greedy verification
accepts the longest path of argmax tokens, deterministically.

The best tree: a node's path probability never exceeds its parent's, so among all trees of at most N
drafts and depth <= D the sum above is largest for the N nodes of highest path probability (they form
a tree: each one's parent ranks above it). `best_tree_value` finds them by best-first search, one
target forward per expanded node; it bounds the expected τ of *every* draft at that tree size, a
perfect draft model included. With greedy verification the bound is D + 1 (the argmax chain).

`measure_contexts` runs both on the same contexts: positions of the target's own continuation of each
prompt (sampled at the benchmark temperature, or greedy), so two heads are compared on identical
prefixes (a paired comparison without the sampling noise of whole generations).
"""

from __future__ import annotations

import copy
import heapq
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from bench.stats import BOOTSTRAP_REPS, _paired_bootstrap
from heads.config import option, parse_cli, repeatable
from infer.draft import Proposer
from infer.runner import TreeRunner
from infer.tree import DraftTree
from infer.verify import accept_greedy


def path_probability(probs: Tensor, tree: DraftTree) -> Tensor:
    """probs [N+1, V] (the target's warped distribution at every node), tree -> [N+1]: for each node,
    Π over its path (root excluded) of p_parent(j)(x_j); 1 for the root."""
    V = probs.shape[-1]
    q = probs.flatten().gather(0, tree.parents.clamp(min=0) * V + tree.tokens).float()  # p_parent(i)(x_i)
    q[0] = 1.0
    return torch.where(tree.ancestors, q[None, :], torch.ones_like(q)[None, :]).prod(-1)


def expected_accepted(probs: Tensor, tree: DraftTree) -> Tensor:
    """[] float: E[drafts accepted] under `infer.verify.accept_exact` for this tree (the module
    docstring's sum); τ = 1 + this (the bonus token)."""
    return path_probability(probs, tree)[1:].sum()


@torch.inference_mode()
def best_tree_value(
    target: nn.Module, prefix: Tensor, root: int, warp, drafts: int, depth: int
) -> list[float]:
    """[depth] floats: E[drafts accepted at depth d] (d = 1..depth) of the best tree, whose sum is the
    largest E[drafts accepted] of any tree of at most ``drafts`` nodes and depth <= ``depth`` below
    ``root``, for the target after ``prefix`` [1, T]: the sum of the ``drafts`` highest path
    probabilities, found best-first (``warp``: the sampling warpers, as `infer.arguments` builds them).

    One target forward per expanded node on a cache of prefix + root (cropped back after each), so at
    most ``drafts`` forwards of <= ``depth`` tokens. A measurement tool, not a decode path."""
    from transformers import DynamicCache

    cache = DynamicCache()
    ids = torch.cat([prefix, prefix.new_tensor([[root]])], 1)
    logits = target(input_ids=ids, past_key_values=cache, use_cache=True).logits[0, -1]
    base = ids.shape[1]

    def children(logits: Tensor, prob: float, path: tuple[int, ...], k: int) -> list:
        p = torch.softmax(warp(None, logits.float()[None])[0], -1)
        top = p.topk(min(k, p.shape[-1]))
        return [
            (-prob * v, path + (t,))
            for v, t in zip(top.values.tolist(), top.indices.tolist(), strict=True)
            if v > 0
        ]

    heap = children(logits, 1.0, (), drafts)
    heapq.heapify(heap)
    by_depth, taken = [0.0] * depth, 0
    while heap and taken < drafts:
        neg, path = heapq.heappop(heap)
        by_depth[len(path) - 1] -= neg
        taken += 1
        if len(path) < depth and taken < drafts:
            out = target(input_ids=prefix.new_tensor([path]), past_key_values=cache, use_cache=True,
                         position_ids=torch.arange(base, base + len(path), device=prefix.device)[None])  # fmt: skip
            cache.crop(-len(path))  # back to prefix + root
            for item in children(out.logits[0, -1], -neg, path, drafts - taken):
                heapq.heappush(heap, item)
    return by_depth


@torch.inference_mode()
def head_tree_value(
    target: nn.Module, proposer: Proposer, prefix: Tensor, root: int, warp, depth: int
) -> list[float]:
    """[depth] floats: the drafts accepted at depth d = 1..depth of ``proposer``'s tree after ``prefix``
    [1, T] with ``root`` as the step's root, drafted as `infer.generate` would draft it there: their
    expectation under exact sampling (``warp`` given; the sum of path probabilities at that depth), or
    greedy's 0/1 (``warp`` None). The sum is the step's accepted drafts."""
    runner = TreeRunner(target, proposer.aux_layers, max_len=prefix.shape[1] + depth + 8)
    proposer.plan(prefix.shape[1] + depth + 8)
    out = runner.prefill(prefix)
    proposer.start(prefix, out)
    tree = proposer.propose(prefix.new_tensor(root).view(()), depth)
    logits = runner.verify(tree).logits[0]  # [N+1, V]
    if warp is None:
        n = int(accept_greedy(logits, tree).length) - 1
        return [1.0] * n + [0.0] * (depth - n)
    pp = path_probability(torch.softmax(warp(None, logits.float()), -1), tree)
    by_depth = torch.zeros(depth + 1, dtype=pp.dtype).index_add_(0, tree.depth.cpu(), pp.cpu())
    return by_depth[1:].tolist()


def sampling_warp(target: nn.Module, gc):
    """The warpers `infer.generate` (and ``target.generate``) sample with under ``gc``: the config resolved
    as `infer.arguments` resolves it, so transformers' global defaults (top-k 50) are included."""
    from infer.arguments import resolve_generation_config, sampling_warpers

    return sampling_warpers(resolve_generation_config(target, gc, {}))


def _continuation(target: nn.Module, ids: Tensor, gc, seed: int) -> Tensor:
    """The target's own continuation [n] of ``ids`` [1, T] under ``gc``, to the full length: EOS cleared
    (transformers fills a None ``eos_token_id`` from the model's generation config, so both)."""
    saved = target.generation_config.eos_token_id
    target.generation_config.eos_token_id = None
    try:
        torch.manual_seed(seed)
        out = target.generate(ids, generation_config=copy.copy(gc), attention_mask=torch.ones_like(ids),
                              eos_token_id=None)  # fmt: skip
    finally:
        target.generation_config.eos_token_id = saved
    return out[0, ids.shape[1] :]


def contexts(continuation: Tensor, stride: int, depth: int) -> list[int]:
    """Positions t of a continuation [n] to measure at: every ``stride``-th, with ``depth`` tokens left
    after the root (so no tree is cut short by the end)."""
    return list(range(0, continuation.shape[0] - depth, stride))


@torch.inference_mode()
def measure_contexts(target: nn.Module, proposers: dict[str, Proposer], prompts: list[Tensor], gc, warp,
                     *, stride: int, drafts: int, depth: int, seed: int = 0, ceiling: bool = True,
                     progress=None) -> dict:  # fmt: skip
    """For each prompt [1, T]: the target's continuation under ``gc`` (seeded per prompt), then at each
    of its `contexts` the accepted drafts of every proposer's tree (`head_tree_value`) and, sampling
    (``warp`` not None) with ``ceiling``, the best tree's (`best_tree_value`).

    Returns {"values": {label: [[accepted drafts per context] per prompt]}, "depths": {label: the same
    split by depth, [[[per depth] per context] per prompt]}, "contexts": [count per prompt]}, the best
    tree under the label "best tree"."""
    sampling = warp is not None
    for prop in proposers.values():
        prop.decoding((gc.temperature or 1.0) if sampling else None)
    values: dict[str, list[list[float]]] = {label: [] for label in proposers}
    if sampling and ceiling:
        values["best tree"] = []
    depths: dict[str, list[list[list[float]]]] = {label: [] for label in values}
    counts = []
    for i, ids in enumerate(prompts):
        cont = _continuation(target, ids, gc, seed * 100_003 + i)
        at = contexts(cont, stride, depth)
        counts.append(len(at))
        for label in values:
            values[label].append([])
            depths[label].append([])
        for t in at:
            prefix = torch.cat([ids, cont[None, :t]], 1)
            root = int(cont[t])
            for label, prop in proposers.items():
                d = head_tree_value(target, prop, prefix, root, warp, depth)
                values[label][-1].append(sum(d))
                depths[label][-1].append(d)
            if "best tree" in values:
                d = best_tree_value(target, prefix, root, warp, drafts, depth)
                values["best tree"][-1].append(sum(d))
                depths["best tree"][-1].append(d)
            if progress is not None:
                progress.update(1)
    return {"values": values, "depths": depths, "contexts": counts}


def _tree_size(proposer: Proposer) -> tuple[int, int]:
    """(drafts, depth) of a proposer's trees: an EAGLE-2 budget, or a static tree's paths."""
    total = getattr(proposer, "total_tokens", None)
    return (total - 1 if total else len(proposer.tree)), proposer.depth


@dataclass
class CeilingOptions:
    """Expected τ of each head's trees on fixed contexts, against the best tree of the same size
    (`bench.ceiling`)."""

    target: str = option("demo", help="'demo' / 'demo-tiny', a dir or Hub id")
    heads: list[str] = repeatable(help="[LABEL=]DIR: heads checkpoint, repeatable")
    prompts: list[str] = repeatable(
        help="[NAME=]JSONL: prompt set, repeatable (default for the demo: its code and chat sets)"
    )
    limit: int = option(16, help="prompts per set (the first N rows)")
    max_new_tokens: int = option(128, help="length of the target's continuation")
    stride: int = option(16, help="measure at every stride-th position of the continuation")
    modes: str = option("greedy,sample", help="comma list of greedy, sample (T=0.7)")
    depth: int | None = option(None, help="EAGLE-2 max draft depth (default: the heads')")
    draft_top_k: int | None = option(None, help="EAGLE-2 children per node (default: the heads')")
    total_tokens: int | None = option(None, help="EAGLE-2 tree size, root incl. (default: the heads')")
    ceiling: bool = option(True, help="also find the best tree (sampling; one forward per node)")
    dtype: str = option("bf16", help="target dtype")
    device: str | None = option(None, help="cuda, cpu, ... (default: cuda if available)")
    seed: int = option(0, help="seed of the continuations (per prompt)")
    threads: int | None = option(None, help="torch CPU threads (default: all cores)")
    vs: list[str] = repeatable(help="A:B paired difference of two labels, repeatable")
    out: str = option("out/ceiling", help="output directory (results.json, results.md)")

    def __post_init__(self) -> None:
        modes = [m for m in self.modes.split(",") if m]
        if not modes or any(m not in ("greedy", "sample") for m in modes):
            raise ValueError(f"--modes must list greedy and/or sample, got {self.modes!r}")
        if not self.heads:
            raise ValueError("--heads: give at least one heads checkpoint")
        if min(self.limit, self.max_new_tokens, self.stride) < 1:
            raise ValueError("--limit, --max-new-tokens and --stride must be >= 1")


def summarise(result: dict, pairs: list[tuple[str, str]], reps: int = BOOTSTRAP_REPS) -> dict:
    """τ = 1 + mean accepted drafts per context, with a 95% bootstrap interval over prompts (each
    prompt's contexts resampled together), the mean accepted at each depth, each head's share of the
    best tree's τ, and paired differences τ A - τ B (same contexts)."""
    counts = [float(c) for c in result["contexts"]]
    sums = {k: [sum(v) for v in vs] for k, vs in result["values"].items()}
    out = {"contexts": int(sum(counts)), "prompts": len(counts), "tau": {}, "vs": {}}
    for label, s in sums.items():
        ci = _paired_bootstrap([s, counts], lambda a, n: 1 + a / n, reps, 0, 0.95)
        out["tau"][label] = {"mean": 1 + sum(s) / sum(counts), "ci95": ci}
        rows = [d for per_prompt in result.get("depths", {}).get(label, []) for d in per_prompt]
        if rows:  # E[accepted at depth d] per context: where a tree gains or loses against the best one
            out["tau"][label]["by_depth"] = [sum(col) / len(rows) for col in zip(*rows, strict=True)]
    best = sums.get("best tree")
    for label, s in sums.items():
        if best is not None and label != "best tree":
            share = _paired_bootstrap([s, best, counts], lambda a, b, n: (n + a) / (n + b), reps, 0, 0.95)
            out["tau"][label]["share_of_best"] = (sum(counts) + sum(s)) / (sum(counts) + sum(best))
            out["tau"][label]["share_ci95"] = share
    for a, b in pairs:
        d = _paired_bootstrap([sums[a], sums[b], counts], lambda x, y, n: (x - y) / n, reps, 0, 0.95)
        wins = sum(1 for x, y in zip(sums[a], sums[b], strict=True) if x > y)
        out["vs"][f"{a}:{b}"] = {"diff": (sum(sums[a]) - sum(sums[b])) / sum(counts), "ci95": d,
                                 "prompts_ahead": wins}  # fmt: skip
    return out


def _ci(ci: list[float] | None) -> str:
    return f" [{ci[0]:+.3f} to {ci[1]:+.3f}]" if ci else ""


def markdown(report: dict) -> str:
    lines = [f"# Expected τ on fixed contexts against the best tree\n\n`{report['command']}`\n",
             f"Machine: {report['machine']}. {report['tree']}. τ = 1 + E[drafts accepted] per context "
             "(exact sampling: the sum of path probabilities, `bench.ceiling`; greedy: the "
             "accepted length); intervals: 95% bootstrap over prompts.\n"]  # fmt: skip
    for key, s in report["results"].items():
        lines.append(f"\n## {key} ({s['prompts']} prompts, {s['contexts']} contexts)\n")
        lines.append(
            "| draft | τ | 95% interval | share of the best tree's τ | accepted at depth 1, 2, ... |"
        )
        lines.append("|---|---|---|---|---|")
        for label, t in s["tau"].items():
            ci, share, sci = t["ci95"], t.get("share_of_best"), t.get("share_ci95")
            interval = f"{ci[0]:.3f}-{ci[1]:.3f}" if ci else "-"
            share_s = (
                "-" if share is None else f"{share:.3f}" + (f" [{sci[0]:.3f}-{sci[1]:.3f}]" if sci else "")
            )
            by = " / ".join(f"{x:.3f}" for x in t["by_depth"]) if t.get("by_depth") else "-"
            lines.append(f"| {label} | {t['mean']:.3f} | {interval} | {share_s} | {by} |")
        for pair, v in s["vs"].items():
            lines.append(f"\nτ {pair.replace(':', ' - ')}: {v['diff']:+.3f}{_ci(v['ci95'])}, ahead on "
                         f"{v['prompts_ahead']}/{s['prompts']} prompts")  # fmt: skip
    return "\n".join(lines) + "\n"


def run(argv: list[str]) -> dict:
    """The command line of ``scripts/tree_ceiling.py``: writes results.json and results.md into ``--out``."""
    import json
    import os

    from tqdm.auto import tqdm
    from transformers import AutoTokenizer

    import demo
    import infer
    from bench.machine import machine_info
    from bench.methods import SAMPLE_TEMPERATURE, generation_config
    from bench.prompt_sets import prompt_files
    from bench.report import write_text
    from bench.run import parse_pairs
    from heads import load_target
    from infer.prompts import read_prompts, render_prompt

    o = parse_cli(CeilingOptions, argv, prog="scripts/tree_ceiling.py")
    torch.set_num_threads(o.threads or os.cpu_count() or 1)
    heads = [
        (s.partition("=")[0], s.partition("=")[2]) if "=" in s else (os.path.basename(s), s) for s in o.heads
    ]
    pairs = parse_pairs(o.vs, [label for label, _ in heads])
    path, size = demo.resolve(o.target), demo.NAMES.get(o.target)
    device = torch.device(o.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    target = load_target(path, dtype=o.dtype, device=device)
    tok = AutoTokenizer.from_pretrained(path)
    os.makedirs(o.out, exist_ok=True)
    sets = prompt_files(o.prompts, size, o.out)
    prompts = {n: [render_prompt(r, tok, f"{p} row {i + 1}").to(device) for i, r in enumerate(read_prompts(p)[: o.limit])]
               for n, p in sets.items()}  # fmt: skip
    shape = {k: v for k, v in (("depth", o.depth), ("draft_top_k", o.draft_top_k),
                                ("total_tokens", o.total_tokens)) if v is not None}  # fmt: skip
    proposers = {label: infer.load(target, heads=d).proposer(**shape) for label, d in heads}
    sizes = {label: _tree_size(p) for label, p in proposers.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"the best tree needs one tree size for all heads; (drafts, depth) are {sizes}")
    drafts, depth = next(iter(sizes.values()))
    modes = [m for m in o.modes.split(",") if m]
    n_ctx = sum(
        len(contexts(torch.empty(o.max_new_tokens), o.stride, depth)) * len(p) for p in prompts.values()
    )
    bar = tqdm(total=n_ctx * len(modes), desc="contexts", unit="ctx", dynamic_ncols=True)
    results, raw = {}, {}
    try:
        for mode in modes:
            gc = generation_config(target, tok, sampling=mode == "sample", max_new_tokens=o.max_new_tokens,
                                   stop_at_eos=False)  # fmt: skip
            warp = sampling_warp(target, gc) if mode == "sample" else None
            for name, ps in prompts.items():
                r = measure_contexts(target, proposers, ps, gc, warp, stride=o.stride, drafts=drafts, depth=depth,
                                     seed=o.seed, ceiling=o.ceiling, progress=bar)  # fmt: skip
                key = f"{name} {'greedy' if mode == 'greedy' else f'T={SAMPLE_TEMPERATURE}'}"
                raw[key] = r
                results[key] = summarise(r, pairs)
                if mode == "greedy":  # the best greedy tree holds the argmax chain: depth + 1 tokens a step
                    for t in results[key]["tau"].values():
                        t["share_of_best"] = t["mean"] / (depth + 1)
                        t["share_ci95"] = [c / (depth + 1) for c in t["ci95"]] if t["ci95"] else None
                    results[key]["tau"]["best tree"] = {"mean": depth + 1.0, "ci95": None}
    finally:
        bar.close()
    report = {"command": " ".join(["scripts/tree_ceiling.py", *argv]),
              "machine": machine_info(device)["summary"],
              "tree": f"trees of {drafts} drafts, depth <= {depth}" + (f" ({shape})" if shape else " (the heads' default)"),
              "options": vars(o), "results": results, "raw": raw}  # fmt: skip
    write_text(
        os.path.join(o.out, "results.json"), json.dumps(report, indent=1) + "\n"
    )  # atomic: no partial file
    write_text(os.path.join(o.out, "results.md"), markdown(report))
    return report
