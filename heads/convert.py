"""Export selfspec heads to the serving engines' formats, and import Medusa / EAGLE / EAGLE-3 checkpoints.

Every mapping is a small pure function over a state dict and a config dict; `export_heads` and
`import_heads` only add file handling around them. The schemas were read from the engines' loaders
(vLLM ``models/medusa.py``, ``llama_eagle.py``, ``llama_eagle3.py``, ``transformers_utils/configs/
speculators``; SGLang ``models/llama_eagle.py``, ``llama_eagle3.py``; Medusa's ``medusa_model.py``;
vllm-project/speculators ``models/eagle3``); docs/design.md §9 lists them.

Exports (``to``):

=========== ================ =====================================================================
head type   to               what is written
=========== ================ =====================================================================
medusa      ``vllm``         vLLM ``MedusaModel``: ``blocks.{h}.layers.{l}.weight|bias`` and
                             ``lm_heads.{h}.weight`` (one shared ``lm_heads.0`` with
                             ``original_lm_head: true`` when the heads reuse the target's lm_head)
medusa      ``medusa``       original Medusa: ``medusa_num_heads``/``medusa_num_layers`` config and
                             ``medusa_lm_head.safetensors`` with ``{h}.{l}.linear.*`` and ``{h}.{L}.weight``
eagle       ``sglang``       SGLang ``LlamaForCausalLMEagle`` (``Qwen2ForCausalLMEagle``): one-layer
                             config, ``fc.*``, ``layers.0.*`` (no ``input_layernorm``), no ``bias`` key
eagle       ``vllm``         vLLM EAGLE (``LlamaForCausalLM`` -> ``EagleLlamaForCausalLM``), same keys
eagle3      ``sglang``       HF/SGLang ``LlamaForCausalLMEagle3``: ``fc``, ``midlayer.*``, ``norm``,
                             ``lm_head``, ``d2t``, ``t2d``; aux ids in SGLang's convention
eagle3      ``speculators``  vLLM speculators ``Eagle3Speculator`` (``vllm`` is an alias): ``fc``,
                             ``layers.0.*``, ``norm``, ``lm_head``, ``d2t``, ``t2d``; vLLM's convention
=========== ================ =====================================================================

Medusa -> SGLang is refused (SGLang has no Medusa drafter; neither has vLLM 0.33: ``--to vllm`` is
for vLLM <= 0.32). ``--to medusa`` also writes ``medusa_lm_head.pt`` (tensors only), the file
FasterDecoding's loader reads. With the full target vocabulary EAGLE-3 exports write no ``d2t``/``t2d``.

**Target weights in a draft** (docs/design.md §8: never, unless a format strictly requires them). No export
writes the target's embedding. Two Medusa formats must hold the target's lm_head when selfspec's heads
reuse it (``lm_head="target"``): vLLM's ``MedusaModel`` computes draft logits only with its own
``lm_heads`` and has no way to borrow the target's, so one copy is written as ``lm_heads.0`` with
``original_lm_head: true`` (vLLM shares it over the heads); the original Medusa format gives every
head its own ``{h}.{L}.weight`` (a ``Sequential`` ending in a Linear), so K copies are written. Only
these two need the target model loaded.

**EAGLE-3 aux layer ids.** selfspec's ``aux_layer_ids`` index HF ``hidden_states``: id i is the *input*
of decoder layer i (the output of layer i-1), see `heads.eagle3`. The engines differ:

- vLLM captures ``hidden_states + residual`` *before* running layer ``idx`` for ``idx`` in
  ``eagle_aux_hidden_state_layer_ids`` (``models/llama.py`` forward), i.e. the input of layer idx: the
  same numbers as selfspec. The speculators format carries them at the top level of ``config.json``.
- SGLang's ``set_eagle3_layers_to_capture`` stores ``[val + 1 for val in layer_ids]`` for ids from the
  draft config's ``eagle_config.eagle_aux_hidden_state_layer_ids`` and captures the input of those
  layers: a configured id j means "the output of layer j", i.e. selfspec id j + 1. (With no ids
  configured it captures ``[2, L//2, L-3]`` without the +1, which is selfspec's default.)

So the SGLang export writes ``id - 1`` (id 0, the embedding output, is -1: the input of layer 0, which
SGLang accepts) and the speculators export writes ``id`` unchanged; importing inverts this. Both engines
capture in sorted, de-duplicated order, so ids that are not distinct and increasing are refused. Serving the
SGLang-format directory with vLLM is not recommended: vLLM versions that read the nested
``eagle_config`` ids use them as-is, one layer off.

**norm_before_residual.** In the EAGLE-3 layer the residual stream is either the fused feature g
before its norm (``residual = g; h = hidden_norm(g)``, norm *after* taking the residual) or the normed
one (``h = hidden_norm(g); residual = h``). selfspec's layer keeps the pre-norm g as residual (the
layer's ``input_layernorm`` is replaced by the fusion, and the decoder layer adds its input), as
SGLang's ``LlamaDecoderLayer`` for EAGLE-3 does unconditionally; that is speculators'
``norm_before_residual: false``. vLLM's speculators config reader defaults a *missing*
``norm_before_residual`` to ``true``, so the export always writes ``false`` explicitly, and an import
of a checkpoint whose layer norms before the residual (or does not say) is refused.

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

**Draft layers** (`engine_layer_config`). ``draft_layer: llama`` heads export to the engines' Llama
draft classes for any target (the layer's config is the recorded ``draft_layer_config``);
``draft_layer: target`` heads export where an engine has that family's draft class: Llama/Mistral
(Llama classes), Qwen3 EAGLE-3 (vLLM ``Eagle3Qwen3ForCausalLM``, HF layout with ``num_aux_layers``),
Qwen2 EAGLE-1 (SGLang ``Qwen2ForCausalLMEagle``); anything else raises a one-line ``ValueError``.
tests/test_engines.py loads every claimed pair with the engines' own code. Imports rebuild the layer
from the *target's* config class (as `heads.eagle` always does) and load the weights strictly.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import warnings
from typing import Any

import torch
from torch import Tensor, nn

from heads.base import CONFIG_NAME, WEIGHTS_NAME
from heads.io import atomic_text, atomic_write

EXPORT_FORMATS = ("vllm", "sglang", "speculators", "medusa")
SUPPORTED_EXPORTS: dict[str, tuple[str, ...]] = {
    "medusa": ("vllm", "medusa"),
    "eagle": ("sglang", "vllm"),
    "eagle3": ("sglang", "speculators", "vllm"),
}
MEDUSA_WEIGHTS_NAME = "medusa_lm_head.safetensors"
# target architectures whose decoder layer is exactly the engines' Llama layer
LLAMA_COMPATIBLE = ("llama", "mistral")
_VERIFIER_ARCH = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}
# files an imported checkpoint's weights may be in, in order of preference (safetensors first)
_FOREIGN_WEIGHTS = (
    "model.safetensors",
    MEDUSA_WEIGHTS_NAME,
    "pytorch_model.bin",
    "medusa_lm_head.pt",
    "model.pt",
)
# the one-layer Llama draft's own keys, relative to its layer prefix
_LLAMA_LAYER_KEYS = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "post_attention_layernorm.weight",
)


# ---------------------------------------------------------------------------------------------- helpers


def _cpu(state: dict[str, Tensor]) -> dict[str, Tensor]:
    # clone: safetensors refuses tensors that share storage (e.g. K copies of one lm_head)
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}


def _dtype_name(state: dict[str, Tensor]) -> str:
    floats = [v.dtype for v in state.values() if v.is_floating_point()]
    return str(floats[0]).removeprefix("torch.") if floats else "float32"


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


def _expect_keys(state: dict[str, Tensor], expected: set[str], what: str) -> None:
    missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or extra:
        raise ValueError(f"{what}: unexpected weight names: missing {missing}, unexpected {extra}")


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
        "torch_dtype": _dtype_name(state if state else out),
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


def check_aux_ids(ids: list[int], what: str) -> None:
    """Both engines capture the aux hidden states in sorted, de-duplicated layer order (vLLM
    ``tuple(sorted(set(layers)))``; SGLang in its layer loop), so heads trained on other ids would be fed
    other features: refuse them."""
    if list(ids) != sorted(set(ids)):
        raise ValueError(
            f"cannot export {what}: aux_layer_ids {list(ids)} are not distinct and increasing, but the engines "
            "capture aux hidden states in sorted, de-duplicated layer order (the heads would get other features)"
        )


def engine_layer_config(cfg: dict[str, Any], head: str, engine: str) -> tuple[str, dict[str, Any]]:
    """(layer family, one-layer config in the engines' keys) of the draft layer an engine must rebuild.

    ``draft_layer: llama`` heads (any target) and ``target`` heads on a Llama-compatible target give a
    Llama layer; ``target`` heads on Qwen3 (EAGLE-3, vLLM ``Eagle3Qwen3ForCausalLM``) or Qwen2 (EAGLE-1,
    SGLang ``Qwen2ForCausalLMEagle``) give the target's own layer config; anything else is refused.
    """
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    tc = cfg["target_config"]
    dtype = cfg.get("_dtype", "float32")
    if cfg.get("draft_layer", "target") == "llama":
        return "llama", llama_draft_config({**tc, **cfg["draft_layer_config"]}, H, V, dtype)
    mt = tc.get("model_type")
    native = {("eagle3", "qwen3", "vllm"), ("eagle", "qwen2", "sglang")}
    if (head, mt, engine) in native:
        layer = {k: v for k, v in tc.items() if k not in ("architectures", "auto_map", "layer_types", "_name_or_path")}
        layer.update(num_hidden_layers=1, tie_word_embeddings=False, vocab_size=V, torch_dtype=dtype)
        return mt, layer
    if mt not in LLAMA_COMPATIBLE:
        where = {"eagle3": "vLLM has a Qwen3 EAGLE-3 draft class", "eagle": "SGLang has a Qwen2 EAGLE draft class"}
        raise ValueError(
            f"cannot export {head} heads with draft_layer: target on a {mt!r} target to {engine}: {engine} has no "
            f"{mt} {head} draft class ({where.get(head, '')}); retrain with heads.options.draft_layer=llama, "
            "whose Llama layer every engine serves"
        )
    check_llama_compatible(tc, f"{head} heads to {engine}")
    return "llama", llama_draft_config(tc, H, V, dtype)


def needs_embed_scale(cfg: dict[str, Any]) -> bool:
    """True iff exporting these heads needs the target's embedding scale, which they do not record: an
    EAGLE-1 head for a Gemma-family target saved before ``embed_scale`` was recorded."""
    mt = str((cfg.get("target_config") or {}).get("model_type", ""))
    return cfg.get("head_type") == "eagle" and cfg.get("embed_scale") is None and "gemma" in mt


def resolve_embed_scale(cfg: dict[str, Any], target: nn.Module | None = None) -> float:
    """The factor s by which the target's embedding module scales its weight rows, for an EAGLE-1 export.

    The recorded ``embed_scale`` (checked against ``target`` if given); else measured from ``target``
    (`heads.draft_layer.target_embed_scale`); else 1.0, except for Gemma-family targets (whose embedding
    module multiplies by sqrt(H)), which are refused: a guessed factor would be silently wrong.
    """
    from heads.draft_layer import target_embed_scale

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
    if needs_embed_scale({**cfg, "head_type": "eagle"}):
        mt = cfg["target_config"]["model_type"]
        raise ValueError(
            f"cannot export these EAGLE heads for a {mt!r} target without its embedding scale: they were saved "
            "before embed_scale was recorded, and Gemma's embedding module multiplies by sqrt(hidden_size), "
            "which the export folds into fc; pass the target (scripts/export_heads.py --target)"
        )
    return 1.0


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


def _with_dtype(cfg: dict[str, Any], state: dict[str, Tensor]) -> dict[str, Any]:
    return {**cfg, "_dtype": _dtype_name(state)}


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
    (train with ``heads.options.bias=false``, or serve with SGLang). No ``bias`` key is written: SGLang's
    Llama layer reads ``config.bias`` as *attention* bias.

    Embedding scale: both engines feed the draft the target's raw embedding rows W[x] (vLLM shares the
    target's ``embed_tokens`` module, SGLang its weight through ``set_embed_and_head``; Gemma's sqrt(H)
    is applied outside those, in the target's own forward), while selfspec's fc sees embed(x) = s W[x].
    So fc's embedding columns are multiplied by s = ``cfg["embed_scale"]`` (`resolve_embed_scale`,
    `fold_embed_scale`): exact up to one rounding of the product in the weight dtype.
    """
    if engine not in ("sglang", "vllm"):
        raise ValueError(f"EAGLE-1 exports to sglang or vllm, not {engine!r}")
    family, layer = engine_layer_config(_with_dtype(cfg, state), "eagle", engine)
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
                    "heads.options.bias=false for vLLM, or export --to sglang"
                )
            del out["fc.bias"]
        arch = "LlamaForCausalLM"  # vLLM maps it to EagleLlamaForCausalLM for method "eagle"
    config = {
        "architectures": [arch],
        **layer,
        "base_model_name_or_path": cfg.get("base_model_name_or_path"),
    }
    return config, out


