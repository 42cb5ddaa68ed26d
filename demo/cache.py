"""Where demo artefacts live, and the one way they are built: into a temp directory renamed into place,
under a file lock.

`build_cached` is not `heads.io.atomic_dir` on purpose: `demo` imports nothing from heads/train/infer
(it sits below them), and a shared cache needs two things a plain atomic write does not: a lock, so two
processes (two ranks of ``accelerate launch``) never build the same entry twice, and the removal of
temp directories that killed builds left behind (safe only under that lock).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator


def cache_dir() -> str:
    """Where demo artefacts live: ``$SELFSPEC_CACHE`` if set, else ``~/.cache/selfspec``."""
    return os.environ.get("SELFSPEC_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "selfspec")


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (POSIX ``flock``; a no-op where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build_cached(final: str, build: Callable[[str], None], force: bool) -> str:
    """Return ``final``, calling ``build(tmp_dir)`` first if it does not exist (or ``force``).

    ``build`` writes into a fresh temp directory next to ``final`` that is then renamed into place, so
    ``final`` either does not exist or is complete. The lock serialises concurrent builders: the
    second one finds the directory built and returns it. Temp directories left by killed builds are
    removed here (under the lock nobody else is writing them).
    """
    parent, name = os.path.split(os.path.abspath(final))
    os.makedirs(parent, exist_ok=True)
    with locked(os.path.join(parent, f".{name}.lock")):
        if os.path.isdir(final) and not force:
            return final
        for stale in os.listdir(parent):
            if stale.startswith(f".{name}.tmp-"):
                shutil.rmtree(os.path.join(parent, stale), ignore_errors=True)
        tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; the cache is shared like any dir
        try:
            build(tmp)
            aside = f"{tmp}-old"  # force: the old copy, under a temp name (stale, if we die, removed above)
            if os.path.isdir(final):
                os.rename(final, aside)
            os.rename(tmp, final)
            shutil.rmtree(aside, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def write_jsonl(path: str, rows: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for text in rows:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
