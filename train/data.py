"""Training data: load text or chat datasets, render chats with the target's own chat template, tokenize,
and build the loss mask the heads are trained under.

What one example looks like after `build_datasets`:

    input_ids: list[int], length T with 2 <= T <= max_length   (the rendered, tokenized example)
    loss_mask: list[int], length T, 0/1, aligned with input_ids

``loss_mask[t] == 1`` means token ``t`` is a *target* the draft heads should learn to predict, i.e. it
is a label, not an input position. A head that reads position ``p`` and predicts token ``p + d`` is
trained there iff ``loss_mask[p + d] == 1``. Position 0 can never be a label, so an example is kept
only if some position ``t >= 1`` is masked in.

Why the mask matters: the heads must imitate what the target *generates* at serving time. For chat
data that is the assistant turns only (training on user or system text is a known way to get good
training accuracy and poor acceptance, docs/design.md §8), rendered exactly as the serving engine will
render them, i.e. with the tokenizer's own chat template. For plain text every token is a label.

How assistant tokens are found for any chat template is `train.chat_mask`'s job; where rows come from
(files, directories, Hub datasets) `train.sources`'. Nothing is tokenized in pieces, so the token ids
are exactly those a server gets.

Every row is validated during tokenization, before any training starts; a bad row raises a one-line
`DataError` such as ``data.jsonl row 3: conversation has no assistant turn`` (rows are 0-based, as in
``dataset[3]``; for a JSONL file, row 3 is the 4th non-blank line).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import datasets
import torch
from omegaconf import MISSING

# What other modules import from here: the row loaders and the chat rendering live in their own modules.
from train.chat_mask import ROLES, _render, assistant_spans, chat_mask, end_ids, to_messages
from train.sources import (
    JSON_SUFFIXES,
    PARQUET_SUFFIXES,
    DataError,
    _head,
    _load,
    _load_parts,
    _one_line,
    _sample,
    _sample_rows,
    _Source,
)

__all__ = [
    "FORMATS", "FORMAT_COLUMNS", "JSON_SUFFIXES", "PARQUET_SUFFIXES", "ROLES", "DataConfig", "DataError",
    "_head", "_load", "_render", "assistant_spans", "build_datasets", "chat_mask", "collate",
    "detect_format", "load_raw", "to_messages", "tokenize_dataset",
]  # fmt: skip

logger = logging.getLogger(__name__)

FORMATS = ("auto", "text", "sharegpt", "messages")
# format -> the column that holds it; "auto" tries them in this order (chat before plain text).
FORMAT_COLUMNS = {"messages": "messages", "sharegpt": "conversations", "text": "text"}
_ACCEPTED = (
    "text (a 'text' column of strings), sharegpt (a 'conversations' column of {from, value} turns) or "
    "messages (a 'messages' column of {role, content} turns)"
)


@dataclass
class DataConfig:
    """Where the training data comes from and how it is cut.

    path (required): a Hub dataset id, a local .json/.jsonl/.parquet file, or a directory of them (read in
        sorted order; each file in its own format, so text and chat files can share a directory). "demo" is
        resolved by the training script before it gets here.
    eval_path: an optional separate held-out set (same kinds as ``path``); otherwise ``eval_fraction``
        of ``path`` is held out.
    split / eval_split: split names for Hub datasets (``eval_split`` defaults to ``split``).
    format: auto | text | sharegpt | messages. auto picks by column: messages, conversations, text.
    max_length: examples are truncated to this many tokens.
    eval_fraction, max_eval_examples: the held-out size is ``round(n * eval_fraction)`` clamped to
        [1, max_eval_examples]; a separate ``eval_path`` is subsampled (seeded) to ``max_eval_examples``.
    max_examples: keep only the first ``max_examples`` rows of ``path`` (quick runs).
    num_proc: worker processes for tokenization (``datasets.map``).
    """

    path: str = MISSING
    eval_path: str | None = None
    split: str = "train"
    format: str = "auto"
    max_length: int = 512
    eval_fraction: float = 0.05
    max_eval_examples: int = 256
    max_examples: int | None = None
    num_proc: int = 1
    eval_split: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise ValueError(
                f"data.path must be a Hub dataset id or a local file/directory, got {self.path!r}"
            )
        if self.eval_path is not None and (not isinstance(self.eval_path, str) or not self.eval_path):
            raise ValueError(f"data.eval_path must be None or a non-empty string, got {self.eval_path!r}")
        if not self.split:
            raise ValueError("data.split must be a split name such as 'train'")
        if self.format not in FORMATS:
            raise ValueError(f"data.format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if not isinstance(self.max_length, int) or self.max_length < 2:
            raise ValueError(
                f"data.max_length must be an int >= 2 (an input and a label), got {self.max_length!r}"
            )
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"data.eval_fraction must be in (0, 1), got {self.eval_fraction!r}")
        if not isinstance(self.max_eval_examples, int) or self.max_eval_examples < 1:
            raise ValueError(f"data.max_eval_examples must be an int >= 1, got {self.max_eval_examples!r}")
        if self.max_examples is not None and (
            not isinstance(self.max_examples, int) or self.max_examples < 1
        ):
            raise ValueError(f"data.max_examples must be None or an int >= 1, got {self.max_examples!r}")
        if not isinstance(self.num_proc, int) or self.num_proc < 1:
            raise ValueError(f"data.num_proc must be an int >= 1, got {self.num_proc!r}")
        if self.eval_path == self.path and (self.eval_split or self.split) == self.split:
            raise ValueError(
                f"data.eval_path is the same dataset and split as data.path ({self.path!r}, split {self.split!r}); "
                "set data.eval_split (e.g. 'test'), point eval_path elsewhere, or leave it None to hold out "
                "eval_fraction of path"
            )


# ----------------------------------------------------------------------------- loading


def _eval_size(n: int, cfg: DataConfig, label: str) -> int:
    if n < 2:
        raise DataError(
            f"{label}: only {n} usable example(s); need at least 2 to hold out an eval split (add data or set eval_path)"
        )
    return min(max(1, round(n * cfg.eval_fraction)), cfg.max_eval_examples, n - 1)


def _split(
    ds: datasets.Dataset, cfg: DataConfig, seed: int, label: str
) -> tuple[datasets.Dataset, datasets.Dataset]:
    parts = ds.train_test_split(test_size=_eval_size(len(ds), cfg, label), shuffle=True, seed=seed)
    return parts["train"], parts["test"]


def load_raw(cfg: DataConfig, seed: int = 0) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Raw rows as ``(train, eval)``, untokenized, for inspection.

    ``train`` is the first ``max_examples`` rows of ``cfg.path`` minus the held-out rows; ``eval`` is
    ``cfg.eval_path`` (seeded subsample of ``max_eval_examples`` rows) or a seeded split of ``cfg.path``.
    `build_datasets` splits *after* tokenizing and dropping unusable rows, so its eval rows can differ.
    """
    ds, src = _load(cfg.path, cfg.split)
    ds = _head(ds, cfg.max_examples)
    if cfg.eval_path is None:
        return _split(ds, cfg, seed, src.label)
    ev, esrc = _load(cfg.eval_path, cfg.eval_split or cfg.split)
    return ds, _sample(ev, esrc, cfg.max_eval_examples, seed)[0]


