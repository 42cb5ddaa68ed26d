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

Finding assistant tokens works for any template without ``{% generation %}`` support: render the
whole conversation; for assistant message ``i`` the turn starts where the rendering of
``messages[:i]`` with ``add_generation_prompt=True`` ends (that text must be a prefix of the whole
rendering) and its content is located right after; the template's end-of-turn token (the first
special token after the content, within the turn) is masked in too, so the heads learn to stop. The
rendered text is tokenized once, with offsets, and a token is masked in iff its characters overlap
an assistant span. Nothing is tokenized in pieces, so the token ids are exactly those a server gets.

Every row is validated during tokenization, before any training starts; a bad row raises a one-line
`DataError` such as ``data.jsonl row 3: conversation has no assistant turn`` (rows are 0-based, as in
``dataset[3]``; for a JSONL file, row 3 is the 4th non-blank line).
"""

from __future__ import annotations

import bisect
import gzip
import json
import logging
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import datasets
import torch

logger = logging.getLogger(__name__)

FORMATS = ("auto", "text", "sharegpt", "messages")
# format -> the column that holds it; "auto" tries them in this order (chat before plain text).
FORMAT_COLUMNS = {"messages": "messages", "sharegpt": "conversations", "text": "text"}
JSON_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")
PARQUET_SUFFIXES = (".parquet",)
# Role spellings of OpenAI-style messages and ShareGPT, mapped to the roles chat templates expect.
ROLES = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "model": "assistant",
}
_ACCEPTED = (
    "text (a 'text' column of strings), sharegpt (a 'conversations' column of {from, value} turns) or "
    "messages (a 'messages' column of {role, content} turns)"
)


class DataError(ValueError):
    """A problem with the training data. The message is one line naming the file (and row, if any)."""


@dataclass
class DataConfig:
    """Where the training data comes from and how it is cut.

    path: a Hub dataset id, a local .json/.jsonl/.parquet file, or a directory of them (read in sorted
        order). "demo" is resolved by the training script before it gets here.
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

    path: str = "demo"
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


@dataclass(frozen=True)
class _Source:
    """Maps a row index of a loaded (maybe concatenated, maybe subsampled) dataset to its file and row.

    parts: (label, number of rows) per file, in concatenation order. rows: if set, row i of the
    dataset is original row ``rows[i]`` (after subsampling).
    """

    label: str
    parts: tuple[tuple[str, int], ...]
    rows: tuple[int, ...] | None = None

    def where(self, i: int) -> str:
        if self.rows is not None:
            i = self.rows[i]
        for part, n in self.parts:
            if i < n:
                return f"{part} row {i}"
            i -= n
        return f"{self.label} row {i}"


def _one_line(e: BaseException) -> str:
    """The innermost cause of ``e`` as ``Type: first line`` (datasets wraps the useful error)."""
    while e.__cause__ is not None:
        e = e.__cause__
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


def _looks_like_path(s: str) -> bool:
    """True for a string that can only be a local path (a Hub id is ``name`` or ``org/name``)."""
    return (
        s.startswith(("./", "../", "/", "~"))
        or s.count("/") > 1
        or s.endswith(JSON_SUFFIXES + PARQUET_SUFFIXES)
    )


def _local_files(path: str, label: str) -> list[tuple[str, str]] | None:
    """(file, label) pairs for a local path, None for a Hub id. Raises DataError for a missing path."""
    full = os.path.expanduser(path)
    if not os.path.exists(full):
        if _looks_like_path(path):
            raise DataError(f"{label}: no such file or directory")
        return None
    suffixes = JSON_SUFFIXES + PARQUET_SUFFIXES
    if os.path.isfile(full):
        if not full.endswith(suffixes):
            raise DataError(f"{label}: unsupported file type; expected one of {', '.join(suffixes)}")
        return [(full, label)]
    names = sorted(
        os.path.relpath(os.path.join(root, f), full)
        for root, _, files in os.walk(full)
        for f in files
        if f.endswith(suffixes) and not f.startswith(".")
    )
    if not names:
        raise DataError(f"{label}: directory has no {', '.join(suffixes)} files")
    if any(n.endswith(PARQUET_SUFFIXES) for n in names) and any(n.endswith(JSON_SUFFIXES) for n in names):
        raise DataError(f"{label}: directory mixes JSON and parquet files; keep one kind per directory")
    return [(os.path.join(full, n), os.path.join(path, n)) for n in names]