def _eagle3_layer_state(state: dict[str, Tensor], prefix: str, full_vocab: bool) -> dict[str, Tensor]:
    """selfspec EAGLE-3 keys -> the engines' (``prefix`` = ``midlayer.`` or ``layers.0.``).

    With the full target vocabulary no ``d2t``/``t2d`` is written: vLLM then has no
    ``draft_id_to_target_id`` parameter (a ``d2t`` fails its load) and SGLang uses the identity."""
    if "midlayer.self_attn.q_proj.weight" not in state or "fc.weight" not in state:
        raise ValueError(f"EAGLE-3 heads: unexpected weight names {sorted(state)[:8]}")
    out = {k: v for k, v in state.items() if not k.startswith(("midlayer.", "input_norm.", "hidden_norm."))}
    for k, v in state.items():
        if k.startswith("midlayer."):
            out[prefix + k.removeprefix("midlayer.")] = v
    # the fusion's two norms live inside the engines' layer: input_layernorm is applied to the embedding
    out[prefix + "input_layernorm.weight"] = state["input_norm.weight"]
    out[prefix + "hidden_norm.weight"] = state["hidden_norm.weight"]
    if full_vocab:
        del out["d2t"], out["t2d"]
    else:
        out["d2t"] = state["d2t"].to(torch.int64)
        out["t2d"] = state["t2d"].to(torch.bool)
    return out


