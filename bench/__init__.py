"""Benchmark speculative decoding against plain decoding: τ, tokens/s, speedup, efficiency, time split.

The machinery of ``scripts/benchmark.py`` (a thin CLI over `run`): `methods` (what is compared), `measure`
(timing, memory, forward counting, verify cost), `stats` (aggregation, bootstrap), `report` (markdown,
plot), `machine` (where it ran), `prompt_sets`, `run` (options and the interleaved runs), `device_check`
(the GPU check of ``scripts/gpu_check.py``).

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
  e.g. a tuned tree against the default one, plus on how many prompts A was faster, and τ A - τ B with
  its 95% paired bootstrap interval over prompts (is one head's τ lead more than prompt-to-prompt noise?).
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

from bench.machine import machine_info
from bench.measure import ForwardRecorder, PeakMemory, first_difference, tie_margin, verify_cost
from bench.methods import SAMPLE_TEMPERATURE, Method, Run, generation_config, heads_methods
from bench.report import SCHEMA, SPEEDUP_DEFINITION, TAU_DEFINITION, markdown, plot
from bench.run import DEFAULT_TIE_TOL, BenchmarkOptions, benchmark, main, parse_pairs, run
from bench.stats import bootstrap_ratio_ci, bootstrap_tau_diff_ci, compare, summarise, total_rate

__all__ = [
    "DEFAULT_TIE_TOL",
    "SAMPLE_TEMPERATURE",
    "SCHEMA",
    "SPEEDUP_DEFINITION",
    "TAU_DEFINITION",
    "BenchmarkOptions",
    "ForwardRecorder",
    "Method",
    "PeakMemory",
    "Run",
    "benchmark",
    "bootstrap_ratio_ci",
    "bootstrap_tau_diff_ci",
    "compare",
    "first_difference",
    "generation_config",
    "heads_methods",
    "machine_info",
    "main",
    "markdown",
    "parse_pairs",
    "plot",
    "run",
    "summarise",
    "tie_margin",
    "total_rate",
    "verify_cost",
]
