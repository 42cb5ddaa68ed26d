"""Side-by-side generation on the demo target: `target.generate` vs `infer.generate` with trained heads.

    python scripts/demo_generate.py --heads out/demo-medusa [--target demo] [--dtype auto] [--prompts 8]

A thin command line over `infer.benchmark.side_by_side` (what it prints is described there).
"""

from infer.benchmark.side_by_side import main

if __name__ == "__main__":
    main()
