"""Checking `infer.generate`'s arguments and resolving them into one `Job`, before any forward.

Every bad argument is one ``ValueError`` (or ``NotImplementedError`` for a transformers option the loop
does not implement) naming it; the effective generation config follows transformers' precedence.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import (
    GenerationConfig,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

# GenerationConfig fields whose logits processors this loop does not apply. Refusing them keeps the
# promise that output matches `target.generate` with the same settings.
_UNSUPPORTED = {
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "min_length": 0,
    "min_new_tokens": None,
    "bad_words_ids": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "min_p": None,
    "num_beams": 1,
    "num_return_sequences": 1,
    "sequence_bias": None,
    "guidance_scale": None,
    "top_h": None,
    "exponential_decay_length_penalty": None,
    "watermarking_config": None,
    "stop_strings": None,
}


def resolve_generation_config(target, generation_config, overrides: dict) -> GenerationConfig:
    """The effective config, in transformers' order: keyword arguments > ``generation_config`` > the
    target's ``generation_config`` > transformers' global defaults (e.g. ``top_k=50`` when sampling)."""
    if generation_config is not None and not isinstance(generation_config, GenerationConfig):
        raise ValueError(
            f"generation_config must be a transformers GenerationConfig or None, got {type(generation_config).__name__}"
        )
    base = target.generation_config
    gc = copy.deepcopy(generation_config if generation_config is not None else base or GenerationConfig())
    if generation_config is not None and base is not None:
        gc.update(**base.to_dict(), defaults_only=True)
    global_defaults = getattr(gc, "_get_default_generation_params", None)
    if global_defaults is not None:
        gc.update(**global_defaults(), defaults_only=True)
    for k, v in overrides.items():
        if v is not None:
            setattr(gc, k, v)
    defaults = GenerationConfig()
    for name, default in _UNSUPPORTED.items():
        value = getattr(gc, name, default)
        if value is not None and value != default and value != getattr(defaults, name, default):
            raise NotImplementedError(
                f"generation option {name}={value!r} is not supported by selfspec.generate"
            )
    return gc


def sampling_warpers(gc) -> LogitsProcessorList:
    """The sampling warpers transformers applies, in its order: temperature, top-k, top-p."""
    procs = LogitsProcessorList()
    if gc.temperature is not None and gc.temperature != 1.0:
        procs.append(TemperatureLogitsWarper(gc.temperature))
    if gc.top_k is not None and gc.top_k != 0:
        procs.append(TopKLogitsWarper(top_k=gc.top_k, min_tokens_to_keep=1))
    if gc.top_p is not None and gc.top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p=gc.top_p, min_tokens_to_keep=1))
    return procs


def context_length(config) -> int | None:
    cfg = config.get_text_config()
    return getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)


def _show(v, n: int = 60) -> str:
    """``repr(v)``, cut short: a bad argument may be huge."""
    text = repr(v)
    return text if len(text) <= n else text[:n] + "..."


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _eos_ids(eos, vocab: int) -> set[int]:
    """The EOS ids as a set; each must be an int token id in [0, vocab - 1] (a string such as "</s>" is
    a token, not an id: ``tokenizer.convert_tokens_to_ids`` gives the id)."""
    if eos is None:
        return set()
    if isinstance(eos, Tensor):
        eos = eos.tolist()
    ids = [eos] if not isinstance(eos, (list, tuple, set)) else list(eos)
    bad = [e for e in ids if not _is_int(e) or not 0 <= e < vocab]
    if bad:
        raise ValueError(
            f"eos_token_id must be a token id (or a list of them) in [0, {vocab - 1}], got {_show(bad[0])}"
            + (
                " (a token string: pass tokenizer.convert_tokens_to_ids(...))"
                if isinstance(bad[0], str)
                else ""
            )
        )
    return set(ids)


def _check_prompt(input_ids, attention_mask_2d, vocab: int) -> tuple[Tensor, Tensor]:
    """(input_ids [B, T] long, valid [B, T] bool) after checking type, dtype, shape, that every id is in
    [0, vocab - 1] and that the mask (0/1, input_ids' shape) leaves each row one contiguous run of
    tokens (left or right padding), at least one long."""
    if not isinstance(input_ids, Tensor):
        raise ValueError(
            f"input_ids must be a torch.Tensor of token ids [batch, seq_len], got {type(input_ids).__name__}"
        )
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise ValueError(f"input_ids must hold integer token ids (torch.long), got dtype {input_ids.dtype}")
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
        if attention_mask_2d is not None and isinstance(attention_mask_2d, Tensor):
            attention_mask_2d = attention_mask_2d.reshape(1, -1)
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, seq_len], got shape {tuple(input_ids.shape)}")
    if input_ids.shape[0] == 0:
        raise ValueError("empty batch: input_ids needs at least one row")
    if input_ids.shape[1] == 0:
        raise ValueError("empty prompt: input_ids needs at least one token")
    lo, hi = int(input_ids.min()), int(input_ids.max())
    if lo < 0 or hi >= vocab:
        raise ValueError(
            f"input_ids holds token id {lo if lo < 0 else hi}, outside the target's vocabulary [0, {vocab - 1}]"
        )
    if attention_mask_2d is None:
        return input_ids.long(), torch.ones_like(input_ids, dtype=torch.bool)
    if not isinstance(attention_mask_2d, Tensor) or tuple(attention_mask_2d.shape) != tuple(input_ids.shape):
        shape = tuple(getattr(attention_mask_2d, "shape", ()))
        raise ValueError(
            f"attention_mask must be a tensor of input_ids' shape {tuple(input_ids.shape)}, got {shape}"
        )
    if attention_mask_2d.dtype.is_complex or not bool(
        ((attention_mask_2d == 0) | (attention_mask_2d == 1)).all()
    ):
        raise ValueError("attention_mask must hold 0 (padding) and 1 (token) only")
    valid = attention_mask_2d.to(input_ids.device).bool()
    runs = valid[:, 0].long() + (valid[:, 1:] & ~valid[:, :-1]).sum(1)  # [B] runs of tokens per row
    if bool((runs == 0).any()):
        raise ValueError(f"attention_mask row {int((runs == 0).nonzero()[0])} has no token (an empty prompt)")
    if bool((runs > 1).any()):
        raise ValueError(
            f"attention_mask row {int((runs > 1).nonzero()[0])} has padding between tokens: "
            "only left or right padding is supported"
        )
    return input_ids.long(), valid


def _check_options(gc, acceptance: str, typical_eps, typical_delta, generator, streamer, timing) -> None:
    """One-line ``ValueError`` naming the argument and its allowed range, for every sampling option of the
    resolved config ``gc`` and the loop's own arguments."""
    if acceptance not in ("exact", "typical"):
        raise ValueError(
            f"acceptance must be 'exact' (lossless) or 'typical' (Medusa, faster, lossy), got {acceptance!r}"
        )
    if gc.max_new_tokens is not None and (not _is_int(gc.max_new_tokens) or gc.max_new_tokens < 0):
        raise ValueError(f"max_new_tokens must be an int >= 0, got {_show(gc.max_new_tokens)}")
    if gc.max_length is not None and (not _is_int(gc.max_length) or gc.max_length < 0):
        raise ValueError(f"max_length must be an int >= 0, got {_show(gc.max_length)}")
    if not isinstance(gc.do_sample, bool):
        raise ValueError(f"do_sample must be True or False, got {_show(gc.do_sample)}")

    def number(name: str, v, ok, allowed: str) -> None:
        if v is None:
            return
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not ok(v):
            raise ValueError(f"{name} must be {allowed}, got {_show(v)}")

    if gc.do_sample:  # as transformers: the sampling warpers' settings only matter when sampling
        number("temperature", gc.temperature, lambda v: v > 0, "a number > 0 when sampling")
        number("top_p", gc.top_p, lambda v: 0 < v <= 1, "a number in (0, 1]")
        if gc.top_k is not None and (not _is_int(gc.top_k) or gc.top_k < 0):
            raise ValueError(f"top_k must be an int >= 0 (0: no top-k), got {_show(gc.top_k)}")
    if acceptance == "typical":
        number("typical_eps", typical_eps, lambda v: 0 <= v <= 1, "a number in [0, 1]")
        number("typical_delta", typical_delta, lambda v: v >= 0, "a number >= 0")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if streamer is not None and not (
        callable(getattr(streamer, "put", None)) and callable(getattr(streamer, "end", None))
    ):
        raise ValueError(
            f"streamer must have put() and end() methods (like TextStreamer), got {type(streamer).__name__}"
        )
    if not isinstance(timing, bool):
        raise ValueError(f"timing must be True or False, got {_show(timing)}")


@dataclass
class Job:
    """One generation's resolved settings.

    input_ids: [B, T] long on the target's device, as given (padding included); valid: [B, T] bool,
    False at padding; gc: the effective ``GenerationConfig``; limit: new tokens per row at most;
    eos: EOS token ids; warp: the sampling warpers (None when greedy); pad_id: the id that fills a
    finished row of the output."""

    input_ids: Tensor
    valid: Tensor
    gc: object
    limit: int
    eos: set[int]
    warp: object
    pad_id: int

    @property
    def sampling(self) -> bool:
        return self.warp is not None

    @property
    def batched(self) -> bool:
        """A batch or a padded prompt: the ragged loop (`infer.generate._decode_batch`)."""
        return self.input_ids.shape[0] > 1 or not bool(self.valid.all())


def prepare(target, input_ids, attention_mask_2d, generation_config, overrides: dict, *, acceptance: str,
            typical_eps, typical_delta, generator, streamer, timing) -> Job:  # fmt: skip
    """Check every argument and resolve the config (`resolve_generation_config`); the first problem found
    is raised."""
    vocab = int(target.get_input_embeddings().weight.shape[0])
    input_ids, valid = _check_prompt(input_ids, attention_mask_2d, vocab)
    gc = resolve_generation_config(target, generation_config, overrides)
    _check_options(gc, acceptance, typical_eps, typical_delta, generator, streamer, timing)
    T = input_ids.shape[1]
    limit = gc.max_new_tokens if gc.max_new_tokens is not None else max((gc.max_length or 20) - T, 0)
    ctx = context_length(target.config)
    if ctx is not None and T + limit > ctx:
        raise ValueError(
            f"prompt ({T} tokens) + max_new_tokens ({limit}) = {T + limit} exceeds the target's context length {ctx}"
        )
    if streamer is not None and input_ids.shape[0] > 1:
        raise ValueError(f"a streamer takes one row; got a batch of {input_ids.shape[0]} (as transformers)")
    device = next(target.parameters()).device
    eos = _eos_ids(gc.eos_token_id, int(target.get_output_embeddings().weight.shape[0]))
    if generator is not None and gc.do_sample and generator.device.type != device.type:
        raise ValueError(
            f"generator is on {generator.device}, the target on {device}: create it on {device.type}"
        )
    pad = gc.pad_token_id if _is_int(gc.pad_token_id) else min(eos, default=0)
    warp = sampling_warpers(gc) if gc.do_sample else None
    return Job(input_ids.to(device), valid.to(device), gc, limit, eos, warp, pad)
