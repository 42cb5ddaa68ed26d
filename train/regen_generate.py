"""The generation steps of `train.regenerate`: batched ``target.generate`` calls, and the rewrite of one batch
of text rows (a continuation of each prompt) or chat rows (every assistant turn, in order).

The rules (prompts, eos, seeds, skipped rows) are in `train.regenerate`'s module docstring.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import GenerationConfig

from heads.conversation import ROLES
from train.data import DataError, _render, to_messages

_NO_ASSISTANT = "conversation has no assistant turn"


def eos_ids(model: nn.Module, tokenizer) -> list[int]:
    """Token ids that end a generation: the model's generation_config eos (an int or a list: chat
    models often stop on an end-of-turn token too) and the tokenizer's eos."""
    ids: list[int] = []
    for src in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        for i in src if isinstance(src, (list, tuple)) else [src]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    if not ids:
        raise ValueError(
            "the target has no eos token (generation_config.eos_token_id and tokenizer.eos_token_id)"
        )
    return ids


def context_length(model: nn.Module) -> int | None:
    """The target's context in tokens (``max_position_embeddings``, or GPT-2's ``n_positions``)."""
    cfg = model.config.get_text_config()
    return getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)


def prompt_chars(value: Any, fmt: str) -> int:
    """A row's batching key: for chat rows the characters of the turns before the first assistant turn (its
    first prompt), for ``text`` rows 0 (every prompt has ``prompt_tokens`` tokens)."""
    if fmt == "text":
        return 0
    n = 0
    for turn in value:
        role = turn.get("role") if turn.get("role") is not None else turn.get("from")
        if ROLES.get(role) == "assistant":
            if n:
                break
            continue  # an assistant turn before any prompt: training drops it
        content = turn.get("content") if turn.get("content") is not None else turn.get("value")
        n += len(content) if isinstance(content, str) else 0
    return n


