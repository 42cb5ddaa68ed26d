"""EAGLE-3 training speed on the demo target: per-part split and interleaved tokens/s vs the original trainer.

    python scripts/bench_eagle3_train.py [--reference PATH/TO/EAGLE] [--ttt 7,4] [--modes fp32,bf16] \
        [--batch 8] [--length 256] [--rounds 5] [--threads 1] [--out results/eagle3-train-speed]

Ours is `train.objective.batch_loss` + backward + AdamW on the demo target (or, when it is not built,
a random model with its config). ``--reference`` points at a checkout of SafeAILab/EAGLE (its
``eagle/traineagle3`` model code is imported from there, never copied); without it only ours is
reported. Modes: ``fp32`` (target and heads fp32) and ``bf16`` (target bf16, forward under bf16
autocast, fp32 master weights, for both trainers). The logic is in `train.eagle3_bench` and
`train.eagle3_speed`.
"""

from __future__ import annotations

from heads.config import parse_cli
from train.eagle3_bench import BenchOptions, run


def main(argv: list[str] | None = None) -> dict:
    return run(parse_cli(BenchOptions, argv, prog="bench_eagle3_train.py"), argv)


if __name__ == "__main__":
    main()
