"""Fit the draft tree to a head checkpoint and to this machine, and save it as ``<heads>/tree.json``.

    python scripts/tune_tree.py --heads out/demo-medusa                      # Medusa: a static tree
    python scripts/tune_tree.py --heads out/demo-eagle --compare 6           # EAGLE-2: total_tokens/depth

1. Accuracies: per-depth rank probabilities of the heads on held-out data (`scripts/eval_heads.py`, or
   ``--accuracies`` to reuse its JSON).
2. Latency profile: the target's cost of one verification step over k = 1..64 new tokens after a real
   prefix (the forward with the 4D tree mask, greedy acceptance and KV compaction, as `infer.generate`
   does them), timed at a grid of k (`profile_grid`) and interpolated in between, the fastest of
   ``--repeats`` interleaved repeats (medians are recorded too), made monotone in k; and the draft's
   cost of one ``propose``.
3. Choice (`infer.tree`): Medusa: the greedy tree of N nodes maximising E[τ(N)] / (t_step(N+1) + t_draft),
   N = 1..63. EAGLE-2: (total_tokens, depth) maximising the same with E[τ] from the best static tree
   of that size within the depth and draft_top_k (a conservative estimate of the dynamic tree).
   With ``--measure-tau P`` (default 4) the candidates (Medusa: greedy trees of several sizes and the
   default tree; EAGLE: the best budget per depth and the default) are re-priced with τ measured by
   `infer.generate` on P held-out prompts, and the best measured one is kept (`refine_medusa`,
   `refine_eagle`).
4. ``tree.json`` (written atomically) holds the choice plus a ``"tuning"`` record: the profile, the
   accuracies and the expected τ and tokens/s of the tuned and the default tree. `heads.load_heads`
   reads it, so `infer.load` + `infer.generate` use it by default (explicit arguments still win).

``--compare P`` then runs `infer.generate` with the default and the tuned tree (and ``target.generate``),
interleaved, on P held-out prompts, and prints measured τ and tokens/s. ``--dry-run`` writes nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import sys
import time

import torch
from torch import Tensor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import eval_heads  # noqa: E402  (scripts/eval_heads.py, a sibling)

EAGLE_DEFAULTS = {"depth": 6, "draft_top_k": 8, "total_tokens": 48}  # infer.eagle_draft.EagleProposer


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _times(fns: dict, repeats: int, warmup: int, device: torch.device, seed: int = 0) -> dict:
    """Wall times of each callable over ``repeats`` rounds (after ``warmup``), run interleaved in a fresh
    random order every round, so slow drifts of the machine hit every callable alike."""
    rng = random.Random(seed)
    keys = list(fns)
    times: dict = {k: [] for k in keys}
    for r in range(warmup + repeats):
        rng.shuffle(keys)
        for k in keys:
            _sync(device)
            t0 = time.perf_counter()
            fns[k]()
            _sync(device)
            if r >= warmup:
                times[k].append(time.perf_counter() - t0)
    return times


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


@torch.inference_mode()
def profile_grid(max_k: int) -> list[int]:
    """The k measured by `measure_profile`: every k up to 8, every 4th up to 32, every 8th beyond, and
    max_k. Fewer points with more repeats each give a steadier fastest-of-n on a shared machine than
    every k with few repeats; the costs in between are interpolated (they change slowly with k)."""
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


def measure_profile(
    target,
    prefix_ids: Tensor,
    max_k: int = 64,
    repeats: int = 5,
    warmup: int = 1,
    aux_layers=(),
    ks: list[int] | None = None,
) -> dict:
    """Seconds of one verification step over k = 1..max_k new tokens after ``prefix_ids`` [1, T].

    A step is what `infer.generate` does per tree: the target forward over the k nodes with the 4D tree
    mask and position ids, `accept_greedy`, the host read of the result and the KV compaction; the cache
    is then cut back to the prefix. The tree shapes are greedy trees on `default_accuracies` (the cost
    hardly depends on the shape). ``ks`` (default: every k) are the sizes timed; the others are
    `interpolate`d. Returns {"k": [1..max_k], "k_measured": ks, "step_s_median" and "step_s_min": the
    median and the fastest of the interleaved repeats at every k, "step_s": the `monotone` fit of the
    fastest (what the choice uses)}. On a shared machine the slowdowns are bursts of contention that only add time: on the
    demo target with 2 busy cores the medians of 7 repeats jumped by up to 30 ms between neighbouring k
    (56-107 ms), while the fastest runs rose smoothly from 48 to 73 ms over k = 1..64. The fastest run
    is the cost of the step itself.
    """
    from heads.graft import run_target
    from infer.cache import compact, new_cache
    from infer.tree import DraftTree, attention_mask, build_tree, default_accuracies, tree_buffers
    from infer.verify import accept_greedy

    device = next(target.parameters()).device
    prefix_ids = prefix_ids.to(device)
    cache = new_cache()
    run_target(target, prefix_ids, cache=cache, use_cache=True)
    past = prefix_ids.shape[1]
    text_cfg = target.config.get_text_config()
    acc = default_accuracies(6, 10)
    pool = prefix_ids[0].repeat(max_k // past + 1)

    def step(k: int):
        tb = tree_buffers(build_tree(acc, k - 1), device)
        tokens = pool[:k]
        mask = attention_mask(tb.ancestors, tb.depth, past, target.dtype, text_cfg)
        out = run_target(
            target,
            tokens[None],
            mask,
            aux_layers=aux_layers,
            position_ids=(past + tb.depth)[None],
            cache=cache,
            use_cache=True,
        )
        tree = DraftTree(tokens, tb.parents, tb.depth, tb.ancestors, tb.retrieve, tb.sib_before)
        a = accept_greedy(out.logits[0], tree)
        n = int(torch.cat([a.length.view(1), a.next_token.view(1)]).tolist()[0])
        compact(cache, past, a.path[:n])
        cache.crop(-n)  # back to the prefix (transformers 5: crop(-tokens_to_drop))

    ks = sorted(set(ks or range(1, max_k + 1)))
    if ks[0] != 1 or ks[-1] != max_k:
        raise ValueError(f"the profiled sizes must run from 1 to max_k = {max_k}, got {ks}")
    times = _times({k: (lambda k=k: step(k)) for k in ks}, repeats, warmup, device)
    fastest = interpolate(ks, [min(times[k]) for k in ks], max_k)
    return {
        "k": list(range(1, max_k + 1)),
        "k_measured": ks,
        "step_s": monotone(fastest),
        "step_s_min": fastest,
        "step_s_median": interpolate(ks, [statistics.median(times[k]) for k in ks], max_k),
        "prefix_len": past,
        "repeats": repeats,
    }


@torch.inference_mode()
def measure_draft(model, prefix_ids: Tensor, configs: dict, repeats: int = 5, warmup: int = 1) -> dict:
    """Seconds of one ``propose`` (fastest of ``repeats``, see `measure_profile`) for each proposer config
    {name: kwargs of SpecModel.proposer}, in the state right after prefilling ``prefix_ids`` [1, T]."""
    from heads.graft import run_target

    device = next(model.target.parameters()).device
    prefix_ids = prefix_ids.to(device)
    fns = {}
    for name, kwargs in configs.items():
        prop = model.proposer(**kwargs)
        out = run_target(model.target, prefix_ids, aux_layers=prop.aux_layers)
        prop.start(prefix_ids, out)
        root = out.logits[0, -1].argmax()
        fns[name] = lambda prop=prop, root=root: prop.propose(root, max_depth=64)
    return {k: min(v) for k, v in _times(fns, repeats, warmup, device).items()}


# ---------------------------------------------------------------------------------------------- choosing


def tune_medusa(
    rank_probs: Tensor, profile: dict, draft_s: float, num_heads: int, joint: Tensor | None
) -> dict:
    """tree.json content for Medusa heads: the greedy tree of the best size, and the tuning record."""
    from infer.tree import (
        choose_num_nodes,
        default_tree,
        empirical_accept_length,
        expected_accept_curve,
        expected_accept_length,
        greedy_nodes,
    )

    step_s = profile["step_s"]
    tau = expected_accept_curve(rank_probs, len(step_s) - 1, max_depth=num_heads)
    n, rates = choose_num_nodes(tau, step_s, draft_s)
    paths = [list(p) for p in greedy_nodes(rank_probs, n, max_depth=num_heads)[0]]
    default = default_tree(num_heads)
    acc = rank_probs.double()
    tau_default = expected_accept_length(default, _pad_ranks(acc, default))
    fits = len(default) < len(step_s)  # else the profile is too short to price the default tree
    rate_default = tau_default / (step_s[len(default)] + draft_s) if fits else None
    record = {
        "num_nodes": n,
        "expected_accept_length": tau[n],
        "expected_tokens_per_s": rates[n],
        "default_num_nodes": len(default),
        "default_expected_accept_length": tau_default,
        "default_expected_tokens_per_s": rate_default,
        "expected_accept_length_by_nodes": tau,
        "expected_tokens_per_s_by_nodes": rates,
    }
    if joint is not None and joint.shape[0]:
        record["measured_accept_length"] = empirical_accept_length(paths, joint)
        record["default_measured_accept_length"] = empirical_accept_length(default, joint)
    return {"paths": paths, "tuning": record}


def _pad_ranks(acc: Tensor, paths) -> Tensor:
    """acc with zero columns for ranks a tree uses beyond the measured ones."""
    need = max((max(p) for p in paths), default=0) + 1
    return acc if acc.shape[1] >= need else torch.nn.functional.pad(acc, (0, need - acc.shape[1]))


def tune_eagle(rank_probs: Tensor, profile: dict, draft_s: dict, draft_top_k: int) -> dict:
    """tree.json content for EAGLE heads: EAGLE-2's total_tokens and depth, and the tuning record."""
    from infer.tree import choose_eagle_budget, expected_accept_curve

    best = choose_eagle_budget(rank_probs, profile["step_s"], draft_s, draft_top_k)
    d = EAGLE_DEFAULTS
    tau_default = expected_accept_curve(
        rank_probs, d["total_tokens"] - 1, max_depth=d["depth"], max_rank=d["draft_top_k"]
    )[-1]
    record = {
        "expected_accept_length": best["expected_accept_length"],
        "expected_tokens_per_s": best["expected_tokens_per_s"],
        "default": d,
        "default_expected_accept_length": tau_default,
        "default_expected_tokens_per_s": (
            tau_default / (profile["step_s"][d["total_tokens"] - 1] + draft_s[d["depth"]])
            if d["total_tokens"] <= len(profile["step_s"]) and d["depth"] in draft_s
            else None
        ),
        "total_tokens_grid": list(range(2, len(profile["step_s"]) + 1)),
        "expected_tokens_per_s_by_depth": {str(k): v[1:] for k, v in best["curves"].items()},
    }
    tree = {k: best[k] for k in ("total_tokens", "depth", "draft_top_k")}
    return tree | {"tuning": record}


