"""EAGLE-3 training-step speed: where one step's time and memory go, and tokens/s against the original.

A step is what `train.train_heads.fit` does per micro-batch: `train.objective.batch_loss` (the frozen
target's forward with its aux layers and full-vocab logits, the TTT unroll, the loss over the draft
vocab), ``loss.backward()`` and an AdamW step. `part_split` times its parts with forward hooks on the
target's decoder stack, the target's lm_head and the draft layer, so it needs no change to the code it
measures (and measures older versions of it the same way). Memory per part: the bytes the autograd
graph saves for backward (parameters excluded, storages counted once) and the target outputs' bytes.

`reference_step` runs the original EAGLE-3 trainer's model (SafeAILab/EAGLE ``eagle/traineagle3``,
``cnets.Model``: its own Llama target with three aux layers, a ``length``-step unroll, its loss) from a
checkout the user passes; nothing of it is part of this project. `interleave` times the steps in
alternating rounds on the same batch, so machine load hits both alike.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor, nn
from transformers import LlamaForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from heads.graft import freeze, load_target
from train.objective import batch_loss

PARTS = (
    "target forward (aux layers)",
    "target logits (full vocab)",
    "TTT unroll",
    "draft logits + loss",
    "backward",
    "optimizer step",
)


class _DemoVocab:
    """What `demo.target.llama_config` reads from the demo tokenizer (``<unk> <pad> <s> <|end|>`` first)."""

    unk_token_id, pad_token_id, bos_token_id, eos_token_id = 0, 1, 2, 3

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


def demo_like_target(dtype: torch.dtype, cache: str | None = None, seed: int = 0) -> tuple[nn.Module, str]:
    """The demo target (`demo`, size ``full``) if it is already built in the cache, else a randomly
    initialised ``LlamaForCausalLM`` with its exact config (same shapes, so the same cost per step).
    Returns (frozen model in ``dtype``, a sentence saying which)."""
    from demo import SPECS, cache_dir  # the demo builder: only for this benchmark
    from demo.target import llama_config as _llama_config

    path = os.path.join(cache or cache_dir(), f"demo-target-full-s{seed}")
    if os.path.isfile(os.path.join(path, "config.json")):
        return load_target(path, dtype=dtype), f"the demo target ({path})"
    spec = SPECS["full"]
    config = _llama_config(spec, _DemoVocab(spec.vocab_size))
    torch.manual_seed(seed)
    note = (
        f"a randomly initialised Llama with the demo target's config (demo SPECS['full']: "
        f"{spec.num_layers} layers, hidden {spec.hidden_size}, vocab {spec.vocab_size}); the demo target "
        f"is not built in {os.path.dirname(path)}"
    )
    return freeze(LlamaForCausalLM(config).to(dtype)), note


def bench_batch(batch: int, length: int, vocab: int, prompt: int = 16, seed: int = 0) -> dict[str, Tensor]:
    """[batch, length] random token rows, all real, the loss mask off on the first ``prompt`` tokens (the
    cost of a step does not depend on the token values)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, length), generator=g)
    loss_mask = torch.ones_like(ids)
    loss_mask[:, :prompt] = 0
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": loss_mask}


def autocast(dtype: torch.dtype | None):
    """bf16/fp16 autocast on CPU (what accelerate's mixed precision does), or nothing for None."""
    return torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()


def our_step(target: nn.Module, head: nn.Module, lr: float = 1e-4, amp: torch.dtype | None = None):
    """A training step of ours on a batch: `batch_loss` + backward + AdamW, as `fit` runs it."""
    run = SimpleNamespace(
        cfg=SimpleNamespace(joint=SimpleNamespace(enabled=False), train=SimpleNamespace(decay=0.8)),
        head_config=head.config,
        heads=head,
        target=target,
        lm_head=target.get_output_embeddings(),
    )
    opt = torch.optim.AdamW(head.parameters(), lr=lr, betas=(0.9, 0.95))
    parts = {"backward": 0.0, "optimizer step": 0.0}

    def step(batch: dict[str, Tensor]) -> float:
        with autocast(amp):
            loss, _ = batch_loss(run, batch)
        t = time.perf_counter()
        loss.backward()
        parts["backward"] += time.perf_counter() - t
        t = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        parts["optimizer step"] += time.perf_counter() - t
        return float(loss.detach())

    step.parts = parts  # type: ignore[attr-defined]
    return step


