"""Export selfspec heads to the serving engines' formats, and import Medusa / EAGLE / EAGLE-3 checkpoints.

The generic part: which head type handles a format is the registry's answer (`heads.registry.HeadType`
``exports``, ``detect``, ``import_state``); every mapping is a small pure function over a state dict and
a config dict in the head type's own ``heads/<type>/formats.py``, and what the formats share (the Llama
draft config, RoPE keys, the embedding-scale fold, strict loading) is in `heads.formats`. `export_heads`
and `import_heads` only add file handling around them. The schemas were read from the engines' loaders
(vLLM ``models/medusa.py``, ``llama_eagle.py``, ``llama_eagle3.py``, ``transformers_utils/configs/
speculators``; SGLang ``models/llama_eagle.py``, ``llama_eagle3.py``; Medusa's ``medusa_model.py``;
vllm-project/speculators ``models/eagle3``); docs/design.md §9 lists them.

Exports (``to``) of the built-in head types:

=========== ================ =====================================================================
head type   to               what is written (details in ``heads/<type>/formats.py``)
=========== ================ =====================================================================
medusa      ``vllm``         vLLM ``MedusaModel`` (with one copy of the target's lm_head if shared)
medusa      ``medusa``       original Medusa (``medusa_lm_head.safetensors`` and ``.pt``)
eagle       ``sglang``       SGLang ``LlamaForCausalLMEagle`` (``Qwen2ForCausalLMEagle``)
eagle       ``vllm``         vLLM EAGLE (``LlamaForCausalLM`` -> ``EagleLlamaForCausalLM``)
eagle3      ``sglang``       HF/SGLang ``LlamaForCausalLMEagle3``; aux ids in SGLang's convention
eagle3      ``speculators``  vLLM speculators ``Eagle3Speculator`` (``vllm`` is an alias)
=========== ================ =====================================================================

A pair not in a head type's ``exports`` is refused with one line (the entry's ``export_notes`` say why).
Imports: `detect_format` asks every head type's ``detect`` which of its layouts a ``config.json`` without
selfspec's ``head_type`` is; that head type's ``import_state`` reads it.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from heads.base import CONFIG_NAME
from heads.formats import cpu_state, read_state_file
from heads.gguf import note
from heads.io import atomic_text, atomic_write
from heads.registry import REGISTRY, Exported, ExportInputs

NOTE_NAME = "README.md"  # an export of heads trained on a GGUF release: that note

__all__ = [  # and EXPORT_FORMATS, SUPPORTED_EXPORTS (`__getattr__`)
    "detect_format",
    "export_formats",
    "export_heads",
    "export_state",
    "import_heads",
    "needs_embed_scale",
    "needs_target_weights",
    "read_state_file",
    "supported_exports",
]


def supported_exports() -> dict[str, tuple[str, ...]]:
    """Head type -> the format names it exports to (from the registry)."""
    return {name: tuple(entry.exports) for name, entry in REGISTRY.items() if entry.exports}


def export_formats() -> tuple[str, ...]:
    """Every format name some registered head type exports to."""
    return tuple(dict.fromkeys(f for formats in supported_exports().values() for f in formats))


def __getattr__(name: str) -> Any:
    # ``EXPORT_FORMATS`` / ``SUPPORTED_EXPORTS`` are read from the registry when asked for, so they hold
    # every registered head type whatever the import order (PEP 562 module attributes).
    if name == "EXPORT_FORMATS":
        return export_formats()
    if name == "SUPPORTED_EXPORTS":
        return supported_exports()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def needs_target_weights(heads: nn.Module, to: str) -> bool:
    """True iff exporting ``heads`` to ``to`` must copy target weights (Medusa reusing the target lm_head)."""
    entry = REGISTRY.get(heads.config.head_type)
    fmt = entry.exports.get(to) if entry is not None else None
    return fmt is not None and fmt.needs_lm_head(heads.config.to_dict())


def needs_embed_scale(cfg: dict[str, Any]) -> bool:
    """True iff exporting heads with this ``config.json`` dict needs the target's embedding scale, which
    they do not record (EAGLE-1 heads for a Gemma-family target saved before ``embed_scale`` existed)."""
    entry = REGISTRY.get(cfg.get("head_type"))
    return entry is not None and any(f.needs_embed_scale(cfg) for f in entry.exports.values())


def _exported(
    heads: nn.Module,
    to: str,
    target_lm_head: Tensor | None,
    speculative_tokens: int,
    target: nn.Module | None,
) -> Exported:
    kind = heads.config.head_type
    entry = REGISTRY.get(kind)
    if entry is None or not entry.exports:
        raise ValueError(f"unknown head type {kind!r}: exports exist for {sorted(supported_exports())}")
    if to not in entry.exports:
        why = entry.export_notes.get(to, f"{to!r} is not a format")
        raise ValueError(
            f"{kind} heads cannot be exported to {to!r} ({why}); supported for {kind}: {tuple(entry.exports)}"
        )
    cfg = heads.config.to_dict()
    mt = str((cfg.get("target_config") or {}).get("model_type", ""))
    why = entry.unserved.get((mt, to))
    if why is not None:  # scripts/export_heads.py refuses it; the engine tests export it to see the refusal
        warnings.warn(
            f"no engine serves {kind} heads for a {mt!r} target exported to {to!r}: {why}", stacklevel=3
        )
    state = {k: v.detach() for k, v in heads.state_dict().items()}
    lm = target_lm_head.detach() if target_lm_head is not None else None
    if lm is not None and tuple(lm.shape) != (cfg["vocab_size"], cfg["hidden_size"]):
        raise ValueError(
            f"target lm_head is {tuple(lm.shape)}, but the heads were trained for vocab {cfg['vocab_size']} x "
            f"hidden {cfg['hidden_size']}: a checkpoint for another base model"
        )
    if lm is not None and state:
        lm = lm.to(next(iter(state.values())).dtype)
    return entry.exports[to].write(state, cfg, ExportInputs(lm, target, speculative_tokens))


def export_state(
    heads: nn.Module,
    to: str,
    target_lm_head: Tensor | None = None,
    *,
    speculative_tokens: int = 3,
    target: nn.Module | None = None,
) -> tuple[dict[str, Any], dict[str, Tensor], str]:
    """(config dict, state dict, weights file name) of ``heads`` in format ``to``; see the module docstring.
    ``target``: optional; EAGLE-1 exports measure its embedding scale (or check the recorded one)."""
    out = _exported(heads, to, target_lm_head, speculative_tokens, target)
    return out.config, out.state, out.weights_name


def export_heads(
    heads: nn.Module,
    out_dir: str,
    to: str,
    target_lm_head: Tensor | None = None,
    *,
    speculative_tokens: int = 3,
    target: nn.Module | None = None,
) -> list[str]:
    """Write ``heads`` in format ``to`` (``config.json`` + weights) to ``out_dir``; returns the paths."""
    out = _exported(heads, to, target_lm_head, speculative_tokens, target)
    os.makedirs(out_dir, exist_ok=True)
    state = cpu_state(out.state)
    wpath, cpath = os.path.join(out_dir, out.weights_name), os.path.join(out_dir, CONFIG_NAME)
    atomic_write(wpath, lambda p: save_file(state, p, metadata={"format": "pt"}))
    paths = [cpath, wpath]
    if out.pickle_copy is not None:  # tensors only: loaders that read nothing but the .pt file
        ppath = os.path.join(out_dir, out.pickle_copy)
        atomic_write(ppath, lambda p: torch.save(state, p))
        paths.append(ppath)
    atomic_text(cpath, json.dumps(out.config, indent=2, sort_keys=True) + "\n")
    source = heads.config.to_dict().get("target_gguf")
    if source:  # the engine configs have no field for it: which release the heads were trained on
        npath = os.path.join(out_dir, NOTE_NAME)
        atomic_text(
            npath,
            f"# {heads.config.head_type} heads for `{heads.config.base_model_name_or_path}`\n\n{note(source)}\n",
        )
        paths.append(npath)
    return paths


def detect_format(raw: dict[str, Any]) -> tuple[str, str]:
    """(head type, foreign layout) of a ``config.json`` without selfspec's ``head_type``: the one head type
    whose ``detect`` recognises it (e.g. ``("medusa", "vllm-medusa")``, ``("eagle3", "speculators-eagle3")``).
    Raises ``ValueError`` if none does (or, for a mis-registered head type, more than one)."""
    found = [(name, fmt) for name, e in REGISTRY.items() if e.detect is not None and (fmt := e.detect(raw))]
    if len(found) > 1:
        raise ValueError(f"config.json matches the foreign layouts of several head types: {found}")
    if not found:
        known = ", ".join(e.title or name for name, e in REGISTRY.items() if e.detect is not None)
        raise ValueError(
            "unknown head type: config.json has no selfspec head_type and is none of the foreign layouts the "
            f"head types import ({known}: original Medusa / vLLM MedusaModel, one-layer EAGLE Llama configs, "
            "LlamaForCausalLMEagle3 / eagle_config / speculators eagle3)"
        )
    return found[0]


def import_heads(directory: str, raw: dict[str, Any], target: nn.Module | None = None) -> nn.Module:
    """Load a foreign checkpoint directory (``config.json`` ``raw`` without ``head_type``) as selfspec heads.

    Medusa (original or vLLM) imports without a target (it is checked against one if given); EAGLE and
    EAGLE-3 need the target. The result is on CPU in the checkpoint's dtype (see `heads.base.load_heads`).
    """
    head_type, _ = detect_format(raw)
    importer = REGISTRY[head_type].import_state
    if importer is None:
        raise ValueError(f"{directory}: {head_type} heads have no importer for this layout")
    return importer(directory, raw, target)