def measure_tau(model, prompts: list[Tensor], configs: dict, max_new_tokens: int) -> dict:
    """Greedy mean accepted length (bonus included) of each config ({name: generate kwargs}), pooled over
    the prompts' steps. Greedy τ is deterministic, so one run per prompt measures it exactly."""
    import infer

    taus = {}
    for name, kw in configs.items():
        lengths = []
        for ids in prompts:
            out = infer.generate(model, ids, max_new_tokens=max_new_tokens, do_sample=False, **kw)
            lengths += out.stats.accepted_lengths
        taus[name] = sum(lengths) / max(len(lengths), 1)
    return taus


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


def refine_eagle(
    model,
    tree: dict,
    prompts: list[Tensor],
    profile: dict,
    draft_s: dict,
    max_new_tokens: int,
    extra_total_tokens: tuple[int, ...] = (32, 48, 64),
):
    """Re-decide EAGLE-2's budget with measured τ. The candidates, for every depth, are the best
    ``total_tokens`` by the static estimate and ``extra_total_tokens``, plus the default; each is priced
    as measured τ / (t_step(T) + t_draft(depth)). The static estimate misses how much the per-context
    reranking gains (measured on the demo: τ 2.96 vs 3.36 at depth 6 for 35 vs 48 tokens, where the
    static estimate gains far less), so it proposes candidates and measured τ decides.
    Updates ``tree`` (the budget, and the tuning record's expected numbers) in place and returns it."""
    rec = tree["tuning"]
    grid, step_s = rec["total_tokens_grid"], profile["step_s"]
    cands = {}
    for d, rates in rec["expected_tokens_per_s_by_depth"].items():
        i = max(range(len(rates)), key=rates.__getitem__)
        for total in sorted({grid[i], *(t for t in extra_total_tokens if 2 <= t <= len(step_s))}):
            cands[f"depth={d},total_tokens={total}"] = {
                "depth": int(d),
                "draft_top_k": tree["draft_top_k"],
                "total_tokens": total,
            }
    default = dict(EAGLE_DEFAULTS)
    if default["total_tokens"] <= len(step_s) and default["depth"] in draft_s:
        cands["default"] = default
    cost, info = {}, {}
    for name, kw in cands.items():
        cost[name] = step_s[kw["total_tokens"] - 1] + draft_s[kw["depth"]]
        static = rec["expected_tokens_per_s_by_depth"].get(str(kw["depth"]))
        fits = static and kw["total_tokens"] - 2 < len(static)
        info[name] = {
            **kw,
            "static_expected_accept_length": static[kw["total_tokens"] - 2] * cost[name] if fits else None,
        }
    best = pick_by_measured_tau(model, rec, prompts, cands, cost, info, max_new_tokens)
    tree.update({k: cands[best][k] for k in EAGLE_DEFAULTS})
    rec["expected_accept_length"] = info[best]["static_expected_accept_length"]
    return tree


