"""Where the time of one `infer.generate` step goes, and the speedup over `target.generate`.

    python scripts/profile_generate.py --heads out/demo-medusa out/demo-eagle [--dtype bf16] \
        [--prompts 8] [--max-new-tokens 128] [--repeats 3] [--sample] [--threads N] [--cprofile]

A thin command line over `infer.benchmark.profile` (the two measurements are described there).
"""

from infer.benchmark.profile import main

if __name__ == "__main__":
    main()
