"""Head-training data and benchmark prompts from the demo corpus (`ensure_demo_data`), and the same chunks
as chat conversations (`ensure_demo_chat_data`)."""

from __future__ import annotations

import hashlib
import json
import os
import random

from demo.cache import build_cached, cache_dir, write_jsonl
from demo.corpus import code_chunks, conversation, function_prompts, read_source, relpath, stdlib_files
from demo.spec import DATA_MAX_TOKENS, DATA_ROWS, Size


def _tokenizer_fingerprint(tokenizer_dir: str) -> str:
    with open(os.path.join(tokenizer_dir, "tokenizer.json"), "rb") as f:
        return hashlib.sha1(f.read()).hexdigest()[:10]


def _build_data(out: str, size: Size, seed: int, tokenizer_dir: str | None) -> None:
    n_train, n_eval, n_prompts = DATA_ROWS[size]
    chunks = []
    for path in stdlib_files("train"):
        chunks.extend(code_chunks(read_source(path), random.Random(f"{seed}:chunks:{relpath(path)}")))
    prompts = []
    for path in stdlib_files("heldout"):
        prompts.extend(function_prompts(read_source(path), random.Random(f"{seed}:prompts:{relpath(path)}")))
    if tokenizer_dir is not None:  # cap each chunk at DATA_MAX_TOKENS by dropping trailing lines
        from transformers import AutoTokenizer  # heavy; only this (rare) build path needs it

        tok = AutoTokenizer.from_pretrained(tokenizer_dir)

        def fit(text: str) -> str:
            lines = text.rstrip("\n").split("\n")
            while len(lines) > 1 and len(tok("\n".join(lines) + "\n")["input_ids"]) > DATA_MAX_TOKENS:
                lines = lines[: max(1, len(lines) * 3 // 4)]
            return "\n".join(lines) + "\n"

        chunks = [fit(c) for c in chunks]
    random.Random(f"{seed}:shuffle").shuffle(chunks)
    random.Random(f"{seed}:prompts").shuffle(prompts)
    if len(chunks) < n_eval + 1 or not prompts:
        raise RuntimeError(
            f"too little stdlib code for demo data: {len(chunks)} chunks, {len(prompts)} prompts"
        )
    write_jsonl(os.path.join(out, "eval.jsonl"), chunks[:n_eval])
    write_jsonl(os.path.join(out, "train.jsonl"), chunks[n_eval : n_eval + n_train])
    write_jsonl(os.path.join(out, "prompts.jsonl"), prompts[:n_prompts])


def ensure_demo_data(
    size: Size = "full",
    seed: int = 0,
    cache: str | None = None,
    *,
    tokenizer_dir: str | None = None,
    force: bool = False,
) -> dict[str, str]:
    """JSONL files of ``{"text": ...}`` rows for head training and benchmarks, built on first call.

    Returns ``{"train": path, "eval": path, "prompts": path}``:
    - train / eval: disjoint code chunks (20-60 lines, starting at a def or class, dedented) from
      *train-split* files; 4000 / 200 rows for ``full``, 100 / 20 for ``tiny``.
    - prompts: a function's signature plus its first few body lines, without a trailing newline (see
      `function_prompts`), from *held-out* files only (never trained on by the target or the heads); 200 rows
      for ``full``, 10 for ``tiny``.
    With ``tokenizer_dir``, chunks are cut to at most 512 tokens of that tokenizer (the cache entry is
    then specific to the tokenizer). Deterministic given ``(size, seed)``; written atomically.
    """
    if size not in DATA_ROWS:
        raise ValueError(f"size must be one of {', '.join(DATA_ROWS)}, got {size!r}")
    name = f"demo-data-{size}-s{seed}"
    if tokenizer_dir is not None:
        name += f"-tok{_tokenizer_fingerprint(tokenizer_dir)}"
    final = build_cached(
        os.path.join(cache or cache_dir(), name),
        lambda tmp: _build_data(tmp, size, seed, tokenizer_dir),
        force,
    )
    return {split: os.path.join(final, f"{split}.jsonl") for split in ("train", "eval", "prompts")}


def chat_rows(texts: list[str], seed: int = 0) -> list[dict]:
    """Code chunks as conversations (`conversation`), in the form the demo target saw its chat files
    (`documents`). Deterministic given ``(texts, seed)``."""
    return [
        {"messages": conversation(text.rstrip("\n").split("\n"), random.Random(f"{seed}:chat-rows:{i}"))}
        for i, text in enumerate(texts)
    ]


def ensure_demo_chat_data(size: Size = "full", seed: int = 0, cache: str | None = None) -> dict[str, str]:
    """The demo's train / eval code chunks as chat conversations (`chat_rows`), built on first call.

    Returns ``{"train-chat": path, "eval-chat": path}``: JSONL files of ``{"messages": [...]}`` rows,
    one per row of `ensure_demo_data`'s train / eval files, in the same order. They are the input of
    ``scripts/regenerate_data.py --data demo --split train-chat``: heads for a chat-served model train on
    the target's own answers in the chat format it is served in.
    """
    files = ensure_demo_data(size, seed=seed, cache=cache)

    def build(tmp: str) -> None:
        for split in ("train", "eval"):
            with open(files[split], encoding="utf-8") as f:
                texts = [json.loads(line)["text"] for line in f if line.strip()]
            with open(os.path.join(tmp, f"{split}-chat.jsonl"), "w", encoding="utf-8") as f:
                for row in chat_rows(texts, seed):
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")

    final = build_cached(os.path.dirname(files["train"]) + "-chat", build, force=False)
    return {f"{split}-chat": os.path.join(final, f"{split}-chat.jsonl") for split in ("train", "eval")}
