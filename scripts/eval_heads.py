"""Held-out per-position top-k accuracy of a head checkpoint (Medusa, EAGLE-1/2, EAGLE-3) and the τ it implies.

    python scripts/eval_heads.py --heads out/demo-medusa                 # data: the run's eval_path
    python scripts/eval_heads.py --heads out/demo-eagle --data held_out.jsonl --depth 6 --output acc.json

What it scores and writes: `infer.head_accuracy` (options: `infer.head_accuracy.EvalOptions`; any option also as
``key=value`` or in a ``--config`` YAML). Writes JSON (``--output``, default ``<heads>/eval_heads.json``).
"""

from __future__ import annotations

from heads.config import parse_cli
from infer.head_accuracy import EvalOptions, eval_heads
from train.held_out import eval_batches


def main(argv: list[str] | None = None) -> dict:
    opts = parse_cli(EvalOptions, argv, prog="eval_heads.py", description=__doc__.split("\n")[0])
    return eval_heads(opts, eval_batches)  # held-out rows in any training format (`train.data`)


if __name__ == "__main__":
    main()
