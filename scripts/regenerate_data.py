"""Self-distillation data: rewrite a dataset's responses with the target model (train/regenerate.py).

    python scripts/regenerate_data.py --target demo|PATH|HUB_ID --data IN.jsonl|DIR|HUB_ID|demo \\
        --out OUT.jsonl [--temperature 0|T] [--max-new-tokens N] [--batch-size B] [--prompt-tokens K] \\
        [--limit N] [--seed S] [--split train] [--format auto] [--dtype auto] [--device cpu|cuda]

Chat rows (``messages`` or ShareGPT ``conversations``): every assistant turn is regenerated in order,
each from the conversation so far rendered with the target's chat template. ``text`` rows: the first K
tokens are kept and the rest is the target's continuation. The output has the input's format (plus a
``source_index`` column) and trains directly: ``data.path: OUT.jsonl``. Interrupt it at any time and
run the same command again to resume.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from train.regenerate import RegenConfig, report_dict, run  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="Hub id, local model dir, or demo / demo-tiny")
    ap.add_argument(
        "--data",
        required=True,
        help="local .jsonl/.json/.parquet file or directory, Hub dataset id, or demo / demo-tiny",
    )
    ap.add_argument("--out", required=True, help="output JSONL (appended to; rerun to resume)")
    ap.add_argument(
        "--split",
        default="train",
        help="Hub dataset split; for demo data: train | eval | prompts | train-chat | eval-chat",
    )
    ap.add_argument("--format", default="auto", choices=["auto", "text", "sharegpt", "messages"])
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; T > 0 samples at T")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="per assistant turn / continuation")
    ap.add_argument("--batch-size", type=int, default=16, help="rows per generate call")
    ap.add_argument(
        "--prompt-tokens", type=int, default=32, help="text rows: leading tokens kept as the prompt"
    )
    ap.add_argument("--limit", type=int, default=None, help="only the first N input rows")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (temperature > 0)")
    ap.add_argument("--dtype", default="auto", help="auto (as stored) | bf16 | fp16 | fp32")
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        cfg = RegenConfig(
            target=args.target,
            data=args.data,
            out=args.out,
            split=args.split,
            format=args.format,
            temperature=args.temperature,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
            prompt_tokens=args.prompt_tokens,
            limit=args.limit,
            seed=args.seed,
            dtype=args.dtype,
            device=args.device,
        )
        report = run(cfg)
    except (ValueError, OSError) as e:  # DataError is a ValueError; a missing model an OSError
        raise SystemExit(f"error: {e}") from None
    print(report.summary())
    print(json.dumps(report_dict(report)))


if __name__ == "__main__":
    main()
