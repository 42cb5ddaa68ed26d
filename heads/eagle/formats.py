"""EAGLE-1/2's export formats (SGLang, vLLM) and the import of EAGLE-1 checkpoints.

=========== ================ =====================================================================
head type   to               what is written
=========== ================ =====================================================================
eagle       ``sglang``       SGLang ``LlamaForCausalLMEagle`` (``Qwen2ForCausalLMEagle``): one-layer
                             config, ``fc.*``, ``layers.0.*`` (no ``input_layernorm``), no ``bias`` key
eagle       ``vllm``         vLLM EAGLE (``LlamaForCausalLM`` -> ``EagleLlamaForCausalLM``), same keys
=========== ================ =====================================================================

**Embedding scale (Gemma).** selfspec's drafts take ``embed(x)`` from the target's embedding *module*;
Gemma's multiplies the rows by s = sqrt(H) (in the weight dtype). Both engines give a Llama draft the
raw rows W[x]: vLLM shares the target's ``model.embed_tokens`` (a plain ``VocabParallelEmbedding``;
Gemma2/3's ``normalizer`` is applied in the target's ``embed_input_ids``/forward, outside it), SGLang
passes ``get_embed_and_head()``'s weight to ``set_embed``/``set_embed_and_head`` (the draft's plain
lookup; Gemma-3's ``Gemma3TextScaledWordEmbedding`` scale is in the target module's forward only). The
heads record s as ``embed_scale`` when made for a target (`heads.draft_layer.target_embed_scale`).
EAGLE-1: fc(cat(s W[x], f)) = (s W_e) W[x] + W_f f, so the export multiplies fc's embedding columns
(the first H in selfspec's layout and in both engines' ``cat((embeds, hidden_states))``) by s: exact up
to one rounding of the product in the weight dtype (`fold_embed_scale`; imports divide it out). Heads
without ``embed_scale`` are measured from ``target`` when given, else assumed 1.0 except for a Gemma
family target, which is refused. EAGLE-3 is not changed: its embedding enters only through the RMSNorm
``input_norm`` (``input_layernorm`` in the engines), which cancels s up to its eps: for a row of mean
square ms, the engines' output differs from selfspec's by the relative factor
1 - sqrt((ms + eps/s^2) / (ms + eps)) <= eps (1 - 1/s^2) / (2 ms) (zero rows: 0). No weight can absorb
it (the factor depends on the row), and the layer's one ``rms_norm_eps`` also sets its other three norms.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor, nn

from heads.draft_layer import target_embed_scale
from heads.eagle.config import EagleConfig
from heads.eagle.module import EagleHead
from heads.formats import (
    check_config_dims,
    draft_target_config,
    drop_embedding,
    engine_layer_config,
    fold_embed_scale,
    load_strict,
    need_target,
    read_state_file,
    strip_model_prefix,
    target_name,
    weights_file,
    with_dtype,
)
from heads.graft import target_dims
from heads.registry import REGISTRY, Exported, ExportFormat, ExportInputs

_NATIVE_HINT = "SGLang has a Qwen2 EAGLE draft class"


# ---------------------------------------------------------------------------------------------- export


def missing_embed_scale(cfg: dict[str, Any]) -> bool:
    """True iff exporting these heads needs the target's embedding scale, which they do not record: an
    EAGLE-1 head for a Gemma-family target saved before ``embed_scale`` was recorded."""
    mt = str((cfg.get("target_config") or {}).get("model_type", ""))
    return cfg.get("embed_scale") is None and "gemma" in mt


def resolve_embed_scale(cfg: dict[str, Any], target: nn.Module | None = None) -> float:
    """The factor s by which the target's embedding module scales its weight rows, for an EAGLE-1 export.

    The recorded ``embed_scale`` (checked against ``target`` if given); else measured from ``target``
    (`heads.draft_layer.target_embed_scale`); else 1.0, except for Gemma-family targets (whose embedding
    module multiplies by sqrt(H)), which are refused: a guessed factor would be silently wrong.
    """
    recorded = cfg.get("embed_scale")
    measured = target_embed_scale(target) if target is not None else None
    if target is not None and measured is None:
        raise ValueError(
            "cannot export EAGLE heads: the target's input embedding is not a scaled lookup of its weight rows, "
            "which is all an engine's Llama draft can compute"
        )
    if recorded is not None:
        if measured is not None and abs(measured - recorded) > 1e-3 * abs(recorded):
            raise ValueError(
                f"the heads recorded embed_scale {recorded}, but the given target's embedding scales by {measured}: "
                "a target other than the one the heads were trained on"
            )
        return float(recorded)
    if measured is not None:
        return measured
    if missing_embed_scale(cfg):
        mt = cfg["target_config"]["model_type"]
        raise ValueError(
            f"cannot export these EAGLE heads for a {mt!r} target without its embedding scale: they were saved "
            "before embed_scale was recorded, and Gemma's embedding module multiplies by sqrt(hidden_size), "
            "which the export folds into fc; pass the target (scripts/export_heads.py --target)"
        )
    return 1.0


# Why EAGLE-1 heads with a reduced draft vocabulary (``heads.eagle.draft_vocab_size``) are not exported.
REDUCED_VOCAB_REFUSAL = {
    "vllm": "cannot export EAGLE-1 heads with a reduced draft vocabulary (draft_vocab_size) to vLLM: its EAGLE-1 "
    "draft (EagleLlamaForCausalLM) scores the target's full vocabulary and has no d2t (draft_id_to_target_id is "
    "EAGLE-3's only); train without heads.eagle.draft_vocab_size to serve with vLLM",
    "sglang": "cannot export EAGLE-1 heads with a reduced draft vocabulary (draft_vocab_size) to SGLang yet: SGLang "
    "takes an EAGLE-1 draft vocabulary only from the server flag --speculative-token-map (FR-Spec), which this "
    "export does not write; train without heads.eagle.draft_vocab_size to serve with SGLang",
}


def eagle_to_engine(
    state: dict[str, Tensor], cfg: dict[str, Any], engine: str
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """selfspec EAGLE-1/2 (``fc.*``, ``layers.0.*``) -> SGLang ``LlamaForCausalLMEagle`` /
    ``Qwen2ForCausalLMEagle`` or vLLM EAGLE (``LlamaForCausalLM`` -> ``EagleLlamaForCausalLM``).

    The keys are already the engines' (``layers.0`` has no ``input_layernorm``; both engines replace it
    by the identity on layer 0). The fc bias differs: SGLang's ``fc`` is ``nn.Linear(2H, H)`` and always
    has a bias, so a bias-free head gets a zero ``fc.bias`` (the same function; without it SGLang keeps
    its random init). vLLM's ``EagleLlamaForCausalLM`` builds ``fc`` without a bias and skips weights it
    has no parameter for, so a head with a non-zero bias cannot be served by vLLM and is refused
    (train with ``heads.eagle.bias=false``, or serve with SGLang). No ``bias`` key is written: SGLang's
    Llama layer reads ``config.bias`` as *attention* bias.

    Embedding scale: both engines feed the draft the target's raw embedding rows W[x] (vLLM shares the
    target's ``embed_tokens`` module, SGLang its weight through ``set_embed_and_head``; Gemma's sqrt(H)
    is applied outside those, in the target's own forward), while selfspec's fc sees embed(x) = s W[x].
    So fc's embedding columns are multiplied by s = ``cfg["embed_scale"]`` (`resolve_embed_scale`,
    `fold_embed_scale`): exact up to one rounding of the product in the weight dtype.

    Heads with a reduced draft vocabulary (``draft_vocab_size``) are refused (`REDUCED_VOCAB_REFUSAL`).
    """
    if engine not in ("sglang", "vllm"):
        raise ValueError(f"EAGLE-1 exports to sglang or vllm, not {engine!r}")
    if cfg.get("draft_vocab_size") or "d2t" in state:
        raise ValueError(REDUCED_VOCAB_REFUSAL[engine])
    native = "qwen2" if engine == "sglang" else None  # SGLang's Qwen2ForCausalLMEagle
    family, layer = engine_layer_config(with_dtype(cfg, state), "eagle", engine, native, _NATIVE_HINT)
    H = cfg["hidden_size"]
    out = dict(state)
    out["fc.weight"] = fold_embed_scale(state["fc.weight"], resolve_embed_scale(cfg))
    if engine == "sglang":
        if "fc.bias" not in out:
            out["fc.bias"] = torch.zeros(H, dtype=state["fc.weight"].dtype)
        arch = "Qwen2ForCausalLMEagle" if family == "qwen2" else "LlamaForCausalLMEagle"
    else:
        if "fc.bias" in out:
            if torch.count_nonzero(state["fc.bias"]):
                raise ValueError(
                    "cannot export EAGLE heads with an fc bias to vLLM: vLLM's EAGLE draft "
                    "(EagleLlamaForCausalLM) builds fc without a bias and would silently drop it. Train with "
                    "heads.eagle.bias=false for vLLM, or export --to sglang"
                )
            del out["fc.bias"]
        arch = "LlamaForCausalLM"  # vLLM maps it to EagleLlamaForCausalLM for method "eagle"
    config = {
        "architectures": [arch],
        **layer,
        "base_model_name_or_path": cfg.get("base_model_name_or_path"),
    }
    return config, out


def _export(engine: str):
    def write(state: dict[str, Tensor], cfg: dict[str, Any], inputs: ExportInputs) -> Exported:
        scaled = {**cfg, "embed_scale": resolve_embed_scale(cfg, inputs.target)}
        config, out = eagle_to_engine(state, scaled, engine)
        return Exported(config, out)

    return ExportFormat(write, needs_embed_scale=missing_embed_scale)


EXPORTS = {"sglang": _export("sglang"), "vllm": _export("vllm")}
EXPORT_NOTES = {  # why a format is not offered (in the refusal)
    "medusa": "the medusa format is Medusa's",
    "speculators": "use --to vllm for EAGLE-1 heads",
}


# ---------------------------------------------------------------------------------------------- import


_EAGLE3_KEYS = ("eagle_config", "draft_vocab_size", "speculators_model_type")


def detect(raw: dict[str, Any]) -> str | None:
    """``"eagle"`` for EAGLE-1's layout: a one-layer decoder config (SGLang / vLLM / EAGLE's own) without
    EAGLE-3's keys or architecture names; else None."""
    if any(k in raw for k in _EAGLE3_KEYS) or any("Eagle3" in a for a in raw.get("architectures") or []):
        return None
    if raw.get("num_hidden_layers") == 1 and raw.get("model_type") and "hidden_size" in raw:
        return "eagle"
    return None