def batch_plan(keys: Sequence[int], batch_size: int) -> list[list[int]]:
    """The batches of rows ``0 .. len(keys) - 1``: sorted by ``(keys[i], i)`` and cut into chunks of
    ``batch_size``, so prompts of similar length share a batch and left padding stays short. A pure
    function of all the rows, so a resumed run batches the remaining rows as an uninterrupted run would."""
    order = sorted(range(len(keys)), key=lambda i: (keys[i], i))
    return [order[k : k + batch_size] for k in range(0, len(order), batch_size)]


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)``, both [B, L]: the prompts left-padded to the longest, mask 0 on padding."""
    L = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), L), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), L), dtype=torch.long)
    for b, p in enumerate(prompts):
        input_ids[b, L - len(p) :] = torch.as_tensor(p, dtype=torch.long)
        attention_mask[b, L - len(p) :] = 1
    return input_ids, attention_mask


def generate_batch(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    eos: Sequence[int],
    pad_id: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
) -> list[list[int]]:
    """Continue each prompt with the target; returns the new tokens of each, eos excluded.

    The prompts are left-padded into ``input_ids`` [B, L] with ``attention_mask`` [B, L] (`left_pad`), so
    every row's last real token sits at position L-1 and ``generate`` appends at L; transformers derives
    position ids from the mask, so a padded row decodes as it would alone. ``generate`` returns [B, L + n]; row b's continuation is ``[:, L:]`` cut before its first token in
    ``eos`` (rows that finished early keep computing, padded after their eos, until every row ends). One
    host sync per batch. Sampling (``temperature`` > 0) draws from ``softmax(logits / temperature)``
    restricted to the top-``top_p`` nucleus (1.0: the whole distribution), after
    ``torch.manual_seed(seed)``.
    """
    device = next(model.parameters()).device
    input_ids, attention_mask = left_pad(prompts, pad_id)
    L = input_ids.shape[1]
    sample = temperature > 0
    # A fresh config for the call: model.generation_config's own sampling defaults (top_p, top_k,
    # repetition_penalty, ...) would otherwise be merged in and change the distribution.
    gen = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=sample,
        temperature=temperature if sample else None,
        top_k=0 if sample else None,
        top_p=top_p if sample else None,
        eos_token_id=list(eos),
        pad_token_id=pad_id,
    )
    if sample and seed is not None:
        torch.manual_seed(seed)
    saved = model.generation_config
    model.generation_config = gen
    try:
        out = model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device))
    finally:
        model.generation_config = saved
    new = out[:, L:]  # [B, n]
    if new.shape[1] == 0:
        return [[] for _ in prompts]
    is_eos = torch.isin(new, torch.as_tensor(list(eos), device=new.device))
    # first eos per row (n if none): argmax over [is_eos, True] picks the first True
    stop = torch.cat([is_eos, torch.ones_like(is_eos[:, :1])], dim=1).int().argmax(dim=1)
    rows, stops = new.tolist(), stop.tolist()
    return [r[:s] for r, s in zip(rows, stops, strict=True)]


@dataclass
class _Chat:
    """One chat row in flight: its output copy, the rendered messages and where the assistant turns are."""

    index: int
    row: dict
    turns: list  # the output row's turn dicts (the same objects as inside ``row``)
    messages: list[dict[str, str]]  # normalised, leading assistant turns dropped
    offset: int  # turns[offset + m] is messages[m]
    assistant: list[int]  # indices into messages
    skipped: bool = False


def chat_row(value: Any, row: dict, column: str, index: int, where: str) -> _Chat | None:
    """Validate one chat row; None if it has no assistant turn (other problems raise DataError)."""
    try:
        messages = to_messages(value, where)
    except DataError as e:
        if str(e).endswith(_NO_ASSISTANT):
            return None
        raise
    out = copy.deepcopy(row)
    turns = out[column]
    offset = len(turns) - len(messages)
    assistant = [m for m, msg in enumerate(messages) if msg["role"] == "assistant"]
    return _Chat(index, out, turns, messages, offset, assistant)


def _seed(cfg, batch: int, turn: int) -> int:
    return (cfg.seed * 1_000_003 + batch) * 1_009 + turn


def regen_text(model, tokenizer, rows, idx, column, cfg, gen, k, report, label) -> list[tuple[int, dict]]:
    prompts = []
    eos = set(gen["eos"])
    for i, row in zip(idx, rows, strict=True):
        ids = tokenizer(row[column], verbose=False)["input_ids"][: cfg.prompt_tokens]
        while ids and ids[-1] in eos:  # a tokenizer that appends eos: continue the text, not after it
            ids = ids[:-1]
        if not ids:
            raise DataError(f"{label} row {i}: the text has no tokens to use as a prompt")
        prompts.append(ids)
    new = generate_batch(model, prompts, seed=_seed(cfg, k, 0), **gen)
    out = []
    for i, row, p, c in zip(idx, rows, prompts, new, strict=True):
        report.new_tokens += len(c)
        text = tokenizer.decode(p + c, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        out.append((i, {**row, column: text}))
    return out


def regen_chat(
    model, tokenizer, rows, idx, column, cfg, gen, k, ctx, report, label
) -> list[tuple[int, dict]]:
    chats = []
    for i, row in zip(idx, rows, strict=True):
        chats.append(chat_row(row[column], row, column, i, f"{label} row {i}"))
    # Round r regenerates the r-th assistant turn of every row that has one, in one batch: turn r
    # needs turns < r, so rounds are sequential; rows within a round are independent.
    for r in range(max((len(c.assistant) for c in chats), default=0)):
        live = [c for c in chats if not c.skipped and r < len(c.assistant)]
        prompts = []
        for c in live:
            m = c.assistant[r]
            text = _render(tokenizer, c.messages[:m], True, f"{label} row {c.index}")
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if ctx is not None and len(ids) + cfg.max_new_tokens > ctx:
                c.skipped = True
                report.skipped["too_long"] += 1
                report.skipped_rows.append(c.index)
            prompts.append(ids)
        keep = [(c, p) for c, p in zip(live, prompts, strict=True) if not c.skipped]
        if not keep:
            continue
        new = generate_batch(model, [p for _, p in keep], seed=_seed(cfg, k, r), **gen)
        for (c, _), ids in zip(keep, new, strict=True):
            report.new_tokens += len(ids)
            m = c.assistant[r]
            content = tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            c.messages[m]["content"] = content
            turn = c.turns[c.offset + m]
            turn["content" if turn.get("content") is not None else "value"] = content
    return [(c.index, c.row) for c in chats if not c.skipped]
