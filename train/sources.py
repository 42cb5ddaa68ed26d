"""Where training rows come from: local JSON/JSONL/parquet files or directories, or Hub datasets, loaded with
every row's origin kept (`_Source`), so a bad row is reported by file and row.

Errors are `DataError`: one line naming the file (and row, if any).
"""

from __future__ import annotations

import gzip
import json
import os
import random
from dataclasses import dataclass

import datasets

JSON_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")
PARQUET_SUFFIXES = (".parquet",)


class DataError(ValueError):
    """A problem with the training data. The message is one line naming the file (and row, if any)."""


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
    import pyarrow.parquet as pq  # only to explain a parquet file that did not load

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


def _load_parts(path: str, split: str) -> tuple[str, list[tuple[datasets.Dataset, str]]]:
    """``(label, [(rows, file label), ...])`` for ``path`` (Hub id, file or directory), one entry per file in
    sorted order (one for a Hub dataset). The files are not concatenated here: a directory may mix text and
    chat files, which only agree once tokenized."""
    files = _local_files(path, path)
    if files is None:
        label = f"{path} (split {split})"
        try:
            ds = datasets.load_dataset(path, split=split)
        except Exception as e:
            raise DataError(f"{label}: could not load Hub dataset ({_one_line(e)})") from e
        parts = [(ds, label)]
    else:
        label = path
        parts = [(_load_file(f, lab), lab) for f, lab in files]
    if sum(len(d) for d, _ in parts) == 0:
        raise DataError(f"{label}: dataset is empty")
    return label, parts


def _load(path: str, split: str) -> tuple[datasets.Dataset, _Source]:
    """Every row of ``path`` as one raw dataset, and where each row came from (for inspection; training
    tokenizes each file in its own format, `train.data.build_datasets`)."""
    label, loaded = _load_parts(path, split)
    try:
        ds = datasets.concatenate_datasets([d for d, _ in loaded]) if len(loaded) > 1 else loaded[0][0]
    except Exception as e:
        raise DataError(
            f"{label}: files do not share one schema, so their raw rows cannot be shown as one table "
            f"({_one_line(e)}); training still reads each file in its own format"
        ) from e
    return ds, _Source(label, tuple((lab, len(d)) for d, lab in loaded))


def _head(ds: datasets.Dataset, n: int | None) -> datasets.Dataset:
    """The first ``n`` rows (row indices, and so error messages, stay those of the file)."""
    return ds if n is None or len(ds) <= n else ds.select(range(n))


def _sample(ds: datasets.Dataset, src: _Source, n: int, seed: int) -> tuple[datasets.Dataset, _Source]:
    """A seeded random subset of ``n`` rows, kept in file order, with its row map."""
    if len(ds) <= n:
        return ds, src
    rows = _sample_rows(len(ds), n, seed)
    return ds.select(rows), _Source(src.label, src.parts, rows)


def _sample_rows(total: int, n: int, seed: int) -> tuple[int, ...]:
    """A seeded random choice of ``n`` of ``range(total)``, sorted (so the rows stay in file order)."""
    return tuple(sorted(random.Random(seed).sample(range(total), n)))
