"""Self-distillation data: rewrite a dataset's responses with the target model itself.

Heads imitate what the target *generates* (they are verified against its logits), so training them on
the target's own outputs instead of human-written text closes the gap between the training and the
serving distribution. This is Medusa's self-distillation recipe (Cai et al. 2024, §3.3) and the
"regenerated data" EAGLE-3 trains on (Li et al. 2025).

What is rewritten, per data format (`train.data.detect_format`):

- ``messages`` / ``sharegpt``: every assistant turn, in order. Turn ``j`` is generated from the
  conversation so far (system and user turns as given, earlier assistant turns already regenerated),
  rendered with the tokenizer's chat template and ``add_generation_prompt=True``, exactly as
  `train.data.assistant_spans` locates turns at training time. System and user turns are kept.
  Assistant turns before the first user/system turn are copied unchanged (training drops them).
- ``text``: the first ``prompt_tokens`` tokens (tokenized as training tokenizes text, so a BOS the
  tokenizer adds counts) are kept as the prompt and the rest is replaced by the target's continuation.

Output rows keep the input's format, columns and key spellings (``from``/``value`` stays
``from``/``value``), plus ``source_index``: the row's 0-based index in the input. So the output file
trains directly (``data.path: OUT.jsonl`` in a recipe).

Generation is batched: rows are sorted by the length of their first prompt (characters; input order for
``text`` rows) and cut into batches of ``batch_size`` (`train.regen_generate.batch_plan`), left-padded with
an attention mask, into one ``target.generate`` call per batch and turn. It stops at the target's eos (``generation_config.eos_token_id``, which may be a list, plus the tokenizer's
eos) or after ``max_new_tokens``, and is greedy at temperature 0. At temperature T > 0 it samples from ``softmax(logits / T)`` with no top-k/top-p/repetition penalty
(the model's own generation_config is replaced for the call, so its sampling defaults do not leak in),
seeded per batch from ``(seed, batch index, turn)``.

Resuming: rows are appended to ``OUT`` one JSON line each, and each batch is flushed and fsync'ed
before the next starts. On restart the indices already in ``OUT`` are skipped; a last line without
its newline (a write cut off by a crash) is removed first. The batches are planned from all the input
rows, so a resumed run with the same batch size generates every remaining row in the same batch as an
uninterrupted run: the output is the same text. Rows are written in batch order, each with its index.
The settings that change the text (target, data, format, temperature, token budgets, seed, dtype) are
recorded in ``OUT.meta`` and a resume with different settings is refused.

Rows that cannot be regenerated are not written, and are counted in the report: chat rows with no
assistant turn, and chat rows where some turn's prompt plus ``max_new_tokens`` exceeds the target's
context (``max_position_embeddings``): such a turn could only be generated cut short, so the whole
row is skipped rather than truncated (a truncated prompt would lose the template's start). For
``text`` rows the prompt length is fixed, so a budget over the context is a `ValueError` up front.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import AutoTokenizer

from heads import targets
from heads.config import option
from heads.graft import load_target
from heads.io import check_settings
from train.data import DataError, _load, detect_format
from train.regen_generate import (  # noqa: F401  (generate_batch, context_length: part of this module's API)
    batch_plan,
    chat_row,
    context_length,
    eos_ids,
    generate_batch,
    prompt_chars,
    regen_chat,
    regen_text,
)

logger = logging.getLogger(__name__)

INDEX_KEY = "source_index"


@dataclass(kw_only=True)
class TargetOptions:
    """The target a data-writing script samples from (`load_target_and_tokenizer`) and its torch threads:
    the options ``scripts/regenerate_data.py`` and ``scripts/make_prompts.py`` share. Keyword-only, so a
    subclass may add fields without defaults."""

    target: str = option(
        help="Hub id, local model dir, .gguf file, or demo / demo-tiny / smollm2-135m-instruct"
    )
    dtype: str = option(
        "auto", help="auto (as stored) | fast (bf16 where native, else fp32) | bf16 | fp16 | fp32"
    )
    device: str | None = option(None, help="default: cuda if available, else cpu")
    threads: int | None = option(None, help="torch CPU threads (default: torch's)")


@dataclass
class RegenConfig(TargetOptions):
    """What to regenerate and how.

    target: a Hub id, a local model directory, a .gguf file, or a built-in name (`TargetOptions`).
    data: a local .json/.jsonl/.parquet file or directory, a Hub dataset id, or demo / demo-tiny
        (the demo head-training data; ``split`` then picks train | eval | prompts, or train-chat |
        eval-chat: the train / eval chunks as chat conversations, `demo.ensure_demo_chat_data`).
    out: the output JSONL file (appended to; see the module docstring on resuming).
    split: the split of a Hub dataset (or the demo file, see ``data``).
    format: auto | text | sharegpt | messages (as in `train.data.DataConfig`).
    temperature: 0 = greedy; T > 0 samples from softmax(logits / T).
    seed: sampling seed (unused when greedy).
    max_new_tokens: per generated turn or continuation.
    prompt_tokens: ``text`` rows: how many leading tokens are kept as the prompt.
    limit: only the first ``limit`` input rows (None = all).
    batch_size: rows per ``generate`` call.
    dtype: the target's dtype: auto (as stored) | fast (bf16 where native, else fp32) | bf16 | fp16 | fp32.
    device: where the target runs (None: cuda if available, else cpu).
    threads: torch CPU threads for the run (None: torch's default); does not change the text.

    `heads.config.load` / `heads.config.parse_cli` build it (``scripts/regenerate_data.py``'s flags).
    """

    data: str = option(
        help="local .jsonl/.json/.parquet file or directory, Hub dataset id, or demo / demo-tiny"
    )
    out: str = option(help="output JSONL (appended to; rerun to resume)")
    split: str = option(
        "train", help="Hub dataset split; for demo data: train | eval | prompts | train-chat | eval-chat"
    )
    # With target, data, split and dtype, what changes the text (`settings`: checked on resume).
    format: str = option("auto", help="auto | text | sharegpt | messages")
    temperature: float = option(0.0, help="0 = greedy; T > 0 samples at T")
    seed: int = option(0, help="sampling seed (temperature > 0)")
    max_new_tokens: int = option(256, help="per assistant turn / continuation")
    prompt_tokens: int = option(32, help="text rows: leading tokens kept as the prompt")
    # Which rows, and how many per generate call (not recorded).
    limit: int | None = option(None, help="only the first N input rows")
    batch_size: int = option(16, help="rows per generate call")

    def __post_init__(self) -> None:
        if not self.out:
            raise ValueError("out must be a file path for the regenerated JSONL")
        if self.format not in ("auto", "text", "sharegpt", "messages"):
            raise ValueError(f"format must be auto, text, sharegpt or messages, got {self.format!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        for name in ("max_new_tokens", "batch_size", "prompt_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.limit is not None and (not isinstance(self.limit, int) or self.limit < 1):
            raise ValueError(f"limit must be None or an int >= 1, got {self.limit!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be None or an int >= 1, got {self.threads!r}")

    def settings(self) -> dict[str, Any]:
        """The settings that change the generated text (recorded in ``OUT.meta``, checked on resume)."""
        keep = (
            "target",
            "data",
            "split",
            "format",
            "temperature",
            "max_new_tokens",
            "prompt_tokens",
            "dtype",
        )
        out = {k: getattr(self, k) for k in keep}
        if self.temperature > 0:
            out["seed"] = self.seed
        return out


# Why a row is not regenerated (see the module docstring): the report's key and the summary's words.
SKIP_REASONS = {
    "no_assistant": "rows with no assistant turn",
    "too_long": "rows whose prompt + max_new_tokens exceed the target's context",
}


@dataclass(kw_only=True)
class RunReport:
    """What a data-writing run did: its output file ``out``, and ``new_tokens`` generated in ``seconds``."""

    out: str
    new_tokens: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """The report for JSON: not `dataclasses.asdict`, which rebuilds a Counter from its (key, count)
        items and so counts those pairs."""
        return dict(vars(self))


@dataclass(kw_only=True)
class RegenReport(RunReport):
    """What a regenerating run did. ``rows``: input rows considered (after ``limit``); ``done_before``:
    already in the output when the run started; ``written``: rows this run appended; ``skipped``: rows
    not regenerated, by reason (`SKIP_REASONS`, every reason present), ``skipped_rows`` their indices."""

    format: str
    rows: int = 0
    done_before: int = 0
    written: int = 0
    skipped: Counter[str] = field(default_factory=lambda: Counter(dict.fromkeys(SKIP_REASONS, 0)))
    skipped_rows: list[int] = field(default_factory=list)

    def summary(self) -> str:
        parts = [
            f"{self.out}: {self.written} rows written this run, {self.done_before} already there, "
            f"{self.rows} input rows ({self.format}); {self.new_tokens} new tokens in {self.seconds:.0f} s"
        ]
        parts += [f"skipped {n} {SKIP_REASONS[why]}" for why, n in self.skipped.items() if n]
        return "; ".join(parts)


# ----------------------------------------------------------------------------- output file


def read_done(out: str) -> set[int]:
    """Source indices already in ``out``, after cutting off a torn last line.

    A line is complete only with its trailing newline: a crash mid-write leaves a last line without
    one, which is truncated away (the row is then regenerated). Any other unreadable line, a line
    without ``source_index``, or a repeated index is a `DataError`: the file was not written by this
    tool, and appending to it could lose or duplicate rows.
    """
    if not os.path.exists(out):
        return set()
    with open(out, "rb+") as f:
        data = f.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            logger.warning(
                "%s: dropping a truncated last line (%d bytes) from an interrupted write",
                out,
                len(data) - end,
            )
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())
    done: set[int] = set()
    for n, line in enumerate(data[:end].splitlines(), 1):
        if not line.strip():
            continue
        try:
            idx = json.loads(line)[INDEX_KEY]
        except (json.JSONDecodeError, TypeError, KeyError):
            raise DataError(
                f"{out} line {n}: not a row written by regenerate (invalid JSON or no {INDEX_KEY!r}); "
                "use a new output path"
            ) from None
        if not isinstance(idx, int) or idx in done:
            raise DataError(f"{out} line {n}: bad or repeated {INDEX_KEY} {idx!r}; the file is corrupt")
        done.add(idx)
    return done


# ----------------------------------------------------------------------------- the loop


def _check_rows(dataset, n: int, fmt: str, column: str, label: str) -> set[int]:
    """Validate rows ``0..n-1`` before any generation (bad data fails in seconds, not mid-run); returns
    the chat rows without an assistant turn (skipped). DataError for a bad row or if none is usable."""
    skip: set[int] = set()
    for i in range(n):
        value = dataset[i][column]
        where = f"{label} row {i}"
        if fmt == "text":
            if not isinstance(value, str):
                raise DataError(f"{where}: {column!r} is not a string (got {type(value).__name__})")
        elif chat_row(value, {column: value}, column, i, where) is None:
            skip.add(i)
    if len(skip) == n:
        raise DataError(f"{label}: no row has an assistant turn to regenerate (all {n} rows checked)")
    return skip


def _check_inputs(model, tokenizer, dataset, cfg: RegenConfig, label: str):
    """``(fmt, column, n, ctx)`` after the checks that need no generation: format, chat template, the text
    budget against the target's context."""
    if len(dataset) == 0:
        raise DataError(f"{label}: dataset is empty")
    columns = dataset.column_names if hasattr(dataset, "column_names") else list(dataset[0])
    fmt, column = detect_format(columns, cfg.format, label)
    if fmt != "text" and not getattr(tokenizer, "chat_template", None):
        raise DataError(f"{label}: {fmt} data needs a chat template, but the tokenizer has none")
    n = min(len(dataset), cfg.limit or len(dataset))
    ctx = context_length(model)
    if fmt == "text" and ctx is not None and cfg.prompt_tokens + cfg.max_new_tokens > ctx:
        raise ValueError(
            f"prompt_tokens + max_new_tokens = {cfg.prompt_tokens + cfg.max_new_tokens} exceeds the target's "
            f"context of {ctx} tokens; lower one of them"
        )
    return fmt, column, n, ctx


def regenerate(
    model: nn.Module,
    tokenizer,
    dataset,
    cfg: RegenConfig,
    *,
    label: str | None = None,
    on_batch: Callable[[int, int], None] | None = None,
    progress: bool = True,
) -> RegenReport:
    """Regenerate ``dataset`` (a `datasets.Dataset` or list of row dicts) with ``model`` into ``cfg.out``.

    Appends to ``cfg.out`` and skips rows already there (see the module docstring). ``on_batch(k,
    n_written)`` is called after batch ``k`` is on disk (tests interrupt a run from it). Raises
    DataError for an empty dataset, an unknown format or bad rows, ValueError for a text budget over
    the target's context or for resuming with other settings.
    """
    label = label or cfg.data
    fmt, column, n, ctx = _check_inputs(model, tokenizer, dataset, cfg, label)
    eos = eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    skip = _check_rows(dataset, n, fmt, column, label)

    os.makedirs(os.path.dirname(os.path.abspath(cfg.out)), exist_ok=True)
    done = read_done(cfg.out)
    check_settings(cfg.out, cfg.settings(), fresh=not done)
    report = RegenReport(out=cfg.out, format=fmt, rows=n, done_before=sum(i < n for i in done))
    report.skipped["no_assistant"], report.skipped_rows = len(skip), sorted(skip)
    if skip:
        logger.warning("%s: skipping %d of %d rows with no assistant turn", label, len(skip), n)
    # A plan fixed by all the rows (not the pending ones): a resumed run batches the remaining rows as an
    # uninterrupted run would, so its output does not depend on where it was interrupted.
    plan = batch_plan([prompt_chars(dataset[i][column], fmt) for i in range(n)], cfg.batch_size)
    chunks = [(k, [i for i in idx if i not in done and i not in skip]) for k, idx in enumerate(plan)]
    pending = sum(len(idx) for _, idx in chunks)
    if not pending:
        logger.info("%s: all %d rows already regenerated", cfg.out, n)
        return report
    t0 = time.perf_counter()
    bar = tqdm(
        total=pending, unit="row", desc=f"regenerating {os.path.basename(cfg.out)}", disable=not progress
    )
    gen = dict(max_new_tokens=cfg.max_new_tokens, eos=eos, pad_id=pad_id, temperature=cfg.temperature)
    with open(cfg.out, "a", encoding="utf-8") as f:
        for k, idx in (c for c in chunks if c[1]):
            rows = [dataset[i] for i in idx]
            if fmt == "text":
                out_rows = regen_text(model, tokenizer, rows, idx, column, cfg, gen, k, report, label)
            else:
                out_rows = regen_chat(model, tokenizer, rows, idx, column, cfg, gen, k, ctx, report, label)
            f.write("".join(json.dumps({**r, INDEX_KEY: i}, ensure_ascii=False) + "\n" for i, r in out_rows))
            f.flush()
            os.fsync(f.fileno())  # the batch is on disk before the next starts: resume loses at most one
            report.written += len(out_rows)
            bar.update(len(idx))
            bar.set_postfix(tok_s=f"{report.new_tokens / (time.perf_counter() - t0):.0f}")
            if on_batch is not None:
                on_batch(k, len(out_rows))
    bar.close()
    report.seconds = time.perf_counter() - t0
    if report.skipped["too_long"]:
        logger.warning(
            "%s: skipped %d rows whose prompt + max_new_tokens exceed the target's context of %s tokens",
            label,
            report.skipped["too_long"],
            ctx,
        )
    return report


# ----------------------------------------------------------------------------- loading


def resolve_data(cfg: RegenConfig) -> tuple[str, str]:
    """(path or Hub id, split) for ``cfg.data``; demo / demo-tiny map to the demo data's files."""
    files = targets.resolve_data(cfg.data, chat=cfg.split.endswith("-chat"))  # built on first use
    if files is not None:
        if cfg.split not in files:
            names = ", ".join(dict.fromkeys([*files, "train-chat", "eval-chat"]))
            raise ValueError(f"demo data has splits {names}; got split {cfg.split!r}")
        return files[cfg.split], "train"
    return cfg.data, cfg.split


def load_target_and_tokenizer(cfg: TargetOptions):
    """The frozen target (on ``cfg.device``) and its tokenizer; built-in names and GGUF files are built on
    first use (`heads.targets.resolve`)."""
    path = targets.resolve(cfg.target)
    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = load_target(path, dtype=cfg.dtype, device=device)
    tokenizer = AutoTokenizer.from_pretrained(os.path.expanduser(path))
    return model, tokenizer


def run(cfg: RegenConfig, **kwargs) -> RegenReport:
    """Load the data and the target named in ``cfg`` and `regenerate`. The data is checked first, so a
    bad path fails before the (slow) model load."""
    path, split = resolve_data(cfg)
    dataset, source = _load(path, split)
    model, tokenizer = load_target_and_tokenizer(cfg)
    report = regenerate(model, tokenizer, dataset, cfg, label=source.label, **kwargs)
    logger.info("%s", report.summary())
    return report


def report_dict(report: RegenReport) -> dict[str, Any]:
    return {**report.as_dict(), "skipped_rows": report.skipped_rows[:20]}


def cli(cfg: RegenConfig) -> RegenReport:
    """``scripts/regenerate_data.py``: run ``cfg``, print the summary and the report as JSON; an input
    problem (bad data, a missing model) ends in one ``error: ...`` line."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        report = run(cfg)
    except (ValueError, OSError) as e:  # DataError is a ValueError; a missing model an OSError
        raise SystemExit(f"error: {e}") from None
    print(report.summary())
    print(json.dumps(report_dict(report)))
    return report
