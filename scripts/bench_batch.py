"""Batched speculative decoding: total tokens/s at batch 1, 4 and 8 (measured, never asserted).

    python scripts/bench_batch.py --out results/batch [--batches 1 4 8] [--max-new-tokens 64]
        [--repeats 3] [--threads 1] [--heads medusa eagle] [--train-steps 300]

What it trains, measures and writes: `bench.batch` (options: ``BenchBatchOptions``).
"""

from __future__ import annotations

import os
import sys

from heads.config import parse_cli

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # bench/ sits beside the packages
from bench.batch import BenchBatchOptions, bench_batch  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    return bench_batch(
        parse_cli(BenchBatchOptions, argv, prog="bench_batch.py", description=__doc__.split("\n")[0]), argv
    )


if __name__ == "__main__":
    main()
