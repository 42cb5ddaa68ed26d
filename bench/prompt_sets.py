"""The benchmark's prompt sets: ``--prompts NAME=JSONL`` files, or for the demo target its held-out code
prompts and a chat set built from other held-out prompts."""

from __future__ import annotations

import json
import os

import demo
from bench.report import write_text
from infer.prompts import read_prompts


def demo_chat_prompts(code_prompts: str, out_path: str, n: int = 32, offset: int = 100) -> str:
    """A chat-style prompt set from the demo's held-out code prompts, written to ``out_path``.

    Rows ``offset .. offset+n`` of the held-out prompts (disjoint from the first rows, which the code
    set uses; the second half of a file shorter than ``offset``) become conversations in the format the
    demo target saw in its ~10% chat-rendered
    training files (`demo.documents`): the user message is the start of a function (ending in a
    newline, as in training), the assistant continues it; every other one has the demo system prompt.
    Deterministic: a pure function of the prompts file.
    """
    rows = read_prompts(code_prompts)
    rows = rows[min(offset, len(rows) // 2) :][:n]  # a small file (demo-tiny: 10 rows) uses its second half
    out = []
    for i, row in enumerate(rows):
        messages = [{"role": "user", "content": row["text"] + "\n"}]
        if i % 2 == 1:
            messages.insert(0, {"role": "system", "content": demo.SYSTEM_PROMPT})
        out.append({"messages": messages})
    write_text(out_path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out))
    return out_path


def prompt_files(specs: list[str], demo_size: str | None, out_dir: str) -> dict[str, str]:
    """``[NAME=]JSONL`` specs -> {set name: path} (the name defaults to the file's stem). None given: the
    demo target's sets (``code``, ``chat``, built on first use); other targets need ``--prompts``."""
    sets: dict[str, str] = {}
    for spec in specs:
        name, _, path = spec.rpartition("=")
        sets[name or os.path.splitext(os.path.basename(path))[0]] = path
    if not sets:
        if not demo_size:
            raise ValueError("--prompts is required for a non-demo target")
        code = demo.ensure_demo_data(size=demo_size)["prompts"]
        sets = {"code": code, "chat": demo_chat_prompts(code, os.path.join(out_dir, "chat_prompts.jsonl"))}
    return sets
