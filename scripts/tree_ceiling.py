"""Expected τ of each head's draft trees on fixed contexts, against the best tree of the same size.

    python scripts/tree_ceiling.py --target demo --heads eagle1=out/demo-eagle --heads eagle31=out/demo-eagle31 \\
        --vs eagle31:eagle1 --out out/ceiling

At every ``--stride``-th position of the target's own continuation of each prompt (greedy, or sampled at
T = 0.7), each head drafts its default tree as `infer.generate` would there, and one verify forward gives
its expected accepted length (exact sampling: the sum of path probabilities; greedy: the accepted length).
With sampling, the best tree of the same size and depth (the N nodes of highest path probability under
the target, a perfect draft) bounds every draft. See `bench.ceiling`. Exit status 2 on bad input.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # bench/ sits beside the packages

from bench.ceiling import markdown, run  # noqa: E402  (after the offline default)

if __name__ == "__main__":
    try:
        print(markdown(run(sys.argv[1:])))
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