def _json_rows_problem(file: str, label: str) -> str | None:
    """Find why a JSON/JSONL file did not load: the first unparsable row, or an empty file."""
    opener = gzip.open if file.endswith(".gz") else open
    with opener(file, "rt", encoding="utf-8", errors="replace") as f:
        text = f.read()
    if not text.strip():
        return f"{label}: file is empty"
    if text.lstrip().startswith("["):  # one JSON array
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            return f"{label}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}"
        bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
        if bad is not None:
            return f"{label} row {bad}: expected a JSON object, got {type(rows[bad]).__name__}"
        return None if rows else f"{label}: file is empty"
    row = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            return f"{label} row {row}: invalid JSON ({e.msg} at column {e.colno})"
        if not isinstance(obj, dict):
            return f"{label} row {row}: expected a JSON object, got {type(obj).__name__}"
        row += 1
    return None


def _parquet_problem(file: str, label: str) -> str | None:
    import pyarrow.parquet as pq

    try:
        rows = pq.ParquetFile(file).metadata.num_rows
    except Exception as e:
        return f"{label}: not a readable parquet file ({_one_line(e)})"
    return f"{label}: file is empty" if rows == 0 else None


def _load_file(file: str, label: str) -> datasets.Dataset:
    if os.path.getsize(file) == 0:
        raise DataError(f"{label}: file is empty")
    builder = "parquet" if file.endswith(PARQUET_SUFFIXES) else "json"
    try:
        return datasets.load_dataset(builder, data_files=file, split="train")
    except Exception as e:
        problem = _json_rows_problem(file, label) if builder == "json" else _parquet_problem(file, label)
        raise DataError(problem or f"{label}: could not load ({_one_line(e)})") from e


def _load(path: str, split: str) -> tuple[datasets.Dataset, _Source]:
    """Load every row of ``path`` (Hub id, file or directory) and where each row came from."""
    files = _local_files(path, path)
    if files is None:
        label = f"{path} (split {split})"
        try:
            ds = datasets.load_dataset(path, split=split)
        except Exception as e:
            raise DataError(f"{label}: could not load Hub dataset ({_one_line(e)})") from e
        parts = ((label, len(ds)),)
    else:
        label = path
        loaded = [(_load_file(f, lab), lab) for f, lab in files]
        parts = tuple((lab, len(d)) for d, lab in loaded)
        try:
            ds = datasets.concatenate_datasets([d for d, _ in loaded]) if len(loaded) > 1 else loaded[0][0]
        except Exception as e:
            raise DataError(f"{label}: files do not share one schema ({_one_line(e)})") from e
    if len(ds) == 0:
        raise DataError(f"{label}: dataset is empty")
    return ds, _Source(label, parts)


def _head(ds: datasets.Dataset, n: int | None) -> datasets.Dataset:
    """The first ``n`` rows (row indices, and so error messages, stay those of the file)."""
    return ds if n is None or len(ds) <= n else ds.select(range(n))


def _sample(ds: datasets.Dataset, src: _Source, n: int, seed: int) -> tuple[datasets.Dataset, _Source]:
    """A seeded random subset of ``n`` rows, kept in file order, with its row map."""
    if len(ds) <= n:
        return ds, src
    rows = tuple(sorted(random.Random(seed).sample(range(len(ds)), n)))
    return ds.select(rows), _Source(src.label, src.parts, rows)


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


