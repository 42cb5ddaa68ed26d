"""Self-distillation data: rewrite a dataset's responses with the target model (train/regenerate.py).

    python scripts/regenerate_data.py --target demo|PATH|HUB_ID --data IN.jsonl|DIR|HUB_ID|demo \\
        --out OUT.jsonl [--temperature 0|T] [--max-new-tokens N] [--batch-size B] [--prompt-tokens K] \\
        [--limit N] [--seed S] [--split train] [--format auto] [--dtype auto] [--device cpu|cuda]

Chat rows (``messages`` or ShareGPT ``conversations``): every assistant turn is regenerated in order,
each from the conversation so far rendered with the target's chat template. ``text`` rows: the first K
tokens are kept and the rest is the target's continuation. The output has the input's format (plus a
``source_index`` column) and trains directly: ``data.path: OUT.jsonl``. Interrupt it at any time and
run the same command again to resume. The options are `train.regenerate.RegenConfig`.
"""

from __future__ import annotations

from heads.config import parse_cli
from train.regenerate import RegenConfig, cli


def main(argv: list[str] | None = None) -> None:
    cli(parse_cli(RegenConfig, argv, prog="regenerate_data.py", description=__doc__.split("\n\n")[0]))


if __name__ == "__main__":
    main()
