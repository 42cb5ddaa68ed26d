"""``compile=``: the decode loop's steps under ``torch.compile``, compiled once per process and reused.

Three steps run under ``torch.compile(dynamic=True)`` when ``infer.generate(..., compile=...)`` asks:
the target's verify forward (`CompiledStep`, batch 1 and batches), the Medusa heads' top-k
(`infer.draft`) and one EAGLE draft-layer forward with its lm_head and top-k (`infer.eagle_draft`,
`infer.parallel_draft`). The prefill and the host-side bookkeeping between steps stay eager.

Reuse across generations: dynamo keeps its compiled graphs on the code object of the function it
compiled, behind guards on the inputs. Every step here is a module-level function (or a method of an
object cached per target) whose inputs are the tensors, modules and caches of the call, so a new
generation (a new cache, a new proposer, a prompt of another length: the sizes are dynamic) passes
the same guards and reuses the graphs. Nothing a generation creates is read from a global inside a
step (`infer.attention`'s tiled-mask memo is bypassed while tracing for that reason).

Hooks: the verify step catches the hidden states the proposer reads with forward hooks on the
target, registered around each call only (so plain ``target(...)`` calls never see them) and with the
same bound methods every time. Dynamo does not guard on module hooks (``skip_nnmodule_hook_guards``),
so re-registering them does not recompile; the traced graph returns the caught states itself.

Limits: dynamo's ``recompile_limit`` (8 graphs per function) is shared by every target in the process;
past it the step runs eagerly (correct, with a dynamo warning). A size of 1 is specialised by dynamo,
so a root-only tree, a batch down to one row and each Medusa tree cut add one graph the first time.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from heads.graft import TargetOutput, _cache_kwarg, decoder_layers, num_layers, unwrap_peft


def backend_of(compile: bool | str) -> str | None:
    """``compile=`` -> the dynamo backend name (True: inductor), or None for eager."""
    if not isinstance(compile, bool | str) or compile == "":
        raise ValueError(f"compile must be True, False or a torch.compile backend name, got {compile!r}")
    if compile is False:
        return None
    return "inductor" if compile is True else compile


@functools.lru_cache(maxsize=64)
def compiled(fn: Callable, backend: str | None) -> Callable:
    """``fn`` under ``torch.compile(dynamic=True, backend=backend)`` (one wrapper per function and
    backend; dynamo's graphs live on ``fn``'s code object, shared by every wrapper), or ``fn`` itself
    for backend None."""
    return fn if backend is None else torch.compile(fn, dynamic=True, backend=backend)


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
    """

    def __init__(self, target: nn.Module, aux_layers: Sequence[int], backend: str) -> None:
        self._target = weakref.ref(target)
        n = num_layers(target)
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
        self.step = torch.compile(self._forward, dynamic=True, backend=backend)

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
