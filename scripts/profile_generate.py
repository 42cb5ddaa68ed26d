"""Where the time of one `infer.generate` step goes, and the speedup over `target.generate`.

    python scripts/profile_generate.py --heads out/demo-medusa out/demo-eagle [--dtype bf16] \
        [--prompts 8] [--max-new-tokens 128] [--repeats 3] [--sample] [--threads N] [--cprofile]

A thin command line over `bench.profile` (the two measurements are described there).
"""

import os
import sys

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # bench/ sits beside the packages

from bench.profile import main  # noqa: E402

if __name__ == "__main__":
    main()
