"""EAGLE-3 training speed on the demo target: per-part split and interleaved tokens/s vs the original trainer.

    python scripts/bench_eagle3_train.py [--reference PATH/TO/EAGLE] [--ttt 7,4] [--modes fp32,bf16] \
        [--batch 8] [--length 256] [--rounds 5] [--threads 1] [--out results/eagle3-train-speed]

Ours is `train.objective.batch_loss` + backward + AdamW on the demo target (or, when it is not built,
a random model with its config). ``--reference`` points at a checkout of SafeAILab/EAGLE (its
``eagle/traineagle3`` model code is imported from there, never copied); without it only ours is
reported. Modes: ``fp32`` (target and heads fp32) and ``bf16`` (target bf16, forward under bf16
autocast, fp32 master weights, for both trainers). The logic is in `bench.eagle3_train` and
`bench.eagle3_speed`.
"""

from __future__ import annotations

import importlib
import os
import sys

from heads.config import parse_cli

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # bench/ sits beside the packages
from bench.eagle3_train import BenchOptions, run  # noqa: E402


def import_reference(path: str) -> tuple:
    """(cnets, configs.EConfig) of the original EAGLE-3 trainer from the user's checkout ``path`` (the
    ``eagle/traineagle3`` directory or the repository root). Its modules import their siblings by bare
    name, so the directory goes on ``sys.path``: this script is the one place that does so (the
    packages never edit it); it runs the user's own checkout, only when ``--reference`` names it."""
    here = os.path.join(path, "eagle", "traineagle3")
    path = here if os.path.isdir(here) else path
    if not os.path.isfile(os.path.join(path, "cnets.py")):
        raise SystemExit(f"--reference {path!r}: no cnets.py (give SafeAILab/EAGLE's eagle/traineagle3)")
    sys.path.insert(0, path)
    return importlib.import_module("cnets"), importlib.import_module("configs").EConfig


def main(argv: list[str] | None = None) -> dict:
    args = parse_cli(BenchOptions, argv, prog="bench_eagle3_train.py")
    return run(args, argv, import_reference(args.reference) if args.reference else None)


if __name__ == "__main__":
    main()