# ----------------------------------------------------------------------------- formats


def detect_format(columns: Sequence[str], fmt: str, label: str) -> tuple[str, str]:
    """``(format, column)`` for a dataset with ``columns``; ``fmt`` is the configured format or "auto"."""
    if fmt == "auto":
        for name, col in FORMAT_COLUMNS.items():
            if col in columns:
                return name, col
        raise DataError(
            f"{label}: unknown data format; accepted formats: {_ACCEPTED}; columns seen: {list(columns)}"
        )
    if fmt not in FORMAT_COLUMNS:
        raise DataError(f"{label}: unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    col = FORMAT_COLUMNS[fmt]
    if col not in columns:
        raise DataError(f"{label}: format {fmt!r} needs a {col!r} column; columns seen: {list(columns)}")
    return fmt, col


def _tokenize_row(
    value: Any,
    idx: int,
    *,
    tokenizer,
    fmt: str,
    max_length: int,
    source: _Source,
    end_ids: set[int],
) -> dict[str, Any]:
    """One raw row -> ``{input_ids: [T], loss_mask: [T], _keep: bool}`` with T <= max_length."""
    where = source.where(idx)
    if fmt == "text":
        if not isinstance(value, str):
            raise DataError(f"{where}: 'text' is not a string (got {type(value).__name__})")
        ids = tokenizer(value, truncation=True, max_length=max_length)["input_ids"]
        mask = [1] * len(ids)
    else:
        messages = to_messages(value, where)
        text, spans = assistant_spans(tokenizer, messages, where)
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        mask = chat_mask(enc["offset_mapping"], ids, spans, end_ids)
        ids, mask = ids[:max_length], mask[:max_length]
    return {"input_ids": ids, "loss_mask": mask, "_keep": len(ids) >= 2 and any(mask[1:])}


def _check_tokenizer(tokenizer, fmt: str, label: str) -> None:
    if fmt == "text":
        return
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            f"{label}: {fmt} data needs a chat template, but the tokenizer has none "
            "(set tokenizer.chat_template, or use text data)"
        )
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(f"{label}: chat data needs a fast tokenizer (for offset mappings)")


