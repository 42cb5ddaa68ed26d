"""Benchmark speculative decoding against plain decoding: τ, tokens/s, speedup, efficiency, time split.

    python scripts/benchmark.py --target demo --heads medusa=out/demo-medusa --heads eagle=out/demo-eagle \\
        --modes greedy,sample --prompt-lookup 3 --total-tokens 16,32,60 --out out/bench

For every prompt set, mode (greedy; sample at T=0.7) and prompt, all methods run in ONE process,
interleaved (A B C, then B C A, ...) after a warm-up, on the same prompt:

- ``target.generate``: plain decoding, the baseline (one target forward per token);
- ``prompt-lookup``: HF's assisted generation with ``prompt_lookup_num_tokens`` (no trained draft);
- ``infer.generate`` once per heads checkpoint and tree setting (Medusa static trees: ``--tree``;
  EAGLE-2 dynamic trees: ``--total-tokens``/``--depth``/``--draft-top-k``).

Definitions (also written into results.json):

- **τ** (mean accepted length) = tokens emitted per target *decode* forward, **the bonus token
  included** (the Medusa/EAGLE papers' convention): pooled over every verify step of every prompt.
  The prefill forward and the one token it emits are left out. Plain decoding has τ = 1 by
  construction. For prompt lookup τ is counted from the target's forward calls (a hook records the
  cache length before each call).
- **speedup** = ratio to ``target.generate`` on the same prompts in the same run, two ways: total-time
  ratio (Σ plain seconds / Σ method seconds; every run generates exactly ``--max-new-tokens`` tokens
  unless ``--stop-at-eos``, so this is the tokens/s ratio) and the median of per-prompt ratios. The
  total-time ratio comes with a 95% percentile-bootstrap interval over prompts (each prompt's pair of
  interleaved runs resampled together): it covers the spread across prompts and the timing noise in
  this run, not a machine that is faster or slower in another run.
- **paired comparisons** (``--vs A:B``, repeatable): the same ratio and interval between two methods,
  e.g. a tuned tree against the default one, plus on how many prompts A was faster.
- **efficiency** = speedup (total-time) / τ: the share of the acceptance that becomes wall-clock.
- **time split** (``infer.generate`` only, when it supports ``timing=True``): draft, verify and
  bookkeeping (= total - draft - verify) seconds summed over prompts; "n/a" otherwise.
- **peak memory**: on CUDA ``torch.cuda.max_memory_allocated`` (reset before each call); on Linux
  CPU the process's peak RSS (``VmHWM``, reset before each call through ``/proc/self/clear_refs``);
  elsewhere ``resource.getrusage`` peak RSS over the whole process (not per method). The JSON says which.

Greedy outputs of every method are compared token by token with ``target.generate``. A mismatch is
printed loudly with the prompt and the first differing position and the script exits with status 1.
In bf16/fp16 a multi-token verify forward rounds differently from one-token decoding, so a near-tie
argmax can legitimately flip (README "Exactness and floating point"); such a mismatch is still
printed and counted, but it is *explained* (and not fatal unless ``--strict``) only when the target's
own logits at the divergence point put the two tokens within ``--tie-tol`` of each other. In float32
the tolerance is 0: any mismatch fails.

Outputs in ``--out``: results.json, results.md (a markdown table) and speedup_vs_tree.png (speedup
and τ against tree size, the number of tokens verified per step, root included).
Timing: CUDA-synchronised on GPU, ``time.perf_counter`` on CPU. Speeds are never asserted anywhere.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import infer  # noqa: E402

SCHEMA = "selfspec-benchmark/1"
SAMPLE_TEMPERATURE = 0.7
TAU_DEFINITION = (
    "tokens emitted per target decode forward (verify step), bonus token included, pooled over all "
    "steps of all prompts; the prefill forward and its token are excluded; plain decoding has tau = 1"
)
SPEEDUP_DEFINITION = (
    "ratio to target.generate on the same prompts in the same run: 'total' = sum of plain seconds / sum "
    "of method seconds (equal token counts unless --stop-at-eos, so the tokens/s ratio); 'median' = "
    "median over prompts of (method tokens/s) / (plain tokens/s)"
)
DEFAULT_TIE_TOL = {torch.float32: 0.0, torch.float64: 0.0, torch.bfloat16: 0.25, torch.float16: 0.05}


# ----------------------------------------------------------------------------- prompts


def render_prompt(row: dict, tokenizer, where: str) -> torch.Tensor:
    """A JSONL row -> input ids [1, T]: ``text`` is tokenized as is (with the tokenizer's special
    tokens, e.g. BOS); chat ``messages`` go through the chat template with a generation prompt."""
    if "messages" in row:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(f"{where}: chat 'messages' need a tokenizer with a chat template")
        text = tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    elif "text" in row:
        ids = tokenizer(row["text"], return_tensors="pt").input_ids
    else:
        raise ValueError(f"{where}: a prompt row needs 'text' or 'messages', got keys {sorted(row)}")
    if ids.shape[1] == 0:
        raise ValueError(f"{where}: the prompt is empty after tokenization")
    return ids


def read_prompts(path: str) -> list[dict]:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"prompts file not found: {path!r}")
    rows = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not valid JSON ({e})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{i}: each line must be a JSON object with 'text' or 'messages'")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no prompts")
    return rows


def demo_chat_prompts(code_prompts: str, out_path: str, n: int = 32, offset: int = 100) -> str:
    """A chat-style prompt set from the demo's held-out code prompts, written to ``out_path``.

    Rows ``offset .. offset+n`` of the held-out prompts (disjoint from the first rows, which the code
    set uses; the second half of a file shorter than ``offset``) become conversations in the format the demo target saw in its ~10% chat-rendered
    training files (`train.demo._documents`): the user message is the start of a function (ending in a
    newline, as in training), the assistant continues it; every other one has the demo system prompt.
    Deterministic: a pure function of the prompts file.
    """
    from train.demo import SYSTEM_PROMPT

    rows = read_prompts(code_prompts)
    rows = rows[min(offset, len(rows) // 2) :][:n]  # a small file (demo-tiny: 10 rows) uses its second half
    out = []
    for i, row in enumerate(rows):
        messages = [{"role": "user", "content": row["text"] + "\n"}]
        if i % 2 == 1:
            messages.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
        out.append({"messages": messages})
    _atomic_text(out_path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out))
    return out_path


def _atomic_text(path: str, text: str) -> None:
    from heads.io import atomic_write

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    atomic_write(path, write)


# ----------------------------------------------------------------------------- measurement helpers


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PeakMemory:
    """Per-call peak memory in MiB; ``kind`` says what is measured (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cuda":
            self.kind = "cuda.max_memory_allocated, reset before each call"
        elif self._can_reset_rss():
            self.kind = "peak RSS of the process (VmHWM), reset before each call via /proc/self/clear_refs"
        else:
            self.kind = "peak RSS of the whole process so far (resource.getrusage; not per call)"

    @staticmethod
    def _can_reset_rss() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return PeakMemory._vmhwm_kib() is not None
        except OSError:
            return False

    @staticmethod
    def _vmhwm_kib() -> int | None:
        with open("/proc/self/status") as f:
            m = re.search(r"VmHWM:\s+(\d+)\s*kB", f.read())
        return int(m.group(1)) if m else None

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.kind.startswith("peak RSS of the process"):
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")

    def read_mib(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        if self.kind.startswith("peak RSS of the process"):
            return (self._vmhwm_kib() or 0) / 1024
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        return rss / (2**20 if sys.platform == "darwin" else 1024)


class ForwardRecorder:
    """Counts the target's forward calls and the cache length before each, to get τ for HF methods.

    Step lengths: consecutive decode forwards start ``s_i`` and ``s_{i+1}`` apart, which is what step i
    emitted (accepted candidates + the bonus token); the last step emitted ``final_len - 1 - s_last``.
    """

    def __init__(self, model) -> None:
        self.model, self.starts, self.handle = model, [], None

    def _hook(self, module, args, kwargs) -> None:
        # The cache length before the call: the first position id, else the cache's own count (the
        # kwarg is `cache` in transformers >= 5.2x, `past_key_values` before).
        start = None
        for key in ("position_ids", "cache_position"):
            if kwargs.get(key) is not None:
                start = int(kwargs[key].reshape(-1)[0])
                break
        if start is None:
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            if cache is not None and hasattr(cache, "get_seq_length"):
                start = int(cache.get_seq_length())
        self.starts.append(start)

    def __enter__(self) -> ForwardRecorder:
        self.starts = []
        self.handle = self.model.register_forward_pre_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()

    def step_lengths(self, final_len: int) -> list[int] | None:
        s = self.starts[1:]  # [0] is the prefill
        if not s or any(x is None for x in s):
            return None
        return [b - a for a, b in zip(s, s[1:], strict=False)] + [final_len - 1 - s[-1]]


# ----------------------------------------------------------------------------- methods


@dataclass
class Run:
    """One method on one prompt. ``sequences`` [1, T + new]; ``steps``: tokens per decode forward."""

    sequences: torch.Tensor
    new_tokens: int
    seconds: float
    steps: list[int] | None
    peak_mib: float
    draft_s: float | None = None
    verify_s: float | None = None
    total_s: float | None = None


@dataclass
class Method:
    """A way to generate. ``kind``: "plain", "prompt_lookup" or "heads"."""

    label: str
    kind: str
    heads: str | None = None
    head_type: str | None = None
    tree_size: int | None = None  # tokens verified per step, root included
    tree_desc: str | None = None
    options: dict = field(default_factory=dict)
    model: infer.SpecModel | None = None

    def run(self, target, ids: torch.Tensor, gc, seed: int, timing: bool, mem: PeakMemory) -> Run:
        device = ids.device
        sampling = bool(gc.do_sample)
        mem.reset()
        if self.kind == "heads":
            gen = torch.Generator(device=device).manual_seed(seed) if sampling else None
            kw = dict(self.options)
            if timing:
                kw["timing"] = True
            _sync(device)
            t = time.perf_counter()
            out = infer.generate(
                self.model, ids, generation_config=gc, eos_token_id=_eos_arg(gc), generator=gen, **kw
            )
            _sync(device)
            seconds = time.perf_counter() - t
            st = out.stats
            return Run(
                out.sequences,
                st.new_tokens,
                seconds,
                list(st.accepted_lengths),
                mem.read_mib(),
                getattr(st, "draft_time_s", None),
                getattr(st, "verify_time_s", None),
                getattr(st, "total_time_s", None),
            )
        if self.kind == "prompt_lookup":  # in the config: transformers deprecates config + kwargs
            gc = copy.deepcopy(gc)
            gc.prompt_lookup_num_tokens = self.options["prompt_lookup_num_tokens"]
        if sampling:
            torch.manual_seed(seed)
        with ForwardRecorder(target) if self.kind == "prompt_lookup" else contextlib.nullcontext() as rec:
            _sync(device)
            t = time.perf_counter()
            seq = target.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gc)
            _sync(device)
            seconds = time.perf_counter() - t
        n = seq.shape[1] - ids.shape[1]
        steps = rec.step_lengths(seq.shape[1]) if rec is not None else [1] * max(n - 1, 0)
        return Run(seq, n, seconds, steps, mem.read_mib())


def _eos_arg(gc):
    """infer.generate treats a None eos as 'use the target's': pass [] to really disable it."""
    return gc.eos_token_id if gc.eos_token_id is not None else []


def generation_config(target, tokenizer, *, sampling: bool, max_new_tokens: int, stop_at_eos: bool):
    """One GenerationConfig for every method, so they decode with identical settings."""
    gc = copy.deepcopy(target.generation_config)
    gc.max_new_tokens = max_new_tokens
    gc.max_length = None
    gc.do_sample = sampling
    gc.temperature = SAMPLE_TEMPERATURE if sampling else None
    gc.top_p = None if not sampling else gc.top_p
    gc.top_k = None if not sampling else gc.top_k
    if not stop_at_eos:
        gc.eos_token_id = None
    if gc.pad_token_id is None:
        pad = getattr(tokenizer, "pad_token_id", None)
        gc.pad_token_id = pad if pad is not None else (getattr(tokenizer, "eos_token_id", None) or 0)
    return gc


def parse_pairs(specs: list[str], labels: list[str]) -> list[tuple[str, str]]:
    """``--vs A:B`` values -> [(A, B)] of method labels of this run. A ``--heads`` label stands for the
    one method it became (``medusa`` for ``medusa [33 tok]``) when there is exactly one."""

    def resolve(name: str, spec: str) -> str:
        if name in labels:
            return name
        found = [x for x in labels if x.startswith(name + " [")]
        if len(found) == 1:
            return found[0]
        if found:
            raise ValueError(f"--vs {spec!r}: {name!r} is ambiguous, name one of {found}")
        raise ValueError(f"--vs {spec!r}: no method labelled {name!r}; methods: {labels}")

    pairs = []
    for spec in specs:
        a, sep, b = spec.partition(":")
        if not sep or not a or not b:
            raise ValueError(f"--vs takes LABEL_A:LABEL_B, got {spec!r}")
        pairs.append((resolve(a, spec), resolve(b, spec)))
    return pairs


def parse_list(value: str | None) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()] if value else []


