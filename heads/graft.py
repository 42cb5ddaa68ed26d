"""The graft: a frozen Hugging Face causal LM whose hidden states feed the draft heads.

The heads never own target weights. They read the target's hidden states and reuse its frozen
embedding and lm_head, so a head checkpoint is small and only valid for the target it was trained on
(same vocabulary and hidden size; see `heads.base.HeadConfig.check_target`).

Hidden-state convention (transformers 5.x, measured in DESIGN.md §5): with
``output_hidden_states=True`` a model returns ``num_layers + 1`` states; ``hidden_states[i]`` is the
*input* of decoder layer ``i`` and ``hidden_states[-1]`` is the last layer's output *after* the final
norm, so ``lm_head(hidden_states[-1])`` gives the logits (before any final soft-capping).
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass
class TargetOutput:
    """What one target forward gives the heads.

    logits: [B, T, V] target logits.
    hidden: [B, T, H] last post-norm hidden state (Medusa and EAGLE-1/2 read this).
    aux: tuple of [B, T, H], ``hidden_states[i]`` for each requested layer id (EAGLE-3 reads these).
    """

    logits: Tensor
    hidden: Tensor
    aux: tuple[Tensor, ...] = ()


def looks_local(name_or_path: str) -> bool:
    """True for something that can only be a filesystem path (a Hub id is ``name`` or ``org/name``)."""
    return (
        name_or_path.startswith((".", "/", "~"))
        or name_or_path.count("/") > 1
        or os.path.exists(name_or_path)
    )


def resolve_dtype(dtype: str | torch.dtype | None) -> str | torch.dtype:
    """Map a config string ("auto", "bf16", "bfloat16", "float32", ...) to what transformers takes."""
    if dtype is None or isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype or "auto"
    aliases = {
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "float16": torch.float16,
        "fp32": torch.float32,
        "float32": torch.float32,
    }
    if dtype not in aliases:
        raise ValueError(f"unknown dtype {dtype!r}; use one of auto, {', '.join(aliases)}")
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
) -> nn.Module:
    """Load a frozen causal LM from a Hub id or a local directory.

    ``dtype="auto"`` keeps the dtype stored in the model's config. The model is returned in eval mode
    with ``requires_grad=False`` on every parameter. A missing local path or an unreachable Hub id is
    a ``FileNotFoundError``/``OSError`` that names what was asked for.
    """
    from transformers import AutoModelForCausalLM

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
    return freeze(model)


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
        forward_kwargs[_cache_kwarg(type(model))] = forward_kwargs.pop("cache")
    out = model(
        input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, **forward_kwargs
    )
    hs = out.hidden_states
    return TargetOutput(logits=out.logits, hidden=hs[-1], aux=tuple(hs[i] for i in aux_layers))
