"""What the engine drivers of tests/test_engine_numerics.py share (torch only; run inside an engine venv).

The engines' attention layers call a backend (FlashAttention, FlashInfer, Triton, SGLang's radix
attention) that needs a GPU and a KV-cache pool. `SdpaAttention` stands in for exactly that call: it
takes the q / k / v the engine's own attention module has already projected (``qkv_proj``), normed
(Qwen3's ``q_norm``/``k_norm``) and rotated (the engine's rotary embedding), and returns plain causal
``torch.nn.functional.scaled_dot_product_attention`` over the T tokens of one prefill, with the
engine's head counts and scale; the engine's ``o_proj`` then runs on it. Everything else is the
engine's code, on the weights the engine's loader put into the modules.

`Recorder` keeps (a clone of, since the engines' fused add + RMSNorm works in place) what named
modules return, so each stage of the engine's forward can be compared with selfspec's.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from check_common import freeze_heap


class SdpaAttention(nn.Module):
    """q [T, nh*hd], k / v [T, nkv*hd] -> causal attention [T, nh*hd] (grouped-query: each KV head serves
    nh / nkv query heads, as in every engine backend); records its inputs and output in ``rec``."""

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, rec: Recorder, name: str
    ):
        super().__init__()
        self.nh, self.nkv, self.hd, self.scale = num_heads, num_kv_heads, head_dim, float(scale)
        self.rec, self.name = rec, name

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        T = q.shape[0]
        qh = q.reshape(T, self.nh, self.hd).transpose(0, 1)
        kh = k.reshape(T, self.nkv, self.hd).transpose(0, 1).repeat_interleave(self.nh // self.nkv, dim=0)
        vh = v.reshape(T, self.nkv, self.hd).transpose(0, 1).repeat_interleave(self.nh // self.nkv, dim=0)
        out = F.scaled_dot_product_attention(qh[None], kh[None], vh[None], is_causal=True, scale=self.scale)[
            0
        ]
        out = out.transpose(0, 1).reshape(T, self.nh * self.hd)
        if self.name:
            self.rec.put(self.name + "q_rope", qh)  # [nh, T, hd], the layout selfspec's attention sees
            self.rec.put(self.name + "k_rope", k.reshape(T, self.nkv, self.hd).transpose(0, 1))
            self.rec.put(self.name + "attn", out)
        return out


def replace_attention(
    model: nn.Module,
    is_backend: Callable[[nn.Module], bool],
    dims,
    rec: Recorder,
    record: nn.Module | None = None,
) -> int:
    """Swap every backend attention module of ``model`` (``is_backend``) for `SdpaAttention`; ``dims(m)`` ->
    (heads, kv heads, head dim, scale) read from the engine's module. Only the one inside ``record``
    (the draft's layer) records its tensors. Returns how many were swapped."""
    inside = {id(m) for m in record.modules()} if record is not None else set()
    n = 0
    for parent in list(model.modules()):
        for cname, child in list(parent.named_children()):
            if is_backend(child):
                nh, nkv, hd, scale = dims(child)
                setattr(
                    parent,
                    cname,
                    SdpaAttention(nh, nkv, hd, scale, rec, "" if id(child) not in inside else "draft."),
                )
                n += 1
    return n


class Recorder:
    """name -> tensor, from forward hooks on the engine's modules (``pick`` chooses the output part)."""

    def __init__(self) -> None:
        self.got: dict[str, Tensor] = {}
        self.handles: list = []

    def put(self, name: str, t: Tensor) -> None:
        self.got.setdefault(name, t.detach().float().clone())

    def watch(self, module: nn.Module | None, name: str, pick: Callable[[Any], Tensor] = lambda o: o) -> None:
        if module is None:
            return
        self.handles.append(module.register_forward_hook(lambda m, a, o: self.put(name, pick(o))))

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()


def first(o: Any) -> Tensor:
    """The tensor of a module output that may be a tuple (vLLM's linear layers return (out, bias); the
    fused add + RMSNorm returns (normed, residual))."""
    return o[0] if isinstance(o, (tuple, list)) else o


def split_qkv(rec: Recorder, qkv: Tensor, q_size: int, kv_size: int, prefix: str = "draft.") -> None:
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    rec.put(prefix + "q", q)
    rec.put(prefix + "k", k)
    rec.put(prefix + "v", v)


def watch_draft_layer(rec: Recorder, layer: nn.Module) -> None:
    """Hooks on the draft decoder layer's parts, by the names both engines give them (``qkv_proj`` with
    ``q_size`` / ``kv_size``, ``o_proj``, ``post_attention_layernorm``, ``mlp``): the fused q|k|v output is
    recorded split as ``draft.q`` / ``draft.k`` / ``draft.v`` and whole as ``draft.qkv``."""
    attn = layer.self_attn
    rec.watch(
        attn.qkv_proj, "draft.qkv", lambda o: split_qkv(rec, first(o), attn.q_size, attn.kv_size) or first(o)
    )
    rec.watch(attn.o_proj, "draft.o_proj", first)
    rec.watch(layer.post_attention_layernorm, "draft.post_attention_layernorm", first)
    rec.watch(layer.mlp, "draft.mlp", first)


def tensors_to_json(got: dict[str, Tensor]) -> dict[str, Any]:
    """Non-finite entries (the -inf of logits outside the draft vocabulary) as strings JSON can carry."""
    out = {}
    for k, t in got.items():
        t = t.float()
        fin = torch.isfinite(t)
        out[k] = {
            "shape": list(t.shape),
            "values": torch.where(fin, t, torch.zeros_like(t)).flatten().tolist(),
            "neg_inf": (~fin & (t < 0)).flatten().nonzero().flatten().tolist(),
        }
    return out


def main(run: Callable[[dict], dict]) -> None:
    """``python compute_x.py spec.json out.json``: spec ``{"port", "cases": [...]}``; one result per case."""
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    results = []
    for case in spec["cases"]:
        freeze_heap()
        case = {**case, "port": spec["port"]}
        try:
            results.append({"id": case["id"], "ok": True, **run(case)})
        except Exception as e:  # reported per case by the test
            results.append(
                {
                    "id": case["id"],
                    "ok": False,
                    "error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc()[-3000:],
                }
            )
        with open(sys.argv[2], "w") as f:
            json.dump(results, f)