def refine_medusa(
    model,
    tree: dict,
    rank_probs: Tensor,
    prompts: list[Tensor],
    profile: dict,
    draft_s: float,
    max_new_tokens: int,
    extra_nodes: tuple[int, ...] = (16, 32, 48, 63),
) -> dict:
    """Re-decide the Medusa tree with measured τ. The candidates are the greedy trees on ``rank_probs``
    of the chosen size and of ``extra_nodes`` sizes (up to what the profile prices), plus the default
    tree; each is priced as measured τ / (t_step(N + 1) + t_draft). The accuracies come from
    teacher-forced held-out text, where the heads do better than when the target writes the text, so
    the estimate undervalues wide trees (measured on the demo: a tuned 18-node tree lost 9% of τ
    against the 32-node default in generation, where the estimate said 2%); measured τ decides, and the
    default is among the candidates, so the choice is never one the measurement priced below it.
    Updates ``tree`` (the paths, and the tuning record) in place and returns it."""
    from infer.tree import default_tree, greedy_nodes

    rec, step_s = tree["tuning"], profile["step_s"]
    sizes = sorted({len(tree["paths"]), *(n for n in extra_nodes if n < len(step_s))})
    nodes = [list(p) for p in greedy_nodes(rank_probs, max(sizes))[0]]  # greedy trees are nested
    paths = {f"greedy,{n} nodes": nodes[:n] for n in sizes}
    default = default_tree(rank_probs.shape[0])
    if len(default) < len(step_s):
        paths["default"] = default
    for key in ("measured_accept_length", "default_measured_accept_length"):  # keep the rank-vector τ
        if key in rec:
            rec[key.replace("measured", "rank_vector")] = rec.pop(key)
    best = pick_by_measured_tau(
        model,
        rec,
        prompts,
        {k: {"tree": v} for k, v in paths.items()},
        {k: step_s[len(v)] + draft_s for k, v in paths.items()},
        {k: {"num_nodes": len(v)} for k, v in paths.items()},
        max_new_tokens,
    )
    tree["paths"] = paths[best]
    by_nodes = rec.get("expected_accept_length_by_nodes") or []
    greedy = best != "default" and len(paths[best]) < len(by_nodes)
    rec.update(
        num_nodes=len(paths[best]),
        expected_accept_length=by_nodes[len(paths[best])]
        if greedy
        else rec.get("default_expected_accept_length"),
    )
    return tree


