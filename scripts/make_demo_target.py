"""Build (or find) the demo target and its head-training data, and print where they are.

    python scripts/make_demo_target.py                  # the 12-layer target, ~10 min on 2 CPU cores
    python scripts/make_demo_target.py --size tiny      # the 2-layer test target, seconds
    python scripts/make_demo_target.py --force --cache /tmp/selfspec

Both are cached (``$SELFSPEC_CACHE`` or ``~/.cache/selfspec`` unless ``--cache``); a second run only
prints. See `train.demo` and docs/design.md §10.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from train.demo import cache_dir, ensure_demo_data, ensure_demo_target  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--size", choices=["full", "tiny"], default="full", help="full: 12 layers; tiny: 2 layers"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="training seed (part of the cache directory name)"
    )
    parser.add_argument("--cache", default=None, help=f"cache directory (default: {cache_dir()})")
    parser.add_argument("--force", action="store_true", help="rebuild even if a cached copy exists")
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    target = ensure_demo_target(args.size, seed=args.seed, cache=args.cache, force=args.force)
    data = ensure_demo_data(args.size, seed=args.seed, cache=args.cache, force=args.force)
    with open(os.path.join(target, "demo_info.json")) as f:
        info = json.load(f)
    info.pop("spec", None)
    print(f"target: {target}")
    for split, path in data.items():
        with open(path) as f:
            rows = sum(1 for _ in f)
        print(f"data {split}: {path} ({rows} rows)")
    print("info: " + json.dumps(info))
    print(f"done in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