def _eagle3_common(state: dict[str, Tensor], cfg: dict[str, Any], engine: str):
    ids = [int(i) for i in cfg["aux_layer_ids"]]
    check_aux_ids(ids, f"EAGLE-3 heads to {engine}")
    family, layer = engine_layer_config(_with_dtype(cfg, state), "eagle3", engine)
    Vd = int(state["lm_head.weight"].shape[0])
    return ids, family, layer, Vd, Vd == cfg["vocab_size"]


def eagle3_to_sglang(
    state: dict[str, Tensor], cfg: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """selfspec EAGLE-3 -> HF/SGLang ``LlamaForCausalLMEagle3`` with SGLang's aux ids (selfspec id - 1).

    Loaders: SGLang ``EAGLE3`` (and HF-layout trainers such as SpecForge). No ``target_hidden_size``: the
    engines read it only to size ``fc`` (3 x it, else 3 x ``hidden_size``, the same here), while
    SafeAILab's ``EaModel`` takes its presence to mean "the draft file holds the embedding" and would
    keep a random one; without it, EaModel reads the embedding from the target's shard index
    (``model.safetensors.index.json``; a single-file target has none and EaModel fails to load).
    EaModel's target code captures the layers (2, L//2, L-3) whatever the config says, so it runs
    heads trained with other ``aux_layer_ids`` on other features.
    """
    ids, _, layer, Vd, full = _eagle3_common(state, cfg, "sglang")
    out = _eagle3_layer_state(state, "midlayer.", full)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **layer,
        "draft_vocab_size": Vd,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": [i - 1 for i in ids],  # id 0 -> -1: the input of layer 0
            "use_aux_hidden_state": True,
        },
        "base_model_name_or_path": cfg.get("base_model_name_or_path"),
    }
    return config, out


