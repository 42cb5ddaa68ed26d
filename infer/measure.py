"""Measured τ and throughput of `infer.generate` configurations, and the held-out prompts they run on.

`infer.tune_tree` prices its candidate trees with `measure_tau` and checks its choice with `compare`.
"""

from __future__ import annotations

import os
import random
import statistics
import time

import torch
from torch import Tensor

import infer


def measure_tau(model, prompts: list[Tensor], configs: dict, max_new_tokens: int) -> dict:
    """Greedy mean accepted length (bonus included) of each config ({name: generate kwargs}), pooled over
    the prompts' steps. Greedy τ is deterministic, so one run per prompt measures it exactly."""
    taus = {}
    for name, kw in configs.items():
        lengths = []
        for ids in prompts:
            out = infer.generate(model, ids, max_new_tokens=max_new_tokens, do_sample=False, **kw)
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