class _Timer:
    """Wall-clock seconds spent inside a module's forward calls (forward pre/post hooks)."""

    def __init__(self, modules: list[nn.Module]) -> None:
        self.seconds, self.depth, self.t0 = 0.0, 0, 0.0
        self.handles = []
        for m in modules:
            self.handles.append(m.register_forward_pre_hook(self._enter))
            self.handles.append(m.register_forward_hook(self._leave))

    def _enter(self, *_):
        if self.depth == 0:
            self.t0 = time.perf_counter()
        self.depth += 1

    def _leave(self, *_):
        self.depth -= 1
        if self.depth == 0:
            self.seconds += time.perf_counter() - self.t0

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _nbytes(x: Any) -> int:
    if isinstance(x, Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (tuple, list)):
        return sum(_nbytes(v) for v in x)
    if hasattr(x, "to_tuple"):
        return _nbytes(x.to_tuple())
    return 0


def part_split(
    target: nn.Module,
    head: nn.Module,
    batch: dict[str, Tensor],
    steps: int = 3,
    amp: torch.dtype | None = None,
) -> dict[str, dict[str, float]]:
    """Seconds per step (mean of ``steps`` after one warm-up) and MiB per part of our training step.

    MiB (of one step): target parts = the bytes of their outputs (all hidden states; the logits); TTT
    unroll and draft logits + loss = the bytes saved for backward while they run (parameters excluded,
    each storage once)."""
    step = our_step(target, head, amp=amp)
    step(batch)
    inner = target.get_base_model() if hasattr(target, "get_base_model") else target
    decoder = inner.get_decoder() if hasattr(inner, "get_decoder") else inner.model
    t_dec, t_lm, t_ttt = (
        _Timer([decoder]),
        _Timer([inner.get_output_embeddings()]),
        _Timer([head.midlayer, head.fc]),
    )
    out_bytes = {"dec": 0, "lm": 0}
    hooks = [
        decoder.register_forward_hook(lambda m, a, o: out_bytes.__setitem__("dec", _nbytes(o))),
        inner.get_output_embeddings().register_forward_hook(
            lambda m, a, o: out_bytes.__setitem__("lm", _nbytes(o))
        ),
    ]
    params = {p.data_ptr() for p in head.parameters()} | {p.data_ptr() for p in target.parameters()}
    saved: dict[str, dict[int, int]] = {"ttt": {}, "loss": {}}

    def pack(t: Tensor):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            saved["ttt" if t_ttt.depth else "loss"][ptr] = t.untyped_storage().nbytes()
        return t

    for k in step.parts:
        step.parts[k] = 0.0
    total = 0.0
    try:
        for _ in range(steps):
            for d in saved.values():  # bytes of one step (the last), not summed over steps
                d.clear()
            t = time.perf_counter()
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                step(batch)
            total += time.perf_counter() - t
    finally:
        for h in [t_dec, t_lm, t_ttt]:
            h.remove()
        for h in hooks:
            h.remove()
    sec = {
        PARTS[0]: t_dec.seconds,
        PARTS[1]: t_lm.seconds,
        PARTS[2]: t_ttt.seconds,
        PARTS[4]: step.parts["backward"],
        PARTS[5]: step.parts["optimizer step"],
    }
    sec[PARTS[3]] = total - sum(sec.values())  # the rest of batch_loss: draft norm + lm_head, loss, metrics
    mib = {
        PARTS[0]: out_bytes["dec"],
        PARTS[1]: out_bytes["lm"],
        PARTS[2]: sum(saved["ttt"].values()),
        PARTS[3]: sum(saved["loss"].values()),
    }
    split = {p: {"s": sec[p] / steps, "MiB": mib[p] / 2**20 if p in mib else None} for p in PARTS}
    split["total"] = {"s": total / steps, "MiB": None}
    return split


# ---------------------------------------------------------------------------------------------- reference


def _transformers5_shims(cnets) -> None:
    """What the original trainer's vendored Llama needs to build under transformers 5: a ``default`` RoPE
    init (removed from ``ROPE_INIT_FUNCTIONS``) and ``_tied_weights_keys`` as a mapping (it was a list)."""

    def default_rope(config, device=None, **_):
        dim = config.hidden_size // config.num_attention_heads
        theta = getattr(config, "rope_theta", None) or (config.rope_parameters or {}).get("rope_theta", 1e4)
        return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)), 1.0

    ROPE_INIT_FUNCTIONS.setdefault("default", default_rope)
    cnets.LlamaForCausalLM._tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}


def _reset_rope(model: nn.Module) -> None:
    """Recompute the vendored Llama's RoPE ``inv_freq``: a non-persistent buffer, so transformers 5's
    ``from_pretrained`` (which builds the model on the meta device) leaves it uninitialised memory."""
    for m in model.modules():
        if hasattr(m, "rope_init_fn") and hasattr(m, "inv_freq"):
            inv_freq, m.attention_scaling = m.rope_init_fn(m.config, None, **getattr(m, "rope_kwargs", {}))
            m.inv_freq = inv_freq.to(m.inv_freq.device)
            m.original_inv_freq = m.inv_freq