def eagle3_to_speculators(
    state: dict[str, Tensor], cfg: dict[str, Any], speculative_tokens: int = 3
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """selfspec EAGLE-3 -> vLLM speculators ``Eagle3Speculator`` with vLLM's aux ids (= selfspec ids); a
    ``draft_layer: target`` head on a Qwen3 target -> vLLM's ``Eagle3Qwen3ForCausalLM`` (HF layout)."""
    if speculative_tokens < 1:
        raise ValueError(f"speculative_tokens must be >= 1, got {speculative_tokens}")
    ids, family, layer, Vd, full = _eagle3_common(state, cfg, "vllm")
    out = _eagle3_layer_state(state, "layers.0.", full)
    H = cfg["hidden_size"]
    eagle3 = {
        "draft_vocab_size": Vd,
        "norm_before_residual": False,
        "target_hidden_size": H,
        "eagle_aux_hidden_state_layer_ids": ids,
    }
    if family == "qwen3":  # vLLM renames Qwen3ForCausalLM to Eagle3Qwen3ForCausalLM for method eagle3
        config = {"architectures": ["Qwen3ForCausalLM"], **layer, **eagle3, "num_aux_layers": len(ids),
                  "base_model_name_or_path": cfg.get("base_model_name_or_path")}
        return config, out
    layer_cfg = {**layer, "architectures": ["LlamaForCausalLM"]}
    mt = cfg["target_config"].get("model_type")
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(speculative_tokens)}],
            "verifier": {
                "name_or_path": cfg.get("base_model_name_or_path"),
                "architectures": [_VERIFIER_ARCH.get(mt) or cfg["target_config"].get("architectures", [None])[0]],
            },
        },
        "transformer_layer_config": layer_cfg,
        **eagle3,
        "torch_dtype": layer_cfg["torch_dtype"],
    }
    return config, out


