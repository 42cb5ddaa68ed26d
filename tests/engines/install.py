"""Cached virtual environments with the serving engines installed from PyPI wheels, CPU only.

``engine_python(name)`` returns the interpreter of a venv under ``$SELFSPEC_CACHE/engines`` (default
``~/.cache/selfspec``), keyed by the engine version and a hash of its pinned requirement list. A venv is
built in a temporary folder and renamed into place, so an interrupted build is never used, under a file
lock per venv, so concurrent test processes (pytest-xdist workers, two checkouts sharing the cache) build
it once: the others wait and use it.

Each venv gets ``torch==2.13.0`` (the CPU build), the engine wheel with ``--no-deps`` (its declared
dependencies pull CUDA builds of torch, torchvision, flashinfer, sgl-kernel...) and the exact pure-Python
packages the engine imports on its CPU loading path, ``requirements/<engine>.txt``, also ``--no-deps``.
Import-only stand-ins (`stubs_template.py`: any attribute is a placeholder that raises when called)
replace the modules that exist only as CUDA builds:

- SGLang 0.5.23: ``torchvision`` (imported at module level by its multimodal utilities; given a
  ``0.0.0+stub`` dist-info so transformers' version checks parse) and ``sgl_kernel``.
- vLLM 0.32 / 0.33: none.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

from demo.cache import locked

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH = "torch==2.13.0"
ENGINES: dict[str, dict] = {
    "vllm-0.33.0": {"wheel": "vllm==0.33.0", "stubs": ()},
    "vllm-0.32.0": {"wheel": "vllm==0.32.0", "stubs": ()},
    "sglang-0.5.23": {"wheel": "sglang==0.5.23", "stubs": ("torchvision", "sgl_kernel")},
}


def cache_dir() -> str:
    return os.path.join(os.environ.get("SELFSPEC_CACHE") or os.path.expanduser("~/.cache/selfspec"), "engines")


def _requirements(name: str) -> str:
    with open(os.path.join(HERE, "requirements", f"{name}.txt")) as f:
        return f.read()


def _key(name: str) -> str:
    spec = ENGINES[name]
    with open(os.path.join(HERE, "stubs_template.py")) as f:
        stub = f.read()
    text = "\n".join([TORCH, spec["wheel"], ",".join(spec["stubs"]), _requirements(name), stub])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _base_python() -> str:
    # the interpreter this venv was made from (the engines' wheels are built for its minor version)
    return getattr(sys, "_base_executable", None) or sys.executable


def venv_dir(name: str) -> str:
    return os.path.join(cache_dir(), f"{name}-{_key(name)}")


def venv_python(name: str) -> str:
    """The interpreter of ``name``'s venv (present once the venv is built)."""
    return os.path.join(venv_dir(name), "bin", "python")


def _pip(py: str, *args: str) -> None:
    # --no-compile: byte-compiling every module of torch and the engine at install time costs ~25 s of CPU
    # per venv; the few modules the tests import compile on first import instead
    subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile", *args],
                   check=True)


def _site_packages(py: str) -> str:
    out = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True,
                         capture_output=True, text=True)
    return out.stdout.strip()


def _write_stubs(py: str, modules: tuple[str, ...]) -> None:
    site = _site_packages(py)
    with open(os.path.join(HERE, "stubs_template.py")) as f:
        text = f.read().replace("STUBBED = ()", f"STUBBED = {tuple(modules)!r}")
    with open(os.path.join(site, "_selfspec_stubs.py"), "w") as f:
        f.write(text)
    with open(os.path.join(site, "_selfspec_stubs.pth"), "w") as f:
        f.write("import _selfspec_stubs\n")
    for mod in set(modules) & {"torchvision"}:  # transformers parses its version: give it a dist-info
        info = os.path.join(site, f"{mod}-0.0.0+stub.dist-info")
        os.makedirs(info, exist_ok=True)
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write(f"Metadata-Version: 2.1\nName: {mod}\nVersion: 0.0.0+stub\n")
        open(os.path.join(info, "RECORD"), "w").close()


def engine_python(name: str) -> str:
    """The python of the cached venv for ``name`` (a key of `ENGINES`), building it if needed."""
    final, py = venv_dir(name), venv_python(name)
    if os.path.isfile(py):
        return py
    os.makedirs(cache_dir(), exist_ok=True)
    with locked(f"{final}.lock"):
        if not os.path.isfile(py):  # not built by the holder we waited for
            for stale in glob.glob(os.path.join(cache_dir(), f".{name}-*")):  # a killed build's; none in use
                shutil.rmtree(stale, ignore_errors=True)
            _build(name, final)
    return py


def _build(name: str, final: str) -> None:
    """Install the venv of ``name`` into a temp folder next to ``final``, then rename it to ``final``."""
    tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=cache_dir())
    try:
        subprocess.run([_base_python(), "-m", "venv", tmp], check=True)
        tpy = os.path.join(tmp, "bin", "python")
        # with its own dependencies: a CUDA build of torch (where pip finds no CPU one) needs its nvidia
        # libraries to import at all; the CPU build's are a handful of small pure-Python packages
        _pip(tpy, TORCH)
        reqs = os.path.join(tmp, "requirements.txt")
        with open(reqs, "w") as f:
            f.write(_requirements(name))
        _pip(tpy, "--no-deps", ENGINES[name]["wheel"], "-r", reqs)
        _write_stubs(tpy, ENGINES[name]["stubs"])
        try:
            os.rename(tmp, final)
        except OSError:  # another process won the race (one not holding the lock: an older checkout)
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def missing() -> list[str]:
    """The engines whose venv is not built yet."""
    return [n for n in ENGINES if not os.path.isfile(venv_python(n))]


def build_all(names: list[str]) -> list[str]:
    """Build the venvs of ``names`` side by side (cold installs are mostly download and unzip)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(len(names), 1)) as pool:
        return list(pool.map(engine_python, names))


def prefetch(log: str) -> subprocess.Popen | None:
    """Start building the missing venvs in a background process (its output to ``log``), so that the
    downloads overlap other tests instead of holding the pytest worker of the first engine test, which
    then only waits on the lock; None when all are built. Its failure is not reported here: the engine
    tests call `engine_python` themselves, which builds again and raises the real error."""
    names = missing()
    if not names:
        return None
    os.makedirs(os.path.dirname(log), exist_ok=True)
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, os.path.abspath(__file__), *names], stdout=out, stderr=out,
                                stdin=subprocess.DEVNULL)


if __name__ == "__main__":
    for py in build_all(sys.argv[1:] or list(ENGINES)):
        print(py)