class _File(NamedTuple):
    """One file's rows (only its format's column), as `_runs` groups them."""

    rows: datasets.Dataset
    label: str
    size: int  # rows of the file (after max_examples), before sampling
    picked: tuple[int, ...] | None  # the sampled rows, or None for all
    fmt: str
    column: str


@dataclass
class _Run:
    """Consecutive files (or one Hub split) that share a format: their rows (only the format's column),
    where each row came from, and the format."""

    rows: datasets.Dataset
    source: _Source
    fmt: str
    column: str


def _runs(
    path: str,
    split: str,
    cfg: DataConfig,
    *,
    first: int | None = None,
    sample: int | None = None,
    seed: int = 0,
) -> tuple[str, list[_Run]]:
    """``(label, runs)``: the rows of ``path`` to tokenize, in file order, as runs of consecutive files of
    one format.

    Each file's format is found on its own (``cfg.format``, or its columns for "auto") and only that
    column is kept, so one directory can hold text and chat files side by side, each tokenized the way it
    is served, and extra columns (an ``id``) need not agree. ``first``: only the first ``first`` rows of
    all files together (``max_examples``). ``sample``: a seeded random ``sample`` rows drawn over all files
    together (the rows `train.sources._sample` would draw from their concatenation).
    """
    label, parts = _load_parts(path, split)
    sizes = [len(d) for d, _ in parts]
    total, offsets = sum(sizes), [sum(sizes[:i]) for i in range(len(sizes))]
    files: list[_File] = []
    for (ds, lab), n, off in zip(parts, sizes, offsets, strict=True):
        picked = None  # rows 0..n-1
        if sample is not None and total > sample:
            picked = tuple(r - off for r in _sample_rows(total, sample, seed) if off <= r < off + n)
        elif first is not None and off + n > first:
            ds, n = ds.select(range(max(0, first - off))), max(0, first - off)
        if n == 0 or picked == ():
            continue
        fmt, col = detect_format(ds.column_names, cfg.format, lab)
        files.append(_File(ds.select_columns([col]), lab, n, picked, fmt, col))
    groups: list[list[_File]] = []
    for f in files:
        if groups and (groups[-1][0].fmt, groups[-1][0].column) == (f.fmt, f.column):
            groups[-1].append(f)
        else:
            groups.append([f])
    runs = []
    for g in groups:
        if len(groups) == 1:
            run_label = label
        else:
            run_label = (
                g[0].label if len(g) == 1 else f"{g[0].label} and {len(g) - 1} more {g[0].fmt} file(s)"
            )
        try:
            ds = datasets.concatenate_datasets([f.rows for f in g]) if len(g) > 1 else g[0].rows
        except Exception as e:
            raise DataError(f"{run_label}: {g[0].fmt} files do not share one schema ({_one_line(e)})") from e
        rows = None
        if any(f.picked is not None for f in g):  # sampled: map each kept row back to its file's row
            offs = [sum(f.size for f in g[:i]) for i in range(len(g))]
            rows = tuple(o + r for o, f in zip(offs, g, strict=True) for r in f.picked)
            ds = ds.select(rows)
        runs.append(
            _Run(ds, _Source(run_label, tuple((f.label, f.size) for f in g), rows), g[0].fmt, g[0].column)
        )
    return label, runs


def _tokenize_runs(runs: list[_Run], tokenizer, cfg: DataConfig, label: str) -> datasets.Dataset:
    """Tokenize every run in its own format and concatenate them, dropping unusable examples (with a
    warning); DataError if none is usable."""
    outs = []
    for run in runs:
        _check_tokenizer(tokenizer, run.fmt, run.source.label)
        logger.info(
            "%s: %d rows in %s format (column %r)", run.source.label, len(run.rows), run.fmt, run.column
        )
        outs.append(
            run.rows.map(
                _tokenize_row,
                with_indices=True,
                input_columns=[run.column],
                fn_kwargs=dict(
                    tokenizer=tokenizer,
                    fmt=run.fmt,
                    max_length=cfg.max_length,
                    source=run.source,
                    end_ids=end_ids(tokenizer),
                ),
                remove_columns=run.rows.column_names,
                num_proc=min(cfg.num_proc, len(run.rows)) if cfg.num_proc > 1 else None,
                desc=f"tokenizing {run.source.label}",
            )
        )
    out = datasets.concatenate_datasets(outs) if len(outs) > 1 else outs[0]
    keep = out["_keep"]
    kept = [i for i, k in enumerate(keep) if k]
    if not kept:
        raise DataError(
            f"{label}: no usable examples: all {len(keep)} have fewer than 2 tokens or no loss tokens "
            f"within max_length={cfg.max_length}"
        )
    if len(kept) < len(keep):
        logger.warning(
            "%s: dropped %d of %d examples with fewer than 2 tokens or no loss tokens within max_length=%d",
            label,
            len(keep) - len(kept),
            len(keep),
            cfg.max_length,
        )
        out = out.select(kept)
    return out.remove_columns("_keep")