def needs_target_weights(heads: nn.Module, to: str) -> bool:
    """True iff exporting ``heads`` to ``to`` must copy target weights (Medusa reusing the target lm_head)."""
    cfg = heads.config
    return cfg.head_type == "medusa" and cfg.lm_head == "target" and to in ("vllm", "medusa")


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
    kind = heads.config.head_type
    if kind not in SUPPORTED_EXPORTS:
        raise ValueError(f"unknown head type {kind!r}: exports exist for {sorted(SUPPORTED_EXPORTS)}")
    if to not in SUPPORTED_EXPORTS[kind]:
        why = {
            ("medusa", "sglang"): "SGLang has no Medusa drafter",
            ("medusa", "speculators"): "the speculators export is EAGLE-3's",
            ("eagle", "medusa"): "the medusa format is Medusa's",
            ("eagle", "speculators"): "use --to vllm for EAGLE-1 heads",
            ("eagle3", "medusa"): "the medusa format is Medusa's",
        }.get((kind, to), f"{to!r} is not a format")
        raise ValueError(
            f"{kind} heads cannot be exported to {to!r} ({why}); supported for {kind}: {SUPPORTED_EXPORTS[kind]}"
        )
    cfg = heads.config.to_dict()
    state = {k: v.detach() for k, v in heads.state_dict().items()}
    lm = target_lm_head.detach() if target_lm_head is not None else None
    if lm is not None and tuple(lm.shape) != (cfg["vocab_size"], cfg["hidden_size"]):
        raise ValueError(
            f"target lm_head is {tuple(lm.shape)}, but the heads were trained for vocab {cfg['vocab_size']} x "
            f"hidden {cfg['hidden_size']}: a checkpoint for another base model"
        )
    if lm is not None and state:
        lm = lm.to(next(iter(state.values())).dtype)
    if kind == "medusa":
        fn = medusa_to_vllm if to == "vllm" else medusa_to_original
        config, out = fn(state, cfg, lm)
        name = WEIGHTS_NAME if to == "vllm" else MEDUSA_WEIGHTS_NAME
    elif kind == "eagle":
        config, out = eagle_to_engine(state, {**cfg, "embed_scale": resolve_embed_scale(cfg, target)}, to)
        name = WEIGHTS_NAME
    elif to == "sglang":
        config, out = eagle3_to_sglang(state, cfg)
        name = WEIGHTS_NAME
    else:
        config, out = eagle3_to_speculators(state, cfg, speculative_tokens)
        name = WEIGHTS_NAME
    return config, out, name


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
    from safetensors.torch import save_file

    config, state, name = export_state(
        heads, to, target_lm_head, speculative_tokens=speculative_tokens, target=target
    )
    os.makedirs(out_dir, exist_ok=True)
    state = _cpu(state)
    wpath, cpath = os.path.join(out_dir, name), os.path.join(out_dir, CONFIG_NAME)
    atomic_write(wpath, lambda p: save_file(state, p, metadata={"format": "pt"}))
    paths = [cpath, wpath]
    if to == "medusa":  # FasterDecoding's MedusaModel.from_pretrained reads medusa_lm_head.pt (tensors only)
        ppath = os.path.join(out_dir, "medusa_lm_head.pt")
        atomic_write(ppath, lambda p: torch.save(state, p))
        paths.append(ppath)
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    atomic_text(cpath, text)
    return paths


# ---------------------------------------------------------------------------------------------- import


