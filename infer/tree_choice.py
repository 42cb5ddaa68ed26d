"""Offline tree tuning maths: fitting a draft tree's size and shape to measured heads and hardware.

Model (Medusa's sparse trees, Cai et al. 2024): a draft node at depth d with rank r along its path is
correct with probability acc[d-1, r], independently across depths, so a root-to-node rank path
p = (r_1..r_d) is accepted with probability P(p) = Π_i acc[i-1, r_i] and a tree's expected accepted
length (bonus token included) is E[τ] = 1 + Σ_{p in tree} P(p) (`expected_accept_length`). One step costs
t_verify(N+1) + t_draft, so the expected throughput of an N-node tree is E[τ(N)] / (t_verify(N+1) +
t_draft). The greedy trees of `infer.tree.greedy_nodes` are the optimal N-node trees under this model.
The measured side: `measure_tau` (greedy τ of `infer.generate` configurations with their trees
fixed), `pick_by_measured_tau` (the candidate trees re-priced with it) and `compare` (tokens/s against
``target.generate``). `infer.tune_tree` measures the
inputs (accuracies, `infer.cost` latency profiles) and saves the choice.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Sequence

import torch
from torch import Tensor

import infer
from infer.tree import greedy_nodes, validate_paths


def expected_accept_length(paths: Sequence[Sequence[int]], acc: Tensor) -> float:
    """Expected tokens per step, bonus included: 1 + Σ_nodes Π_{prefix} acc[depth-1, rank].

    acc: [D, K] probability that head d's rank-k token is the right one (ranks disjoint events).
    """
    return 1.0 + sum(float(torch.stack([acc[i, r] for i, r in enumerate(p)]).prod()) for p in paths)


def expected_accept_curve(
    acc: Tensor, max_nodes: int, *, max_depth: int | None = None, max_rank: int | None = None
) -> list[float]:
    """E[τ(N)] of the greedy N-node tree for N = 0..max_nodes (shorter if fewer paths exist).

    tau[0] = 1 (the bonus token alone); tau[N] = 1 + Σ_{i<N} P(node_i) with the nodes of `greedy_nodes`.
    """
    _, values = greedy_nodes(acc, max_nodes, max_depth=max_depth, max_rank=max_rank)
    tau = [1.0]
    for v in values:
        tau.append(tau[-1] + v)
    return tau


def empirical_accept_length(paths: Sequence[Sequence[int]], ranks: Tensor) -> float:
    """Mean accepted length of a static tree on measured rank vectors (no independence assumption).

    ranks: [M, D] long, ranks[m, d] = rank of the correct token among depth-(d+1)'s candidates at
    held-out position m (anything >= the tree's ranks, e.g. K, means "not among the candidates").
    Greedy verification accepts the deepest node whose path equals ranks[m, :depth]; in a prefix-closed
    tree the nodes that are prefixes of ranks[m] are exactly that node's ancestors and itself, so
    τ_m = 1 + #{p in tree : p == ranks[m, :len(p)]}.
    """
    valid = validate_paths(paths)
    if ranks.dim() != 2:
        raise ValueError(f"ranks must be [positions, depth], got shape {tuple(ranks.shape)}")
    if not valid or ranks.shape[0] == 0:
        return 1.0
    if max(len(p) for p in valid) > ranks.shape[1]:
        raise ValueError(f"the tree is deeper than the {ranks.shape[1]} measured depths")
    hits = torch.zeros(ranks.shape[0], dtype=torch.long)
    for p in valid:
        hits += (ranks[:, : len(p)] == torch.tensor(p)).all(1).long()
    return 1.0 + float(hits.double().mean())


def choose_num_nodes(
    tau: Sequence[float], verify_s: Sequence[float], draft_s: float, min_nodes: int = 1
) -> tuple[int, list[float]]:
    """The tree size N that maximises expected tokens/s, and the expected rate of every N.

    tau: E[τ(N)] for N = 0..; verify_s: [k-1] = seconds to verify k tokens (root + N nodes: k = N+1);
    draft_s: seconds of drafting per step (for Medusa it does not depend on N).
    rate(N) = tau[N] / (verify_s[N] + draft_s), for N up to min(len(tau), len(verify_s)) - 1; the
    result is argmax over N >= min_nodes (ties: the smaller tree).
    """
    n_max = min(len(tau), len(verify_s)) - 1
    if n_max < min_nodes:
        raise ValueError(f"need E[τ] and verify costs up to N = {min_nodes} nodes, got up to {n_max}")
    if draft_s < 0 or any(t <= 0 for t in verify_s[: n_max + 1]):
        raise ValueError("latencies must be positive")
    rates = [tau[n] / (verify_s[n] + draft_s) for n in range(n_max + 1)]
    best = max(range(min_nodes, n_max + 1), key=lambda n: (rates[n], -n))
    return best, rates


def choose_eagle_budget(
    acc: Tensor, verify_s: Sequence[float], draft_s: dict[int, float], draft_top_k: int
) -> dict:
    """EAGLE-2's ``total_tokens`` (and ``depth``) that maximise expected tokens/s.

    acc: [D, K] per-depth rank accuracies of the draft unrolled on its own features (as it drafts);
    verify_s: [k-1] = seconds to verify k tokens; draft_s: {depth: seconds of one `propose` with that
    depth} (EAGLE-2 runs one draft forward per depth level, whatever the tree size).

    E[τ] of a dynamic tree of T tokens is estimated by the best static tree of N = T-1 nodes of depth
    <= depth and ranks < draft_top_k on ``acc`` (`expected_accept_curve`). Assumptions: a calibrated
    draft ranks its candidates like ``acc`` does on average (EAGLE-2 reranks per context, so it is
    usually better than this static estimate, which makes the estimate conservative); EAGLE-2 only
    expands draft_top_k nodes per depth, which the static tree ignores (it matters only for trees wider
    than draft_top_k at some depth). Returns {"total_tokens", "depth", "draft_top_k",
    "expected_accept_length", "expected_tokens_per_s", "curves": {depth: [rate(T) for T = 1..]}}.
    """
    best: dict | None = None
    curves: dict[int, list[float]] = {}
    for depth, t_draft in sorted(draft_s.items()):
        tau = expected_accept_curve(acc, len(verify_s) - 1, max_depth=depth, max_rank=draft_top_k)
        n, rates = choose_num_nodes(tau, verify_s, t_draft)
        curves[depth] = rates
        if best is None or rates[n] > best["expected_tokens_per_s"]:
            best = {
                "total_tokens": n + 1,
                "depth": depth,
                "draft_top_k": draft_top_k,
                "expected_accept_length": tau[n],
                "expected_tokens_per_s": rates[n],
            }
    if best is None:
        raise ValueError("draft_s needs at least one depth")
    return best | {"curves": curves}


def monotone(values: list[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in least squares (pool-adjacent-violators).

    Verifying more tokens never costs less; on a shared machine single timings still jump around, and an
    outlier at one k would otherwise decide the tree size.
    """
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    return [s / c for s, c in blocks for _ in range(int(c))]


def profile_grid(max_k: int) -> list[int]:
    """The k timed by `infer.cost.measure_profile`: every k up to 8, every 4th up to 32, every 8th
    beyond, and max_k. Fewer points with more repeats each give a steadier fastest-of-n on a shared
    machine than every k with few repeats; the costs in between are interpolated (they change slowly)."""
    ks = [k for k in range(1, max_k + 1) if k <= 8 or (k <= 32 and k % 4 == 0) or k % 8 == 0]
    return sorted({*ks, max_k})


def interpolate(ks: list[int], values: list[float], max_k: int) -> list[float]:
    """Piecewise-linear values at k = 1..max_k through the points (ks[i], values[i]); ks sorted, ks[0] = 1."""
    out = []
    for k in range(1, max_k + 1):
        j = next(i for i, x in enumerate(ks) if x >= k)
        if ks[j] == k:
            out.append(values[j])
        else:
            k0, k1, v0, v1 = ks[j - 1], ks[j], values[j - 1], values[j]
            out.append(v0 + (v1 - v0) * (k - k0) / (k1 - k0))
    return out


def pad_ranks(acc: Tensor, paths) -> Tensor:
    """acc with zero columns for ranks a tree uses beyond the measured ones."""
    need = max((max(p) for p in paths), default=0) + 1
    return acc if acc.shape[1] >= need else torch.nn.functional.pad(acc, (0, need - acc.shape[1]))


def measure_tau(model, prompts: list[Tensor], configs: dict, max_new_tokens: int) -> dict:
    """Greedy mean accepted length (bonus included) of each config ({name: generate kwargs}) with its tree
    fixed (``adaptive=False``), pooled over the prompts' steps. Greedy τ is deterministic, so one run
    per prompt measures it exactly."""
    taus = {}
    for name, kw in configs.items():
        lengths = []
        for ids in prompts:
            out = infer.generate(  # the heads' tree alone: what the tree model predicts
                model, ids, max_new_tokens=max_new_tokens, do_sample=False, adaptive=False, lookup=0, **kw
            )
            lengths += out.stats.accepted_lengths
        taus[name] = sum(lengths) / max(len(lengths), 1)
    return taus


def compare(model, prompts: list[Tensor], configs: dict, max_new_tokens: int, warmup: int = 1) -> dict:
    """Measured tokens/s and τ per config ({name: generate kwargs}; None = ``target.generate``), run
    interleaved per prompt in a shuffled order; the greedy outputs must agree with the target's."""
    rng = random.Random(0)
    res = {k: {"tokens_per_s": [], "tau": []} for k in configs}
    mismatches = {k: 0 for k in configs if configs[k] is not None}
    with torch.inference_mode():
        for i, ids in enumerate(prompts):
            names = list(configs)
            rng.shuffle(names)
            outs = {}
            for name in names:
                kw = configs[name]
                t0 = time.perf_counter()
                if kw is None:
                    seq = model.target.generate(
                        ids,
                        attention_mask=torch.ones_like(ids),
                        max_new_tokens=max_new_tokens,
                        do_sample=False,
                    )
                    dt, tau = time.perf_counter() - t0, 1.0
                else:
                    o = infer.generate(model, ids, max_new_tokens=max_new_tokens, do_sample=False, **kw)
                    seq, dt, tau = o.sequences, time.perf_counter() - t0, o.stats.mean_accepted_length
                outs[name] = seq[0, ids.shape[1] :].tolist()
                if i >= warmup:
                    res[name]["tokens_per_s"].append(len(outs[name]) / dt)
                    res[name]["tau"].append(tau)
            ref = outs.get("target.generate")
            for k in mismatches:
                if ref is not None and outs[k] != ref:
                    mismatches[k] += 1
    summary = {}
    for k, v in res.items():
        summary[k] = {
            "median_tokens_per_s": statistics.median(v["tokens_per_s"]),
            "mean_tau": statistics.mean(v["tau"]),
            "prompts": len(v["tau"]),
        }
        if k in mismatches:
            summary[k]["greedy_mismatches_vs_target"] = mismatches[k]
    return summary


def measure_src(prompts: str | None, data: str) -> str:
    """Where ``--measure-tau`` prompts come from: held-out rows of the data the accuracies came from, past
    the ones scored (the ``--compare`` prompts stay unseen by the tuning)."""
    return data if data.endswith(".jsonl") and os.path.isfile(data) else prompts_path(prompts, data)


def prompts_path(prompts: str | None, data: str) -> str:
    """``prompts`` (``--prompts``), else the ``prompts.jsonl`` beside the data."""
    path = prompts or os.path.join(os.path.dirname(data), "prompts.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"prompts file {path!r} not found (pass --prompts)")
    return path


def pick_by_measured_tau(
    model,
    rec: dict,
    prompts: list[Tensor],
    cands: dict[str, dict],
    step_cost: dict[str, float],
    info: dict[str, dict],
    max_new_tokens: int,
) -> str:
    """Measure the greedy τ of each candidate ({name: generate kwargs}) on ``prompts``, price it as
    τ / ``step_cost[name]`` (seconds per step), and return the name of the fastest. The tuning record
    ``rec`` gets the winner's and the default's (a candidate named "default") measured τ and rate, and
    every candidate under ``"refined"`` (with its ``info``)."""
    taus = measure_tau(model, prompts, cands, max_new_tokens)
    scored = {
        name: {
            **info[name],
            "measured_accept_length": taus[name],
            "expected_tokens_per_s": taus[name] / step_cost[name],
        }
        for name in cands
    }
    best = max(scored, key=lambda k: scored[k]["expected_tokens_per_s"])
    rec.update(
        measured_accept_length=scored[best]["measured_accept_length"],
        expected_tokens_per_s=scored[best]["expected_tokens_per_s"],
    )
    if "default" in scored:
        rec.update(
            default_measured_accept_length=scored["default"]["measured_accept_length"],
            default_expected_tokens_per_s=scored["default"]["expected_tokens_per_s"],
        )
    rec["refined"] = {"prompts": len(prompts), "max_new_tokens": max_new_tokens, "candidates": scored}
    return best
