"""EAGLE-3's export formats (HF/SGLang, vLLM speculators) and the import of EAGLE-3 checkpoints.

=========== ================ =====================================================================
head type   to               what is written
=========== ================ =====================================================================
eagle3      ``sglang``       HF/SGLang ``LlamaForCausalLMEagle3``: ``fc``, ``midlayer.*``, ``norm``,
                             ``lm_head``, ``d2t``, ``t2d``; aux ids in SGLang's convention
eagle3      ``speculators``  vLLM speculators ``Eagle3Speculator`` (``vllm`` is an alias): ``fc``,
                             ``layers.0.*``, ``norm``, ``lm_head``, ``d2t``, ``t2d``; vLLM's convention
=========== ================ =====================================================================

EAGLE-3.1 heads (``fc_norm``, ``norm_output``) add both keys, true, at the top level of either config and
the weights ``fc_norm.{0,1,2}.weight``: vLLM 0.32/0.33 (Llama and Qwen3 EAGLE-3 drafts) and SGLang 0.5.23
(``LlamaForCausalLMEagle3``) read them there (`eagle31_flags`).

With the full target vocabulary EAGLE-3 exports write no ``d2t``/``t2d``. The embedding is not
rescaled for Gemma: it enters only through the RMSNorm ``input_norm`` (see `heads.eagle.formats`).

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
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import torch
from torch import Tensor, nn

from heads.draft_layer import target_embed_scale
from heads.eagle3.config import Eagle3Config, default_aux_layer_ids
from heads.eagle3.module import Eagle3Head
from heads.formats import (
    check_config_dims,
    draft_target_config,
    drop_embedding,
    engine_layer_config,
    load_strict,
    need_target,
    read_state_file,
    strip_model_prefix,
    target_name,
    weights_file,
    with_dtype,
)
from heads.graft import num_layers, target_dims
from heads.registry import Exported, ExportFormat, ExportInputs

VERIFIER_ARCH = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}
_NATIVE_HINT = "vLLM has a Qwen3 EAGLE-3 draft class"


# ---------------------------------------------------------------------------------------------- export


def check_engine_aux_ids(ids: list[int], what: str) -> None:
    """Both engines capture the aux hidden states in sorted, de-duplicated layer order (vLLM
    ``tuple(sorted(set(layers)))``; SGLang in its layer loop), so heads trained on other ids would be fed
    other features: refuse them."""
    if list(ids) != sorted(set(ids)):
        raise ValueError(
            f"cannot export {what}: aux_layer_ids {list(ids)} are not distinct and increasing, but the engines "
            "capture aux hidden states in sorted, de-duplicated layer order (the heads would get other features)"
        )


def eagle3_layer_state(state: dict[str, Tensor], prefix: str, full_vocab: bool) -> dict[str, Tensor]:
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


def eagle3_common(state: dict[str, Tensor], cfg: dict[str, Any], engine: str):
    ids = [int(i) for i in cfg["aux_layer_ids"]]
    check_engine_aux_ids(ids, f"EAGLE-3 heads to {engine}")
    native = "qwen3" if engine == "vllm" else None  # vLLM's Eagle3Qwen3ForCausalLM
    family, layer = engine_layer_config(with_dtype(cfg, state), "eagle3", engine, native, _NATIVE_HINT)
    Vd = int(state["lm_head.weight"].shape[0])
    return ids, family, layer, Vd, Vd == cfg["vocab_size"]


def eagle31_flags(cfg: dict[str, Any]) -> dict[str, bool]:
    """EAGLE-3.1's two top-level config keys, read the same way by vLLM 0.32/0.33 (``update_eagle3`` in
    ``transformers_utils/configs/speculators/algos.py``, then ``getattr(config, ...)`` in
    ``models/llama_eagle3.py`` and ``qwen3_eagle3.py``) and SGLang 0.5.23 (``models/llama_eagle3.py``):
    ``fc_norm`` builds the per-layer RMSNorms ``fc_norm.{i}`` applied to the aux chunks before ``fc``,
    ``norm_output`` makes the draft hand its post-norm state (the one its logits read) to the next step.
    Written only when on: both engines read a missing key as False, so EAGLE-3 exports stay as they were."""
    return {k: True for k in ("fc_norm", "norm_output") if cfg.get(k)}


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
    ids, _, layer, Vd, full = eagle3_common(state, cfg, "sglang")
    _warn_sglang_gemma3(cfg, ids)
    out = eagle3_layer_state(state, "midlayer.", full)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **layer,
        "draft_vocab_size": Vd,
        **eagle31_flags(cfg),
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": [i - 1 for i in ids],  # id 0 -> -1: the input of layer 0
            "use_aux_hidden_state": True,
        },
        "base_model_name_or_path": cfg.get("base_model_name_or_path"),
    }
    return config, out


def _warn_sglang_gemma3(cfg: dict[str, Any], ids: list[int]) -> None:
    """SGLang 0.5.23's Gemma-3 forward keeps the residual apart across layers, and its EAGLE-3 capture
    records the block output before layer i, not the residual stream HF's ``hidden_states[i]`` holds
    (the heads' training features); only id 0 (the embedding output) agrees. It still loads and serves
    the draft, so warn (tests/test_engine_numerics.py measures the difference)."""
    mt = str((cfg.get("target_config") or {}).get("model_type", ""))
    if mt.startswith("gemma3") and any(i > 0 for i in ids):
        warnings.warn(
            f"SGLang serves EAGLE-3 heads on a {mt!r} target with other features than they were trained on: "
            "its Gemma-3 capture for aux ids > 0 lacks the residual stream, so expect low acceptance",
            stacklevel=3,
        )


def eagle3_to_speculators(
    state: dict[str, Tensor], cfg: dict[str, Any], speculative_tokens: int = 3
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """selfspec EAGLE-3 -> vLLM speculators ``Eagle3Speculator`` with vLLM's aux ids (= selfspec ids); a
    ``draft_layer: target`` head on a Qwen3 target -> vLLM's ``Eagle3Qwen3ForCausalLM`` (HF layout)."""
    if speculative_tokens < 1:
        raise ValueError(f"speculative_tokens must be >= 1, got {speculative_tokens}")
    ids, family, layer, Vd, full = eagle3_common(state, cfg, "vllm")
    out = eagle3_layer_state(state, "layers.0.", full)
    H = cfg["hidden_size"]
    eagle3 = {
        "draft_vocab_size": Vd,
        "norm_before_residual": False,
        "target_hidden_size": H,
        "eagle_aux_hidden_state_layer_ids": ids,
        **eagle31_flags(cfg),
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
                "architectures": [VERIFIER_ARCH.get(mt) or cfg["target_config"].get("architectures", [None])[0]],
            },
        },
        "transformer_layer_config": layer_cfg,
        **eagle3,
        "torch_dtype": layer_cfg["torch_dtype"],
    }
    return config, out