def read_state_file(path: str) -> dict[str, Tensor]:
    """A flat ``{name: tensor}`` from a safetensors file or a ``torch.save``d state dict.

    Pickles are read with ``torch.load(weights_only=True)`` only: a file that needs anything beyond
    tensors and plain containers (a pickled class, i.e. code) is refused, never executed.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing")
    if path.endswith(".safetensors"):
        from safetensors import SafetensorError
        from safetensors.torch import load_file

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


def _weights_file(directory: str, names: tuple[str, ...] = _FOREIGN_WEIGHTS) -> str:
    from heads.guard import inside  # a weights file that is a symlink out of the checkpoint is refused

    for name in names:
        path = inside(directory, name)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"{directory}: no weights file found (looked for {', '.join(names)})")


def detect_format(raw: dict[str, Any]) -> str:
    """Which foreign layout a ``config.json`` without selfspec's ``head_type`` describes.

    Returns ``"medusa"`` (original), ``"vllm-medusa"``, ``"speculators-eagle3"``, ``"eagle3"`` (HF/SGLang)
    or ``"eagle"``; raises ``ValueError`` for anything else.
    """
    archs = raw.get("architectures") or []
    if "medusa_num_heads" in raw:
        return "medusa"
    if raw.get("model_type") == "medusa" or "MedusaModel" in archs:
        return "vllm-medusa"
    if "speculators_model_type" in raw:
        if raw["speculators_model_type"] != "eagle3":
            raise ValueError(
                f"speculators model type {raw['speculators_model_type']!r} is not supported; only eagle3 imports"
            )
        return "speculators-eagle3"
    if any("Eagle3" in a for a in archs) or "eagle_config" in raw or "draft_vocab_size" in raw:
        return "eagle3"
    if raw.get("num_hidden_layers") == 1 and raw.get("model_type") and "hidden_size" in raw:
        return "eagle"
    raise ValueError(
        "unknown head type: config.json has no selfspec head_type and is neither an original Medusa config "
        "(medusa_num_heads), a vLLM Medusa config (model_type medusa), an EAGLE-3 config (LlamaForCausalLMEagle3 / "
        "eagle_config / speculators eagle3) nor a one-layer EAGLE Llama config"
    )


def _check_other_base(what: str, got: tuple[int, int], target: nn.Module | None) -> None:
    """got = (vocab, hidden) of the checkpoint; raise if ``target`` has other sizes."""
    if target is None:
        return
    from heads.graft import target_dims

    vocab, hidden = target_dims(target)
    if got != (vocab, hidden):
        name = getattr(target.config, "_name_or_path", "") or type(target).__name__
        raise ValueError(
            f"{what} is a checkpoint for another base model: vocab {got[0]} x hidden {got[1]}, but target "
            f"{name!r} has vocab {vocab} x hidden {hidden}"
        )


def _target_name(raw: dict[str, Any], target: nn.Module | None) -> str | None:
    name = raw.get("base_model_name_or_path")
    if not name and isinstance(raw.get("speculators_config"), dict):
        name = (raw["speculators_config"].get("verifier") or {}).get("name_or_path")
    if not name and target is not None:
        name = getattr(target.config, "_name_or_path", None) or None
    return name


def _strip_medusa_head_prefix(state: dict[str, Tensor]) -> dict[str, Tensor]:
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
    state = _strip_medusa_head_prefix(state)
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
    from heads.graft import target_dims
    from heads.medusa import MedusaConfig, MedusaHeads

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
        _check_other_base(what, (V, H), target)
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
    _load_strict(heads, state, what)
    return heads


def _load_strict(module: nn.Module, state: dict[str, Tensor], what: str) -> None:
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


def _strip_model_prefix(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Some trainers save the draft as ``model.*`` (beside ``lm_head``, ``d2t``...): drop that prefix."""
    if "model.fc.weight" in state and "fc.weight" not in state:
        return {k.removeprefix("model."): v for k, v in state.items()}
    return state


def _draft_target_config(raw: dict[str, Any], target: nn.Module, what: str) -> dict[str, Any]:
    """The target's config dict, with the RoPE and norm eps the draft was built with when its config says.

    An engine builds the draft layer from the draft's own config; EAGLE's trainer even ignored the
    target's rope_theta (docs/design.md §8). Taking them from the draft config keeps the imported head the
    function the engine would run; a difference from the target is reported.
    """
    from heads.eagle import target_config_dict

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


def _drop_embedding(state: dict[str, Tensor], hidden: int, vocab: int, what: str) -> None:
    """EAGLE checkpoints often hold a copy of the frozen target embedding: check its shape, drop it."""
    emb = state.pop("embed_tokens.weight", None)
    if emb is not None and tuple(emb.shape) != (vocab, hidden):
        raise ValueError(
            f"{what} is a checkpoint for another base model: its embed_tokens is {tuple(emb.shape)}, the "
            f"target's embedding is ({vocab}, {hidden})"
        )


