"""``compile=``: the decode loop's steps under ``torch.compile``, compiled once per process and reused.

Three steps run under ``torch.compile(dynamic=True)`` when ``infer.generate(..., compile=...)`` asks:
the target's verify forward (`CompiledStep`, batch 1 and batches), the Medusa heads' top-k
(`infer.draft`) and one EAGLE draft-layer forward with its lm_head and top-k (`infer.eagle_draft`,
`infer.parallel_draft`). The prefill and the host-side bookkeeping between steps stay eager.

Reuse across generations: dynamo keeps its compiled graphs on the code object of the function it
compiled, behind guards on the inputs, and counts them against ``recompile_limit`` (8) per code
object. Each target's verify step and each head's draft step therefore run a copy of the step
function with a code object of its own (`fresh_copy`): one target's or head's graphs never use up
another's limit (past it dynamo would run that step eagerly, with a warning). The inputs of a step
are the tensors, modules and caches of the call, so a new generation (a new cache, a new proposer, a
prompt of another length: the sizes are dynamic) passes the same guards and reuses the graphs.
Nothing a generation creates is read from a global inside a step (`infer.attention`'s tiled-mask
memo is bypassed while tracing for that reason).

Hooks: the verify step catches the hidden states the proposer reads with forward hooks on the
target, registered around each call only (so plain ``target(...)`` calls never see them) and with the
same bound methods every time. Dynamo does not guard on module hooks (``skip_nnmodule_hook_guards``),
so re-registering them does not recompile; the traced graph returns the caught states itself.

Sizes of 1: dynamo specialises a dimension of size 1, so a size-1 input is a graph of its own. A
root-only tree (one plain decoding step, when a single token is left to generate) is verified
eagerly rather than compiled for that: it would otherwise add a graph at the end of some
generations, long after the first. A batch that shrinks to one row, a draft step over one pair or
one frontier node, and each distinct Python int a step takes (a tree's depth and top-k, a tail
length) still add one graph the first time they occur.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import types
import weakref
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from heads.graft import TargetOutput, _cache_kwarg, decoder_layers, num_layers, run_target_lean, unwrap_peft


def backend_of(compile: bool | str) -> str | None:
    """``compile=`` -> the dynamo backend name (True: inductor), or None for eager."""
    if not isinstance(compile, bool | str) or compile == "":
        raise ValueError(f"compile must be True, False or a torch.compile backend name, got {compile!r}")
    if compile is False:
        return None
    return "inductor" if compile is True else compile


def fresh_copy(fn: Callable) -> Callable:
    """``fn`` with a code object of its own (equal to ``fn``'s): dynamo's graphs, guards and recompile
    count live on the code object, so each copy compiles and counts separately."""
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__,
                              fn.__closure__)  # fmt: skip
    copy.__kwdefaults__, copy.__qualname__ = fn.__kwdefaults__, fn.__qualname__
    return copy


def canonical(x):
    """A contiguous tensor with a size-1 dimension -> the same memory with the strides a new tensor of its
    shape has (a view; anything else unchanged). A size-1 dimension's stride is arbitrary, masks built
    by different paths differ there, and dynamo guards on it: without this, each would be a graph."""
    if isinstance(x, Tensor) and 1 in x.shape and x.is_contiguous():
        return x.as_strided(x.shape, torch.empty(x.shape, device="meta").stride())
    return x


class PerModule:
    """``fn(module, *args)`` under ``torch.compile(dynamic=True, backend=backend)``, one `fresh_copy`
    of ``fn`` per ``module`` (held weakly): a draft step's graphs belong to the head it drafts with.
    ``copies``: module -> its compiled copy."""

    def __init__(self, fn: Callable, backend: str) -> None:
        self.fn, self.backend = fn, backend
        self.copies: weakref.WeakKeyDictionary[nn.Module, Callable] = weakref.WeakKeyDictionary()
        self.lock = threading.Lock()

    def __call__(self, module: nn.Module, *args):
        args = tuple(canonical(a) for a in args)
        step = self.copies.get(module)
        if step is None:
            with self.lock:
                step = self.copies.get(module)
                if step is None:
                    step = torch.compile(fresh_copy(self.fn), dynamic=True, backend=self.backend)
                    self.copies[module] = step
        return step(module, *args)


@functools.lru_cache(maxsize=64)
def compiled(fn: Callable, backend: str | None) -> Callable:
    """``fn(module, ...)`` under ``torch.compile(dynamic=True, backend=backend)`` with one copy of
    ``fn`` per module it is called with (`PerModule`; one dispatcher per function and backend), or
    ``fn`` itself for backend None."""
    return fn if backend is None else PerModule(fn, backend)


class CompiledStep:
    """The target's verify forward under ``torch.compile(dynamic=True)``, with no graph break of its own.

    One per (target, aux layers, backend), from `compiled_step`, reused by every generation. It holds
    the target by weak reference (the per-target table must not keep it alive) and registers its
    hooks for the duration of each call; a lock serialises calls on one target (the hooks and
    `infer.attention.attention_implementation` act on the model itself).

    __call__(tokens [B, N+1], mask, position_ids [B, N+1], cache) -> `TargetOutput` with logits
    [B, N+1, V], hidden and aux [B, N+1, H] (aux: the inputs of decoder layers ``aux_layers``, an
    index equal to the layer count meaning ``hidden``); ``mask`` as the runner builds it (a boolean or
    additive 4D tensor, or a dict of them per layer type), ``cache`` the runner's transformers Cache.
    A root-only tree (N = 0) runs eagerly (`heads.graft.run_target_lean`, the runners' eager path).
    ``fn``: this step's own copy of `_forward` (its code object holds this target's graphs).
    """

    def __init__(self, target: nn.Module, aux_layers: Sequence[int], backend: str) -> None:
        self._target = weakref.ref(target)
        n = num_layers(target)
        self.aux_layers = tuple(aux_layers)
        self.n, self.wanted = n, [i + n + 1 if i < 0 else i for i in aux_layers]
        self.caught: dict[int, Tensor] = {}
        inner = unwrap_peft(target)
        # the modules to hook and one hook object each, found once (the layers do not keep the target alive)
        self._base, self._hook_out = inner.base_model, self._catch_output
        at = sorted({i for i in self.wanted if i < n})
        layers = decoder_layers(inner) if at else []
        self._pre_hooks = [(layers[i], self._catch_input(i)) for i in at]
        self.cache_kw = _cache_kwarg(type(inner))
        self.lock = threading.Lock()
        self.fn = fresh_copy(CompiledStep._forward)
        self.step = torch.compile(types.MethodType(self.fn, self), dynamic=True, backend=backend)

    @property
    def target(self) -> nn.Module:
        target = self._target()
        if target is None:
            raise RuntimeError("the target of this compiled step was garbage-collected")
        return target

    def _catch_output(self, module, args, output) -> None:
        self.caught[self.n] = output[0] if isinstance(output, tuple) else output.last_hidden_state

    def _catch_input(self, i: int):
        def hook(module, args, kwargs) -> None:
            self.caught[i] = args[0] if args else kwargs["hidden_states"]

        return hook

    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        """The catching hooks on the target inside the block only (8-18 µs a call on this CPU with 0-3 aux layers)."""
        handles = [self._base.register_forward_hook(self._hook_out)]
        try:
            handles += [layer.register_forward_pre_hook(h, with_kwargs=True) for layer, h in self._pre_hooks]
            yield
        finally:
            for h in handles:
                h.remove()
            self.caught.clear()  # the last step's states are returned, not kept here

    def _forward(self, target: nn.Module, tokens: Tensor, mask, position_ids: Tensor, cache):
        out = target(input_ids=tokens, attention_mask=mask, position_ids=position_ids, use_cache=True,
                     output_hidden_states=False, **{self.cache_kw: cache})  # fmt: skip
        return out.logits, self.caught[self.n], tuple(self.caught[i] for i in self.wanted)

    def __call__(self, tokens: Tensor, mask, position_ids: Tensor, cache) -> TargetOutput:
        target = self.target
        if tokens.shape[1] == 1:  # a size-1 dimension would be a graph of its own
            return run_target_lean(target, tokens, mask, aux_layers=self.aux_layers, logits_to_keep=0,
                                   position_ids=position_ids, cache=cache, use_cache=True)  # fmt: skip
        if isinstance(mask, dict):
            mask = {k: canonical(m) for k, m in mask.items()}
        tokens, mask, position_ids = canonical(tokens), canonical(mask), canonical(position_ids)
        with self.lock, self.hooks():
            logits, hidden, aux = self.step(target, tokens, mask, position_ids, cache)
        return TargetOutput(logits=logits, hidden=hidden, aux=aux)


_steps: weakref.WeakKeyDictionary[nn.Module, dict[tuple, CompiledStep]] = weakref.WeakKeyDictionary()
_steps_lock = threading.Lock()


def compiled_step(target: nn.Module, aux_layers: Sequence[int], backend: str) -> CompiledStep:
    """The `CompiledStep` of ``target`` for these aux layers and backend: built on first use, then the
    same object for every generation (dropped with the target)."""
    key = (tuple(aux_layers), backend)
    with _steps_lock:
        per_target = _steps.setdefault(target, {})
        if key not in per_target:
            per_target[key] = CompiledStep(target, aux_layers, backend)
        return per_target[key]
