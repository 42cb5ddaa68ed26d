"""Cost of the target side of `infer.generate` on a random Llama: prefill and one tree-verify step.

    python scripts/bench_target_step.py [--lengths 512 1024 2048 4096] [--threads 1] [--out results/...]

A thin command line over `bench.target_step` (what is measured, and how, is in its docstring).
"""

import os
import sys

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # bench/ sits beside the packages

from bench.target_step import main  # noqa: E402

if __name__ == "__main__":
    main()
