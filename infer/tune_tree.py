"""Fit the draft tree to a head checkpoint and to this machine, and save it with the heads (`tune_tree`).

``scripts/tune_tree.py`` is this module's command line (options: `TuneOptions`):

1. Accuracies: per-depth rank probabilities of the heads on held-out data (`infer.head_accuracy`, or
   ``--accuracies`` to reuse its JSON).
2. Latency profile (`infer.cost`): the target's cost of one verification step over k = 1..64 new
   tokens after a real prefix, timed at a grid of k and interpolated in between, the fastest of
   ``--repeats`` interleaved repeats (medians are recorded too), made monotone in k (kept as this
   machine's verify-cost curve for `infer.adaptive` too: `infer.cost.remember`); and the draft's cost
   of one ``propose``, both measured here, on the machine that will generate.
3. Choice (`infer.tree_choice`), by the heads' registry entry's tree kind: static trees (Medusa): the greedy
   tree of N nodes maximising E[τ(N)] / (t_step(N+1) + t_draft), N = 1..63. Dynamic trees (EAGLE-2):
   (total_tokens, depth) maximising the same with E[τ] from the best static tree of that size within
   the depth and draft_top_k (a conservative estimate of the dynamic tree). With ``--measure-tau P``
   (default 4) the candidates (static: greedy trees of several sizes and the default tree; dynamic: the
   best budget per depth and the default) are re-priced with τ measured by `infer.generate` on P
   held-out prompts, and the best measured one is kept (`refine_medusa`, `refine_eagle`).
4. ``inference.json`` (`infer.settings.write_settings`, atomic) holds the choice plus a ``"tuning"``
   record: the profile, the accuracies and the expected τ and tokens/s of the tuned and the default
   tree. `infer.load` reads it, so `infer.generate` uses it by default (explicit arguments still win).

``--compare P`` then times the default and the tuned tree and ``target.generate``, interleaved, on P
held-out prompts. ``--dry-run`` writes nothing.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

import infer
from heads import registry
from heads.card import TRAIN_CONFIG_NAME, is_run_config
from infer.cost import measure_draft, measure_profile, remember
from infer.head_accuracy import (
    BatchLoader,
    default_data,
    default_depth,
    evaluate_heads,
    held_out_prompts,
    load_all,
    summary,
    table,
)
from infer.prompts import load_prompts
from infer.settings import BUDGET_KEYS, DEFAULTS, write_settings
from infer.tree import default_tree, greedy_nodes
from infer.tree_choice import (
    choose_eagle_budget,
    choose_num_nodes,
    compare,
    empirical_accept_length,
    expected_accept_curve,
    expected_accept_length,
    measure_src,
    pad_ranks,
    pick_by_measured_tau,
    profile_grid,
    prompts_path,
)


@dataclass
class TuneOptions:
    """Options of ``scripts/tune_tree.py`` (`tune_tree`)."""

    heads: str | None = field(
        default=None, metadata={"help": "head checkpoint directory (inference.json is written there)"}
    )
    target: str | None = field(default=None, metadata={"help": "default: the heads' own target"})
    data: str | None = field(default=None, metadata={"help": "held-out data (default: the heads' run's)"})
    accuracies: str | None = field(
        default=None, metadata={"help": "eval_heads.py JSON to reuse instead of evaluating"}
    )
    max_examples: int = field(default=64, metadata={"help": "held-out rows for the accuracies"})
    dtype: str = field(default="bf16", metadata={"help": "target dtype"})
    max_k: int = field(default=64, metadata={"help": "largest verification size profiled"})
    prefix_len: int = field(default=128, metadata={"help": "prefix tokens before the profiled step"})
    repeats: int = field(
        default=15, metadata={"help": "timing repeats per profiled size (the fastest counts)"}
    )
    eagle_depths: str = field(default="3,4,5,6,7", metadata={"help": "EAGLE-2 depths to consider"})
    draft_top_k: int = field(
        default=DEFAULTS.draft_top_k, metadata={"help": "EAGLE-2 frontier width / children per node"}
    )
    measure_tau: int = field(
        default=4,
        metadata={
            "help": "re-decide among candidate trees (Medusa: sizes; EAGLE: the best budget per depth) by "
            "τ measured with infer.generate on this many held-out prompts (0 = off)"
        },
    )
    compare: int = field(default=0, metadata={"help": "check on this many held-out prompts (0 = skip)"})
    prompts: str | None = field(
        default=None, metadata={"help": "prompts JSONL for --compare (default: prompts.jsonl by the data)"}
    )
    max_new_tokens: int = field(default=128, metadata={"help": "new tokens per --compare prompt"})
    dry_run: bool = field(default=False, metadata={"help": "print the choice, write nothing"})

    def __post_init__(self) -> None:
        if not self.heads:
            raise ValueError("--heads is required: the head checkpoint directory")
        try:
            depths = [int(d) for d in str(self.eagle_depths).split(",")]
        except ValueError:
            raise ValueError(
                f"--eagle-depths must be comma-separated ints, got {self.eagle_depths!r}"
            ) from None
        if not depths or min(depths) < 1:
            raise ValueError(f"--eagle-depths must be ints >= 1, got {self.eagle_depths!r}")
        for key in ("max_examples", "max_k", "prefix_len", "repeats", "draft_top_k", "max_new_tokens"):
            if getattr(self, key) < 1:
                raise ValueError(f"--{key.replace('_', '-')} must be >= 1, got {getattr(self, key)}")
        for key in ("measure_tau", "compare"):
            if getattr(self, key) < 0:
                raise ValueError(f"--{key.replace('_', '-')} must be >= 0, got {getattr(self, key)}")

    @property
    def depths(self) -> list[int]:
        return sorted({int(d) for d in self.eagle_depths.split(",")})


# ---------------------------------------------------------------------------------------------- choosing


def tune_medusa(
    rank_probs: Tensor, profile: dict, draft_s: float, num_heads: int, joint: Tensor | None
) -> dict:
    """The tuned settings for static-tree heads: the greedy tree of the best size, and the tuning record."""
    step_s = profile["step_s"]
    tau = expected_accept_curve(rank_probs, len(step_s) - 1, max_depth=num_heads)
    n, rates = choose_num_nodes(tau, step_s, draft_s)
    paths = [list(p) for p in greedy_nodes(rank_probs, n, max_depth=num_heads)[0]]
    default = default_tree(num_heads)
    acc = rank_probs.double()
    tau_default = expected_accept_length(default, pad_ranks(acc, default))
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


def tune_eagle(
    rank_probs: Tensor, profile: dict, draft_s: dict, draft_top_k: int, default: dict | None = None
) -> dict:
    """The tuned settings for dynamic-tree heads: EAGLE-2's total_tokens and depth, and the tuning record
    (``default``: the untuned budget it is compared with, the model's ``settings.budget()``; the
    library's if None)."""
    best = choose_eagle_budget(rank_probs, profile["step_s"], draft_s, draft_top_k)
    d = default or DEFAULTS.budget()
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


def refine_eagle(
    model,
    tree: dict,
    prompts: list[Tensor],
    profile: dict,
    draft_s: dict,
    max_new_tokens: int,
    extra_total_tokens: tuple[int, ...] = (16, 24, 32, 48, 64),
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
    default = model.settings.budget()  # the untuned budget: the model is built without saved settings
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
    tree.update({k: cands[best][k] for k in BUDGET_KEYS})
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


# ---------------------------------------------------------------------------------------------- the run


@dataclass
class _Run:
    """What every step of `tune_tree` reads: the options, the model and the held-out data."""

    opts: TuneOptions
    model: infer.SpecModel
    tokenizer: object
    directory: str
    data: str
    rank_probs: Tensor
    joint: Tensor | None
    profile: dict
    prefix: Tensor
    inputs: dict  # the accuracies behind the choice, for the tuning record
    load_batches: BatchLoader

    def prompts(self) -> list[Tensor]:
        n, skip = self.opts.measure_tau, self.opts.max_examples  # past the rows the accuracies scored
        print(f"measuring τ of the candidates on {n} prompts")
        if self.opts.prompts is None and is_run_config(self.data):
            try:  # a small held-out split: the accuracies may have read all of it
                return held_out_prompts(self.load_batches, self.data, self.tokenizer, n, skip)
            except ValueError as e:
                raise ValueError(f"{e}; give --prompts FILE, or --measure-tau 0") from None
        return load_prompts(measure_src(self.opts.prompts, self.data), self.tokenizer, n, skip=skip)


def _accuracies(
    opts: TuneOptions, heads, target, tokenizer, data: str, depth: int, load_batches: BatchLoader
):
    """(eval_heads-style summary, joint rank vectors or None): from ``--accuracies`` or evaluated now."""
    if opts.accuracies:
        with open(opts.accuracies) as f:
            acc_json = json.load(f)
        kind = heads.config.head_type
        if acc_json.get("head_type") != kind or acc_json["depth"] < depth:
            raise ValueError(f"{opts.accuracies} is not a {kind} evaluation of depth >= {depth}")
        return acc_json, None
    batches = load_batches(data, tokenizer, opts.max_examples, 256, 4)
    stats = evaluate_heads(heads, target, batches, depth)
    return summary(stats), stats.joint


def _print_candidates(tree: dict) -> None:
    for name, c in tree["tuning"]["refined"]["candidates"].items():
        print(f"  {name}: τ {c['measured_accept_length']:.2f}, {c['expected_tokens_per_s']:.1f} tok/s")


def _tune_static(run: _Run) -> tuple[dict, dict]:
    """(tuned tree dict, --compare configs) for static-tree heads."""
    model, n_heads = run.model, run.model.heads.config.num_heads
    draft = measure_draft(model, run.prefix, {"default": {"tree": default_tree(n_heads)}}, run.opts.repeats)
    run.profile["draft_s"] = draft["default"]
    tree = tune_medusa(run.rank_probs, run.profile, draft["default"], n_heads, run.joint)
    if run.opts.measure_tau:
        half = run.opts.max_new_tokens // 2
        acc = run.rank_probs[:n_heads]
        tree = refine_medusa(model, tree, acc, run.prompts(), run.profile, draft["default"], half)
        _print_candidates(tree)
    return tree, {"default": {"tree": default_tree(n_heads)}, "tuned": {"tree": tree["paths"]}}


def _tune_dynamic(run: _Run) -> tuple[dict, dict]:
    """(tuned budget dict, --compare configs) for dynamic-tree (EAGLE-2) heads."""
    opts, model = run.opts, run.model
    default = model.settings.budget()  # the library's, under the heads' own (a P-EAGLE head's depth K)
    depths = sorted({*opts.depths, default["depth"]})  # the untuned depth is always a candidate
    cfgs = {d: {"depth": d, "draft_top_k": opts.draft_top_k, "total_tokens": 64} for d in depths}
    draft = measure_draft(model, run.prefix, cfgs, opts.repeats)
    run.profile["draft_s_by_depth"] = {str(d): s for d, s in draft.items()}
    tree = tune_eagle(run.rank_probs, run.profile, draft, opts.draft_top_k, default)
    if opts.measure_tau:
        tree = refine_eagle(model, tree, run.prompts(), run.profile, draft, opts.max_new_tokens // 2)
        _print_candidates(tree)
    return tree, {"default": default, "tuned": {k: tree[k] for k in BUDGET_KEYS}}


# What tuning chooses for each tree kind (`heads.registry.HeadType.tree`).
TUNERS: dict[str, Callable[[_Run], tuple[dict, dict]]] = {"static": _tune_static, "dynamic": _tune_dynamic}


def _prepare(opts: TuneOptions, load_batches: BatchLoader) -> _Run:
    """Load the heads and target, get the accuracies and the verification profile."""
    heads, target, tokenizer, directory = load_all(opts.heads, opts.target, opts.dtype)
    static = registry.of(heads).tree == "static"
    depth = default_depth(heads) if static else max(*opts.depths, default_depth(heads))
    data = opts.data or default_data(directory)
    if not data:  # the accuracies and the profile's prefix both come from held-out text
        raise ValueError(f"no --data, and no {TRAIN_CONFIG_NAME} in {directory} names its run's data")
    acc_json, joint = _accuracies(opts, heads, target, tokenizer, data, depth, load_batches)
    print(table(acc_json))
    model = infer.SpecModel(target, heads, tokenizer=tokenizer)
    rows = load_batches(data, tokenizer, 8, 512, 1)
    prefix = max((b["input_ids"] for b in rows), key=lambda x: x.shape[1])[:, : opts.prefix_len]
    print(f"profiling verification of k = 1..{opts.max_k} tokens after a {prefix.shape[1]}-token prefix")
    aux = tuple(getattr(heads, "aux_layer_ids", ()) or ())
    profile = measure_profile(
        target, prefix, opts.max_k, opts.repeats, aux_layers=aux, ks=profile_grid(opts.max_k)
    )
    remember(target, profile["step_s"])  # adaptive speculation prices trees with this curve too
    ms = profile["step_s"]
    print(
        "step ms at k=1,8,16,32,64: "
        + ", ".join(f"{ms[k - 1] * 1e3:.2f}" for k in (1, 8, 16, 32, 64) if k <= len(ms))
    )
    rank_probs = torch.tensor(acc_json["rank_probs"], dtype=torch.float64)
    inputs = {"rank_probs": acc_json["rank_probs"], "accuracy_count": acc_json["count"]}
    return _Run(
        opts, model, tokenizer, directory, data, rank_probs, joint, profile, prefix, inputs, load_batches
    )


def _report(run: _Run, tree: dict) -> None:
    rec = tree["tuning"]
    shown = {k: v for k, v in tree.items() if k != "tuning"}
    if "paths" in tree:
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


def settings_values(tree: dict) -> dict:
    """The `infer.settings.InferSettings` fields a tuned tree dict sets: the static tree or the budget."""
    return {"tree": tree["paths"]} if "paths" in tree else {k: tree[k] for k in BUDGET_KEYS}


def tune_tree(opts: TuneOptions, load_batches: BatchLoader) -> dict:
    """``scripts/tune_tree.py``: tune, report, optionally compare, save ``<heads>/inference.json`` and return
    the tree dict (``paths`` or the EAGLE-2 budget, and ``tuning``); ``load_batches`` reads held-out rows."""
    run = _prepare(opts, load_batches)
    tree, configs = TUNERS[registry.of(run.model.heads).tree](run)
    target = run.model.target
    tree["tuning"].update(
        profile=run.profile,
        **run.inputs,
        data=run.data,
        dtype=opts.dtype,
        machine=f"{platform.machine()}, {os.cpu_count()} cpus, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}, device {next(target.parameters()).device}",
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )
    _report(run, tree)
    if opts.compare:
        ppath = prompts_path(opts.prompts, run.data)
        prompts = load_prompts(ppath, run.tokenizer, opts.compare + 1)
        cmp = compare(run.model, prompts, {"target.generate": None, **configs}, opts.max_new_tokens)
        for name, r in cmp.items():
            print(f"  {name:>16s}: {r['median_tokens_per_s']:7.1f} tok/s (median), τ {r['mean_tau']:.2f}")
        tree["tuning"]["compare"] = cmp | {"prompts_file": ppath, "max_new_tokens": opts.max_new_tokens}
    if not opts.dry_run:
        print(f"wrote {write_settings(run.directory, settings_values(tree), tree['tuning'])}")
    return tree
