"""Export selfspec heads for a serving engine (see `heads.convert` for the formats and conventions).

    python scripts/export_heads.py --heads out/demo-eagle3 --to sglang --out export/eagle3-sglang
    python scripts/export_heads.py --heads out/demo-eagle3 --to speculators --out export/eagle3-vllm
    python scripts/export_heads.py --heads out/demo-eagle --to sglang --out export/eagle-sglang
    python scripts/export_heads.py --heads out/demo-medusa --to vllm --out export/medusa-vllm [--target DIR]

The target model is loaded only when the format must hold target weights: Medusa heads that reuse the
target's lm_head, exported to vLLM's ``MedusaModel`` or the original Medusa format. ``--target``
defaults to the heads' ``base_model_name_or_path``.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv: list[str] | None = None) -> list[str]:
    from heads.convert import EXPORT_FORMATS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", required=True, help="selfspec heads directory (or Hub id)")
    p.add_argument("--to", required=True, choices=EXPORT_FORMATS, help="target format")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--target", default=None, help="target model (Hub id or dir); only some formats need it")
    p.add_argument(
        "--speculative-tokens", type=int, default=3, help="speculators export: proposal length recorded"
    )
    args = p.parse_args(argv)

    from heads.base import load_heads
    from heads.convert import export_heads, needs_target_weights

    heads = load_heads(args.heads)
    lm_head = None
    if needs_target_weights(heads, args.to):
        from heads.graft import load_target

        name = args.target or heads.config.base_model_name_or_path
        if not name:
            raise SystemExit(
                f"exporting {heads.config.head_type} heads to {args.to!r} copies the target's lm_head: pass --target"
            )
        print(f"loading target {name} for its lm_head", flush=True)
        target = load_target(name, dtype="auto")
        heads.config.check_target(target)
        lm_head = target.get_output_embeddings().weight
    paths = export_heads(heads, args.out, args.to, lm_head, speculative_tokens=args.speculative_tokens)
    for path in paths:
        print(f"wrote {path} ({os.path.getsize(path) / 1e6:.2f} MB)")
    return paths


if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileNotFoundError, OSError) as e:  # bad input: the message, not a traceback
        raise SystemExit(f"error: {e}") from e
