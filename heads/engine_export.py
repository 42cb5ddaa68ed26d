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


# (head type, target model_type, format) -> why no engine serves that export (read from the engines'
# model classes: vLLM 0.33, SGLang 0.5.23; tests/test_engines.py runs each pair in the engine's own code and
# fails once one is served). ``vllm`` is the EAGLE-3 alias of ``speculators``.
_NO_EAGLE3 = "vLLM's `{}` does not implement `SupportsEagle3` (the hidden states EAGLE-3 reads)"
_G2 = "`Gemma2ForCausalLM`"
UNSERVED: dict[tuple[str, str, str], str] = {
    ("eagle", "gemma2", "vllm"): f"vLLM's {_G2} has no `lm_head` to share, so the EAGLE draft has none",
    ("eagle", "gemma2", "sglang"): f"SGLang's {_G2} has no `get_embed_and_head` for the EAGLE worker",
    ("eagle3", "gemma2", "speculators"): _NO_EAGLE3.format("Gemma2ForCausalLM"),
    ("eagle3", "gemma2", "vllm"): _NO_EAGLE3.format("Gemma2ForCausalLM"),
    ("eagle3", "gemma2", "sglang"): f"SGLang's {_G2} has no `set_eagle3_layers_to_capture`",
    ("eagle3", "gemma3_text", "speculators"): _NO_EAGLE3.format("Gemma3ForCausalLM"),
    ("eagle3", "gemma3_text", "vllm"): _NO_EAGLE3.format("Gemma3ForCausalLM"),
}


def check_served(head_type: str, target_config: dict, to: str) -> None:
    """Raise ``ValueError`` (one line, before the target is loaded or anything written) for an export that
    no engine serves."""
    mt = str((target_config or {}).get("model_type", ""))
    why = UNSERVED.get((head_type, mt, to))
    if why is not None:
        raise ValueError(
            f"not exporting {head_type} heads for a {mt!r} target to {to!r}: no engine would serve them "
            f"({why}); serve them with selfspec (infer.generate)"
        )


def export(o: ExportOptions) -> list[str]:
    """Write the export of ``o.heads`` in format ``o.to`` into ``o.out``; returns the written paths.
    A needed but unknown target is a ``SystemExit`` naming what to pass; a pair no engine serves
    (`UNSERVED`) a ``ValueError`` saying why."""
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