def knob_for(values: list[str], label: str, labels: list[str], flag: str) -> list[str]:
    """The settings of a repeatable knob for the heads ``label``: a ``LABEL:LIST`` entry for it wins
    over a bare ``LIST`` entry (which applies to every heads without its own)."""
    own, common = None, None
    for v in values:
        head, sep, rest = v.partition(":")
        if sep and head in labels:
            if head == label:
                own = rest
        elif sep and not os.path.exists(v):
            raise ValueError(f"{flag} {v!r}: {head!r} is not a --heads label ({', '.join(labels)})")
        else:
            common = v
    return parse_list(own if own is not None else common)


def heads_methods(args, target, heads_specs: list[tuple[str, str]]) -> list[Method]:
    """One Method per (heads, tree setting). Medusa: ``--tree`` (sizes, 'default' or a JSON file of
    paths); EAGLE/EAGLE-3: ``--total-tokens`` (sizes or 'default') with ``--depth``/``--draft-top-k``.
    Both flags repeat and take ``LABEL:LIST`` to set one heads' sweep."""
    from infer.tree import default_tree, validate_paths

    methods = []
    labels = [label for label, _ in heads_specs]
    for label, directory in heads_specs:
        model = infer.load(target, heads=directory)
        kind = model.heads.config.head_type

        def add(size: int, desc: str, kwargs: dict, label=label, kind=kind, model=model) -> None:
            methods.append(Method(f"{label} [{size} tok]", "heads", label, kind, size, desc, kwargs, model))

        if kind == "medusa":
            for opt in knob_for(args.tree, label, labels, "--tree") or ["default"]:
                # "default" is what infer.generate uses: a tree saved with the heads, else default_tree.
                if opt == "default":
                    tree, desc = None, "saved tree" if getattr(model.heads, "tree", None) else "default_tree"
                elif opt.isdigit():
                    tree, desc = default_tree(model.heads.config.num_heads, int(opt)), f"default_tree({opt})"
                else:
                    if not os.path.isfile(opt):
                        raise FileNotFoundError(f"--tree {opt!r}: not a size, 'default' or a JSON file")
                    with open(opt) as f:
                        tree = json.load(f)
                    tree = tree["tree"] if isinstance(tree, dict) else tree
                    validate_paths(tree)
                    desc = os.path.basename(opt)
                size = len(model.proposer(tree).tree) + 1
                add(size, f"static {desc}, {size - 1} drafts", {"tree": tree} if tree is not None else {})
        elif kind in ("eagle", "eagle3"):
            for opt in knob_for(args.total_tokens, label, labels, "--total-tokens") or ["default"]:
                kw = {"depth": args.depth, "draft_top_k": args.draft_top_k}
                if opt != "default":
                    if not opt.isdigit():
                        raise ValueError(f"--total-tokens: {opt!r} is not an integer or 'default'")
                    kw["total_tokens"] = int(opt)
                kw = {k: v for k, v in kw.items() if v is not None}
                prop = model.proposer(**kw)
                size = prop.total_tokens
                add(size, f"EAGLE-2 dynamic, depth {prop.depth}, top-k {prop.top_k}, {size} tokens", kw)
        else:
            methods.append(Method(label, "heads", label, kind, None, "default", {}, model))
    return methods