def _no_parallel(cfg: dict[str, Any], to: str) -> None:
    """Refuse, in one line, a P-EAGLE head: selfspec knows no engine config for its placeholders."""
    if cfg.get("parallel_draft"):
        raise ValueError(
            f"a parallel-draft (P-EAGLE, parallel_draft={cfg['parallel_draft']}) EAGLE-3 head has no {to} export: "
            "selfspec does not know that format's fields for the mask_embed/mask_hidden placeholders"
        )


def _to_sglang(state: dict[str, Tensor], cfg: dict[str, Any], inputs: ExportInputs) -> Exported:
    _no_parallel(cfg, "sglang")
    return Exported(*eagle3_to_sglang(state, cfg))


def _to_speculators(state: dict[str, Tensor], cfg: dict[str, Any], inputs: ExportInputs) -> Exported:
    _no_parallel(cfg, "speculators/vllm")
    return Exported(*eagle3_to_speculators(state, cfg, inputs.speculative_tokens))


EXPORTS = {
    "sglang": ExportFormat(_to_sglang),
    "speculators": ExportFormat(_to_speculators),
    "vllm": ExportFormat(_to_speculators),  # vLLM serves the speculators format
}
EXPORT_NOTES = {"medusa": "the medusa format is Medusa's"}  # why a format is not offered (in the refusal)


# ---------------------------------------------------------------------------------------------- import


def detect(raw: dict[str, Any]) -> str | None:
    """``"speculators-eagle3"`` (vLLM speculators, aux ids as-is), ``"eagle3"`` (HF/SGLang layout:
    ``LlamaForCausalLMEagle3``, ``eagle_config`` or ``draft_vocab_size``), else None. A speculators
    config of another algorithm is a ``ValueError``."""
    if "speculators_model_type" in raw:
        if raw["speculators_model_type"] != "eagle3":
            raise ValueError(
                f"speculators model type {raw['speculators_model_type']!r} is not supported; only eagle3 imports"
            )
        return "speculators-eagle3"
    archs = raw.get("architectures") or []
    if any("Eagle3" in a for a in archs) or "eagle_config" in raw or "draft_vocab_size" in raw:
        return "eagle3"
    return None


def import_state(directory: str, raw: dict[str, Any], target: nn.Module | None = None) -> nn.Module:
    """`Eagle3Head` from an EAGLE-3 checkpoint directory (needs the target): the speculators layout in
    vLLM's aux-id convention, anything else in SGLang's."""
    path = weights_file(directory)
    convention = "vllm" if detect(raw) == "speculators-eagle3" else "sglang"
    return import_eagle3(read_state_file(path), raw, target, path, convention)


