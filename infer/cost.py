"""What verification and drafting cost on this machine: latency profiles for tree tuning.

A verification step is what `infer.generate` does per tree, through the same `infer.runner.TreeRunner`:
the target forward over the k nodes with the tree mask and position ids, `infer.verify.accept_greedy`,
the host read of the result and the KV compaction; the cache is then cut back to the prefix. Costs are
the fastest of interleaved repeats (`timings`), see `measure_profile` for why; `measure_draft` times
one ``propose``.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor

from heads.graft import run_target
from infer.runner import TreeRunner
from infer.tree import DraftTree, default_accuracies, greedy_nodes, tree_buffers
from infer.tune import interpolate, monotone
from infer.verify import accept_greedy


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timings(fns: dict, repeats: int, warmup: int, device: torch.device, seed: int = 0) -> dict:
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


def _verify_step(runner: TreeRunner, pool: Tensor, past: int, max_k: int) -> Callable[[int], None]:
    """step(k): verify a k-token greedy tree after the ``past``-token prefix, accept, then rewind."""
    paths = [list(p) for p in greedy_nodes(default_accuracies(6, 10), max_k - 1)[0]]  # nested in k
    device = pool.device

    def step(k: int) -> None:
        tb = tree_buffers(paths[: k - 1], device)
        tree = DraftTree(pool[:k], tb.parents, tb.depth, tb.ancestors, tb.retrieve, tb.sib_before)
        out = runner.verify(tree)
        a = accept_greedy(out.logits[0], tree)
        n = int(torch.cat([a.length.view(1), a.next_token.view(1)]).tolist()[0])
        runner.accept(a.path[:n])
        runner.cache.crop(-n)  # back to the prefix for the next step (transformers 5: crop(-tokens_to_drop))
        runner.past = past

    return step


@torch.inference_mode()
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

    The tree shapes are greedy trees on `infer.tree.default_accuracies` (the cost hardly depends on the
    shape). The runner keeps a ``DynamicCache`` (``static=False``) so that a step can be cut back to the
    prefix. ``ks`` (default: every k) are the sizes timed; the others are `infer.tune.interpolate`d.
    Returns {"k": [1..max_k], "k_measured": ks, "step_s_median" and "step_s_min": the median and the
    fastest of the interleaved repeats at every k, "step_s": the `infer.tune.monotone` fit of the
    fastest (what the choice uses)}. On a shared machine the slowdowns are bursts of contention that
    only add time: on the demo target with 2 busy cores the medians of 7 repeats jumped by up to 30 ms
    between neighbouring k (56-107 ms), while the fastest runs rose smoothly from 48 to 73 ms over
    k = 1..64. The fastest run is the cost of the step itself.
    """
    ks = sorted(set(ks or range(1, max_k + 1)))
    if ks[0] != 1 or ks[-1] != max_k:
        raise ValueError(f"the profiled sizes must run from 1 to max_k = {max_k}, got {ks}")
    device = next(target.parameters()).device
    prefix_ids = prefix_ids.to(device)
    past = prefix_ids.shape[1]
    runner = TreeRunner(target, aux_layers, max_len=past + max_k, static=False)
    runner.prefill(prefix_ids)
    pool = prefix_ids[0].repeat(max_k // past + 1)
    step = _verify_step(runner, pool, past, max_k)
    times = timings({k: (lambda k=k: step(k)) for k in ks}, repeats, warmup, device)
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
    {name: kwargs of `infer.SpecModel.proposer`}, in the state right after prefilling ``prefix_ids`` [1, T]."""
    device = next(model.target.parameters()).device
    prefix_ids = prefix_ids.to(device)
    fns = {}
    for name, kwargs in configs.items():
        prop = model.proposer(**kwargs)
        out = run_target(model.target, prefix_ids, aux_layers=prop.aux_layers)
        prop.start(prefix_ids, out)
        root = out.logits[0, -1].argmax()
        fns[name] = lambda prop=prop, root=root: prop.propose(root, max_depth=64)
    return {k: min(v) for k, v in timings(fns, repeats, warmup, device).items()}