# ----------------------------------------------------------------------------- greedy check


@torch.inference_mode()
def tie_margin(target, seq: torch.Tensor, prompt_len: int, pos: int, a: int, b: int) -> float:
    """|logit[a] - logit[b]| of the target (one full forward over the common prefix) at new-token ``pos``."""
    logits = target(input_ids=seq[:, : prompt_len + pos]).logits[0, -1].float()
    return abs(float(logits[a] - logits[b]))


def first_difference(ref: torch.Tensor, out: torch.Tensor) -> int | None:
    """Index of the first differing position of two [1, L] sequences (a length difference counts)."""
    n = min(ref.shape[1], out.shape[1])
    diff = (ref[0, :n] != out[0, :n].to(ref.device)).nonzero()
    if len(diff):
        return int(diff[0, 0])
    return n if ref.shape[1] != out.shape[1] else None


# ----------------------------------------------------------------------------- verify cost


@torch.inference_mode()
def verify_cost(target, ks: list[int], prefix: int = 256, reps: int = 30) -> dict:
    """Latency of one target forward over k new tokens after a ``prefix``-token cache, ratio to k=1.

    The k values are interleaved within each repetition (so load changes hit all alike); median over
    repetitions after 5 warm-up rounds. Random token ids: the cost does not depend on the values.
    """
    from infer.cache import new_cache

    device = next(target.parameters()).device
    V = target.config.get_text_config().vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (1, prefix), generator=g).to(device)
    cache = new_cache()
    target(input_ids=ids, past_key_values=cache, use_cache=True)
    times = {k: [] for k in ks}
    for r in range(reps + 5):
        for k in ks:
            x = torch.randint(0, V, (1, k), generator=g).to(device)
            _sync(device)
            t = time.perf_counter()
            target(input_ids=x, past_key_values=cache, use_cache=True)
            _sync(device)
            if r >= 5:
                times[k].append(time.perf_counter() - t)
            cache.crop(-k)
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med[min(ks)]
    return {
        "prefix_tokens": prefix,
        "repetitions": reps,
        "ms": {str(k): round(v * 1e3, 3) for k, v in med.items()},
        "ratio_to_k1": {str(k): round(v / base, 3) for k, v in med.items()},
    }