def import_eagle3(
    state: dict[str, Tensor], raw: dict[str, Any], target: nn.Module | None, what: str, convention: str
) -> nn.Module:
    """EAGLE-3 checkpoint -> `Eagle3Head`. ``convention``: ``"sglang"`` (HF/SGLang layout: ids in
    ``eagle_config`` mean "output of layer j" = selfspec j + 1) or ``"vllm"`` (speculators: as-is)."""
    target = need_target(target, what)
    check_config_dims(raw, target, what)
    vocab, hidden = target_dims(target)
    ids = _aux_ids(raw, target, what, convention)
    th = raw.get("target_hidden_size")
    if th is not None and int(th) != hidden:
        raise ValueError(
            f"{what} is a checkpoint for another base model: target_hidden_size {th} != {hidden}"
        )
    state = strip_model_prefix(dict(state))
    drop_target_copy(state, what)
    drop_embedding(state, hidden, vocab, what)
    mapped = _engine_to_selfspec_keys(state)
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
    _vocab_map(mapped, Vd, vocab, what)
    try:
        config = Eagle3Config(
            hidden_size=hidden,
            vocab_size=vocab,
            base_model_name_or_path=target_name(raw, target),
            target_config=draft_target_config(llama_rope_default(raw), target, what),
            draft_layer="target",  # as before draft_layer existed (the same layer for Llama targets)
            embed_scale=target_embed_scale(target),
            aux_layer_ids=[int(i) for i in ids],
            draft_vocab_size=None if Vd == vocab else Vd,
            **_import_flags(raw, what),
        )
    except ValueError as e:
        raise ValueError(f"{what} ({convention} aux-id convention): {e}") from e
    head = Eagle3Head(config)
    load_strict(head, mapped, what)
    head.set_vocab_map(head.d2t.clone(), head.t2d.clone())  # checks d2t and t2d agree
    return head


def _aux_ids(raw: dict[str, Any], target: nn.Module, what: str, convention: str) -> list[int]:
    """selfspec aux ids of an imported EAGLE-3 draft, from the ids its config gives in ``convention``."""
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
    return ids


def llama_rope_default(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with ``rope_theta: 10000.0`` when it is a Llama draft config without RoPE keys.

    The engines build such a draft layer from ``LlamaConfig``, whose default base is 10000, and SafeAILab's
    ``traineagle3`` draft layer always rotates with base 10000 (its config.json has no ``rope_theta``),
    whatever the target's (Llama-3: 500000); the target's base would be another function."""
    layer = raw.get("transformer_layer_config", raw)
    archs = layer.get("architectures") or raw.get("architectures") or []
    llama = layer.get("model_type") == "llama" or any(a.startswith("Llama") for a in archs)
    if not llama or "rope_theta" in layer or "rope_parameters" in layer:
        return raw
    if layer is raw:
        return {**raw, "rope_theta": 10000.0}
    return {**raw, "transformer_layer_config": {**layer, "rope_theta": 10000.0}}


def _import_flags(raw: dict[str, Any], what: str) -> dict[str, bool]:
    """EAGLE-3.1's ``fc_norm`` / ``norm_output`` of an imported draft (see `eagle31_flags`); gpt-oss style
    ``norm_before_fc`` (one norm over the whole [3H] input) has no selfspec equivalent and is refused."""
    ec = raw.get("eagle_config") or {}
    if raw.get("norm_before_fc") or ec.get("norm_before_fc"):
        raise ValueError(
            f"{what}: norm_before_fc=true (one RMSNorm over the concatenated [3H] input) has no selfspec "
            "equivalent; selfspec's EAGLE-3.1 option is fc_norm (one RMSNorm per aux layer)"
        )
    return {k: bool(raw.get(k, False)) for k in ("fc_norm", "norm_output")}


def _engine_to_selfspec_keys(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """``midlayer.*`` / ``layers.0.*`` -> ``midlayer.*``, and the fusion norms to ``input_norm`` / ``hidden_norm``."""
    mapped: dict[str, Tensor] = {}
    for k, v in state.items():
        k = re.sub(r"^(midlayer|layers\.0)\.", "midlayer.", k)
        k = {
            "midlayer.input_layernorm.weight": "input_norm.weight",
            "midlayer.hidden_norm.weight": "hidden_norm.weight",
        }.get(k, k)
        mapped[k] = v
    return mapped


def _vocab_map(mapped: dict[str, Tensor], Vd: int, vocab: int, what: str) -> None:
    """Fill in (and check) ``d2t`` [Vd] int64 and ``t2d`` [V] bool of an imported draft, in place."""
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


def drop_target_copy(state: dict[str, Tensor], what: str) -> None:
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