def to_messages(conversation: Any, where: str) -> list[dict[str, str]]:
    """Normalise one ShareGPT or OpenAI-style conversation to ``[{"role", "content"}]``.

    Either key pair is accepted per turn (``from``/``value`` or ``role``/``content``); roles are mapped
    with `ROLES` (human -> user, gpt/model -> assistant). Leading assistant turns (before any user or
    system message) are dropped. Raises DataError naming ``where``.
    """
    if not isinstance(conversation, (list, tuple)) or not conversation:
        kind = "an empty list" if isinstance(conversation, (list, tuple)) else type(conversation).__name__
        raise DataError(f"{where}: conversation must be a non-empty list of messages, got {kind}")
    messages = []
    for j, turn in enumerate(conversation):
        if not isinstance(turn, dict):
            raise DataError(
                f"{where}: message {j} must be an object with role/content, got {type(turn).__name__}"
            )
        role = turn.get("role") if turn.get("role") is not None else turn.get("from")
        content = turn.get("content") if turn.get("content") is not None else turn.get("value")
        if role is None:
            raise DataError(f"{where}: message {j} has no role (expected a 'role' or 'from' key)")
        if role not in ROLES:
            raise DataError(
                f"{where}: message {j} has unknown role {role!r}; expected one of {', '.join(ROLES)}"
            )
        if not isinstance(content, str):
            raise DataError(f"{where}: message {j} content is not a string (got {type(content).__name__})")
        messages.append({"role": ROLES[role], "content": content})
    # Assistant turns before any user/system message have no prompt to answer, and templates cannot
    # render the empty conversation before them; drop them, as FastChat/Medusa preprocessing does.
    first = next((j for j, m in enumerate(messages) if m["role"] != "assistant"), len(messages))
    messages = messages[first:]
    if not any(m["role"] == "assistant" for m in messages):
        raise DataError(f"{where}: conversation has no assistant turn")
    return messages


# ----------------------------------------------------------------------------- chat masks


def _render(tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool, where: str) -> str:
    try:
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    except Exception as e:
        raise DataError(f"{where}: the chat template failed on this conversation ({_one_line(e)})") from e
    if not isinstance(text, str):
        raise DataError(f"{where}: apply_chat_template returned {type(text).__name__}, expected text")
    return text


def _common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _find(text: str, content: str, start: int, end: int) -> tuple[int, int] | None:
    """Character span of ``content`` (as is, else stripped: templates often trim) in ``text[start:end]``."""
    for s in (content, content.strip()):
        i = text.find(s, start, end)
        if i >= 0:
            return i, i + len(s)
    return None


def assistant_spans(
    tokenizer, messages: list[dict[str, str]], where: str
) -> tuple[str, list[tuple[int, int, int]]]:
    """Render ``messages`` with the tokenizer's chat template and locate every assistant turn.

    Returns ``(text, spans)`` with one ``(content_start, content_end, turn_end)`` character triple per
    assistant message: the content is ``text[content_start:content_end]``, and the turn's own
    trailing text (where its end-of-turn token lives) ends by ``turn_end``.

    The turn starts at ``len(render(messages[:i], add_generation_prompt=True))``, which must be a prefix
    of ``render(messages)`` (else DataError: the template is not prefix-consistent). Its end is where
    ``render(messages[:i + 1])`` stops agreeing with ``render(messages)`` (templates may add an EOS
    after the *last* message only). Templates that render earlier assistant turns with less injected
    text than the last one (e.g. dropping an empty ``<think></think>`` block) are accepted too.
    """
    text = _render(tokenizer, messages, False, where)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt = _render(tokenizer, messages[:i], True, where)
        inconsistent = DataError(
            f"{where}: the chat template is not prefix-consistent at message {i} (rendering messages[:{i}] "
            "with add_generation_prompt=True is not a prefix of the rendered conversation), so assistant "
            "tokens cannot be located"
        )
        if not text.startswith(prompt):
            raise inconsistent
        start = len(prompt)
        upto = _render(tokenizer, messages[: i + 1], False, where)
        agree = _common_prefix_len(upto, text)
        found = _find(text, m["content"], start, agree)
        if found is not None:
            spans.append((*found, agree))
            continue
        # The turn renders differently inside the conversation than as its last message: find the
        # content in the standalone rendering, then allow at most as much template text before it.
        alone = _find(upto, m["content"], start, len(upto)) if upto.startswith(prompt) else None
        if alone is None:
            raise DataError(
                f"{where}: the chat template does not render assistant message {i} verbatim, so its tokens "
                "cannot be located"
            )
        found = _find(text, m["content"], start, alone[1])
        if found is None:
            raise inconsistent
        spans.append((*found, min(len(text), found[1] + len(upto) - alone[1])))
    return text, spans