def reference_step(
    reference: tuple[Any, Any],
    target: nn.Module,
    head: nn.Module,
    steps: int = 7,
    lr: float = 1e-4,
    amp: torch.dtype | None = None,
) -> tuple[Callable[[dict[str, Tensor]], float], dict]:
    """A training step of the original EAGLE-3 trainer's model, built from ``reference`` = (its ``cnets``
    module, its ``configs.EConfig``), imported from the user's checkout by ``scripts/bench_eagle3_train.py``
    (`import_reference` there), for the same target weights and draft vocab as ``head``: its forward (target + ``steps``-step unroll + losses), Σ 0.8**j loss_j (its main.py),
    backward and AdamW. Returns (step, info) with info["target_logits_max_abs_diff"]: its target's
    logits against ``target``'s on a probe batch (the two trainers must train on the same function)."""
    cnets, EConfig = reference
    _transformers5_shims(cnets)
    cfg = {k: v for k, v in target.config.to_dict().items() if k not in ("rope_scaling", "rope_parameters")}
    econf = EConfig(**cfg, draft_vocab_size=head.config.draft_vocab)
    econf.rope_scaling = None
    econf.rope_theta = target.config.rope_parameters.get("rope_theta", 1e4)
    tmp = tempfile.mkdtemp(prefix="eagle3-ref-")
    target.save_pretrained(tmp, max_shard_size="1MB")  # it reads the embedding through a shard index
    model = cnets.Model(econf, None, SimpleNamespace(gradient_checkpointing=False), path=tmp, load_emb=True)
    dtype = next(target.parameters()).dtype
    _reset_rope(model.target_model)
    model.target_model.to(dtype)
    model.target_model.load_state_dict(target.state_dict())  # it loads in fp16: use the exact weights
    model.length = steps
    model.register_buffer("t2d", head.t2d.clone())
    model.register_buffer("d2t", head.d2t.clone())
    model.train()
    probe = torch.randint(3, target.config.vocab_size, (1, 32))
    with torch.no_grad():
        diff = (model.target_model(input_ids=probe).logits.float() - target(probe).logits.float()).abs().max()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, betas=(0.9, 0.95))

    def step(batch: dict[str, Tensor]) -> float:
        with autocast(amp):
            plosses, _, _ = model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                loss_mask=batch["loss_mask"],
            )
            loss = sum(0.8**i * p for i, p in enumerate(plosses))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step, {"target_logits_max_abs_diff": float(diff), "checkout": os.path.dirname(cnets.__file__)}


def interleave(
    steps: dict[str, Callable], batch: dict[str, Tensor], rounds: int, memory=None
) -> dict[str, dict[str, Any]]:
    """Each step once per round after one warm-up each, the order reversed every other round (so drift in
    the machine's load hits every step alike): per name the wall and process-CPU seconds per round, their
    medians, target tokens/s at the median wall time, and the peak memory of its calls (``memory``: an
    object with reset() and read_mib(), e.g. scripts/benchmark.py's PeakMemory)."""
    tokens = int(batch["attention_mask"].sum())
    for fn in steps.values():
        fn(batch)
    out: dict[str, dict[str, Any]] = {n: {"s": [], "cpu_s": [], "peak_MiB": 0.0} for n in steps}
    names = list(steps)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            if memory is not None:
                memory.reset()
            t, c = time.perf_counter(), time.process_time()
            loss = steps[name](batch)
            out[name]["s"].append(time.perf_counter() - t)
            out[name]["cpu_s"].append(time.process_time() - c)
            if memory is not None:
                out[name]["peak_MiB"] = max(out[name]["peak_MiB"], memory.read_mib())
            if not math.isfinite(loss):
                raise FloatingPointError(f"{name}: loss {loss}")
    for x in out.values():
        x["median_s"] = statistics.median(x["s"])
        x["median_cpu_s"] = statistics.median(x["cpu_s"])
        x["tokens_per_s"] = tokens / x["median_s"]
    return out


def paired_ratios(res: dict[str, dict[str, Any]], a: str, b: str, key: str = "s") -> dict[str, float]:
    """Per-round ratio of b's seconds (``key``: "s" wall, "cpu_s" process CPU) to a's, i.e. a's tokens/s
    over b's: median, min, max."""
    r = [tb / ta for ta, tb in zip(res[a][key], res[b][key], strict=True)]
    return {"median": statistics.median(r), "min": min(r), "max": max(r)}
