"""Run an SGLang-loaded draft's own modules on CPU (inside the SGLang venv; see tests/test_engine_numerics.py).

Loading is `sglang_check`'s path (launch flags through SGLang's parser, ``get_model`` for target and
draft, every draft parameter NaN before SGLang's ``load_weights``, the target's embedding / lm_head
handed over with ``set_embed`` / ``set_embed_and_head`` as the EAGLE worker does, the capture set by
``set_eagle3_layers_to_capture``). Then, with every SGLang fused op (RMSNorm, rotary embedding,
SiLU-and-mul: ``sglang.kernels.fused_op.BaseFusedOp``) on its ``forward_native`` (its CPU kernels come
from ``sgl_kernel``, a CUDA-only wheel here) and ``RadixAttention`` replaced by
`compute_common.SdpaAttention`, on a stand-in ``ForwardBatch`` of one extend (prefill) of T tokens:

- EAGLE-1: ``draft.model(input_ids, positions, batch)`` with ``spec_info.hidden_states`` = the
  features (its ``fc`` on ``cat(embed_tokens(ids), features)``, the decoder layer, the residual fold);
- EAGLE-3 / 3.1: the target's own ``model`` forward capturing ``layers_to_capture``, then the draft's
  ``model`` forward fed that capture as ``spec_info.hidden_states`` [T, 3H]: its fused input path
  (fc_norm chunks and ``fc`` inside the forward, taken when the width is not H), the layer, the norm;
- logits: the ``LogitsProcessor``'s lm_head product (``_compute_lm_head``, with its ``logit_scale``, cut to
  its ``vocab_size`` as it cuts the padded rows)
  on the draft's output, draft ids mapped to target ids through ``hot_token_id`` (as the EAGLE
  worker maps its top-k) with -inf at target ids outside the draft vocabulary.

SGLang's ``@torch.compile``-decorated helpers (the rotary ``apply_rotary_pos_emb`` of Gemma-3's
``forward_native``) run as the same Python eagerly (``torch._dynamo.config.disable``): inductor would
compile C++ for them on first call, 17 of this driver's 26 CPU-s with a cold cache, for the same maths.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sglang_check  # noqa: E402
import torch  # noqa: E402
from check_common import fill_nan  # noqa: E402
from compute_common import Recorder, first, main, replace_attention, tensors_to_json, watch_draft_layer  # noqa: E402

torch._dynamo.config.disable = True  # see the module docstring


def _load(case: dict):
    from sglang.srt.model_loader import loader

    sa = sglang_check._server_args(case)
    sglang_check.PORT["port"] = case["port"]
    sglang_check._init_dist(sa)
    original = loader.DefaultModelLoader.load_weights_and_postprocess
    armed = {}

    def load_weights_and_postprocess(model, weights, target_device):
        if armed:
            fill_nan(model)
        return original(model, weights, target_device)

    loader.DefaultModelLoader.load_weights_and_postprocess = staticmethod(load_weights_and_postprocess)
    try:
        target, _, _ = sglang_check._load(sa, sa.model_path, False)
        armed["draft"] = True
        draft, mc, _ = sglang_check._load(sa, sa.speculative_draft_model_path, True)
    finally:
        loader.DefaultModelLoader.load_weights_and_postprocess = staticmethod(original)
    embed, head = target.get_embed_and_head()
    if case["method"] == "eagle3":
        ec = getattr(mc.hf_config, "eagle_config", None) or {}
        target.set_eagle3_layers_to_capture(ec.get("eagle_aux_hidden_state_layer_ids"))
        draft.set_embed(embed)
    else:
        draft.set_embed_and_head(embed, head)
    return target, draft


def _prepare(model, rec: Recorder, record) -> None:
    from sglang.kernels.fused_op import BaseFusedOp
    from sglang.srt.layers.radix_attention import RadixAttention

    for m in model.modules():
        if isinstance(m, BaseFusedOp):
            m._forward_method = m.forward_native
    replace_attention(
        model,
        lambda m: isinstance(m, RadixAttention),
        lambda m: (m.tp_q_head_num, m.tp_k_head_num, m.head_dim, m.scaling),
        rec,
        record,
    )


class _Batch(SimpleNamespace):
    """A stand-in ``ForwardBatch`` of one extend over T tokens: what the layers read of it is set; the
    parallelism metadata they probe (context / data parallel, LoRA, ...) is absent, as on one rank."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return None


def _batch(hidden):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return _Batch(
        forward_mode=ForwardMode.EXTEND,
        spec_info=SimpleNamespace(hidden_states=hidden),
        contains_mm_inputs=lambda: False,
    )


def _logits(draft, h, rec: Recorder, V: int) -> None:
    lp = draft.logits_processor
    z = lp._compute_lm_head(h, draft.lm_head).float()[:, : lp.vocab_size]  # the padded rows cut, as it does
    if getattr(lp, "logit_scale", None) is not None:
        z = z * lp.logit_scale
    hot = getattr(draft, "hot_token_id", None)
    if hot is not None or z.shape[-1] != V:
        ids = hot.long() if hot is not None else torch.arange(z.shape[-1])
        full = torch.full((z.shape[0], V), float("-inf"))
        full[:, ids] = z
        z = full
    rec.put("logits", z)


def run(case: dict) -> dict:
    target, draft = _load(case)
    rec = Recorder()
    inner, layer = draft.model, draft.model.layers[0]
    _prepare(draft, rec, layer)
    _prepare(target, rec, None)
    V = int(target.config.vocab_size)
    with torch.no_grad():
        if case["method"] == "eagle":
            rec.watch(inner.embed_tokens, "embed")
            rec.watch(inner.fc, "fc", first)
            watch_draft_layer(rec, layer)
            ids = torch.tensor(case["ids"])
            out = inner(ids, torch.arange(len(ids)), _batch(torch.tensor(case["features"])))
            out = first(out)
            rec.put("out", out)
            _logits(draft, out, rec, V)
        else:
            prompt = torch.tensor(case["prompt"])
            target_out, aux = target.model(prompt, torch.arange(len(prompt)), _batch(None))
            rec.put("target_out", target_out)
            aux = torch.cat(list(aux), dim=-1)
            rec.put("aux", aux)
            rec.watch(inner.embed_tokens, "embed")
            rec.watch(inner.fc, "fused", first)
            rec.watch(layer.input_layernorm, "input_norm", first)
            rec.watch(layer.hidden_norm, "hidden_norm", first)
            watch_draft_layer(rec, layer)
            rec.watch(inner.norm, "norm", first)
            ids = torch.tensor(case["ids"])
            h, feed = inner(ids, torch.arange(len(ids)), _batch(aux))
            rec.put("feed", feed[0])
            _logits(draft, h, rec, V)
    rec.close()
    return {"draft_class": type(draft).__name__, "stages": tensors_to_json(rec.got)}


if __name__ == "__main__":
    main(run)
