"""The GPU check: tree-verify cost (k = 1..64, tree attention vs the old float mask) against a
1-token decode, host syncs per step, and fp32 greedy identity with an oracle draft, on a ~1B random Llama.

    python scripts/gpu_check.py --out results/gpu-check/gpu_check.json   # on a CUDA machine, < 8 minutes
    python scripts/gpu_check.py --small --out /tmp/gpu_check.json        # the same code on a tiny CPU model

A thin command line over `bench.device_check` (what each part measures is in its docstring).
Exit status 1 on any greedy mismatch (or drafts not accepted deep), 2 on bad input.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # bench/ sits beside the packages

from bench.device_check import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