def tokenize_dataset(ds: datasets.Dataset, tokenizer, cfg: DataConfig, source: str) -> datasets.Dataset:
    """Tokenize raw rows into ``input_ids`` ([T] ints) and ``loss_mask`` ([T] 0/1), T <= cfg.max_length.

    The format comes from ``cfg.format`` (or the columns, for "auto"). Text: the tokenizer's default
    special tokens, every token a label. Chat: rendered with ``tokenizer.chat_template`` and tokenized
    with ``add_special_tokens=False`` (the template writes BOS itself, if the model wants one); only
    assistant tokens are labels (see `chat_mask`). Examples with < 2 tokens or no label after
    truncation are dropped with a warning; DataError if nothing is left. ``source`` names the data in
    errors (``f"{source} row {i}"``, i indexing ``ds``).
    """
    if len(ds) == 0:
        raise DataError(f"{source}: dataset is empty")
    fmt, column = detect_format(ds.column_names, cfg.format, source)
    return _tokenize_runs(
        [_Run(ds, _Source(source, ((source, len(ds)),)), fmt, column)], tokenizer, cfg, source
    )


def build_datasets(cfg: DataConfig, tokenizer, seed: int = 0) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Tokenized ``(train, eval)`` datasets with columns ``input_ids`` and ``loss_mask``.

    Every row (of the first ``max_examples`` of ``cfg.path``, and of the eval set) is validated and
    tokenized before this returns, so bad data fails here rather than mid-training. Each file is read
    in its own format (`_runs`): a directory may mix text and chat files. Without ``eval_path`` the eval
    set is a seeded split of the tokenized examples: ``round(n * eval_fraction)`` clamped to
    [1, max_eval_examples]. Rows are in file order; shuffle in the DataLoader.
    """
    label, runs = _runs(cfg.path, cfg.split, cfg, first=cfg.max_examples)
    train = _tokenize_runs(runs, tokenizer, cfg, label)
    if cfg.eval_path is None:
        train, ev = _split(train, cfg, seed, label)
    else:
        elabel, eruns = _runs(
            cfg.eval_path, cfg.eval_split or cfg.split, cfg, sample=cfg.max_eval_examples, seed=seed
        )
        ev = _tokenize_runs(eruns, tokenizer, cfg, elabel)
    logger.info("data: %d train and %d eval examples from %s", len(train), len(ev), label)
    return train, ev


# ----------------------------------------------------------------------------- batching


def collate(
    batch: list[dict], pad_token_id: int, pad_to_multiple_of: int | None = None
) -> dict[str, torch.Tensor]:
    """Right-pad a list of examples into a batch.

    Returns ``input_ids`` [B, T] (padded with ``pad_token_id``), ``attention_mask`` [B, T] (1 on real
    tokens) and ``loss_mask`` [B, T] (0 on padding), all int64, with T the longest example (rounded up
    to ``pad_to_multiple_of``). Right padding keeps position ids ``0..len-1`` for every row, as in
    generation, so no position-id bookkeeping is needed.
    """
    if not batch:
        raise ValueError("collate got an empty batch")
    if pad_token_id is None:
        raise ValueError(
            "pad_token_id is None; use tokenizer.pad_token_id, or eos_token_id if there is no pad token"
        )
    lengths = [len(x["input_ids"]) for x in batch]
    T = max(lengths)
    if pad_to_multiple_of:
        T = -(-T // pad_to_multiple_of) * pad_to_multiple_of
    input_ids = torch.full((len(batch), T), int(pad_token_id), dtype=torch.long)
    attention_mask = torch.zeros((len(batch), T), dtype=torch.long)
    loss_mask = torch.zeros((len(batch), T), dtype=torch.long)
    for b, (x, n) in enumerate(zip(batch, lengths, strict=True)):
        if len(x["loss_mask"]) != n:
            raise ValueError(f"example {b}: loss_mask has {len(x['loss_mask'])} entries for {n} tokens")
        input_ids[b, :n] = torch.as_tensor(x["input_ids"], dtype=torch.long)
        attention_mask[b, :n] = 1
        loss_mask[b, :n] = torch.as_tensor(x["loss_mask"], dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}