# ----------------------------------------------------------------------------- aggregation


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    i = (len(s) - 1) * q
    lo, hi = math.floor(i), math.ceil(i)
    return s[lo] + (s[hi] - s[lo]) * (i - lo)


BOOTSTRAP_REPS = 2000


def total_rate(runs: list[Run]) -> float:
    """Σ tokens / Σ seconds over ``runs``: the tokens/s of the whole prompt set."""
    return sum(r.new_tokens for r in runs) / sum(r.seconds for r in runs)


def bootstrap_ratio_ci(
    runs: list[Run], base: list[Run], reps: int = BOOTSTRAP_REPS, seed: int = 0, level: float = 0.95
) -> list[float] | None:
    """Percentile bootstrap interval of the total-rate ratio (Σ tokens / Σ seconds of ``runs``) over
    (Σ tokens / Σ seconds of ``base``), resampling prompts with replacement and keeping each prompt's
    pair together (both ran on the same prompt, interleaved). None for fewer than 2 prompts.

    It covers prompt-to-prompt variation and the timing noise within this run, not a machine that is
    slower or faster in another run. Deterministic given ``seed``.
    """
    n = len(runs)
    if n < 2:
        return None
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n, (reps, n), generator=g)
    cols = [
        torch.tensor([float(getattr(r, k)) for r in rs], dtype=torch.float64)
        for rs in (runs, base)
        for k in ("new_tokens", "seconds")
    ]
    tok_a, sec_a, tok_b, sec_b = (c[idx].sum(1) for c in cols)
    ratios = (tok_a / sec_a) / (tok_b / sec_b)
    lo, hi = torch.quantile(ratios, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64))
    return [float(lo), float(hi)]


def compare(a: dict, b: dict, runs_a: list[Run], runs_b: list[Run]) -> dict:
    """Paired comparison of two methods on the same prompts (``--vs A:B``): the ratio of their total rates,
    its `bootstrap_ratio_ci`, and on how many prompts A was faster."""
    ratio = total_rate(runs_a) / total_rate(runs_b)
    wins = sum(
        x.new_tokens / x.seconds > y.new_tokens / y.seconds for x, y in zip(runs_a, runs_b, strict=True)
    )
    return {
        "a": a["method"],
        "b": b["method"],
        "ratio": ratio,
        "ci95": bootstrap_ratio_ci(runs_a, runs_b),
        "a_faster_on": wins,
        "n_prompts": len(runs_a),
        "tau_a": a["tau"],
        "tau_b": b["tau"],
    }


