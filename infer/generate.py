"""`generate`: self-speculative decoding with tree verification through the stock target model.

One step (batch size 1):

    tree   = proposer.propose(root)                 # root = token the target chose last step
    logits = target(tree.tokens, 4D tree mask, position_ids = past + depth, cache)   # one forward
    path, n, bonus = accept(logits, tree)          # greedy | exact rejection sampling | typical
    emit tree.tokens[path[1:n]] + [bonus]; keep path's KV, drop the rest; root = bonus

Greedy output is token-identical to ``target.generate(do_sample=False)``; sampled output (``acceptance=
"exact"``) follows the target's warped distribution exactly. The only host sync per step is reading
the accepted tokens back (needed to stop at EOS / ``max_new_tokens`` and to size the cache).

``timing=True`` splits the wall-clock time into draft (the proposer), verify (target forwards and their
masks) and bookkeeping (the rest: acceptance, cache compaction, streaming); on CUDA it synchronises
around each section, so it is off by default to keep the loop at one host sync per step.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from infer.draft import Proposer
from infer.runner import TreeRunner
from infer.settings import DEFAULTS
from infer.verify import accept_exact, accept_greedy, accept_typical, sample_from

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


@dataclass
class GenerationStats:
    """accepted_lengths: tokens each verify step produced (accepted drafts + the bonus token), before
    truncation at EOS/max_new_tokens. ``mean_accepted_length`` (τ) counts the bonus token, as the
    Medusa and EAGLE papers do. ``num_target_forwards`` counts the prefill too.

    With ``generate(..., timing=True)`` (else None): ``total_time_s`` is the whole call;
    ``verify_time_s`` all target forwards with their tree masks, the prefill included;
    ``draft_time_s`` the proposer's ``start``/``propose``/``advance``; ``bookkeeping_time_s`` = total -
    draft - verify (config, acceptance, the host sync, cache compaction, streaming)."""

    accepted_lengths: list[int] = field(default_factory=list)
    num_target_forwards: int = 0
    new_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    draft_time_s: float | None = None
    verify_time_s: float | None = None
    total_time_s: float | None = None

    @property
    def mean_accepted_length(self) -> float:
        return sum(self.accepted_lengths) / max(len(self.accepted_lengths), 1)

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / max(self.num_target_forwards, 1)

    @property
    def tokens_per_s(self) -> float:
        t = self.prefill_s + self.decode_s
        return self.new_tokens / t if t > 0 else 0.0

    @property
    def bookkeeping_time_s(self) -> float | None:
        if self.total_time_s is None:
            return None
        return self.total_time_s - (self.draft_time_s or 0.0) - (self.verify_time_s or 0.0)


@dataclass
class GenerateOutput:
    sequences: Tensor  # [1, T + new_tokens], prompt included, as transformers' generate returns
    stats: GenerationStats


def _resolve(target, generation_config, overrides: dict):
    """The effective config, in transformers' order: keyword arguments > ``generation_config`` > the
    target's ``generation_config`` > transformers' global defaults (e.g. ``top_k=50`` when sampling)."""
    from transformers import GenerationConfig

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


def _warpers(gc):
    """The sampling warpers transformers applies, in its order: temperature, top-k, top-p."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

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


def _check_prompt(input_ids, attention_mask_2d, vocab: int) -> Tensor:
    """input_ids as [1, T] after checking type, dtype, shape and that every id is in [0, vocab - 1]."""
    if not isinstance(input_ids, Tensor):
        raise ValueError(
            f"input_ids must be a torch.Tensor of token ids [1, seq_len], got {type(input_ids).__name__}"
        )
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise ValueError(f"input_ids must hold integer token ids (torch.long), got dtype {input_ids.dtype}")
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, seq_len], got shape {tuple(input_ids.shape)}")
    if input_ids.shape[0] != 1:
        raise NotImplementedError(
            f"selfspec.generate supports batch size 1 only (got {input_ids.shape[0]}): per-row tree acceptance "
            "and ragged KV compaction are not implemented; loop over prompts instead"
        )
    if input_ids.shape[1] == 0:
        raise ValueError("empty prompt: input_ids needs at least one token")
    lo, hi = int(input_ids.min()), int(input_ids.max())
    if lo < 0 or hi >= vocab:
        raise ValueError(
            f"input_ids holds token id {lo if lo < 0 else hi}, outside the target's vocabulary [0, {vocab - 1}]"
        )
    if attention_mask_2d is not None:
        if not isinstance(attention_mask_2d, Tensor) or tuple(attention_mask_2d.shape) != tuple(
            input_ids.shape
        ):
            shape = tuple(getattr(attention_mask_2d, "shape", ()))
            raise ValueError(
                f"attention_mask must be a tensor of input_ids' shape {tuple(input_ids.shape)}, got {shape}"
            )
        if not bool(attention_mask_2d.all()):
            raise NotImplementedError("padded prompts are not supported (batch size 1 needs no padding)")
    return input_ids.long()


def _check_options(gc, acceptance: str, typical_eps, typical_delta, generator, streamer, timing) -> None:
    """One-line ``ValueError`` naming the argument and its allowed range, for every sampling option of the
    resolved config ``gc`` and the loop's own arguments."""
    import math

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


