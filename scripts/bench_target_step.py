"""Cost of the target side of `infer.generate` on a random Llama: prefill and one tree-verify step.

    python scripts/bench_target_step.py [--lengths 512 1024 2048 4096] [--threads 1] [--out results/...]

A thin command line over `infer.benchmark.target_step` (what is measured, and how, is in its docstring).
"""

from infer.benchmark.target_step import main

if __name__ == "__main__":
    main()
