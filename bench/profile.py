"""Where the time of one `infer.generate` step goes, and the speedup over `target.generate`.

    python scripts/profile_generate.py --heads out/demo-medusa out/demo-eagle [--dtype bf16] \
        [--prompts 8] [--max-new-tokens 128] [--repeats 3] [--sample] [--threads N] [--cprofile]

(``scripts/profile_generate.py`` is a thin CLI over `main` here.)

Two measurements, in one process, on held-out prompts of the heads' own target (or ``--target``): the
demo's held-out code for a demo target, MT-Bench's first turns for any other (`bench.prompt_sets`):

1. **Speed**, interleaved (target.generate, heads 1, heads 2, ..., then again) after a warm-up and
   repeated ``--repeats`` times; per configuration the median tokens/s over all prompt runs, the
   speedup (ratio of medians to target.generate), τ and efficiency = speedup / τ. Greedy outputs
   are compared with target.generate (in bf16 a near-tie argmax can flip, see README).
2. **Split** of the decode steps into: draft (the proposer's propose/advance), mask (building the
   4D tree mask, or updating the tree-attention mask buffer), verify (the target forward), accept
   (the acceptance rule), compact (KV cache compaction) and other (the loop's own bookkeeping: the
   host sync, emitting, streaming and, when sampling, the warped softmax over the tree's logits). It
   is measured by wrapping the functions `infer.generate.speculative_generate` and its
   `infer.runner.TreeRunner` call with wall-clock timers (CUDA-synchronised on GPU), so it needs no
   change to the loop; the wrapped run is separate from the speed run, whose timings stay unperturbed.

``--cprofile`` additionally prints the top functions by own time (cProfile) for each head.
The machine's other load shows up directly in the numbers: repeat and read the medians.
"""

from __future__ import annotations

import contextlib
import cProfile
import importlib
import io
import json
import os
import pstats
import statistics
import time
from dataclasses import asdict, dataclass

import torch

import demo
import infer
from bench.prompt_sets import comparison_rows, demo_size
from heads.config import option, parse_cli, repeatable
from heads.io import atomic_text
from infer.prompts import render_prompt

G = importlib.import_module("infer.generate")  # the module (``infer.generate`` is also the function)
R = importlib.import_module("infer.runner")  # the target side of the loop (forwards, masks, cache)

SECTIONS = ("draft", "mask", "verify", "accept", "compact", "other")


@dataclass
class ProfileOptions:
    """Where the time of one infer.generate step goes, and the speedup over target.generate."""

    heads: list[str] = repeatable(help="heads directories (e.g. out/demo-medusa)")
    target: str | None = option(
        None,
        help="target name or dir (default: the first heads' own); 'demo' / 'demo-tiny' = the demo targets",
    )
    dtype: str = "bf16"
    prompts: int = 8
    max_new_tokens: int = 128
    prompt_tokens: int = option(128, help="truncate prompts to their last N tokens")
    repeats: int = option(3, help="interleaved rounds over all prompts")
    sample: bool = option(False, help="T=0.7 sampling (top-k/top-p off) instead of greedy")
    threads: int | None = option(None, help="torch CPU threads (default: all cores)")
    attn: str | None = option(None, help="attn_implementation (sdpa, eager); default: the model's")
    cprofile: bool = option(False, help="print cProfile's top functions per head")
    json: str | None = option(None, help="write the results here")

    def __post_init__(self) -> None:
        if not self.heads:
            raise ValueError("--heads is required: one or more heads directories")


class Split:
    """Accumulates wall-clock seconds per section by wrapping callables."""

    def __init__(self, device: torch.device) -> None:
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.t = dict.fromkeys(SECTIONS, 0.0)
        self.in_prefill = False  # the first target forward of a generate call is the prefill

    def wrap(self, section: str, fn):
        def timed(*args, **kwargs):
            if section == "verify" and self.in_prefill:
                self.in_prefill = False
                return fn(*args, **kwargs)
            self.sync()
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self.sync()
            self.t[section] += time.perf_counter() - t0
            return out

        return timed


