"""Cost against length: tokens/s and per-step time of infer.generate and target.generate from 128 new
tokens up to the target's whole context (measured, never asserted).

    python scripts/bench_length.py --out results/length [--target demo-tiny] [--heads eagle]
        [--repeats 2] [--threads 1] [--train-steps 300]

See `bench.length` for what is measured and how.
"""

from __future__ import annotations

import os
import sys

from heads.config import parse_cli

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # bench/ sits beside the packages
from bench.length import BenchLengthOptions, bench_length  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    return bench_length(
        parse_cli(BenchLengthOptions, argv, prog="bench_length.py", description=__doc__.split("\n")[0]), argv
    )


if __name__ == "__main__":
    main()
