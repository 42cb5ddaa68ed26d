"""What verification and drafting cost on this machine: latency profiles for tree tuning and the
verify-cost curve of adaptive speculation.

A verification step is what `infer.generate` does per tree, through the same `infer.runner.TreeRunner`:
the target forward over the k nodes with the tree mask and position ids, `infer.verify.accept_greedy`,
the host read of the result and the KV compaction; the cache is then cut back to the prefix. Costs are
the fastest of interleaved repeats (`timings`), see `measure_profile` for why; `measure_draft` times
one ``propose``.

`verify_seconds` is `measure_profile` on a coarse grid of k, interpolated in between, through
`lower_envelope`, measured once per
(device, dtype, target shape) and cached: in memory for the process and in
``$SELFSPEC_CACHE/verify_cost/<key>.json`` (default ``~/.cache/selfspec``), so a machine measures each
target shape once (about 50 target forwards). The key names the device (GPU name, or CPU model, core
and thread counts), the dtype, the torch version and the target's shape (architecture, sizes,
attention implementation), not its weights: the cost of a forward does not depend on them.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import random
import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor, nn

from heads.graft import run_target
from infer.runner import TreeRunner
from infer.tree import DraftTree, default_accuracies, greedy_nodes, tree_buffers
from infer.tree_choice import interpolate, monotone
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
    prefix. ``ks`` (default: every k) are the sizes timed; the others are `infer.tree_choice.interpolate`d.
    Returns {"k": [1..max_k], "k_measured": ks, "step_s_median" and "step_s_min": the median and the
    fastest of the interleaved repeats at every k, "step_s": the `infer.tree_choice.monotone` fit of the
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


MAX_K = 64  # the largest verification priced; larger trees are priced by extrapolating the last slope
GRID = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]  # the k timed; the others are interpolated
_SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "intermediate_size", "vocab_size", "head_dim", "sliding_window", "_attn_implementation")  # fmt: skip
CURVE = "fastest of 5, lower envelope"  # how the curve is made: part of the key, so a change re-measures
_MEMO: dict[str, list[float]] = {}


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda {torch.cuda.get_device_name(device)}"
    cpu = platform.processor() or platform.machine()
    return f"{device.type} {cpu}, {os.cpu_count()} cpus, {torch.get_num_threads()} threads"


def cost_key(target: nn.Module) -> dict:
    """What the verify cost depends on: the device, dtype, torch version and the target's shape."""
    p = next(target.parameters())
    cfg = target.config.get_text_config()
    shape = {k: getattr(cfg, k, None) for k in _SHAPE_KEYS}
    where = {"device": _device_name(p.device), "dtype": str(p.dtype), "torch": torch.__version__}
    return {"curve": CURVE} | where | shape


def _cache_file(key: dict) -> str:
    root = os.environ.get("SELFSPEC_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "selfspec")
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return os.path.join(root, "verify_cost", f"{digest}.json")


def _read(path: str, key: dict) -> list[float] | None:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    step_s = data.get("step_s") if isinstance(data, dict) else None
    same = isinstance(data, dict) and json.loads(json.dumps(key, default=str)) == data.get("key")
    ok = (
        isinstance(step_s, list)
        and len(step_s) == MAX_K
        and all(isinstance(v, float) and v > 0 for v in step_s)
    )
    return step_s if same and ok else None


def _write(path: str, key: dict, step_s: list[float]) -> None:
    """Atomically; a cache that cannot be written (read-only home) only costs a measurement next time."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"key": key, "k": list(range(1, MAX_K + 1)), "step_s": step_s}, f, default=str)
        os.replace(tmp, path)
    except OSError:
        pass


def lower_envelope(values: list[float]) -> list[float]:
    """[k-1] -> min over k' >= k of values[k'-1]: the true cost never falls with k and a contended machine
    only adds time, so each larger k's timing bounds every smaller k's cost. On 2 loaded cores single
    sizes of a 1 ms tiny-model step timed 16-45 ms in all of their repeats; this drops such spikes (a
    least-squares monotone fit, `infer.tree_choice.monotone`, spreads them over the larger k instead)."""
    out, low = [], float("inf")
    for v in reversed(values):
        low = min(low, v)
        out.append(low)
    return out[::-1]


def remember(target: nn.Module, step_s: list[float]) -> None:
    """Keep a verify-cost curve measured elsewhere (`infer.tune_tree`'s profile, with more repeats after a
    real prefix) as this machine's curve for ``target``'s shape; a curve of another length is ignored."""
    if len(step_s) == MAX_K and all(v > 0 for v in step_s):
        key = cost_key(target)
        path = _cache_file(key)
        _MEMO[path] = lower_envelope([float(v) for v in step_s])
        _write(path, key, _MEMO[path])


def verify_seconds(target: nn.Module, *, refresh: bool = False) -> list[float]:
    """Seconds of one verification step over k = 1..`MAX_K` new tokens on ``target`` ([k-1]: k tokens),
    non-decreasing in k: from memory, from the cache file, or measured now (``refresh``: measured now)."""
    key = cost_key(target)
    path = _cache_file(key)
    if not refresh:
        if path in _MEMO:
            return _MEMO[path]
        cached = _read(path, key)
        if cached is not None:
            _MEMO[path] = cached
            return cached
    vocab = target.config.get_text_config().vocab_size
    prefix = (torch.arange(128, device=next(target.parameters()).device) * 7919 % vocab)[None]
    fastest = measure_profile(target, prefix, MAX_K, repeats=5, warmup=1, ks=GRID)["step_s_min"]
    step_s = lower_envelope(fastest)
    _MEMO[path] = step_s
    _write(path, key, step_s)
    return step_s