@contextlib.contextmanager
def split_timers(split: Split, model: infer.SpecModel):
    """Wrap the names `speculative_generate` and its `TreeRunner` look up in their modules, and the
    proposer's methods."""
    names = {
        (R, "run_target_lean"): "verify",
        (R.BatchTreeMask, "__call__"): "mask",  # the in-place masks of eager targets and sliding windows
        (R.TreeMask, "__call__"): "mask",  # the tree-attention mask buffer (sdpa targets)
        (R, "compact"): "compact",
        (G, "accept_greedy"): "accept",
        (G, "accept_exact"): "accept",
        (G, "accept_typical"): "accept",
    }
    saved = {(mod, n): getattr(mod, n) for mod, n in names}  # a renamed function fails here, loudly
    orig_proposer = model.proposer

    def proposer(*a, **kw):
        p = orig_proposer(*a, **kw)  # called once per generate, before the prefill
        split.in_prefill = True
        p.propose = split.wrap("draft", p.propose)
        p.advance = split.wrap("draft", p.advance)
        return p

    try:
        for (mod, n), fn in saved.items():
            setattr(mod, n, split.wrap(names[mod, n], fn))
        model.proposer = proposer
        yield
    finally:
        for (mod, n), fn in saved.items():
            setattr(mod, n, fn)
        model.proposer = orig_proposer


@dataclass
class Setup:
    """What every measurement shares: the models (one target for all heads), prompts and the kwargs."""

    models: list
    names: list[str]
    encoded: list[torch.Tensor]
    gen: dict
    ref_kw: dict

    def run_ref(self, ids: torch.Tensor) -> torch.Tensor:
        return self.models[0].target.generate(ids, **self.ref_kw)

    def run_spec(self, model, ids: torch.Tensor):
        return infer.generate(model, ids, **self.gen)


def setup(o: ProfileOptions) -> Setup:
    """Load the heads (one shared target) and the held-out prompts (`bench.prompt_sets.comparison_rows`),
    each cut to its last ``prompt_tokens`` tokens."""
    size = demo_size(o.heads[0], o.target)  # before any loading: a demo target for other heads fails here
    target = demo.resolve(o.target) if o.target else None
    models = [infer.load(target, heads=h, dtype=o.dtype, attn_implementation=o.attn) for h in o.heads]
    # one target shared by all heads, so target.generate and every head run the same weights
    for m in models[1:]:
        m.target = models[0].target
    tok, tgt = models[0].tokenizer, models[0].target
    device = next(tgt.parameters()).device
    prompts_path, rows = comparison_rows(size, o.prompts)
    encoded = [
        render_prompt(row, tok, f"{prompts_path} row {i + 1}")[:, -o.prompt_tokens :].to(device)
        for i, row in enumerate(rows)
    ]
    sample = dict(do_sample=True, temperature=0.7, top_k=0, top_p=1.0) if o.sample else dict(do_sample=False)
    gen = dict(max_new_tokens=o.max_new_tokens, eos_token_id=[], **sample)
    ref_kw = dict(max_new_tokens=o.max_new_tokens, eos_token_id=None, pad_token_id=tok.pad_token_id, **sample)
    names = ["target.generate"] + [m.heads.config.head_type for m in models]
    return Setup(models, names, encoded, gen, ref_kw)