def summarise(method: Method, runs: list[Run], base: list[Run]) -> dict:
    """Aggregate one method's runs on one prompt set and mode against the plain runs (same prompts)."""
    steps = [s for r in runs if r.steps is not None for s in r.steps]
    have_steps = all(r.steps is not None for r in runs) and steps
    tps = [r.new_tokens / r.seconds for r in runs]
    base_tps = [r.new_tokens / r.seconds for r in base]
    total_speedup = total_rate(runs) / total_rate(base)
    per_prompt = [a / b for a, b in zip(tps, base_tps, strict=True)]
    tau = sum(steps) / len(steps) if have_steps else None
    split = None
    if all(r.total_s is not None and r.draft_s is not None and r.verify_s is not None for r in runs):
        d, v, t = (sum(getattr(r, k) for r in runs) for k in ("draft_s", "verify_s", "total_s"))
        split = {"draft": d, "verify": v, "bookkeeping": t - d - v, "total": t}
    return {
        "method": method.label,
        "kind": method.kind,
        "heads": method.heads,
        "head_type": method.head_type,
        "tree_size": method.tree_size,
        "tree": method.tree_desc,
        "n_prompts": len(runs),
        "new_tokens": sum(r.new_tokens for r in runs),
        "seconds": sum(r.seconds for r in runs),
        "tau": tau,
        "tau_histogram": {str(k): v for k, v in sorted(Counter(steps).items())} if have_steps else None,
        "tau_quantiles": {f"p{int(q * 100)}": quantile(steps, q) for q in (0.1, 0.5, 0.9)}
        if have_steps
        else None,
        "tokens_per_s": {"median": statistics.median(tps), "min": min(tps), "max": max(tps)},
        "speedup": {
            "total": total_speedup,
            "median": statistics.median(per_prompt),
            "ci95": bootstrap_ratio_ci(runs, base),
        },
        "efficiency": total_speedup / tau if tau else None,
        "time_split_s": split,
        "peak_memory_mib": max(r.peak_mib for r in runs),
        "identical": None,
        "near_tie_flips": None,
        "per_prompt": [
            {
                "new_tokens": r.new_tokens,
                "seconds": r.seconds,
                "tau": (sum(r.steps) / len(r.steps)) if r.steps else None,
            }
            for r in runs
        ],
    }


# ----------------------------------------------------------------------------- reporting


def _fmt(x, spec: str = ".2f", na: str = "n/a") -> str:
    return na if x is None else format(x, spec)


def _ci(d: dict) -> str:
    ci = d.get("ci95")
    return f" [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else ""