def _drop_target_copy(state: dict[str, Tensor], what: str) -> None:
    """SafeAILab's EAGLE-3 trainer keeps the frozen target inside its model (``target_model.*``) and can save
    some of its tensors with the draft: they are the target's, not the draft's; drop them and say so."""
    frozen = [k for k in state if k.startswith("target_model.")]
    for k in frozen:
        del state[k]
    if frozen:
        warnings.warn(
            f"{what}: dropped {len(frozen)} frozen target tensors (target_model.*) saved with the draft; "
            "the target's own weights are used",
            stacklevel=3,
        )


def _check_config_dims(raw: dict[str, Any], target: nn.Module, what: str) -> None:
    """The draft config's vocab/hidden sizes (when it states them) must be the target's."""
    layer = raw.get("transformer_layer_config", raw)
    if "vocab_size" in layer and "hidden_size" in layer:
        _check_other_base(what, (int(layer["vocab_size"]), int(layer["hidden_size"])), target)


def _need_target(target: nn.Module | None, what: str) -> nn.Module:
    if target is None:
        raise ValueError(
            f"importing {what} needs the target model: its draft layer is rebuilt from the target's own config "
            "class. Pass it: load_heads(path, target) or infer.load(target, heads)"
        )
    return target


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
    from heads.draft_layer import target_embed_scale
    from heads.eagle import EagleConfig, EagleHead
    from heads.graft import target_dims

    target = _need_target(target, what)
    _check_config_dims(raw, target, what)
    vocab, hidden = target_dims(target)
    state = _strip_model_prefix(dict(state))
    _drop_embedding(state, hidden, vocab, what)
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
    elif said is False and torch.count_nonzero(bias):
        raise ValueError(
            f"{what}: config says bias=false but fc.bias is present and non-zero; which is right?"
        )
    else:
        use_bias = True
    scale = target_embed_scale(target)
    if scale:  # the engines and EAGLE's own code feed fc raw rows W[x]; selfspec feeds embed(x) = s W[x]
        state["fc.weight"] = fold_embed_scale(w, 1.0 / scale)
    head = EagleHead(
        EagleConfig(
            hidden_size=hidden,
            vocab_size=vocab,
            base_model_name_or_path=_target_name(raw, target),
            target_config=_draft_target_config(raw, target, what),
            draft_layer="target",  # as before draft_layer existed (the same layer for Llama targets)
            embed_scale=scale,
            bias=use_bias,
        )
    )
    _load_strict(head, state, what)
    return head