def speed(o: ProfileOptions, s: Setup) -> dict:
    """Interleaved rounds of target.generate and every heads; prints and returns the speed table."""
    for m in s.models:  # warm-up
        s.run_spec(m, s.encoded[0])
    s.run_ref(s.encoded[0])
    names = s.names
    tps = {n: [] for n in names}
    taus = {n: [] for n in names[1:]}
    same = {n: 0 for n in names[1:]}
    for _ in range(o.repeats):
        for ids in s.encoded:
            t = time.perf_counter()
            ref = s.run_ref(ids)
            tps[names[0]].append((ref.shape[1] - ids.shape[1]) / (time.perf_counter() - t))
            for n, m in zip(names[1:], s.models, strict=True):
                t = time.perf_counter()
                out = s.run_spec(m, ids)
                tps[n].append(out.stats.new_tokens / (time.perf_counter() - t))
                taus[n].append(out.stats.mean_accepted_length)
                same[n] += torch.equal(ref, out.sequences)
    ref_tps = statistics.median(tps[names[0]])
    runs = o.repeats * len(s.encoded)
    mode = "T=0.7 sampling" if o.sample else "greedy"
    print(
        f"\n## speed: {mode}, dtype {o.dtype}, {torch.get_num_threads()} threads, "
        f"{len(s.encoded)} prompts x {o.repeats} interleaved rounds, {o.max_new_tokens} new tokens\n"
    )
    print(
        "| config | tokens/s median (min-max) | speedup | τ | efficiency | identical |\n|---|---|---|---|---|---|"
    )
    table = {}
    for n in names:
        med = statistics.median(tps[n])
        row = {"tokens_per_s": med, "min": min(tps[n]), "max": max(tps[n]), "speedup": med / ref_tps}
        if n in taus:
            tau = statistics.mean(taus[n])
            row.update(tau=tau, efficiency=row["speedup"] / tau)
            if not o.sample:  # sampled runs draw from other random streams: equality means nothing
                row["identical"] = f"{same[n]}/{runs}"
        table[n] = row
        print(
            f"| {n} | {med:.1f} ({row['min']:.1f}-{row['max']:.1f}) | {row['speedup']:.2f}x | "
            f"{row.get('tau', 1.0):.2f} | {row.get('efficiency', 1.0):.2f} | {row.get('identical', '-')} |"
        )
    return table


def split_table(s: Setup) -> dict:
    """The decode loop's sections per step for every heads (a separate, wrapped run); prints and returns it."""
    print("\n## split of the decode loop (ms per step, % of the generate call)\n")
    print("| heads | steps | " + " | ".join(SECTIONS) + " | prefill | total ms/step |")
    print("|---|---|" + "---|" * (len(SECTIONS) + 2))
    device = next(s.models[0].target.parameters()).device
    out_table = {}
    for n, m in zip(s.names[1:], s.models, strict=True):
        split = Split(device)
        steps, total, prefill = 0, 0.0, 0.0
        with split_timers(split, m):
            for ids in s.encoded:
                t = time.perf_counter()
                out = s.run_spec(m, ids)
                total += time.perf_counter() - t
                steps += len(out.stats.accepted_lengths)
                prefill += out.stats.prefill_s
        decode = total - prefill
        split.t["other"] = decode - sum(v for k, v in split.t.items() if k != "other")
        cells = [f"{1e3 * split.t[x] / steps:.2f} ({100 * split.t[x] / total:.0f}%)" for x in SECTIONS]
        print(
            f"| {n} | {steps} | "
            + " | ".join(cells)
            + f" | {100 * prefill / total:.0f}% | {1e3 * decode / steps:.2f} |"
        )
        out_table[n] = {"steps": steps, "total_s": total, "prefill_s": prefill, **split.t}
    return out_table


def cprofile_top(s: Setup, n_top: int = 25) -> None:
    """Print cProfile's top functions by own time for each heads."""
    for n, m in zip(s.names[1:], s.models, strict=True):
        prof = cProfile.Profile()
        prof.enable()
        for ids in s.encoded:
            s.run_spec(m, ids)
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(n_top)
        print(f"\n## cProfile {n} (top {n_top} by own time)\n{buf.getvalue()}")


def main(argv: list[str] | None = None) -> dict:
    """The script: speed table, split table, optionally cProfile; ``--json`` gets the results."""
    o = parse_cli(ProfileOptions, argv, prog="scripts/profile_generate.py")
    torch.set_num_threads(o.threads or os.cpu_count() or 1)
    if o.json:
        os.makedirs(os.path.dirname(os.path.abspath(o.json)), exist_ok=True)  # fail now, not after the run
    try:
        s = setup(o)
    except (ValueError, FileNotFoundError) as e:  # bad input: the message, not a traceback
        raise SystemExit(f"error: {e}") from None
    results = {"args": asdict(o), "speed": speed(o, s), "split": split_table(s)}
    if o.cprofile:
        cprofile_top(s)
    if o.json:
        atomic_text(o.json, json.dumps(results, indent=1))
    return results