def write_tree(directory: str, tree: dict) -> str:
    from heads.base import TREE_NAME
    from heads.io import atomic_text

    path = os.path.join(directory, TREE_NAME)
    text = json.dumps(tree, indent=1) + "\n"
    atomic_text(path, text)
    return path


# ---------------------------------------------------------------------------------------------- checking


def compare(model, prompts: list[Tensor], configs: dict, max_new_tokens: int, warmup: int = 1) -> dict:
    """Measured tokens/s and τ per config ({name: generate kwargs}; None = ``target.generate``), run
    interleaved per prompt in a shuffled order; the greedy outputs must agree with the target's."""
    import infer

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


def load_prompts(path: str, tokenizer, n: int, max_tokens: int = 96, skip: int = 0) -> list[Tensor]:
    """Token ids [1, T] of rows skip..skip+n-1 of a JSONL file: a ``text`` row gives its first
    ``max_tokens`` tokens; a chat row (``messages`` or ShareGPT ``conversations``) gives the conversation
    before its first assistant turn, rendered with the chat template and the generation prompt (what
    the target answers when it is served)."""
    from train.data import to_messages

    out = []
    with open(path) as f:
        rows = [line for line in f if line.strip()][skip : skip + n]
    for i, line in enumerate(rows):
        where = f"{path} row {skip + i}"
        row = json.loads(line)
        chat = row.get("messages", row.get("conversations"))
        if chat is not None:
            messages = to_messages(chat, where)
            first = next(j for j, m in enumerate(messages) if m["role"] == "assistant")  # to_messages: >= 1
            if getattr(tokenizer, "chat_template", None) is None:
                raise ValueError(f"{where}: chat rows need a tokenizer with a chat template")
            text = tokenizer.apply_chat_template(messages[:first], add_generation_prompt=True, tokenize=False)
            out.append(tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids)
            continue
        text = row.get("text")
        if not isinstance(text, str) or not text:
            raise ValueError(f"{where}: prompts need a non-empty 'text' field or a chat 'messages' list")
        out.append(tokenizer(text, return_tensors="pt").input_ids[:, :max_tokens])
    if not out:
        raise ValueError(f"{path} has no rows after the first {skip}")
    return out