def import_eagle3(
    state: dict[str, Tensor], raw: dict[str, Any], target: nn.Module | None, what: str, convention: str
) -> nn.Module:
    """EAGLE-3 checkpoint -> `Eagle3Head`. ``convention``: ``"sglang"`` (HF/SGLang layout: ids in
    ``eagle_config`` mean "output of layer j" = selfspec j + 1) or ``"vllm"`` (speculators: as-is)."""
    from heads.draft_layer import target_embed_scale
    from heads.eagle3 import Eagle3Config, Eagle3Head, default_aux_layer_ids
    from heads.graft import num_layers, target_dims

    target = _need_target(target, what)
    _check_config_dims(raw, target, what)
    vocab, hidden = target_dims(target)
    if convention == "vllm":
        if raw.get("norm_before_residual", True):
            raise ValueError(
                f"{what}: norm_before_residual is true (or missing, which vLLM reads as true): its layer keeps the "
                "normed feature as the residual, selfspec's EAGLE-3 layer keeps the un-normed one"
            )
        ids = raw.get("eagle_aux_hidden_state_layer_ids")
        ids = list(ids) if ids else default_aux_layer_ids(num_layers(target))  # vLLM's default
    else:
        if raw.get("norm_before_residual"):
            raise ValueError(f"{what}: norm_before_residual=true has no selfspec (or SGLang) equivalent")
        ec = raw.get("eagle_config") or {}
        ids = ec.get("eagle_aux_hidden_state_layer_ids")
        # explicit SGLang ids are captured at layer id+1; SGLang's own default (2, L//2, L-3) is not shifted
        ids = [int(i) + 1 for i in ids] if ids else default_aux_layer_ids(num_layers(target))
    th = raw.get("target_hidden_size")
    if th is not None and int(th) != hidden:
        raise ValueError(
            f"{what} is a checkpoint for another base model: target_hidden_size {th} != {hidden}"
        )
    state = _strip_model_prefix(dict(state))
    _drop_target_copy(state, what)
    _drop_embedding(state, hidden, vocab, what)
    mapped: dict[str, Tensor] = {}
    for k, v in state.items():
        k = re.sub(r"^(midlayer|layers\.0)\.", "midlayer.", k)
        k = {
            "midlayer.input_layernorm.weight": "input_norm.weight",
            "midlayer.hidden_norm.weight": "hidden_norm.weight",
        }.get(k, k)
        mapped[k] = v
    w = mapped.get("fc.weight")
    if w is None or tuple(w.shape) != (hidden, 3 * hidden):
        shape = None if w is None else tuple(w.shape)
        raise ValueError(
            f"{what} is not an EAGLE-3 draft for this target: fc.weight is {shape}, expected ({hidden}, {3 * hidden})"
        )
    b = mapped.pop("fc.bias", None)
    if b is not None and torch.count_nonzero(b):
        raise ValueError(
            f"{what}: fc has a non-zero bias; selfspec's (and the engines' Llama) EAGLE-3 fc has none"
        )
    if "lm_head.weight" not in mapped:
        raise ValueError(f"{what}: no lm_head.weight (EAGLE-3 drafts have their own lm_head)")
    Vd = int(mapped["lm_head.weight"].shape[0])
    dv = raw.get("draft_vocab_size")
    if dv is not None and int(dv) != Vd:
        raise ValueError(f"{what}: draft_vocab_size {dv} != lm_head rows {Vd}")
    if "d2t" not in mapped:
        if Vd != vocab:
            raise ValueError(f"{what}: a draft vocabulary of {Vd} < {vocab} tokens needs d2t")
        mapped["d2t"] = torch.zeros(Vd, dtype=torch.long)
    d2t = mapped["d2t"].to(torch.long)
    if d2t.shape != (Vd,):
        raise ValueError(f"{what}: d2t is {tuple(d2t.shape)}, expected ({Vd},)")
    if "t2d" not in mapped:
        t2d = torch.zeros(vocab, dtype=torch.bool)
        ids_t = torch.arange(Vd) + d2t
        if ids_t.min() < 0 or ids_t.max() >= vocab:
            raise ValueError(f"{what}: d2t maps draft ids outside the target vocabulary of {vocab}")
        t2d[ids_t] = True
        mapped["t2d"] = t2d
    mapped["d2t"], mapped["t2d"] = d2t, mapped["t2d"].to(torch.bool)
    try:
        config = Eagle3Config(
            hidden_size=hidden,
            vocab_size=vocab,
            base_model_name_or_path=_target_name(raw, target),
            target_config=_draft_target_config(raw, target, what),
            draft_layer="target",  # as before draft_layer existed (the same layer for Llama targets)
            embed_scale=target_embed_scale(target),
            aux_layer_ids=[int(i) for i in ids],
            draft_vocab_size=None if Vd == vocab else Vd,
        )
    except ValueError as e:
        raise ValueError(f"{what} ({convention} aux-id convention): {e}") from e
    head = Eagle3Head(config)
    _load_strict(head, mapped, what)
    head.set_vocab_map(head.d2t.clone(), head.t2d.clone())  # checks d2t and t2d agree
    return head


def import_heads(directory: str, raw: dict[str, Any], target: nn.Module | None = None) -> nn.Module:
    """Load a foreign checkpoint directory (``config.json`` ``raw`` without ``head_type``) as selfspec heads.

    Medusa (original or vLLM) imports without a target (it is checked against one if given); EAGLE and
    EAGLE-3 need the target. The result is on CPU in the checkpoint's dtype (see `heads.base.load_heads`).
    """
    fmt = detect_format(raw)
    if fmt == "medusa":
        path = _weights_file(directory, (MEDUSA_WEIGHTS_NAME, "medusa_lm_head.pt", *_FOREIGN_WEIGHTS))
        K, L = int(raw["medusa_num_heads"]), int(raw.get("medusa_num_layers", 1))
        blocks, lm = medusa_state_from_original(read_state_file(path), K, L, path, raw.get("version"))
        return import_medusa(blocks, lm, L, _target_name(raw, target), target, path)
    path = _weights_file(directory)
    state = read_state_file(path)
    if fmt == "vllm-medusa":
        blocks, lm = medusa_state_from_vllm(state, raw, path)
        return import_medusa(
            blocks, lm, int(raw["num_hidden_layers"]), _target_name(raw, target), target, path
        )
    if fmt == "speculators-eagle3":
        return import_eagle3(state, raw, target, path, "vllm")
    fc = state.get("fc.weight", state.get("model.fc.weight"))
    if fmt == "eagle3" or (fc is not None and fc.shape[1] == 3 * fc.shape[0]):
        return import_eagle3(state, raw, target, path, "sglang")
    return import_eagle(state, raw, target, path)
