"""Batched speculative decoding: total tokens/s at batch 1, 4 and 8 (measured, never asserted).

    python scripts/bench_batch.py --out results/batch [--batches 1 4 8] [--max-new-tokens 64]
        [--repeats 3] [--threads 1] [--heads medusa eagle] [--train-steps 300]

On the demo-tiny target (built and cached on first use, as `infer.load("demo-tiny")` does) with heads
trained here for ``--train-steps`` full-batch Adam steps on the target's own greedy continuations of
the demo corpus (Medusa: 4 heads on the target's lm_head; EAGLE-1: one draft layer), for each batch
size B (the first B of the demo prompts, different lengths, left-padded) and mode (greedy; sampled
with the target's generation config at temperature 1), four ways of producing ``--max-new-tokens`` new
tokens for every prompt (EOS switched off, so every row makes exactly that many):

- ``spec batch``: one `infer.generate` call on the padded batch;
- ``spec 1x1``: `infer.generate` on each prompt alone, one after another;
- ``target batch``: ``target.generate`` on the padded batch (plain decoding);
- ``target 1x1``: ``target.generate`` on each prompt alone.

Per cell: total new tokens / wall seconds, the median over ``--repeats`` interleaved repeats, and for
spec the total τ (tokens per row-step, bonus included) and the per-row τ of the last repeat. Greedy
rows are compared with ``target.generate`` of the prompt alone; a mismatch is printed (never hidden).
Writes ``bench_batch.json`` and ``bench_batch.md`` (with the command and the machine) to ``--out``.
"""

from __future__ import annotations

import sys

from heads.config import parse_cli
from infer.benchmark.batch import BenchBatchOptions, bench_batch


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    return bench_batch(
        parse_cli(BenchBatchOptions, argv, prog="bench_batch.py", description=__doc__.split("\n")[0]), argv
    )


if __name__ == "__main__":
    main()