def chat_mask(
    offsets: Sequence[tuple[int, int]],
    ids: Sequence[int],
    spans: Sequence[tuple[int, int, int]],
    end_ids: set[int],
) -> list[int]:
    """Token-level loss mask from assistant character spans.

    offsets: [T] (start, end) characters of each token; ids: [T]; spans: from `assistant_spans`;
    end_ids: special-token ids that can end a turn. A token is masked in if its characters overlap
    an assistant content span, or if it lies between the content and the first ``end_ids`` token that
    ends within the turn, that token included (e.g. ``<|im_end|>``, ``<|eot_id|>``, ``</s>``). Role
    headers, the text after the end-of-turn token, and all other turns stay 0.
    """
    mask = [0] * len(ids)
    starts = [s for s, _ in offsets]
    for c0, c1, turn_end in spans:
        j = bisect.bisect_left(starts, c1)  # first token starting at or after the content's end
        # content tokens: those overlapping [c0, c1) (all start before c1; zero-width ones inside count).
        k = j - 1
        while c1 > c0 and k >= 0 and (offsets[k][1] > c0 or offsets[k][0] >= c0):
            mask[k] = 1
            k -= 1
        # end of turn: everything up to the first special token that ends within the turn.
        for t in range(j, len(ids)):
            if offsets[t][1] > turn_end:
                break
            if ids[t] in end_ids:
                for u in range(j, t + 1):
                    mask[u] = 1
                break
    return mask


def _end_ids(tokenizer) -> set[int]:
    """Ids of special tokens (the candidates for an end-of-turn token)."""
    ids = set(tokenizer.all_special_ids)
    ids.update(i for i, tok in tokenizer.added_tokens_decoder.items() if getattr(tok, "special", False))
    return ids


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


def _tokenize(ds: datasets.Dataset, tokenizer, cfg: DataConfig, source: _Source) -> datasets.Dataset:
    if len(ds) == 0:
        raise DataError(f"{source.label}: dataset is empty")
    fmt, column = detect_format(ds.column_names, cfg.format, source.label)
    logger.info("%s: %d rows in %s format (column %r)", source.label, len(ds), fmt, column)
    if fmt != "text":
        if not getattr(tokenizer, "chat_template", None):
            raise DataError(
                f"{source.label}: {fmt} data needs a chat template, but the tokenizer has none "
                "(set tokenizer.chat_template, or use text data)"
            )
        if not getattr(tokenizer, "is_fast", False):
            raise DataError(f"{source.label}: chat data needs a fast tokenizer (for offset mappings)")
    out = ds.map(
        _tokenize_row,
        with_indices=True,
        input_columns=[column],
        fn_kwargs=dict(
            tokenizer=tokenizer,
            fmt=fmt,
            max_length=cfg.max_length,
            source=source,
            end_ids=_end_ids(tokenizer),
        ),
        remove_columns=ds.column_names,
        num_proc=min(cfg.num_proc, len(ds)) if cfg.num_proc > 1 else None,
        desc=f"tokenizing {source.label}",
    )
    keep = out["_keep"]
    kept = [i for i, k in enumerate(keep) if k]
    if not kept:
        raise DataError(
            f"{source.label}: no usable examples: all {len(keep)} have fewer than 2 tokens or no loss tokens "
            f"within max_length={cfg.max_length}"
        )
    if len(kept) < len(keep):
        logger.warning(
            "%s: dropped %d of %d examples with fewer than 2 tokens or no loss tokens within max_length=%d",
            source.label,
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
    return _tokenize(ds, tokenizer, cfg, _Source(source, ((source, len(ds)),)))


def build_datasets(cfg: DataConfig, tokenizer, seed: int = 0) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Tokenized ``(train, eval)`` datasets with columns ``input_ids`` and ``loss_mask``.

    Every row (of the first ``max_examples`` of ``cfg.path``, and of the eval set) is validated and
    tokenized before this returns, so bad data fails here rather than mid-training. Without
    ``eval_path`` the eval set is a seeded split of the tokenized examples: ``round(n * eval_fraction)``
    clamped to [1, max_eval_examples]. Rows are in file order; shuffle in the DataLoader.
    """
    ds, src = _load(cfg.path, cfg.split)
    train = _tokenize(_head(ds, cfg.max_examples), tokenizer, cfg, src)
    if cfg.eval_path is None:
        train, ev = _split(train, cfg, seed, src.label)
    else:
        ev_raw, esrc = _load(cfg.eval_path, cfg.eval_split or cfg.split)
        ev_raw, esrc = _sample(ev_raw, esrc, cfg.max_eval_examples, seed)
        ev = _tokenize(ev_raw, tokenizer, cfg, esrc)
    logger.info("data: %d train and %d eval examples from %s", len(train), len(ev), src.label)
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
