"""The graft: a frozen Hugging Face causal LM whose hidden states feed the draft heads.

The heads never own target weights. They read the target's hidden states and reuse its frozen
embedding and lm_head, so a head checkpoint is small and only valid for the target it was trained on
(same vocabulary and hidden size; see `heads.base.HeadConfig.check_target`).

Hidden-state convention (transformers 5.x, measured in docs/design.md §5): with
``output_hidden_states=True`` a model returns ``num_layers + 1`` states; ``hidden_states[i]`` is the
*input* of decoder layer ``i`` and ``hidden_states[-1]`` is the last layer's output *after* the final
norm, so ``lm_head(hidden_states[-1])`` gives the logits (before any final soft-capping).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from huggingface_hub import try_to_load_from_cache
from safetensors import safe_open
from torch import Tensor, nn
from transformers import AutoModelForCausalLM

from heads import targets


@dataclass
class TargetOutput:
    """What one target forward gives the heads.

    logits: [B, T, V] target logits.
    hidden: [B, T, H] last post-norm hidden state (Medusa and EAGLE-1/2 read this).
    aux: tuple of [B, T, H], ``hidden_states[i]`` for each requested layer id (EAGLE-3 reads these).
    top: [B, T] the argmax of the full [B, T, V] logits, set only when ``logits`` holds a subset of the
        vocabulary's columns (offline features stored for a draft vocabulary, `train.features`).
    """

    logits: Tensor
    hidden: Tensor
    aux: tuple[Tensor, ...] = ()
    top: Tensor | None = None


def looks_local(name_or_path: str) -> bool:
    """True for something that can only be a filesystem path (a Hub id is ``name`` or ``org/name``)."""
    return (
        name_or_path.startswith((".", "/", "~"))
        or name_or_path.count("/") > 1
        or os.path.exists(name_or_path)
    )


def resolve_dtype(dtype: str | torch.dtype | None) -> str | torch.dtype:
    """Map a config string ("auto", "bf16", "bfloat16", "float32", ...) to what transformers takes.

    ``fast``: bf16 where the hardware computes it natively, else fp32 (`heads.targets.fast_precision`;
    emulated bf16 on a CPU without bf16 instructions is many times slower than fp32); the choice and why
    are printed in one line."""
    if dtype is None or isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype or "auto"
    if dtype == targets.FAST:
        chosen = targets.fast_precision()
        print(f"target dtype fast -> {chosen.line}", flush=True)
        return chosen.dtype
    aliases = {
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "float16": torch.float16,
        "fp32": torch.float32,
        "float32": torch.float32,
    }
    if dtype not in aliases:
        raise ValueError(f"unknown dtype {dtype!r}; use one of auto, fast, {', '.join(aliases)}")
    return aliases[dtype]


def freeze(model: nn.Module) -> nn.Module:
    """Put the target in eval mode with no trainable parameter (the graft never updates it)."""
    model.eval()
    model.requires_grad_(False)
    return model


def load_target(
    name_or_path: str,
    *,
    revision: str | None = None,
    dtype: str | torch.dtype | None = "auto",
    device: str | torch.device | None = None,
    attn_implementation: str | None = None,
    trust_remote_code: bool = False,
    adapter: str | None = None,
    adapter_revision: str | None = None,
    merge: bool = False,
    gguf_file: str | None = None,
) -> nn.Module:
    """Load a frozen causal LM from a Hub id, a local directory, a built-in name (``demo``, ``demo-tiny``,
    ``smollm2-135m-instruct``) or a ``.gguf`` file (or a directory plus ``gguf_file``), optionally with
    a PEFT adapter on it. Names and GGUF files become local checkpoints through `heads.targets.resolve`
    (built and cached on first use).

    ``dtype="auto"`` keeps the dtype stored in the model's config. The model is returned in eval mode
    with ``requires_grad=False`` on every parameter. A missing local path or an unreachable Hub id is
    a ``FileNotFoundError``/``OSError`` that names what was asked for.

    ``adapter`` (a PEFT adapter directory or Hub id, e.g. a LoRA) is applied on top: the heads then train
    on, and verify against, the *adapted* model. ``merge=True`` folds it into the weights
    (``merge_and_unload``: a plain transformers model, as fast as the base); ``merge=False`` keeps the
    ``PeftModel`` (W x + B A x computed apart). Either way the model remembers which adapter it carries
    (`adapter_info`), so heads trained on it can check they get the same adapted target.
    """
    name_or_path = targets.resolve(name_or_path, gguf_file=gguf_file)
    if looks_local(name_or_path) and not os.path.isdir(os.path.expanduser(name_or_path)):
        raise FileNotFoundError(f"target model directory not found: {name_or_path!r}")
    kwargs = {"dtype": resolve_dtype(dtype), "revision": revision, "trust_remote_code": trust_remote_code}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        model = AutoModelForCausalLM.from_pretrained(os.path.expanduser(name_or_path), **kwargs)
    except OSError as e:
        offline = (
            " (HF_HUB_OFFLINE is set, so only the local cache is searched)"
            if os.environ.get("HF_HUB_OFFLINE") == "1"
            else ""
        )
        raise OSError(f"could not load target model {name_or_path!r}{offline}: {e}") from e
    if device is not None:
        model.to(device)
    if adapter is not None:
        model = _apply_adapter(model, name_or_path, adapter, adapter_revision, merge)
    elif merge:
        raise ValueError("merge=True needs an adapter to merge")
    return freeze(model)


ADAPTER_ATTR = "_selfspec_adapter"  # set by `load_target` on a model that carries a PEFT adapter


def unwrap_peft(model: nn.Module) -> nn.Module:
    """The transformers model inside a ``PeftModel`` (its LoRA layers stay injected), else ``model``."""
    get_base = getattr(model, "get_base_model", None) if hasattr(model, "peft_config") else None
    return get_base() if callable(get_base) else model


def adapter_info(model: nn.Module) -> dict | None:
    """Which PEFT adapter ``model`` carries: None for a plain model.

    A model loaded by `load_target` with an adapter gives ``{"name_or_path", "sha256", "merged"}``
    (``sha256`` of the adapter's weight file, or None if it could not be read). A ``PeftModel`` built
    elsewhere gives ``{"name_or_path": None, "sha256": None, "merged": False}``: an adapter, but unknown.
    """
    info = getattr(model, ADAPTER_ATTR, None)
    if info is not None:
        return dict(info)
    peft_wrapped = hasattr(model, "peft_config") and callable(getattr(model, "get_base_model", None))
    if peft_wrapped or getattr(model, "_hf_peft_config_loaded", False):  # PeftModel or model.load_adapter
        return {"name_or_path": None, "sha256": None, "merged": False}
    return None


ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


def adapter_weights_file(adapter: str, revision: str | None = None) -> str | None:
    """The weight file of a PEFT adapter (local directory, or a Hub id already in the local cache), or None."""
    local = os.path.expanduser(adapter)
    if os.path.isdir(local):
        return next(
            (os.path.join(local, f) for f in ADAPTER_WEIGHTS if os.path.isfile(os.path.join(local, f))), None
        )
    if looks_local(adapter):
        return None
    for f in ADAPTER_WEIGHTS:
        hit = try_to_load_from_cache(adapter, f, revision=revision)
        if isinstance(hit, str):
            return hit
    return None


def adapter_fingerprint(adapter: str, revision: str | None = None) -> str | None:
    """sha256 of a PEFT adapter's weight file (`adapter_weights_file`); None when there is none.

    Two adapters with the same fingerprint are the same weights whatever their path or name, which
    is what heads trained on an adapted target need to know.
    """
    path = adapter_weights_file(adapter, revision)
    if path is None:
        return None
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _unloaded_modules(peft_model: nn.Module, weights: str | None) -> list[str]:
    """Modules whose adapter weights the file holds but the model has no slot for.

    peft wraps only the ``target_modules`` it finds and, when at least one matches, loads the rest of
    the file non-strictly: weights for modules the target lacks would be dropped without a word.
    """
    if weights is None or not weights.endswith(".safetensors"):
        return []
    from peft import get_peft_model_state_dict  # heavy, and only adapted targets need it

    with safe_open(weights, "pt") as f:
        saved = set(f.keys())
    lost = saved - set(get_peft_model_state_dict(peft_model))
    return sorted({k.split(".lora_")[0].rsplit(".", 1)[-1] for k in lost})


def _module_names(model: nn.Module, limit: int = 12) -> list[str]:
    """Distinct leaf names of the layers LoRA can wrap (Linear, Embedding, GPT-2's Conv1D)."""
    names = {
        n.rsplit(".", 1)[-1]
        for n, m in model.named_modules()
        if n
        and not list(m.children())
        and hasattr(m, "weight")
        and m.weight is not None
        and m.weight.dim() == 2
    }
    return sorted(names)[:limit]


def _apply_adapter(
    model: nn.Module, name_or_path: str, adapter: str, revision: str | None, merge: bool
) -> nn.Module:
    """``PeftModel.from_pretrained(model, adapter)`` with errors that name the adapter and the target:
    weights of other shapes (an adapter for another base model) and LoRA modules the target lacks."""
    from peft import PeftConfig, PeftModel  # heavy, and only adapted targets need it

    local = os.path.expanduser(adapter)
    if looks_local(adapter) or os.path.isdir(local):
        if not os.path.isdir(local):
            raise FileNotFoundError(f"adapter directory not found: {adapter!r}")
        if not os.path.isfile(os.path.join(local, "adapter_config.json")):
            raise FileNotFoundError(
                f"{os.path.join(adapter, 'adapter_config.json')} is missing: {adapter!r} is not a PEFT adapter"
            )
        adapter = local
    try:
        pcfg = PeftConfig.from_pretrained(adapter, revision=revision)
    except (OSError, ValueError) as e:
        offline = " (HF_HUB_OFFLINE is set)" if os.environ.get("HF_HUB_OFFLINE") == "1" else ""
        raise OSError(f"could not load the PEFT adapter config of {adapter!r}{offline}: {e}") from e
    trained_on = getattr(pcfg, "base_model_name_or_path", None)
    if trained_on and os.path.basename(trained_on.rstrip("/")) != os.path.basename(name_or_path.rstrip("/")):
        warnings.warn(
            f"adapter {adapter!r} was made for {trained_on!r}, loading it onto {name_or_path!r}",
            stacklevel=3,
        )
    made_for = f" (made for {trained_on!r})" if trained_on else ""
    real_names = _module_names(model)  # before peft wraps the layers in place

    def missing_modules(modules: list[str]) -> ValueError:
        return ValueError(
            f"adapter {adapter!r}{made_for} wraps modules {modules} that target {name_or_path!r} does not "
            f"have (its layers are named e.g. {real_names}): the adapter was made for another "
            "architecture, or its target_modules are wrong"
        )

    try:
        peft_model = PeftModel.from_pretrained(model, adapter, revision=revision, is_trainable=False)
    except RuntimeError as e:  # load_state_dict: "size mismatch for ..."
        if "size mismatch" not in str(e):
            raise
        first = next((ln.strip() for ln in str(e).splitlines() if "size mismatch" in ln), "")
        raise ValueError(
            f"adapter {adapter!r}{made_for} does not fit target {name_or_path!r}: its weights have other "
            f"shapes, so it was made for another base model ({first})"
        ) from None
    except ValueError as e:  # peft: "Target modules {...} not found in the base model"
        if "not found in the base model" not in str(e):
            raise
        raise missing_modules(sorted(getattr(pcfg, "target_modules", None) or [])) from None
    lost = _unloaded_modules(peft_model, adapter_weights_file(adapter, revision))
    if lost:
        raise missing_modules(lost)
    info = {"name_or_path": adapter, "sha256": adapter_fingerprint(adapter, revision), "merged": merge}
    if merge:
        model = peft_model.merge_and_unload()
    else:
        model = peft_model
    setattr(model, ADAPTER_ATTR, info)
    return model


def target_dims(model: nn.Module) -> tuple[int, int]:
    """(vocab_size, hidden_size) as the heads see them: the lm_head's output rows and the hidden width."""
    lm_head = model.get_output_embeddings()
    vocab, hidden = lm_head.weight.shape
    return int(vocab), int(hidden)


def num_layers(model: nn.Module) -> int:
    return int(model.config.get_text_config().num_hidden_layers)


@functools.lru_cache(maxsize=32)
def _cache_kwarg(model_cls: type) -> str:
    params = inspect.signature(model_cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def run_target(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    aux_layers: Sequence[int] = (),
    **forward_kwargs,
) -> TargetOutput:
    """One target forward returning logits, the last post-norm hidden state and chosen layer inputs.

    input_ids: [B, T]; attention_mask: [B, T] padding mask or a 4D additive mask [B, 1, T, S].
    ``aux_layers`` are indices into ``hidden_states`` (the input of that decoder layer).
    Extra keyword arguments (``position_ids``, ``cache``, ``use_cache``...) go to the model; ``cache`` is
    passed under the name this transformers version uses (``cache`` or ``past_key_values``).
    """
    if "cache" in forward_kwargs:  # transformers renamed past_key_values -> cache during 5.x
        # A PeftModel forwards **kwargs to the model it wraps, so the name is that model's.
        forward_kwargs[_cache_kwarg(type(unwrap_peft(model)))] = forward_kwargs.pop("cache")
    out = model(
        input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, **forward_kwargs
    )
    hs = out.hidden_states
    return TargetOutput(logits=out.logits, hidden=hs[-1], aux=tuple(hs[i] for i in aux_layers))


def _decoder(model: nn.Module) -> tuple[nn.Module, nn.ModuleList]:
    """(the module that runs the decoder layers, those layers): the base model and its ``nn.ModuleList``
    of ``num_hidden_layers`` modules (``model.layers``, GPT-2's ``h``...), or a child of the base model
    that holds them (OPT's ``model.decoder``, which its causal LM calls directly, past the base model).
    """
    base = unwrap_peft(model).base_model
    n = num_layers(model)
    for owner in (base, *base.children()):
        for child in owner.children():
            if isinstance(child, nn.ModuleList) and len(child) == n:
                return owner, child
    raise ValueError(f"cannot find the {n} decoder layers of {type(base).__name__}")


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a causal LM (or a PeftModel around one): the ``nn.ModuleList`` of
    ``num_hidden_layers`` modules under its base model (``model.layers``, GPT-2's ``h``, OPT's
    ``model.decoder.layers``)."""
    return _decoder(model)[1]


@functools.lru_cache(maxsize=32)
def _takes_logits_to_keep(model_cls: type) -> bool:
    return "logits_to_keep" in inspect.signature(model_cls.forward).parameters


def run_target_lean(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    aux_layers: Sequence[int] = (),
    logits_to_keep: int = 1,
    **forward_kwargs,
) -> TargetOutput:
    """`run_target` for inference: logits of the last ``logits_to_keep`` positions only (0: all), and
    only the hidden states the heads read, caught with forward hooks instead of ``output_hidden_states``.

    Returns logits [B, logits_to_keep, V] (or [B, T, V]), hidden [B, T, H] (the decoder's output:
    the last layer after the final norm, = ``hidden_states[-1]``), aux [B, T, H] per requested
    ``hidden_states`` index i (the input of decoder layer i; i = num_layers is ``hidden``). The model's
    own head runs with ``logits_to_keep``, so final soft-capping or logit scaling still applies; a model
    whose forward lacks that argument gets its logits sliced after the full head. A 4K-token prefill of
    a 128K-vocab model then keeps one row of logits instead of 4K, and no per-layer states.
    """
    inner = unwrap_peft(model)
    n = num_layers(model)
    wanted = [i + n + 1 if i < 0 else i for i in aux_layers]
    ids = sorted(set(wanted))
    if any(not 0 <= i <= n for i in ids):
        raise ValueError(f"aux layer ids {list(aux_layers)} out of range for {n} layers")
    caught: dict[int, Tensor] = {}

    def catch_output(module, args, output) -> None:
        caught[n] = output[0] if isinstance(output, tuple) else output.last_hidden_state

    def catch_input(i: int):
        def hook(module, args, kwargs) -> None:
            caught[i] = args[0] if args else kwargs["hidden_states"]

        return hook

    # The module that runs the layers gives the final state (final norm, OPT's project_out included):
    # a causal LM may call it past its base model (OPT), so the base model's own hook would not fire.
    try:
        owner, layers = _decoder(inner)
    except ValueError:
        if any(i < n for i in ids):
            raise
        owner, layers = inner.base_model, []
    handles = [owner.register_forward_hook(catch_output)]
    handles += [layers[i].register_forward_pre_hook(catch_input(i), with_kwargs=True) for i in ids if i < n]
    if "cache" in forward_kwargs:
        forward_kwargs[_cache_kwarg(type(inner))] = forward_kwargs.pop("cache")
    lean = logits_to_keep > 0 and _takes_logits_to_keep(type(inner))
    if lean:
        forward_kwargs["logits_to_keep"] = logits_to_keep
    try:
        out = model(
            input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=False, **forward_kwargs
        )
    finally:
        for h in handles:
            h.remove()
    logits = out.logits if lean or logits_to_keep == 0 else out.logits[:, -logits_to_keep:]
    return TargetOutput(logits=logits, hidden=caught[n], aux=tuple(caught[i] for i in wanted))
