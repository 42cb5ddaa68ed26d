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


def generate_batch(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    eos: Sequence[int],
    pad_id: int,
    temperature: float = 0.0,
    seed: int | None = None,
) -> list[list[int]]:
    """Continue each prompt with the target; returns the new tokens of each, eos excluded.

    The prompts are left-padded into ``input_ids`` [B, L] with ``attention_mask`` [B, L] (0 on
    padding), so every row's last real token sits at position L-1 and ``generate`` appends at L;
    transformers derives position ids from the mask, so a padded row decodes as it would alone.
    ``generate`` returns [B, L + n]; row b's continuation is ``[:, L:]`` cut before its first token in
    ``eos`` (rows that finished early are padded after their eos). One host sync per batch.
    """
    device = next(model.parameters()).device
    L = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), L), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), L), dtype=torch.long)
    for b, p in enumerate(prompts):
        input_ids[b, L - len(p) :] = torch.as_tensor(p, dtype=torch.long)
        attention_mask[b, L - len(p) :] = 1
    sample = temperature > 0
    # A fresh config for the call: model.generation_config's own sampling defaults (top_p, top_k,
    # repetition_penalty, ...) would otherwise be merged in and change the distribution.
    gen = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=sample,
        temperature=temperature if sample else None,
        top_k=0 if sample else None,
        top_p=1.0 if sample else None,
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
                report.too_long += 1
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
