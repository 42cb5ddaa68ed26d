"""Atomic writes: a crash, a full disk or a kill -9 never leaves half a file or half a directory.

Both helpers write next to the destination (same file system, so the final ``os.replace`` is atomic)
under a ``.tmp-`` name that readers never take for a result, and remove it if writing fails.
Every file or directory selfspec writes for a user goes through one of them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

TMP_PREFIX = ".tmp-"


def atomic_write(path: str, write: Callable[[str], object]) -> None:
    """Call ``write(tmp_path)``, then rename the temp file to ``path``."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=TMP_PREFIX, suffix=os.path.basename(path))
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (`atomic_write`)."""

    def write(p: str) -> None:
        with open(p, "w") as f:
            f.write(text)

    atomic_write(path, write)


@contextlib.contextmanager
def atomic_dir(final: str, *, mode: int | None = None) -> Iterator[str]:
    """``with atomic_dir(final) as tmp:`` fill the empty directory ``tmp``; on a clean exit it replaces
    ``final`` (an existing ``final`` is moved aside first and deleted after, so a crash leaves either the
    old or the new directory, never a mix). On an exception ``tmp`` is deleted and ``final`` untouched.
    ``mode``: permission bits for the new directory (mkdtemp makes it private, 0o700)."""
    final = os.path.abspath(final)
    parent, name = os.path.dirname(final), os.path.basename(final)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{name}-", dir=parent)
    try:
        if mode is not None:
            os.chmod(tmp, mode)
        yield tmp
        if os.path.lexists(final):
            old = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}old-{name}-", dir=parent)
            os.rename(final, os.path.join(old, name))
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


META_SUFFIX = ".meta"  # not a data suffix, so a directory of outputs still loads as data


def check_settings(out: str, settings: dict[str, Any], fresh: bool, made: str = "generated") -> None:
    """Record ``settings`` in ``out + ".meta"`` next to a fresh resumable output; refuse (one ``ValueError``
    naming the keys that differ) to append to an output that was ``made`` with other settings."""
    meta = out + META_SUFFIX
    if os.path.exists(meta) and not fresh:
        with open(meta) as f:
            old = json.load(f)
        diff = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
        if diff:
            what = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in diff.items())
            raise ValueError(
                f"{out} was {made} with other settings ({what}); resume with the same settings or "
                "write to a new output path"
            )
        return
    atomic_text(meta, json.dumps(settings, indent=2, sort_keys=True) + "\n")
