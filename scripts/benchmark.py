"""Benchmark speculative decoding against plain decoding: τ, tokens/s, speedup, efficiency, time split.

    python scripts/benchmark.py --target demo --heads medusa=out/demo-medusa --heads eagle=out/demo-eagle \\
        --modes greedy,sample --prompt-lookup 3 --total-tokens 16,32,60 --out out/bench

A thin command line over `bench` (its docstring defines τ, speedup, efficiency and what is
measured; ``--help`` lists the options, `bench.BenchmarkOptions`). Exit status 1 on a greedy
mismatch with ``target.generate`` that is not a near-tie, 2 on bad input.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # bench/ sits beside the packages

from bench import main  # noqa: E402  (after the offline default: transformers reads it at import)

if __name__ == "__main__":
    sys.exit(main())