def import_state(directory: str, raw: dict[str, Any], target: nn.Module | None = None) -> nn.Module:
    """`EagleHead` from an EAGLE-1 checkpoint directory (needs the target). A draft in EAGLE-1's config
    layout whose ``fc`` reads 3H features is an EAGLE-3 one (some trainers write no EAGLE-3 keys) and is
    handed to the ``eagle3`` head type's import."""
    path = weights_file(directory)
    state = read_state_file(path)
    fc = state.get("fc.weight", state.get("model.fc.weight"))
    if fc is not None and fc.dim() == 2 and fc.shape[1] == 3 * fc.shape[0] and "eagle3" in REGISTRY:
        return REGISTRY["eagle3"].import_state(directory, raw, target)
    return import_eagle(state, raw, target, path)


def import_eagle(
    state: dict[str, Tensor], raw: dict[str, Any], target: nn.Module | None, what: str
) -> nn.Module:
    """EAGLE-1/2 checkpoint (``fc.*``, ``layers.0.*``, maybe ``embed_tokens``) -> `EagleHead`.

    Its fc was fed the raw embedding rows (as the engines feed them): for a target whose embedding module
    scales (Gemma), fc's embedding columns are divided by the scale, the inverse of the export's fold.

    fc bias: a checkpoint without ``fc.bias`` imports as ``bias=False`` (the same function as a zero bias)
    even where its config says ``bias: true`` (a known inconsistency of published EAGLE checkpoints,
    which engines then fill with a random init); a non-zero ``fc.bias`` where the config says
    ``bias: false`` is contradictory and refused.
    """
    target = need_target(target, what)
    check_config_dims(raw, target, what)
    vocab, hidden = target_dims(target)
    state = strip_model_prefix(dict(state))
    drop_embedding(state, hidden, vocab, what)
    w = state.get("fc.weight")
    if w is None:
        raise ValueError(f"{what}: no fc.weight, not an EAGLE checkpoint")
    if tuple(w.shape) != (hidden, 2 * hidden):
        raise ValueError(
            f"{what} is a checkpoint for another base model: fc.weight is {tuple(w.shape)}, an EAGLE draft for "
            f"this target (hidden {hidden}) has ({hidden}, {2 * hidden})"
        )
    if "layers.0.input_layernorm.weight" in state:
        raise ValueError(
            f"{what}: layers.0.input_layernorm.weight is present, but an EAGLE draft has no input norm on layer 0"
        )
    said = raw.get("bias")
    bias = state.get("fc.bias")
    if bias is None:
        if said:
            warnings.warn(
                f"{what}: config says bias=true but there is no fc.bias; importing without a bias",
                stacklevel=2,
            )
        use_bias = False
    else:
        if said is False and torch.count_nonzero(bias):
            # SafeAILab's eagle/train/main.py builds fc with a bias whatever its config.json says (its
            # Llama-3 template says false): the bias is part of the function the draft was trained as
            warnings.warn(
                f"{what}: config says bias=false but fc.bias is present and non-zero; importing the bias (the "
                "trained function; EAGLE's EaModel and engines that read bias=false would drop it)",
                stacklevel=2,
            )
        use_bias = True
    scale = target_embed_scale(target)
    if scale:  # the engines and EAGLE's own code feed fc raw rows W[x]; selfspec feeds embed(x) = s W[x]
        state["fc.weight"] = fold_embed_scale(w, 1.0 / scale)
    head = EagleHead(
        EagleConfig(
            hidden_size=hidden,
            vocab_size=vocab,
            base_model_name_or_path=target_name(raw, target),
            target_config=draft_target_config(raw, target, what),
            draft_layer="target",  # as before draft_layer existed (the same layer for Llama targets)
            embed_scale=scale,
            bias=use_bias,
        )
    )
    load_strict(head, state, what)
    return head
