"""Medusa's export formats (vLLM ``MedusaModel``, original Medusa) and the import of both layouts.

=========== ================ =====================================================================
head type   to               what is written
=========== ================ =====================================================================
medusa      ``vllm``         vLLM ``MedusaModel``: ``blocks.{h}.layers.{l}.weight|bias`` and
                             ``lm_heads.{h}.weight`` (one shared ``lm_heads.0`` with
                             ``original_lm_head: true`` when the heads reuse the target's lm_head)
medusa      ``medusa``       original Medusa: ``medusa_num_heads``/``medusa_num_layers`` config and
                             ``medusa_lm_head.safetensors`` with ``{h}.{l}.linear.*`` and ``{h}.{L}.weight``
=========== ================ =====================================================================

Medusa -> SGLang is refused (SGLang has no Medusa drafter; neither has vLLM 0.33: ``--to vllm`` is
for vLLM <= 0.32). ``--to medusa`` also writes ``medusa_lm_head.pt`` (tensors only), the file
FasterDecoding's loader reads.

**Target weights.** Two Medusa formats must hold the target's lm_head when selfspec's heads reuse it
(``lm_head="target"``): vLLM's ``MedusaModel`` computes draft logits only with its own ``lm_heads`` and
has no way to borrow the target's, so one copy is written as ``lm_heads.0`` with
``original_lm_head: true`` (vLLM shares it over the heads); the original Medusa format gives every
head its own ``{h}.{L}.weight`` (a ``Sequential`` ending in a Linear), so K copies are written.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from heads.base import WEIGHTS_NAME
from heads.formats import (
    FOREIGN_WEIGHTS,
    check_other_base,
    dtype_name,
    load_strict,
    read_state_file,
    target_name,
    weights_file,
)
from heads.graft import target_dims
from heads.medusa.config import MedusaConfig
from heads.medusa.module import MedusaHeads
from heads.registry import Exported, ExportFormat, ExportInputs

MEDUSA_WEIGHTS_NAME = "medusa_lm_head.safetensors"


# ---------------------------------------------------------------------------------------------- export


def medusa_to_vllm(
    state: dict[str, Tensor], cfg: dict[str, Any], target_lm_head: Tensor | None = None
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """selfspec Medusa (``blocks.{h}.{l}.linear.*``, ``lm_heads.{h}.weight`` if own) -> vLLM ``MedusaModel``.

    ``target_lm_head`` [V, H] is required when ``cfg["lm_head"] == "target"`` (see the module docstring).
    vLLM builds the blocks' bias from ``medusa_fc_bias`` and skips weights it has no parameter for, so
    it is written ``true`` (selfspec's ResBlocks always have a bias).
    """
    K, L, H, V = cfg["num_heads"], cfg["num_layers"], cfg["hidden_size"], cfg["vocab_size"]
    out: dict[str, Tensor] = {}
    for h in range(K):
        for j in range(L):
            out[f"blocks.{h}.layers.{j}.weight"] = state[f"blocks.{h}.{j}.linear.weight"]
            out[f"blocks.{h}.layers.{j}.bias"] = state[f"blocks.{h}.{j}.linear.bias"]
    shared = cfg["lm_head"] == "target"
    if shared:
        if target_lm_head is None:
            raise ValueError("these Medusa heads reuse the target's lm_head: exporting to vLLM needs it")
        out["lm_heads.0.weight"] = target_lm_head
    else:
        for h in range(K):
            out[f"lm_heads.{h}.weight"] = state[f"lm_heads.{h}.weight"]
    config = {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": H,
        "vocab_size": V,
        "num_heads": K,
        "num_hidden_layers": L,
        "truncated_vocab_size": V,
        "original_lm_head": shared,
        "medusa_fc_bias": True,
        "base_model_name_or_path": cfg.get("base_model_name_or_path"),
        "torch_dtype": dtype_name(state if state else out),
    }
    return config, out


def medusa_to_original(
    state: dict[str, Tensor], cfg: dict[str, Any], target_lm_head: Tensor | None = None
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """selfspec Medusa -> original Medusa (``{h}.{l}.linear.*`` and each head's lm_head ``{h}.{L}.weight``)."""
    K, L = cfg["num_heads"], cfg["num_layers"]
    out: dict[str, Tensor] = {}
    for h in range(K):
        for j in range(L):
            for p in ("weight", "bias"):
                out[f"{h}.{j}.linear.{p}"] = state[f"blocks.{h}.{j}.linear.{p}"]
        if cfg["lm_head"] == "target":
            if target_lm_head is None:
                raise ValueError(
                    "these Medusa heads reuse the target's lm_head: the original Medusa format needs a copy "
                    "per head"
                )
            out[f"{h}.{L}.weight"] = target_lm_head
        else:
            out[f"{h}.{L}.weight"] = state[f"lm_heads.{h}.weight"]
    config = {
        "base_model_name_or_path": cfg.get("base_model_name_or_path"),
        "hidden_size": cfg["hidden_size"],
        "vocab_size": cfg["vocab_size"],
        "medusa_num_heads": K,
        "medusa_num_layers": L,
    }
    return config, out


def _uses_target_lm_head(cfg: dict[str, Any]) -> bool:
    return cfg["lm_head"] == "target"


def _to_vllm(state: dict[str, Tensor], cfg: dict[str, Any], inputs: ExportInputs) -> Exported:
    config, out = medusa_to_vllm(state, cfg, inputs.target_lm_head)
    return Exported(config, out, WEIGHTS_NAME)


def _to_original(state: dict[str, Tensor], cfg: dict[str, Any], inputs: ExportInputs) -> Exported:
    config, out = medusa_to_original(state, cfg, inputs.target_lm_head)
    # FasterDecoding's MedusaModel.from_pretrained reads medusa_lm_head.pt (tensors only)
    return Exported(config, out, MEDUSA_WEIGHTS_NAME, pickle_copy="medusa_lm_head.pt")


EXPORTS = {
    "vllm": ExportFormat(_to_vllm, needs_lm_head=_uses_target_lm_head),
    "medusa": ExportFormat(_to_original, needs_lm_head=_uses_target_lm_head),
}
EXPORT_NOTES = {  # why a format is not offered (in the refusal)
    "sglang": "SGLang has no Medusa drafter",
    "speculators": "the speculators export is EAGLE-3's",
}


# ---------------------------------------------------------------------------------------------- import


def detect(raw: dict[str, Any]) -> str | None:
    """``"medusa"`` for an original Medusa ``config.json`` (``medusa_num_heads``), ``"vllm-medusa"`` for
    vLLM's ``MedusaModel``, else None."""
    if "medusa_num_heads" in raw:
        return "medusa"
    if raw.get("model_type") == "medusa" or "MedusaModel" in (raw.get("architectures") or []):
        return "vllm-medusa"
    return None


def import_state(directory: str, raw: dict[str, Any], target: nn.Module | None = None) -> nn.Module:
    """`MedusaHeads` from an original Medusa or a vLLM ``MedusaModel`` directory (no target needed,
    checked against one if given)."""
    if detect(raw) == "medusa":
        path = weights_file(directory, (MEDUSA_WEIGHTS_NAME, "medusa_lm_head.pt", *FOREIGN_WEIGHTS))
        K, L = int(raw["medusa_num_heads"]), int(raw.get("medusa_num_layers", 1))
        blocks, lm = medusa_state_from_original(read_state_file(path), K, L, path, raw.get("version"))
        return import_medusa(blocks, lm, L, target_name(raw, target), target, path)
    path = weights_file(directory)
    blocks, lm = medusa_state_from_vllm(read_state_file(path), raw, path)
    return import_medusa(blocks, lm, int(raw["num_hidden_layers"]), target_name(raw, target), target, path)


def strip_medusa_head_prefix(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Medusa models saved through their ``medusa_head`` ModuleList attribute name the keys
    ``medusa_head.{h}.{l}...``; drop that prefix (any other key stays, to be reported as unexpected)."""
    return {k.removeprefix("medusa_head."): v for k, v in state.items()}


def medusa_state_from_original(
    state: dict[str, Tensor], num_heads: int, num_layers: int, what: str, version: Any = None
):
    """Original Medusa keys -> (selfspec blocks state, [K] per-head lm_head weights, or None when the heads
    share the base model's lm_head).

    Medusa-1 heads end in their own Linear, ``{h}.{L}.weight``. FasterDecoding's current
    ``train_legacy.py`` writes "version 2" heads (``version: "2"`` in its config): ``num_layers``
    residual blocks only, whose logits come from the base model's lm_head. A file without any
    ``{h}.{L}.weight`` is read the same way; version 2 *with* per-head lm_heads is contradictory.
    """
    state = strip_medusa_head_prefix(state)
    blocks = {}
    for h in range(num_heads):
        for j in range(num_layers):
            for p in ("weight", "bias"):
                key = f"{h}.{j}.linear.{p}"
                if key not in state:
                    raise ValueError(
                        f"{what}: missing {key} (medusa_num_heads={num_heads}, layers={num_layers})"
                    )
                blocks[f"blocks.{h}.{j}.linear.{p}"] = state[key]
    lm_keys = [f"{h}.{num_layers}.weight" for h in range(num_heads)]
    shared = str(version) == "2" or not any(k in state for k in lm_keys)
    if str(version) == "2" and any(k in state for k in lm_keys):
        raise ValueError(
            f"{what}: config version 2 means the heads share the base model's lm_head, but the file also has "
            f"per-head lm_heads ({next(k for k in lm_keys if k in state)}); which is right?"
        )
    lm = None
    if not shared:
        missing = [k for k in lm_keys if k not in state]
        if missing:
            h = lm_keys.index(missing[0])
            raise ValueError(f"{what}: missing the lm_head of head {h}, {missing[0]}")
        lm = [state[k] for k in lm_keys]
    used = {
        f"{h}.{j}.linear.{p}" for h in range(num_heads) for j in range(num_layers) for p in ("weight", "bias")
    }
    used |= set() if shared else set(lm_keys)
    extra = sorted(set(state) - used)
    if extra:
        raise ValueError(f"{what}: weights that are not {num_heads} heads x {num_layers} layers: {extra[:8]}")
    return blocks, lm


def medusa_state_from_vllm(state: dict[str, Tensor], raw: dict[str, Any], what: str):
    """vLLM ``MedusaModel`` keys -> (selfspec blocks state, [K] per-head lm_head weights)."""
    K, L = int(raw["num_heads"]), int(raw["num_hidden_layers"])
    if raw.get("truncated_vocab_size") not in (None, raw.get("vocab_size")) or "token_map" in state:
        raise ValueError(f"{what}: a truncated draft vocabulary (token_map) has no selfspec equivalent")
    state = {k.removeprefix("medusa_heads."): v for k, v in state.items()}
    blocks = {}
    for h in range(K):
        for j in range(L):
            w = state.pop(f"blocks.{h}.layers.{j}.weight", None)
            if w is None:
                raise ValueError(f"{what}: missing blocks.{h}.layers.{j}.weight")
            b = state.pop(f"blocks.{h}.layers.{j}.bias", None)
            blocks[f"blocks.{h}.{j}.linear.weight"] = w
            # medusa_fc_bias false: vLLM's block has no bias, i.e. a zero one
            blocks[f"blocks.{h}.{j}.linear.bias"] = (
                b if b is not None else torch.zeros(w.shape[0], dtype=w.dtype)
            )
    if raw.get("original_lm_head"):
        shared = state.pop("lm_heads.0.weight", None)
        shared = state.pop("lm_head.weight", shared)
        if shared is None:
            raise ValueError(f"{what}: original_lm_head is set but there is no lm_heads.0.weight")
        lm = [shared] * K
    else:
        lm = []
        for h in range(K):
            w = state.pop(f"lm_heads.{h}.weight", None)
            if w is None:
                raise ValueError(f"{what}: missing lm_heads.{h}.weight")
            lm.append(w)
    if state:
        raise ValueError(f"{what}: unexpected weights {sorted(state)[:8]}")
    return blocks, lm


def import_medusa(
    blocks: dict[str, Tensor],
    lm: list[Tensor] | None,
    num_layers: int,
    base: str | None,
    target: nn.Module | None,
    what: str,
) -> nn.Module:
    """selfspec `MedusaHeads` from converted blocks and per-head lm_heads (None: the heads share the
    target's lm_head, which then must be given). The lm_heads are dropped in favour of the target's
    (``lm_head="target"``) when a target is given and every one equals it."""
    if lm is None:
        if target is None:
            raise ValueError(
                f"{what}: these Medusa heads (version 2) use the base model's lm_head; pass the target: "
                "load_heads(path, target) or infer.load(target, heads)"
            )
        V, H = target_dims(target)
        K = len({k.split(".")[1] for k in blocks})
        for k, w in blocks.items():
            if k.endswith(".weight") and tuple(w.shape) != (H, H):
                raise ValueError(
                    f"{what} is a checkpoint for another base model: {k} is {tuple(w.shape)}, the target's "
                    f"hidden size is {H}"
                )
        if not blocks:
            raise ValueError(
                f"{what}: version-2 Medusa heads with no layers would all be the target's lm_head"
            )
    else:
        V, H = (int(s) for s in lm[0].shape)
        K = len(lm)
        if any(tuple(w.shape) != (V, H) for w in lm):
            raise ValueError(f"{what}: the heads' lm_heads have different shapes")
        check_other_base(what, (V, H), target)
    mode = "target" if lm is None else "own"
    if lm is not None and target is not None:
        t = target.get_output_embeddings().weight.detach().cpu()
        if all(torch.equal(w.to(t.dtype), t) for w in lm):
            mode = "target"
    heads = MedusaHeads(
        MedusaConfig(
            hidden_size=H,
            vocab_size=V,
            base_model_name_or_path=base,
            num_heads=K,
            num_layers=num_layers,
            lm_head=mode,
        )
    )
    state = dict(blocks)
    if mode == "own":
        state.update({f"lm_heads.{h}.weight": w for h, w in enumerate(lm)})
    load_strict(heads, state, what)
    return heads
