"""Does compile= help on this CPU? infer.generate with and without torch.compile of the verify and draft
steps, for Medusa, EAGLE and EAGLE-3 heads (measured, never asserted).

    python scripts/bench_compile.py --out results/compile [--heads medusa,eagle,eagle3] [--calls 3]
        [--max-new-tokens 64] [--threads 1] [--backend inductor]

See `bench.compile_step` for what is measured and how.
"""

from __future__ import annotations

import os
import sys

from heads.config import parse_cli

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # bench/ sits beside the packages
from bench.compile_step import BenchCompileOptions, bench_compile  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    return bench_compile(
        parse_cli(BenchCompileOptions, argv, prog="bench_compile.py", description=__doc__.split("\n")[0]),
        argv,
    )


if __name__ == "__main__":
    main()
