"""Fit the draft tree to a head checkpoint and to this machine, and save it as ``<heads>/inference.json``.

    python scripts/tune_tree.py --heads out/demo-medusa                      # Medusa: a static tree
    python scripts/tune_tree.py --heads out/demo-eagle --compare 6           # EAGLE-2: total_tokens/depth

What it measures and how it chooses: `infer.tune_tree` (options: `infer.tune_tree.TuneOptions`; any
option also as ``key=value`` or in a ``--config`` YAML). `infer.load` then drafts with the saved choice.
"""

from __future__ import annotations

from heads.config import parse_cli
from infer.tune_tree import TuneOptions, tune_tree
from train.held_out import eval_batches


def main(argv: list[str] | None = None) -> dict:
    opts = parse_cli(TuneOptions, argv, prog="tune_tree.py", description=__doc__.split("\n")[0])
    try:
        return tune_tree(opts, eval_batches)  # held-out rows in any training format (`train.data`)
    except (ValueError, FileNotFoundError) as e:  # bad input: one line, no traceback
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
