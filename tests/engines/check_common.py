"""Engine-independent checks run inside an engine's own venv (torch and safetensors only, no selfspec).

A driver fills every floating-point parameter of the engine's freshly built draft with NaN, lets the
engine's own ``load_weights`` run on a wrapped weight iterator, and then calls `audit`, which reports:

- ``never_loaded``: engine parameters still holding NaN (minus the ones the engine shares from the
  target, which the driver names explicitly);
- ``dropped``: checkpoint tensors whose values are found in no engine parameter or buffer (a tensor is
  "found" when it equals a contiguous block of rows of one: fused q/k/v and gate/up are such blocks);
- ``shape_problems``: checkpoint tensors that matched nothing and whose name's last part exists with
  another shape.

The exported heads hold distinct random values, so a value match is a name match.
"""

from __future__ import annotations

import gc
import json
import math
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import Tensor, nn


class RecordingIterator:
    """Wraps the engine's ``(name, tensor)`` weight iterator and keeps a copy of what it yielded."""

    def __init__(self, inner: Iterable[tuple[str, Tensor]]):
        self.inner, self.seen = iter(inner), {}

    def __iter__(self) -> Iterator[tuple[str, Tensor]]:
        for name, t in self.inner:
            self.seen[name] = t.detach().clone()
            yield name, t


def fill_nan(model: nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.fill_(math.nan)


def _contains_rows(big: Tensor, small: Tensor) -> bool:
    """True iff ``small`` equals big[i:i+n] (along dim 0) for some i (same trailing shape)."""
    if big.dtype != small.dtype:
        if big.is_floating_point() != small.is_floating_point():
            return False
        small = small.to(big.dtype)
    if big.shape == small.shape:
        return torch.equal(big, small)
    if big.dim() != small.dim() or big.shape[1:] != small.shape[1:] or small.shape[0] > big.shape[0]:
        return False
    n = small.shape[0]
    first = small[0]
    for i in range(big.shape[0] - n + 1):
        if torch.equal(big[i], first) and torch.equal(big[i : i + n], small):
            return True
    return False


def audit(model: nn.Module, seen: dict[str, Tensor], shared: dict[str, str], ignored: dict[str, str]) -> dict:
    """See the module docstring. shared: engine param name -> why it may stay NaN (taken from the target);
    ignored: checkpoint name -> why the engine reads it no more (e.g. vLLM never uses ``t2d``)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    tensors = {**dict(model.named_buffers()), **params}
    never = sorted(n for n, p in params.items() if p.is_floating_point() and torch.isnan(p).any() and n not in shared)
    dropped, shape_problems = [], []
    for name, t in seen.items():
        if name in ignored:
            continue
        if not any(_contains_rows(v.detach().cpu(), t.cpu()) for v in tensors.values()):
            dropped.append(name)
            tail = name.split(".")[-2:]
            same = [n for n, v in tensors.items() if n.split(".")[-2:] == tail and tuple(v.shape) != tuple(t.shape)]
            if same:
                shape_problems.append(f"{name} {tuple(t.shape)} vs {same[0]} {tuple(tensors[same[0]].shape)}")
    return {
        "engine_params": {n: list(p.shape) for n, p in params.items()},
        "checkpoint": sorted(seen),
        "never_loaded": never,
        "dropped": sorted(dropped),
        "shape_problems": shape_problems,
        "shared_from_target": shared,
        "ignored_by_engine": ignored,
    }


def fc_input_error(inner: nn.Module, case: dict) -> float | None:
    """EAGLE-1: relative max error of the engine draft's ``fc(cat(embed_tokens(ids), f))`` (both engines'
    draft forward concatenates the embedding first) against selfspec's ``fc(cat(embed(ids), f))``, which
    the test computed with the target's own embedding module; None when the case carries no check."""
    check = case.get("fc_check")
    if not check:
        return None
    ids, f, want = (torch.tensor(check[k]) for k in ("ids", "features", "expected"))
    with torch.no_grad():
        e = inner.embed_tokens(ids)
        got = inner.fc(torch.cat((e, f.to(e.dtype)), dim=-1))
    got = got[0] if isinstance(got, tuple) else got
    return float((got.float() - want).abs().max() / want.abs().max())


def fuse_error(fuse, case: dict) -> float | None:
    """EAGLE-3: relative max error of the engine draft's own fusion of aux features (``fuse`` = vLLM's
    ``combine_hidden_states``: its fc_norm chunks and fc) against selfspec's ``Eagle3Head.fuse`` on the
    same [n, 3H] features; None when the case carries no check."""
    check = case.get("fuse_check")
    if not check:
        return None
    aux, want = torch.tensor(check["aux"]), torch.tensor(check["expected"])
    with torch.no_grad():
        got = fuse(aux)
    got = got[0] if isinstance(got, tuple) else got
    return float((got.float() - want).abs().max() / want.abs().max())


def eagle31_flags(inner: nn.Module) -> dict[str, bool]:
    """What the engine's EAGLE-3 draft model built from the config: per-layer aux norms (``fc_norm``, a
    module list or None in both engines) and post-norm feedback (``norm_output``, read in its forward)."""
    return {"fc_norm": getattr(inner, "fc_norm", None) is not None,
            "norm_output": bool(getattr(inner, "norm_output", False))}


def freeze_heap() -> None:
    """Move every object alive now out of the garbage collector's reach (``gc.freeze``). Both engines
    call ``gc.collect()`` around each model load; with vLLM or SGLang imported, each full collection walks
    millions of module-level objects (0.3 s here), which was two thirds of a driver's CPU time. Objects
    of earlier cases then stay in memory: tiny models, freed at exit."""
    gc.freeze()


def main(setup, run) -> None:
    """Driver entry: ``python driver.py spec.json out.json``. spec: ``{"port", "cases": [case...]}``;
    ``setup(spec)`` runs once (process group), ``run(case) -> dict`` per case; one result per case."""
    import traceback

    spec = json.load(open(sys.argv[1]))
    torch.manual_seed(0)
    torch.set_num_threads(1)
    results: list[dict[str, Any]] = []
    try:
        setup(spec)
        failed_setup = None
    except Exception as e:
        failed_setup = f"setup: {type(e).__name__}: {e}\n{traceback.format_exc()[-2000:]}"
    for case in spec["cases"]:
        freeze_heap()
        if failed_setup:
            results.append({"id": case["id"], "ok": False, "error": failed_setup})
            continue
        try:
            results.append({"id": case["id"], "ok": True, **run(case)})
        except Exception as e:  # the engine refused or crashed: the test reports the message
            results.append({"id": case["id"], "ok": False, "error": f"{type(e).__name__}: {e}",
                            "traceback": traceback.format_exc()[-3000:]})
        with open(sys.argv[2], "w") as f:
            json.dump(results, f, indent=1)
    with open(sys.argv[2], "w") as f:
        json.dump(results, f, indent=1)
