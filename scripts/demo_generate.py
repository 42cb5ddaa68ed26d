"""Side-by-side generation: `target.generate`, HF prompt lookup and `infer.generate` with trained heads.

    python scripts/demo_generate.py --heads out/demo-medusa [--dtype fast] [--prompts 8]
    python scripts/demo_generate.py --heads out/smollm2-eagle31      # on MT-Bench's first turns

A thin command line over `bench.side_by_side` (what it prints is described there).
"""

import os
import sys

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # bench/ sits beside the packages

from bench.side_by_side import main  # noqa: E402

if __name__ == "__main__":
    main()
