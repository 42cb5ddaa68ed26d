"""Run the frozen target once over the training set and store what the heads read, for offline training.

    python scripts/dump_features.py --config configs/demo-eagle3.yaml --out features/demo-eagle3 [key=value ...]
    python train/train_heads.py --config configs/demo-eagle3.yaml --features features/demo-eagle3

``--config`` is the training recipe (target, data, heads.type) and ``key=value`` overrides it, as for
train/train_heads.py; ``--out`` (the shards' directory), ``--shard-size`` (rows per shard, 256) and
``--batch-size`` (rows per target forward, 8). The shard format and the resume rule are in
`train.features`.
"""

from __future__ import annotations

from heads.config import parse_cli
from train.features import DumpOptions, dump_main


def main(argv: list[str] | None = None) -> None:
    dump_main(parse_cli(DumpOptions, argv, prog="dump_features.py", description=__doc__.split("\n\n")[0]))


if __name__ == "__main__":
    main()