def measure_src(args: argparse.Namespace, data: str) -> str:
    """Where ``--measure-tau`` prompts come from: held-out rows of the data the accuracies came from, past
    the ones scored (the ``--compare`` prompts stay unseen by the tuning)."""
    return data if data.endswith(".jsonl") and os.path.isfile(data) else prompts_path(args, data)


def prompts_path(args: argparse.Namespace, data: str) -> str:
    path = args.prompts or os.path.join(os.path.dirname(data), "prompts.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"prompts file {path!r} not found (pass --prompts)")
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--heads", required=True, help="head checkpoint directory (tree.json is written there)")
    p.add_argument("--target", default=None, help="default: the heads' base_model_name_or_path")
    p.add_argument("--data", default=None, help="held-out data (default: the run's eval_path)")
    p.add_argument("--accuracies", default=None, help="eval_heads.py JSON to reuse instead of evaluating")
    p.add_argument("--max-examples", type=int, default=64, help="held-out rows for the accuracies")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--max-k", type=int, default=64, help="largest verification size profiled")
    p.add_argument("--prefix-len", type=int, default=128, help="prefix tokens before the profiled step")
    p.add_argument(
        "--repeats", type=int, default=15, help="timing repeats per profiled size (the fastest counts)"
    )
    p.add_argument("--eagle-depths", default="3,4,5,6,7", help="EAGLE-2 depths to consider")
    p.add_argument("--draft-top-k", type=int, default=EAGLE_DEFAULTS["draft_top_k"])
    p.add_argument(
        "--measure-tau",
        type=int,
        default=4,
        help="re-decide among candidate trees (Medusa: sizes; EAGLE: the best budget per depth) by τ "
        "measured with infer.generate on this many held-out prompts (0 = off)",
    )
    p.add_argument("--compare", type=int, default=0, help="check on this many held-out prompts (0 = skip)")
    p.add_argument(
        "--prompts", default=None, help="prompts JSONL for --compare (default: prompts.jsonl by the data)"
    )
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dry-run", action="store_true", help="print the choice, write nothing")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    import infer
    from infer.tree import default_tree

    args = parse_args(argv)
    heads, target, tokenizer, directory = eval_heads.load_all(args.heads, args.target, args.dtype)
    kind = heads.config.head_type
    depths = sorted({int(d) for d in args.eagle_depths.split(",")})
    depth = heads.config.num_heads if kind == "medusa" else max(depths)
    data = args.data or eval_heads.default_data(directory)
    if not data:  # the accuracies and the profile's prefix both come from held-out text
        raise ValueError(f"no --data given and {directory} has no train_config.yaml with data.eval_path")
    joint = None
    if args.accuracies:
        with open(args.accuracies) as f:
            acc_json = json.load(f)
        if acc_json.get("head_type") != kind or acc_json["depth"] < depth:
            raise ValueError(f"{args.accuracies} is not a {kind} evaluation of depth >= {depth}")
    else:
        batches = eval_heads.load_batches(data, tokenizer, args.max_examples, 256, 4)
        stats = eval_heads.evaluate_heads(heads, target, batches, depth)
        acc_json = eval_heads.summary(stats)
        joint = stats.joint
    rank_probs = torch.tensor(acc_json["rank_probs"], dtype=torch.float64)
    print(eval_heads.table(acc_json))

    model = infer.SpecModel(target, heads, tokenizer=tokenizer)
    rows = eval_heads.load_batches(data, tokenizer, 8, 512, 1)
    prefix = max((b["input_ids"] for b in rows), key=lambda x: x.shape[1])[:, : args.prefix_len]
    print(f"profiling verification of k = 1..{args.max_k} tokens after a {prefix.shape[1]}-token prefix")
    aux = tuple(getattr(heads, "aux_layer_ids", ()) or ()) if kind == "eagle3" else ()
    profile = measure_profile(
        target, prefix, args.max_k, args.repeats, aux_layers=aux, ks=profile_grid(args.max_k)
    )
    ms = profile["step_s"]
    print(
        "step ms at k=1,8,16,32,64: "
        + ", ".join(f"{ms[k - 1] * 1e3:.2f}" for k in (1, 8, 16, 32, 64) if k <= len(ms))
    )
    if kind == "medusa":
        draft = measure_draft(
            model, prefix, {"default": {"tree": default_tree(heads.config.num_heads)}}, args.repeats
        )
        profile["draft_s"] = draft["default"]
        tree = tune_medusa(rank_probs, profile, draft["default"], heads.config.num_heads, joint)
        if args.measure_tau:
            print(f"measuring τ of the candidate trees on {args.measure_tau} prompts")
            prompts = load_prompts(
                measure_src(args, data), tokenizer, args.measure_tau, skip=args.max_examples
            )
            tree = refine_medusa(
                model,
                tree,
                rank_probs[: heads.config.num_heads],
                prompts,
                profile,
                draft["default"],
                args.max_new_tokens // 2,
            )
            for name, c in tree["tuning"]["refined"]["candidates"].items():
                print(
                    f"  {name}: τ {c['measured_accept_length']:.2f}, {c['expected_tokens_per_s']:.1f} tok/s"
                )
        configs = {
            "default": {"tree": default_tree(heads.config.num_heads)},
            "tuned": {"tree": tree["paths"]},
        }
    else:
        cfgs = {d: {"depth": d, "draft_top_k": args.draft_top_k, "total_tokens": 64} for d in depths}
        draft = measure_draft(model, prefix, cfgs, args.repeats)
        profile["draft_s_by_depth"] = {str(d): s for d, s in draft.items()}
        tree = tune_eagle(rank_probs, profile, draft, args.draft_top_k)
        if args.measure_tau:
            print(f"measuring τ of the candidate budgets on {args.measure_tau} prompts")
            prompts = load_prompts(
                measure_src(args, data), tokenizer, args.measure_tau, skip=args.max_examples
            )
            tree = refine_eagle(model, tree, prompts, profile, draft, args.max_new_tokens // 2)
            for name, c in tree["tuning"]["refined"]["candidates"].items():
                print(
                    f"  {name}: τ {c['measured_accept_length']:.2f}, {c['expected_tokens_per_s']:.1f} tok/s"
                )
        configs = {"default": dict(EAGLE_DEFAULTS), "tuned": {k: tree[k] for k in EAGLE_DEFAULTS}}
    rec = tree["tuning"]
    rec.update(
        profile=profile,
        rank_probs=acc_json["rank_probs"],
        accuracy_count=acc_json["count"],
        data=data,
        dtype=args.dtype,
        machine=f"{platform.machine()}, {os.cpu_count()} cpus, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}, device {next(target.parameters()).device}",
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )
    shown = {k: v for k, v in tree.items() if k != "tuning"}
    if kind == "medusa":
        shown = {"num_nodes": rec["num_nodes"], "depth": max(len(p) for p in tree["paths"])}
    print(f"chosen: {shown}")
    rate = rec["default_expected_tokens_per_s"]
    print(
        f"expected τ {rec['expected_accept_length'] or float('nan'):.3f}, "
        f"{rec['expected_tokens_per_s']:.1f} tok/s "
        f"(default: τ {rec['default_expected_accept_length']:.3f}, "
        + (f"{rate:.1f} tok/s)" if rate is not None else "not profiled)")
    )
    if "measured_accept_length" in rec:
        where = "--measure-tau prompts (infer.generate)" if "refined" in rec else "held-out rank vectors"
        print(
            f"τ measured on the {where}: tuned {rec['measured_accept_length']:.3f}, "
            f"default {rec.get('default_measured_accept_length', float('nan')):.3f}"
        )
    if args.compare:
        ppath = prompts_path(args, data)
        prompts = load_prompts(ppath, tokenizer, args.compare + 1)
        cmp = compare(model, prompts, {"target.generate": None, **configs}, args.max_new_tokens)
        for name, r in cmp.items():
            print(f"  {name:>16s}: {r['median_tokens_per_s']:7.1f} tok/s (median), τ {r['mean_tau']:.2f}")
        rec["compare"] = cmp | {"prompts_file": ppath, "max_new_tokens": args.max_new_tokens}
    if not args.dry_run:
        print(f"wrote {write_tree(directory, tree)}")
    return tree


if __name__ == "__main__":
    main()
