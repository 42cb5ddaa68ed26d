"""What the export and import formats of every head type share (the head types' own mappings are in
``heads/<type>/formats.py``; `heads.convert` dispatches to them through the registry).

- the Llama draft config the engines read (`llama_draft_config`, `rope_legacy`, `check_llama_compatible`)
  and `engine_layer_config`: which layer an engine must rebuild for a ``draft_layer: llama`` or
  ``draft_layer: target`` head.
- `fold_embed_scale`: an embedding scale folded into a weight's embedding columns (EAGLE-1, Gemma).
- reading a foreign checkpoint: `read_state_file` (safetensors, or ``torch.load(weights_only=True)``:
  pickled code is refused, never run), `weights_file` (inside the directory), `load_strict` (names and
  shapes must match exactly), and the checks against the target (`check_other_base`, `need_target`).

**Target weights in a draft** (docs/design.md §8: never, unless a format strictly requires them). No export
writes the target's embedding. Two Medusa formats must hold the target's lm_head when selfspec's heads
reuse it (see `heads.medusa.formats`); only these need the target model loaded.

**Draft layers** (`engine_layer_config`). ``draft_layer: llama`` heads export to the engines' Llama
draft classes for any target (the layer's config is the recorded ``draft_layer_config``);
``draft_layer: target`` heads export where an engine has that family's draft class: Llama/Mistral
(Llama classes), Qwen3 EAGLE-3 (vLLM ``Eagle3Qwen3ForCausalLM``, HF layout with ``num_aux_layers``),
Qwen2 EAGLE-1 (SGLang ``Qwen2ForCausalLMEagle``); anything else raises a one-line ``ValueError``.
tests/test_engines.py loads every claimed pair with the engines' own code. Imports rebuild the layer
from the *target's* config class (as `heads.eagle` always does) and load the weights strictly.
"""

from __future__ import annotations

import os
import pickle
import re
import warnings
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor, nn

from heads.draft_layer import target_config_dict
from heads.graft import target_dims
from heads.guard import inside

# target architectures whose decoder layer is exactly the engines' Llama layer
LLAMA_COMPATIBLE = ("llama", "mistral")
# files an imported checkpoint's weights may be in, in order of preference (safetensors first)
FOREIGN_WEIGHTS = (
    "model.safetensors",
    "medusa_lm_head.safetensors",
    "pytorch_model.bin",
    "medusa_lm_head.pt",
    "model.pt",
)


# ---------------------------------------------------------------------------------------------- export


def cpu_state(state: dict[str, Tensor]) -> dict[str, Tensor]:
    # clone: safetensors refuses tensors that share storage (e.g. K copies of one lm_head)
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}


def dtype_name(state: dict[str, Tensor]) -> str:
    floats = [v.dtype for v in state.values() if v.is_floating_point()]
    return str(floats[0]).removeprefix("torch.") if floats else "float32"


def with_dtype(cfg: dict[str, Any], state: dict[str, Tensor]) -> dict[str, Any]:
    return {**cfg, "_dtype": dtype_name(state)}


def check_llama_compatible(target_config: dict[str, Any], what: str) -> None:
    """Raise ``ValueError`` unless the engines' Llama draft layer computes the same function as the
    target-architecture layer selfspec built from ``target_config``."""
    mt = target_config.get("model_type")
    problems = []
    if mt not in LLAMA_COMPATIBLE:
        problems.append(f"its layer is a {mt!r} layer, not a Llama layer")
    else:
        if target_config.get("attention_bias"):
            problems.append("attention_bias=True (the engines' EAGLE layers build q/k/v without bias)")
        if target_config.get("mlp_bias"):
            problems.append("mlp_bias=True")
        if target_config.get("hidden_act", "silu") != "silu":
            problems.append(
                f"hidden_act={target_config.get('hidden_act')!r} (the engines' Llama MLP is SiLU)"
            )
    if problems:
        raise ValueError(
            f"cannot export {what}: the engines rebuild the draft as a Llama decoder layer, but "
            + "; ".join(problems)
            + f". Supported targets: {', '.join(LLAMA_COMPATIBLE)}. The selfspec checkpoint still works with "
            "infer.generate."
        )