@torch.inference_mode()
def speculative_generate(
    target,
    proposer: Proposer,
    input_ids: Tensor,
    *,
    generation_config=None,
    max_new_tokens: int | None = None,
    do_sample: bool | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    streamer=None,
    acceptance: Literal["exact", "typical"] = DEFAULTS.acceptance,
    typical_eps: float = DEFAULTS.typical_eps,
    typical_delta: float = DEFAULTS.typical_delta,
    generator: torch.Generator | None = None,
    attention_mask_2d: Tensor | None = None,
    timing: bool = False,
) -> GenerateOutput:
    """The decoding loop, for any `Proposer`. See `infer.generate` for the user-facing arguments."""
    t_start = time.perf_counter()
    vocab = int(target.get_input_embeddings().weight.shape[0])
    input_ids = _check_prompt(input_ids, attention_mask_2d, vocab)
    gc = _resolve(
        target,
        generation_config,
        {
            "max_new_tokens": max_new_tokens,
            "do_sample": do_sample,
            "temperature": temperature,
            "top_k": top_k,
            "top_p": top_p,
            "eos_token_id": eos_token_id,
        },
    )
    _check_options(gc, acceptance, typical_eps, typical_delta, generator, streamer, timing)
    T = input_ids.shape[1]
    limit = gc.max_new_tokens if gc.max_new_tokens is not None else max((gc.max_length or 20) - T, 0)
    ctx = context_length(target.config)
    if ctx is not None and T + limit > ctx:
        raise ValueError(
            f"prompt ({T} tokens) + max_new_tokens ({limit}) = {T + limit} exceeds the target's context length {ctx}"
        )
    device = next(target.parameters()).device
    input_ids = input_ids.to(device)
    eos = _eos_ids(gc.eos_token_id, int(target.get_output_embeddings().weight.shape[0]))
    sampling = bool(gc.do_sample)
    if generator is not None and sampling and generator.device.type != device.type:
        raise ValueError(
            f"generator is on {generator.device}, the target on {device}: create it on {device.type}"
        )
    warp = _warpers(gc) if sampling else None
    runner = TreeRunner(target, proposer.aux_layers, max_len=T + limit)  # refuses what it cannot verify
    stats = GenerationStats()
    if timing:
        stats.draft_time_s = stats.verify_time_s = 0.0
    sync = torch.cuda.synchronize if timing and device.type == "cuda" else None
    new: list[int] = []
    if streamer is not None:
        streamer.put(input_ids.cpu())
    if limit == 0:
        if streamer is not None:
            streamer.end()
        if timing:
            stats.total_time_s = time.perf_counter() - t_start
        return GenerateOutput(input_ids.clone(), stats)

    def tick() -> float:  # a section boundary; on CUDA with timing, wait for the queued kernels
        if sync is not None:
            sync()
        return time.perf_counter()

    def probs_of(logits: Tensor) -> Tensor:  # [n, V] float32 warped probabilities
        return torch.softmax(warp(None, logits.float()), dim=-1)

    def emit(tokens: list[int]) -> bool:
        """Append up to the limit, stopping after the first EOS; True when generation is over."""
        done = False
        for i, tok in enumerate(tokens):
            if tok in eos or len(new) + i + 1 >= limit:
                tokens, done = tokens[: i + 1], True
                break
        new.extend(tokens)
        if streamer is not None and tokens:
            streamer.put(torch.tensor(tokens))
        return done

    # prefill
    t0 = tick()
    draft_s = verify_s = 0.0
    out = runner.prefill(input_ids)
    verify_s += tick() - t0
    last = out.logits[0, -1:].float()
    root = (sample_from(probs_of(last), generator) if sampling else last.argmax(-1))[0]
    t_draft = tick()
    proposer.start(input_ids, out)
    draft_s += tick() - t_draft
    stats.num_target_forwards = 1
    done = emit([int(root)])
    t1 = time.perf_counter()
    stats.prefill_s = t1 - t0

    while not done:
        t_draft = tick()
        tree = proposer.propose(root, max_depth=limit - len(new) - 1)
        draft_s += tick() - t_draft
        t_verify = tick()
        out = runner.verify(tree)
        verify_s += tick() - t_verify
        logits = out.logits[0]  # [N+1, V]
        if not sampling:
            acc = accept_greedy(logits, tree)
        elif acceptance == "exact":
            acc = accept_exact(probs_of(logits), tree, generator)
        else:
            acc = accept_typical(probs_of(logits), tree, typical_eps, typical_delta, generator)
        # the one host sync of the step
        host = torch.cat(
            [acc.length.view(1), acc.next_token.view(1), tree.tokens[acc.path.clamp(min=0)]]
        ).tolist()
        n, bonus, path_tokens = host[0], host[1], host[2 : 2 + host[0]]
        keep = acc.path[:n]
        runner.accept(keep)
        t_draft = tick()
        proposer.advance(tree.tokens[keep], out.hidden[0, keep], tuple(a[0, keep] for a in out.aux))
        draft_s += tick() - t_draft
        stats.num_target_forwards += 1
        stats.accepted_lengths.append(n)
        done = emit(path_tokens[1:] + [bonus])
        root = acc.next_token

    stats.decode_s = time.perf_counter() - t1
    stats.new_tokens = len(new)
    if streamer is not None:
        streamer.end()
    seq = torch.cat([input_ids, torch.tensor([new], dtype=input_ids.dtype, device=device)], 1)
    if timing:
        stats.draft_time_s, stats.verify_time_s = draft_s, verify_s
        stats.total_time_s = time.perf_counter() - t_start
    return GenerateOutput(seq, stats)
