"""Export selfspec heads for a serving engine, loading the target only when the format needs it
(``scripts/export_heads.py`` is a thin CLI over `main`; the formats are in `heads.convert`).

The target model is loaded only when the format must hold target weights (Medusa heads that reuse the
target's lm_head, exported to vLLM's ``MedusaModel`` or the original Medusa format) or when EAGLE-1
heads for a Gemma-family target do not record the embedding scale the export folds in. ``--target``
defaults to the heads' ``base_model_name_or_path`` (for heads trained on a built-in GGUF target, that
built-in name: `heads.gguf.target_name`). Heads trained on a GGUF release get its note in the export's
``README.md`` (`heads.convert.export_heads`) and on the terminal.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from heads import gguf
from heads.base import load_heads
from heads.config import parse_cli
from heads.convert import EXPORT_FORMATS, export_heads, needs_embed_scale, needs_target_weights
from heads.graft import load_target
from heads.registry import REGISTRY, get


@dataclass
class ExportOptions:
    """Export selfspec heads for a serving engine (see heads.convert for the formats and conventions)."""

    heads: str | None = field(
        default=None, metadata={"help": "selfspec heads directory (or Hub id); required"}
    )
    to: str | None = field(
        default=None, metadata={"help": f"target format, one of {', '.join(EXPORT_FORMATS)}; required"}
    )
    out: str | None = field(default=None, metadata={"help": "output directory; required"})
    target: str | None = field(
        default=None, metadata={"help": "target model (Hub id or dir); only some formats need it"}
    )
    speculative_tokens: int = field(
        default=3, metadata={"help": "speculators export: proposal length recorded"}
    )

    def __post_init__(self) -> None:
        missing = [f"--{n}" for n in ("heads", "to", "out") if not getattr(self, n)]
        if missing:
            raise ValueError(f"{' and '.join(missing)} required")
        if self.to not in EXPORT_FORMATS:
            raise ValueError(f"--to {self.to!r}: not a format; choose from {', '.join(EXPORT_FORMATS)}")


def unserved() -> dict[tuple[str, str, str], str]:
    """(head type, target model_type, format) -> why no engine serves that export: every registry entry's
    ``unserved`` pairs (tests/test_engines.py runs each pair in the engine's own code)."""
    return {(e.name, mt, to): why for e in REGISTRY.values() for (mt, to), why in e.unserved.items()}


def check_served(head_type: str, target_config: dict, to: str) -> None:
    """Raise ``ValueError`` (one line, before the target is loaded or anything written) for an export that
    no engine serves."""
    mt = str((target_config or {}).get("model_type", ""))
    why = get(head_type).unserved.get((mt, to))
    if why is not None:
        raise ValueError(
            f"not exporting {head_type} heads for a {mt!r} target to {to!r}: no engine would serve them "
            f"({why}); serve them with selfspec (infer.generate)"
        )


def export(o: ExportOptions) -> list[str]:
    """Write the export of ``o.heads`` in format ``o.to`` into ``o.out``; returns the written paths.
    A needed but unknown target is a ``SystemExit`` naming what to pass; a pair no engine serves
    (`unserved`) a ``ValueError`` saying why."""
    heads = load_heads(o.heads)
    check_served(heads.config.head_type, getattr(heads.config, "target_config", None) or {}, o.to)
    lm_head = target = None
    need_lm, need_scale = needs_target_weights(heads, o.to), needs_embed_scale(heads.config.to_dict())
    if need_lm or need_scale:
        name = o.target or gguf.target_name(heads.config.to_dict())
        why = "copies the target's lm_head" if need_lm else "needs the target's embedding scale (Gemma)"
        if not name:
            raise SystemExit(f"exporting {heads.config.head_type} heads to {o.to!r} {why}: pass --target")
        print(f"loading target {name}: the export {why}", flush=True)
        target = load_target(name, dtype="auto")
        heads.config.check_target(target)
        lm_head = target.get_output_embeddings().weight if need_lm else None
    paths = export_heads(heads, o.out, o.to, lm_head, speculative_tokens=o.speculative_tokens, target=target)
    for path in paths:
        print(f"wrote {path} ({os.path.getsize(path) / 1e6:.2f} MB)")
    if heads.config.target_gguf:
        print(f"note: {gguf.note(heads.config.target_gguf)}")
    return paths


def main(argv: list[str] | None = None) -> list[str]:
    """The script's command line (same flags as before: --heads, --to, --out, --target, --speculative-tokens)."""
    return export(parse_cli(ExportOptions, argv, prog="scripts/export_heads.py"))
