"""Prompt files: JSONL rows of ``{"text": ...}`` or chat rows turned into input ids.

One loader for every script that reads prompts (the benchmark, tree tuning, profiling):

    rows = read_prompts(path)                                   # checked rows, one line-numbered error each
    ids = render_prompt(rows[0], tokenizer, f"{path} row 1")     # [1, T]
    prompts = load_prompts(path, tokenizer, n=8, max_tokens=96)  # rows skip..skip+n-1 as [1, T] tensors

    docs = read_corpus(path, tokenizer)                          # every row whole: `infer.CorpusIndex`

A ``text`` row is tokenized as is, with the tokenizer's special tokens (e.g. BOS), optionally cut to its
first ``max_tokens`` tokens. A chat row (``messages`` of role/content turns, or ShareGPT
``conversations`` of from/value turns: `heads.conversation.to_messages`) is rendered with the chat template and
the generation prompt, up to its first assistant turn: what the target answers when it is served.
"""

from __future__ import annotations

import json
import os

from torch import Tensor

from heads.conversation import to_messages


def read_prompts(path: str) -> list[dict]:
    """The JSON objects of a JSONL file (blank lines skipped). A missing file is ``FileNotFoundError``;
    a line that is not a JSON object, or a file without rows, a one-line ``ValueError`` naming the line."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"prompts file not found: {path!r}")
    rows = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not valid JSON ({e})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{i}: each line must be a JSON object with 'text' or 'messages'")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no prompts")
    return rows


def _chat(row: dict, where: str, need_answer: bool) -> list[dict[str, str]] | None:
    """The conversation before the row's first assistant turn, or None for a row that is not chat."""
    chat = row.get("messages", row.get("conversations"))
    if chat is None:
        return None
    messages = to_messages(chat, where, need_answer=need_answer)
    first = next((j for j, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    if first == 0:
        raise ValueError(f"{where}: the conversation has only assistant turns: nothing to answer")
    return messages[:first]


def render_prompt(
    row: dict, tokenizer, where: str, max_tokens: int | None = None, need_answer: bool = False
) -> Tensor:
    """A prompt row -> input ids [1, T] (see the module docstring). ``max_tokens`` cuts text rows only
    (a chat prompt is kept whole: its end is the generation prompt). ``need_answer``: a chat row must
    hold an assistant turn (held-out training-format data) rather than be a bare prompt. ``where``
    names the row in errors."""
    messages = _chat(row, where, need_answer)
    if messages is not None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(f"{where}: chat rows need a tokenizer with a chat template")
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    elif isinstance(row.get("text"), str) and row["text"]:
        ids = tokenizer(row["text"], return_tensors="pt").input_ids[:, :max_tokens]
    else:
        raise ValueError(
            f"{where}: prompts need a non-empty 'text' field or a chat 'messages' list, got keys {sorted(row)}"
        )
    if ids.shape[1] == 0:
        raise ValueError(f"{where}: the prompt is empty after tokenization")
    return ids


def load_prompts(
    path: str, tokenizer, n: int, max_tokens: int | None = 96, skip: int = 0, *, need_answer: bool = True
) -> list[Tensor]:
    """Token ids [1, T] of rows ``skip .. skip+n-1`` of a prompts file (`read_prompts`, `render_prompt`):
    text rows cut to their first ``max_tokens`` tokens (None: whole); by default a chat row must hold an
    answer (held-out data, as tree tuning reads it). Errors name ``<path> row <index from 0>``."""
    rows = read_prompts(path)[skip : skip + n]
    if not rows:
        raise ValueError(f"{path} has no rows after the first {skip}")
    return [
        render_prompt(row, tokenizer, f"{path} row {skip + i}", max_tokens, need_answer)
        for i, row in enumerate(rows)
    ]


def read_corpus(path: str, tokenizer, max_tokens: int = 1 << 24) -> list[list[int]]:
    """Every row of a prompts or training-data file, whole, as token ids: a chat row with all its turns
    through the chat template (the answers included: they are what a corpus lookup copies), a text row
    with the tokenizer's special tokens. Rows past ``max_tokens`` tokens in all are left out."""
    docs, total = [], 0
    for i, row in enumerate(read_prompts(path)):
        where = f"{path} row {i}"
        chat = row.get("messages", row.get("conversations"))
        if chat is not None:
            if getattr(tokenizer, "chat_template", None) is None:
                raise ValueError(f"{where}: chat rows need a tokenizer with a chat template")
            text = tokenizer.apply_chat_template(to_messages(chat, where, need_answer=False), tokenize=False)
            ids = tokenizer(text, add_special_tokens=False).input_ids
        elif isinstance(row.get("text"), str) and row["text"]:
            ids = tokenizer(row["text"]).input_ids
        else:
            raise ValueError(f"{where}: rows need a non-empty 'text' field or a chat 'messages' list")
        if total + len(ids) > max_tokens:
            break
        docs.append(list(ids))
        total += len(ids)
    return docs
