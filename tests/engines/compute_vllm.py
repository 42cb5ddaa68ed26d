"""Run a vLLM-loaded draft's own modules on CPU (inside the vLLM venv; see tests/test_engine_numerics.py).

Loading is `vllm_check`'s path (the serve flags through vLLM's parser, ``get_model`` for the target, the
proposer's ``load_model`` for the draft, every draft parameter NaN before vLLM's ``load_weights``). Then,
with every vLLM ``CustomOp`` (RMSNorm, rotary embedding, SiLU-and-mul, ...) on its ``forward_native``
(the PyTorch implementation vLLM itself dispatches to on CPU) and the backend attention call replaced
by `compute_common.SdpaAttention`:

- EAGLE-1: ``draft(input_ids, positions, features)`` (``EagleLlamaForCausalLM.forward``: embedding
  lookup of the shared target embedding, ``fc``, the decoder layer, ``hidden + residual``) and
  ``compute_logits`` (the target's shared lm_head through vLLM's logits processor);
- EAGLE-3 / 3.1: the target's own forward with the aux layers the model runner sets up
  (``aux_hidden_state_layers``) on the prompt, ``combine_hidden_states`` on what it captured (fc_norm,
  fc), ``draft(input_ids, positions, fused)`` and ``compute_logits`` (own lm_head, scattered to the
  target vocabulary through ``draft_id_to_target_id``);
- Medusa (vLLM 0.32): ``MedusaModel.forward`` (the residual blocks) and ``compute_logits`` per head.

Each named submodule's output is recorded (`compute_common.Recorder`) and returned as JSON.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import vllm_check  # noqa: E402  (its torch.accelerator fix-up and loading helpers)
from check_common import fill_nan  # noqa: E402
from compute_common import Recorder, first, main, replace_attention, tensors_to_json, watch_draft_layer  # noqa: E402


def _load(case: dict):
    """(vllm config, target, draft) as ``vllm serve`` builds them; the draft NaN-filled before its load."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import default_loader, get_model

    vc = vllm_check._engine_config(case)
    original = default_loader.DefaultModelLoader.load_weights

    def load_weights(self, model, model_config):
        if model_config is vc.speculative_config.draft_model_config:
            fill_nan(model)
        return original(self, model, model_config)

    default_loader.DefaultModelLoader.load_weights = load_weights
    vllm_check.PORT["port"] = case["port"]
    try:
        with set_current_vllm_config(vc):
            vllm_check._init_dist()
            target = get_model(vllm_config=vc)
            proposer = vllm_check._proposer(vc, case["method"])
            proposer.load_model(target)
    finally:
        default_loader.DefaultModelLoader.load_weights = original
    return vc, target, proposer.model


def _native(model: torch.nn.Module) -> None:
    from vllm.model_executor.custom_op import CustomOp

    for m in model.modules():
        if isinstance(m, CustomOp):
            m._forward_method = m.forward_native


def _prepare(model, rec: Recorder, record) -> None:
    from vllm.model_executor.layers.attention.attention import Attention

    _native(model)
    replace_attention(
        model,
        lambda m: isinstance(m, Attention),
        lambda m: (m.num_heads, m.num_kv_heads, m.head_size, m.impl.scale),
        rec,
        record,
    )


def _medusa(vc, draft, case: dict, rec: Recorder) -> None:
    hidden = torch.tensor(case["hidden"])
    blocks = draft(hidden)
    logits = draft.compute_logits(blocks)
    for h, (b, z) in enumerate(zip(blocks, logits, strict=True)):
        rec.put(f"block.{h}", b)
        rec.put(f"logits.{h}", z)


def _eagle(vc, target, draft, case: dict, rec: Recorder) -> None:
    ids, pos = torch.tensor(case["ids"]), torch.arange(len(case["ids"]))
    inner = draft.model
    rec.watch(inner.embed_tokens, "embed")
    rec.watch(inner.fc, "fc", first)
    watch_draft_layer(rec, inner.layers[0])
    out, _ = draft(ids, pos, torch.tensor(case["features"]))
    rec.put("out", out)
    rec.put("logits", draft.compute_logits(out))


def _eagle3(vc, target, draft, case: dict, rec: Recorder) -> None:
    from types import SimpleNamespace

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    runner = SimpleNamespace(
        use_aux_hidden_state_outputs=True,
        speculative_config=vc.speculative_config,
        model=target,
        get_model=lambda: target,
    )
    runner._get_eagle3_aux_layers_from_config = lambda: GPUModelRunner._get_eagle3_aux_layers_from_config(
        runner
    )
    GPUModelRunner._setup_eagle3_aux_hidden_state_outputs(runner)
    prompt = torch.tensor(case["prompt"])
    target_out, aux = target(prompt, torch.arange(len(prompt)))
    rec.put("target_out", target_out)
    aux = torch.cat(aux, dim=-1)
    rec.put("aux", aux)
    fused = draft.combine_hidden_states(aux)
    rec.put("fused", fused)
    inner, layer = draft.model, draft.model.layers[0]
    rec.watch(inner.embed_tokens, "embed")
    rec.watch(layer.input_layernorm, "input_norm", first)
    rec.watch(layer.hidden_norm, "hidden_norm", first)
    watch_draft_layer(rec, layer)
    rec.watch(inner.norm, "norm", first)
    ids = torch.tensor(case["ids"])
    h, feed = draft(ids, torch.arange(len(ids)), fused)
    rec.put("feed", feed)
    rec.put("logits", draft.compute_logits(h))


def run(case: dict) -> dict:
    from vllm.config import set_current_vllm_config

    vc, target, draft = _load(case)
    rec = Recorder()
    with set_current_vllm_config(vc), torch.no_grad():
        if case["method"] == "medusa":
            _native(draft)
            _medusa(vc, draft, case, rec)
        else:
            layer = draft.model.layers[0]
            _prepare(draft, rec, layer)
            _prepare(target, rec, None)
            (_eagle if case["method"] == "eagle" else _eagle3)(vc, target, draft, case, rec)
    rec.close()
    return {"draft_class": type(draft).__name__, "stages": tensors_to_json(rec.got)}


if __name__ == "__main__":
    main(run)