def markdown(report: dict) -> str:
    lines = [
        f"# selfspec benchmark ({report['date']})",
        "",
        f"Machine: {report['machine']['summary']}. Target: {report['settings']['target']} "
        f"({report['settings']['dtype']}). {report['settings']['max_new_tokens']} new tokens per prompt"
        f"{'' if report['settings']['stop_at_eos'] else ' (EOS ignored: fixed length)'}; sample = T "
        f"{SAMPLE_TEMPERATURE}.",
        "",
        f"Command: `{report['command']}`",
        "",
        f"τ: {TAU_DEFINITION}. Speedup: {SPEEDUP_DEFINITION}. Efficiency = speedup (total) / τ. "
        f"Peak memory: {report['peak_memory_kind']}. Time split: draft / verify / bookkeeping seconds "
        "summed over prompts (n/a: not reported by this infer.generate). [a-b]: 95% bootstrap interval "
        "over prompts (paired with target.generate on each prompt; it does not cover run-to-run drift).",
        "",
        "| prompts | mode | method | tree | τ (p10/p50/p90) | tok/s median (min-max) | speedup total | "
        "speedup median | efficiency | draft/verify/other s | peak MiB | identical |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        q = r["tau_quantiles"]
        tau = _fmt(r["tau"]) + (f" ({q['p10']:.0f}/{q['p50']:.0f}/{q['p90']:.0f})" if q else "")
        t = r["tokens_per_s"]
        split = r["time_split_s"]
        split_s = "/".join(f"{split[k]:.1f}" for k in ("draft", "verify", "bookkeeping")) if split else "n/a"
        ident = "-" if r["identical"] is None else f"{r['identical']}/{r['n_prompts']}"
        if r["near_tie_flips"]:
            ident += f" ({r['near_tie_flips']} near-tie)"
        lines.append(
            f"| {r['prompt_set']} | {r['mode']} | {r['method']} | {r['tree'] or '-'} | {tau} | "
            f"{t['median']:.1f} ({t['min']:.1f}-{t['max']:.1f}) | {r['speedup']['total']:.2f}x{_ci(r['speedup'])} | "
            f"{r['speedup']['median']:.2f}x | {_fmt(r['efficiency'])} | {split_s} | "
            f"{r['peak_memory_mib']:.0f} | {ident} |"
        )
    if report.get("comparisons"):
        lines += [
            "",
            "Paired comparisons (`--vs A:B`): tokens/s of A over B on the same prompts, with the 95% "
            "bootstrap interval over prompts, and on how many prompts A was faster:",
            "",
            "| prompts | mode | A | B | A / B | A faster on | τ A / τ B |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in report["comparisons"]:
            lines.append(
                f"| {c['prompt_set']} | {c['mode']} | {c['a']} | {c['b']} | {c['ratio']:.3f}{_ci(c)} | "
                f"{c['a_faster_on']}/{c['n_prompts']} | {_fmt(c['tau_a'])} / {_fmt(c['tau_b'])} |"
            )
    if report.get("verify_cost"):
        vc = report["verify_cost"]
        ks = list(vc["ms"])
        lines += [
            "",
            f"Verify cost on this machine: one target forward over k new tokens after a "
            f"{vc['prefix_tokens']}-token prefix, median of {vc['repetitions']}, ratio to k={ks[0]}:",
            "",
            "| k | " + " | ".join(ks) + " |",
            "|---|" + "---|" * len(ks),
            "| ms | " + " | ".join(f"{vc['ms'][k]:.2f}" for k in ks) + " |",
            "| ratio | " + " | ".join(f"{vc['ratio_to_k1'][k]:.2f}" for k in ks) + " |",
        ]
    if report["mismatches"]:
        lines += ["", "Greedy mismatches against target.generate:", ""]
        for m in report["mismatches"]:
            lines.append(
                f"- {m['prompt_set']} prompt {m['prompt_index']}, {m['method']}: first difference at new token "
                f"{m['position']} (target {m['expected']}, got {m['got']}), logit margin "
                f"{_fmt(m['logit_margin'], '.3f')} -> {'near-tie (rounding)' if m['near_tie'] else 'BUG'}"
            )
    return "\n".join(lines) + "\n"


def plot(report: dict, path: str) -> None:
    """Speedup (top) and τ (bottom) against tree size, one column per prompt set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(report["prompt_sets"])
    fig, axes = plt.subplots(2, len(sets), figsize=(5.5 * len(sets), 7), squeeze=False)
    names = sorted({r["heads"] for r in report["results"] if r["kind"] == "heads"})
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    colors = {n: cmap(i % cmap.N) for i, n in enumerate(names)}
    for col, name in enumerate(sets):
        rows = [r for r in report["results"] if r["prompt_set"] == name]
        lines: dict[tuple[str, str], list[dict]] = {}
        for r in rows:
            if r["kind"] == "heads" and r["tree_size"] is not None:
                lines.setdefault((r["heads"], r["mode"]), []).append(r)
        for (heads, mode), rs in sorted(lines.items()):
            rs = sorted(rs, key=lambda r: r["tree_size"])
            x = [r["tree_size"] for r in rs]
            style = "-o" if mode == "greedy" else "--s"
            kw = {"color": colors[heads], "label": f"{heads} ({mode})"}  # one colour per heads, all panels
            axes[0][col].plot(x, [r["speedup"]["total"] for r in rs], style, **kw)
            axes[1][col].plot(x, [r["tau"] for r in rs], style, **kw)
        for r in rows:
            if r["kind"] == "prompt_lookup":
                axes[0][col].axhline(
                    r["speedup"]["total"],
                    color="grey",
                    ls=":" if r["mode"] == "greedy" else "-.",
                    lw=1,
                    label=f"prompt lookup ({r['mode']})",
                )
        axes[0][col].axhline(1.0, color="black", lw=0.8)
        axes[0][col].set_title(f"{name}: speedup over target.generate")
        axes[1][col].set_title(f"{name}: τ (tokens per verify, bonus incl.)")
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xlabel("tree size (tokens verified per step, root incl.)")
            ax.grid(alpha=0.3)
    # One legend beside the panels: per-panel legends cover the data once there are many methods.
    legend: dict[str, object] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    if legend:
        fig.legend(
            list(legend.values()), list(legend), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8
        )
    fig.suptitle(
        f"{report['settings']['target']} ({report['settings']['dtype']}), {report['machine']['summary']}",
        fontsize=9,
    )
    fig.tight_layout()
    from heads.io import atomic_write

    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png", bbox_inches="tight"))
    plt.close(fig)


def machine_info(device: torch.device) -> dict:
    import transformers

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.+)", f.read())
            cpu = m.group(1).strip() if m else cpu
    info = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
    }
    where = info["gpu"] or f"{cpu}, {info['cores']} cores, {info['torch_threads']} torch threads"
    info["summary"] = f"{where}; torch {torch.__version__}, transformers {transformers.__version__}"
    return info


# ----------------------------------------------------------------------------- main


def _measure(args, target, tokenizer, prompts, methods, modes, timing, mem, tie_tol, bar, pairs=()):
    """The interleaved runs and their summaries; returns (result rows, greedy mismatches, comparisons of
    the ``pairs`` of method labels)."""
    results, mismatches, comparisons = [], [], []
    for mode in modes:
        gc = generation_config(
            target,
            tokenizer,
            sampling=mode == "sample",
            max_new_tokens=args.max_new_tokens,
            stop_at_eos=args.stop_at_eos,
        )
        for set_name, ids_list in prompts.items():
            for ids in ids_list[: args.warmup]:
                for m in methods:
                    m.run(target, ids, gc, args.seed, timing, mem)
                    bar.update()
            runs: dict[str, list[Run]] = {m.label: [] for m in methods}
            for i, ids in enumerate(ids_list):
                k = i % len(methods)  # rotate the order so no method always runs first
                for m in methods[k:] + methods[:k]:
                    r = m.run(target, ids, gc, args.seed * 1000 + i, timing, mem)
                    if not args.stop_at_eos and r.new_tokens != args.max_new_tokens:
                        raise RuntimeError(
                            f"{m.label} generated {r.new_tokens} tokens, not --max-new-tokens "
                            f"{args.max_new_tokens} ({set_name} prompt {i}, {mode}): the runs would not be "
                            "comparable (EOS not disabled?)"
                        )
                    runs[m.label].append(r)
                    bar.update()
            base = runs[methods[0].label]
            for m in methods:
                row = {"prompt_set": set_name, "mode": mode, **summarise(m, runs[m.label], base)}
                if mode == "greedy" and m.kind != "plain":
                    row["identical"], row["near_tie_flips"] = 0, 0
                    for i, (ref, got) in enumerate(zip(base, runs[m.label], strict=True)):
                        pos = first_difference(ref.sequences, got.sequences)
                        if pos is None:
                            row["identical"] += 1
                            continue
                        T = ids_list[i].shape[1]
                        new_pos = pos - T
                        a = int(ref.sequences[0, pos]) if pos < ref.sequences.shape[1] else None
                        b = int(got.sequences[0, pos]) if pos < got.sequences.shape[1] else None
                        margin = (
                            tie_margin(target, ref.sequences, T, new_pos, a, b)
                            if a is not None and b is not None and new_pos >= 0
                            else None
                        )
                        near = margin is not None and margin <= tie_tol
                        row["near_tie_flips"] += near
                        mm = {
                            "prompt_set": set_name,
                            "prompt_index": i,
                            "method": m.label,
                            "position": new_pos,
                            "expected": a,
                            "got": b,
                            "logit_margin": margin,
                            "near_tie": near,
                            "prompt_tail": tokenizer.decode(ids_list[i][0, -40:]),
                        }
                        mismatches.append(mm)
                        print(
                            f"\n*** GREEDY MISMATCH *** {set_name} prompt {i}, {m.label}: outputs differ from "
                            f"target.generate at new token {new_pos} (target {a} {tokenizer.decode([a]) if a is not None else ''!r}, "
                            f"got {b} {tokenizer.decode([b]) if b is not None else ''!r}); target logit margin "
                            f"{_fmt(margin, '.4f')} {'<=' if near else '>'} tie tolerance {tie_tol} -> "
                            f"{'near-tie flip from rounding (' + str(target.dtype) + ')' if near else 'a BUG'}\n"
                            f"    prompt ends: {mm['prompt_tail']!r}",
                            file=sys.stderr,
                            flush=True,
                        )
                results.append(row)
            rows = {r["method"]: r for r in results if r["prompt_set"] == set_name and r["mode"] == mode}
            for a, b in pairs:
                c = compare(rows[a], rows[b], runs[a], runs[b])
                comparisons.append({"prompt_set": set_name, "mode": mode, **c})
    return results, mismatches, comparisons


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--target", default="demo", help="'demo' / 'demo-tiny' (built-in demo target), a dir or Hub id"
    )
    ap.add_argument(
        "--heads",
        action="append",
        default=[],
        metavar="[LABEL=]DIR",
        help="heads checkpoint (dir or Hub id), repeatable; LABEL names it in the tables",
    )
    ap.add_argument(
        "--prompts",
        action="append",
        default=[],
        metavar="[NAME=]JSONL",
        help="prompt set (rows with 'text' or chat 'messages'), repeatable. Default for the demo target: "
        "its held-out code prompts ('code') and a chat set built from other held-out prompts ('chat')",
    )
    ap.add_argument("--limit", type=int, default=8, help="prompts per set (the first N rows)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--stop-at-eos", action="store_true", help="stop at EOS (default: fixed-length runs)")
    ap.add_argument("--dtype", default="bf16", help="target dtype: bf16 (default), fp16, fp32 or auto")
    ap.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda if available)")
    ap.add_argument("--modes", default="greedy,sample", help="comma list of greedy, sample (T=0.7)")
    ap.add_argument(
        "--prompt-lookup", type=int, default=3, help="HF prompt_lookup_num_tokens baseline; 0: off"
    )
    ap.add_argument("--warmup", type=int, default=1, help="untimed warm-up prompts per set and mode")
    ap.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="[LABEL:]LIST",
        help="Medusa trees: comma list of node counts, 'default' (the heads' saved tree or default_tree), "
        "JSON files of paths; LABEL: limits it to those heads; repeatable",
    )
    ap.add_argument(
        "--total-tokens",
        action="append",
        default=[],
        metavar="[LABEL:]LIST",
        help="EAGLE-2 tree sizes (root incl.): comma list or 'default'; LABEL: limits it to those heads",
    )
    ap.add_argument("--depth", type=int, default=None, help="EAGLE-2 max draft depth")
    ap.add_argument(
        "--draft-top-k", type=int, default=None, help="EAGLE-2 frontier width / children per node"
    )
    ap.add_argument(
        "--verify-cost", default="1,2,4,8,16,32,64", help="k values to time a k-token verify; '' off"
    )
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (per prompt: seed*1000 + index)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    ap.add_argument(
        "--tie-tol",
        type=float,
        default=None,
        help="greedy near-tie tolerance in logits (default 0 in fp32, 0.25 in bf16, 0.05 in fp16)",
    )
    ap.add_argument("--strict", action="store_true", help="fail on any greedy mismatch, near-ties included")
    ap.add_argument(
        "--no-time-split",
        action="store_true",
        help="don't ask infer.generate for the draft/verify/bookkeeping split (on GPU it synchronises per phase)",
    )
    ap.add_argument(
        "--vs",
        action="append",
        default=[],
        metavar="A:B",
        help="paired comparison of two method labels (repeatable), e.g. 'medusa-tuned:medusa': "
        "ratio of tokens/s with a bootstrap 95%% interval over prompts",
    )
    ap.add_argument("--out", default="out/bench", help="output directory")
    return ap


def run(argv: list[str] | None = None, extra_methods: list[Method] | None = None) -> tuple[dict, int]:
    """Run the benchmark; returns (report, exit status). ``extra_methods`` are appended (for tests)."""
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    modes = parse_list(args.modes)
    if not modes or any(m not in ("greedy", "sample") for m in modes):
        raise ValueError(f"--modes must list greedy and/or sample, got {args.modes!r}")
    if args.limit < 1 or args.max_new_tokens < 1:
        raise ValueError("--limit and --max-new-tokens must be >= 1")
    from transformers import AutoTokenizer

    from heads import load_target
    from train import demo

    target_path, size = args.target, {"demo": "full", "demo-tiny": "tiny"}.get(args.target)
    if size:
        target_path = demo.ensure_demo_target(size)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    target = load_target(target_path, dtype=args.dtype, device=device)
    target.to(device)
    tokenizer = AutoTokenizer.from_pretrained(target_path)
    os.makedirs(args.out, exist_ok=True)

    sets: dict[str, str] = {}
    for spec in args.prompts:
        name, _, path = spec.rpartition("=")
        sets[name or os.path.splitext(os.path.basename(path))[0]] = path
    if not sets:
        if not size:
            raise ValueError("--prompts is required for a non-demo target")
        code = demo.ensure_demo_data(size=size)["prompts"]
        sets = {"code": code, "chat": demo_chat_prompts(code, os.path.join(args.out, "chat_prompts.jsonl"))}
    prompts = {
        name: [
            render_prompt(row, tokenizer, f"{path} row {i + 1}").to(device)
            for i, row in enumerate(read_prompts(path)[: args.limit])
        ]
        for name, path in sets.items()
    }

    heads_specs = []
    for spec in args.heads:
        label, _, path = spec.rpartition("=")
        heads_specs.append((label or os.path.basename(os.path.normpath(path)), path))
    methods = [Method("target.generate", "plain")]
    if args.prompt_lookup > 0:
        methods.append(
            Method(
                f"prompt-lookup ({args.prompt_lookup})",
                "prompt_lookup",
                options={"prompt_lookup_num_tokens": args.prompt_lookup},
            )
        )
    methods += heads_methods(args, target, heads_specs)
    methods += extra_methods or []
    dup = [k for k, v in Counter(m.label for m in methods).items() if v > 1]
    if dup:
        raise ValueError(
            f"two configurations are both labelled {dup}: give the --heads distinct LABEL=DIR names"
        )
    pairs = parse_pairs(args.vs, [m.label for m in methods])
    import inspect

    timing = "timing" in inspect.signature(infer.generate).parameters and not args.no_time_split
    mem = PeakMemory(device)
    tie_tol = args.tie_tol if args.tie_tol is not None else DEFAULT_TIE_TOL.get(target.dtype, 0.0)
    n_calls = len(modes) * sum(len(p) + min(args.warmup, len(p)) for p in prompts.values()) * len(methods)

    from tqdm.auto import tqdm

    bar = tqdm(total=n_calls, desc="benchmark", unit="run", dynamic_ncols=True)
    # transformers fills a None eos_token_id from the model's own generation_config, so fixed-length
    # runs need it cleared there too (restored below).
    saved_eos = target.generation_config.eos_token_id
    if not args.stop_at_eos:
        target.generation_config.eos_token_id = None
    try:
        results, mismatches, comparisons = _measure(
            args, target, tokenizer, prompts, methods, modes, timing, mem, tie_tol, bar, pairs
        )
    finally:
        target.generation_config.eos_token_id = saved_eos
    bar.close()

    ks = [int(k) for k in parse_list(args.verify_cost)]
    report = {
        "schema": SCHEMA,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(
            [
                os.path.relpath(sys.argv[0]) if argv is None else "scripts/benchmark.py",
                *(sys.argv[1:] if argv is None else argv),
            ]
        ),
        "machine": machine_info(device),
        "settings": {
            "target": args.target if size else target_path,
            "target_path": target_path,
            "dtype": str(target.dtype).replace("torch.", ""),
            "max_new_tokens": args.max_new_tokens,
            "stop_at_eos": args.stop_at_eos,
            "modes": modes,
            "sample_temperature": SAMPLE_TEMPERATURE,
            "limit": args.limit,
            "warmup": args.warmup,
            "seed": args.seed,
            "prompt_lookup_num_tokens": args.prompt_lookup,
            "tie_tolerance": tie_tol,
            "timing_split_available": timing,
        },
        "tau_definition": TAU_DEFINITION,
        "speedup_definition": SPEEDUP_DEFINITION,
        "peak_memory_kind": mem.kind,
        "prompt_sets": {name: {"path": path, "n": len(prompts[name])} for name, path in sets.items()},
        "verify_cost": verify_cost(target, ks) if ks else None,
        "results": results,
        "comparisons": comparisons,
        "mismatches": mismatches,
    }
    bugs = [m for m in mismatches if not m["near_tie"] or args.strict]
    report["ok"] = not bugs
    _atomic_text(os.path.join(args.out, "results.json"), json.dumps(report, indent=2) + "\n")
    _atomic_text(os.path.join(args.out, "results.md"), markdown(report))
    plot(report, os.path.join(args.out, "speedup_vs_tree.png"))
    return report, 0 if not bugs else 1


def main() -> None:
    try:
        report, status = run()
    except (ValueError, FileNotFoundError) as e:  # bad input: a clear message, no traceback
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    with open(os.path.join(build_parser().parse_args().out, "results.md")) as f:
        print(f.read())
    if status:
        n = sum(1 for m in report["mismatches"] if not m["near_tie"])
        print(
            f"error: {len(report['mismatches'])} greedy mismatch(es) against target.generate "
            f"({n} not explained by a near-tie); see above and results.json 'mismatches'",
            file=sys.stderr,
        )
    sys.exit(status)


if __name__ == "__main__":
    main()