def rope_legacy(target_config: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) in the pre-transformers-5 keys the engines read, from either layout."""
    rp = target_config.get("rope_parameters")
    if isinstance(rp, dict) and "rope_theta" in rp:
        theta = float(rp["rope_theta"])
        scaling = {k: v for k, v in rp.items() if k != "rope_theta"}
        if scaling.get("rope_type", "default") == "default" and len(scaling) <= 1:
            scaling = None
        return theta, scaling
    if "rope_theta" in target_config:
        return float(target_config["rope_theta"]), target_config.get("rope_scaling")
    raise ValueError("the target config has neither rope_parameters.rope_theta nor rope_theta")


def llama_draft_config(
    target_config: dict[str, Any], hidden_size: int, vocab_size: int, dtype: str
) -> dict[str, Any]:
    """A one-layer Llama config describing selfspec's draft layer for a Llama-compatible target.

    Only architecture keys; ``vocab_size`` is the target's (the engines size their embedding, shared
    with the target, by it). RoPE is written as ``rope_theta``/``rope_scaling``, which every engine's
    transformers reads (transformers 5 converts them to ``rope_parameters``).
    """
    tc = target_config
    theta, scaling = rope_legacy(tc)
    heads = int(tc["num_attention_heads"])
    return {
        "model_type": "llama",
        "hidden_size": hidden_size,
        "intermediate_size": int(tc["intermediate_size"]),
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": int(tc.get("num_key_value_heads") or heads),
        "head_dim": int(tc.get("head_dim") or hidden_size // heads),
        "hidden_act": "silu",
        "rms_norm_eps": float(tc["rms_norm_eps"]),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "max_position_embeddings": int(tc["max_position_embeddings"]),
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,  # SGLang would otherwise use the embedding as the draft lm_head
        "vocab_size": vocab_size,
        "bos_token_id": tc.get("bos_token_id"),
        "eos_token_id": tc.get("eos_token_id"),
        "torch_dtype": dtype,
    }


def engine_layer_config(
    cfg: dict[str, Any], head: str, engine: str, native: str | None = None, native_hint: str = ""
) -> tuple[str, dict[str, Any]]:
    """(layer family, one-layer config in the engines' keys) of the draft layer an engine must rebuild.

    ``draft_layer: llama`` heads (any target) and ``target`` heads on a Llama-compatible target give a
    Llama layer; ``target`` heads on Qwen3 (EAGLE-3, vLLM ``Eagle3Qwen3ForCausalLM``) or Qwen2 (EAGLE-1,
    SGLang ``Qwen2ForCausalLMEagle``) give the target's own layer config; anything else is refused.
    ``native``: the target family (``model_type``) whose own layer ``engine`` has a ``head`` draft class
    for (the head type's export says which); ``native_hint``: where such a class exists, for the refusal.
    """
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    tc = cfg["target_config"]
    dtype = cfg.get("_dtype", "float32")
    if cfg["draft_layer"] == "llama":
        return "llama", llama_draft_config({**tc, **cfg["draft_layer_config"]}, H, V, dtype)
    mt = tc.get("model_type")
    if native is not None and mt == native:
        layer = {k: v for k, v in tc.items() if k not in ("architectures", "auto_map", "layer_types", "_name_or_path")}
        layer.update(num_hidden_layers=1, tie_word_embeddings=False, vocab_size=V, torch_dtype=dtype)
        return mt, layer
    if mt not in LLAMA_COMPATIBLE:
        raise ValueError(
            f"cannot export {head} heads with draft_layer: target on a {mt!r} target to {engine}: {engine} has no "
            f"{mt} {head} draft class ({native_hint}); retrain with heads.{head}.draft_layer=llama, "
            "whose Llama layer every engine serves"
        )
    check_llama_compatible(tc, f"{head} heads to {engine}")
    return "llama", llama_draft_config(tc, H, V, dtype)


def fold_embed_scale(fc_weight: Tensor, scale: float) -> Tensor:
    """fc.weight [H, 2H] with its embedding columns (the first H: every layout concatenates the embedding
    first) multiplied by ``scale``: fc(cat(s e, f)) = (s W_e) e + W_f f, so the engines' unscaled lookup e
    gives selfspec's function. Computed in float32 and rounded once to the weight dtype."""
    if scale == 1.0:
        return fc_weight
    H = fc_weight.shape[0]
    out = fc_weight.clone()
    out[:, :H] = (fc_weight[:, :H].float() * scale).to(fc_weight.dtype)
    return out


# ---------------------------------------------------------------------------------------------- import


def read_state_file(path: str) -> dict[str, Tensor]:
    """A flat ``{name: tensor}`` from a safetensors file or a ``torch.save``d state dict.

    Pickles are read with ``torch.load(weights_only=True)`` only: a file that needs anything beyond
    tensors and plain containers (a pickled class, i.e. code) is refused, never executed.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing")
    if path.endswith(".safetensors"):
        try:
            return load_file(path)
        except (SafetensorError, OSError, ValueError) as e:
            raise ValueError(f"{path} could not be read (corrupt or truncated safetensors file?): {e}") from e
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        lines = [ln.strip() for ln in re.sub(r"\x1b\[[0-9;]*m", "", str(e)).splitlines()]
        detail = next((ln for ln in lines if "Unsupported global" in ln), lines[0] if lines else "")
        raise ValueError(
            f"{path} contains pickled code (objects other than tensors), which could run arbitrary code when "
            "loaded; it is refused. Convert it to safetensors in an environment you trust, e.g. "
            f"safetensors.torch.save_file(state_dict, 'model.safetensors'). ({detail})"
        ) from e
    except (RuntimeError, EOFError, OSError) as e:
        raise ValueError(f"{path} could not be read (corrupt or truncated checkpoint?): {e}") from e
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise ValueError(f"{path} does not hold a flat state dict of tensors (got {type(obj).__name__})")
    return dict(obj)


def weights_file(directory: str, names: tuple[str, ...] = FOREIGN_WEIGHTS) -> str:
    """The first of ``names`` that is a file inside ``directory`` (a symlink out of it is refused)."""
    for name in names:
        path = inside(directory, name)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"{directory}: no weights file found (looked for {', '.join(names)})")


def check_other_base(what: str, got: tuple[int, int], target: nn.Module | None) -> None:
    """got = (vocab, hidden) of the checkpoint; raise if ``target`` has other sizes."""
    if target is None:
        return
    vocab, hidden = target_dims(target)
    if got != (vocab, hidden):
        name = getattr(target.config, "_name_or_path", "") or type(target).__name__
        raise ValueError(
            f"{what} is a checkpoint for another base model: vocab {got[0]} x hidden {got[1]}, but target "
            f"{name!r} has vocab {vocab} x hidden {hidden}"
        )


def target_name(raw: dict[str, Any], target: nn.Module | None) -> str | None:
    name = raw.get("base_model_name_or_path")
    if not name and isinstance(raw.get("speculators_config"), dict):
        name = (raw["speculators_config"].get("verifier") or {}).get("name_or_path")
    if not name and target is not None:
        name = getattr(target.config, "_name_or_path", None) or None
    return name


def load_strict(module: nn.Module, state: dict[str, Tensor], what: str) -> None:
    own = module.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    shapes = [
        f"{k} {tuple(state[k].shape)} != {tuple(own[k].shape)}"
        for k in set(own) & set(state)
        if state[k].shape != own[k].shape
    ]
    if missing or unexpected or shapes:
        raise ValueError(
            f"{what} does not match a selfspec {module.config.head_type} head for this target: missing "
            f"{missing}, unexpected {unexpected}, shape mismatches {sorted(shapes)}"
        )
    module.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()})


def strip_model_prefix(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Some trainers save the draft as ``model.*`` (beside ``lm_head``, ``d2t``...): drop that prefix."""
    if "model.fc.weight" in state and "fc.weight" not in state:
        return {k.removeprefix("model."): v for k, v in state.items()}
    return state


def draft_target_config(raw: dict[str, Any], target: nn.Module, what: str) -> dict[str, Any]:
    """The target's config dict, with the RoPE and norm eps the draft was built with when its config says.

    An engine builds the draft layer from the draft's own config; EAGLE's trainer even ignored the
    target's rope_theta (docs/design.md §8). Taking them from the draft config keeps the imported head the
    function the engine would run; a difference from the target is reported.
    """
    tc = target_config_dict(target)
    layer = raw.get("transformer_layer_config", raw)
    rp = tc.get("rope_parameters")
    if isinstance(rp, dict) and "rope_theta" in rp and ("rope_theta" in layer or "rope_parameters" in layer):
        theta, scaling = rope_legacy(layer)
        mine = {"rope_type": "default", **(scaling or {}), "rope_theta": theta}
        mine.pop("type", None)
        if mine != rp:
            warnings.warn(
                f"{what}: the draft was built with RoPE {mine}, the target uses {rp}; importing the draft's",
                stacklevel=2,
            )
            tc["rope_parameters"] = mine
    eps = layer.get("rms_norm_eps")
    if eps is not None and "rms_norm_eps" in tc and float(eps) != float(tc["rms_norm_eps"]):
        warnings.warn(
            f"{what}: the draft's rms_norm_eps {eps} differs from the target's {tc['rms_norm_eps']}",
            stacklevel=2,
        )
        tc["rms_norm_eps"] = float(eps)
    return tc


def drop_embedding(state: dict[str, Tensor], hidden: int, vocab: int, what: str) -> None:
    """EAGLE checkpoints often hold a copy of the frozen target embedding: check its shape, drop it."""
    emb = state.pop("embed_tokens.weight", None)
    if emb is not None and tuple(emb.shape) != (vocab, hidden):
        raise ValueError(
            f"{what} is a checkpoint for another base model: its embed_tokens is {tuple(emb.shape)}, the "
            f"target's embedding is ({vocab}, {hidden})"
        )


def check_config_dims(raw: dict[str, Any], target: nn.Module, what: str) -> None:
    """The draft config's vocab/hidden sizes (when it states them) must be the target's."""
    layer = raw.get("transformer_layer_config", raw)
    if "vocab_size" in layer and "hidden_size" in layer:
        check_other_base(what, (int(layer["vocab_size"]), int(layer["hidden_size"])), target)


def need_target(target: nn.Module | None, what: str) -> nn.Module:
    if target is None:
        raise ValueError(
            f"importing {what} needs the target model: its draft layer is rebuilt from the target's own config "
            "class. Pass it: load_heads(path, target) or infer.load(target, heads)"
        )
    return target
