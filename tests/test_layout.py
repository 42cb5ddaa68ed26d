"""The repository's shape, read as text and syntax trees (nothing runs; the registry, and in a subprocess the
packages' modules, are imported).

- README.md fits in 20 KB; results/ in 5 MB, each folder with a README that gives the question, the
  command, the machine, the date and the answer, and each cited from docs/experiments.md.
- Package files stay under 450 lines and their functions under 80.
- Layers run one way (``train -> heads <- infer``), and of the packages' modules only the built-in name
  resolver, ``heads/targets.py``, imports ``demo``: inside its functions, so importing heads, train and infer
  leaves ``demo`` unloaded.
- No code outside ``heads/<type>/`` and ``heads/registry.py`` compares a value with a head-type name: every
  other place asks the registry.
"""

from __future__ import annotations

import ast
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("heads", "train", "infer", "demo")
README_BYTES = 20 * 1024
RESULTS_BYTES = 5 * 1024 * 1024


def _py_files(*dirs: str) -> list[str]:
    return sorted(
        os.path.relpath(p, ROOT)
        for d in dirs
        for p in glob.glob(os.path.join(ROOT, d, "**", "*.py"), recursive=True)
    )


def _tree(rel: str) -> ast.Module:
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return ast.parse(f.read(), rel)


def _imported(tree: ast.Module) -> set[str]:
    """The top-level package of every import in ``tree`` (function bodies included)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_readme_fits_in_20_kb():
    size = os.path.getsize(os.path.join(ROOT, "README.md"))
    assert size <= README_BYTES, f"README.md is {size} bytes, over {README_BYTES}"


def test_results_are_small_described_and_cited():
    results = os.path.join(ROOT, "results")
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(results) for f in files)
    assert size <= RESULTS_BYTES, f"results/ holds {size} bytes, over {RESULTS_BYTES}"
    with open(os.path.join(ROOT, "docs", "experiments.md"), encoding="utf-8") as f:
        cited = set(re.findall(r"\(\.\./results/([^/)]+)/?\)", f.read()))
    folders = sorted(d for d in os.listdir(results) if os.path.isdir(os.path.join(results, d)))
    assert folders
    assert not set(folders) - cited, (
        f"results/ folders not cited from docs/experiments.md: {set(folders) - cited}"
    )
    assert not cited - set(folders), (
        f"docs/experiments.md cites missing results/ folders: {cited - set(folders)}"
    )
    for name in folders:
        readme = os.path.join(results, name, "README.md")
        assert os.path.isfile(readme), f"results/{name} has no README.md"
        with open(readme, encoding="utf-8") as f:
            text = f.read().lower()
        missing = [w for w in ("question", "command", "machine", "answer") if w not in text]
        if not re.search(r"\b20\d\d-\d\d-\d\d\b", text):
            missing.append("date (YYYY-MM-DD)")
        assert not missing, f"results/{name}/README.md does not give its {', '.join(missing)}"


def test_package_files_and_functions_are_short():
    too_long = []
    for rel in _py_files(*PACKAGES):
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            lines = len(f.read().splitlines())
        if lines > 450:
            too_long.append(f"{rel}: {lines} lines (at most 450)")
        too_long += [
            f"{rel}: {node.name} has {node.end_lineno - node.lineno + 1} lines (at most 80)"
            for node in ast.walk(_tree(rel))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > 80
        ]
    assert not too_long, too_long


def test_layers_run_one_way_and_one_module_imports_demo():
    """heads imports neither train nor infer; infer never imports train; demo imports no package; and among
    the packages' modules only heads/targets.py (built-in target names) imports demo."""
    forbidden = {
        "heads": {"train", "infer"},
        "infer": {"train"},
        "demo": {"heads", "train", "infer"},
        "train": set(),
    }
    wrong, demo_users = [], []
    for rel in _py_files(*PACKAGES):
        package = rel.split(os.sep)[0]
        imported = _imported(_tree(rel))
        wrong += [f"{rel} imports {name}" for name in sorted(imported & forbidden[package])]
        if package != "demo" and "demo" in imported:
            demo_users.append(rel)
    assert not wrong, wrong
    assert demo_users == [os.path.join("heads", "targets.py")], demo_users


def test_importing_heads_train_and_infer_leaves_demo_unloaded():
    """Every module of heads, train and infer imports, in a fresh interpreter, without loading ``demo``
    (heads/targets.py imports it only when it resolves a name or picks a precision); the demo names and the
    ``fast`` precision heads/targets.py spells so are demo's own."""
    modules = [
        rel[: -len(".py")].replace(os.sep, ".").removesuffix(".__init__")
        for rel in _py_files("heads", "train", "infer")
    ]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m == 'demo' or m.startswith('demo.')))\n"
    )
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout

    import demo
    import demo.precision
    from heads import targets

    assert targets.DEMO_NAMES == tuple(demo.NAMES) and targets.FAST == demo.precision.FAST


def _named_constants(node: ast.AST, names: set[str]) -> set[str]:
    """Head-type names among a compared operand's string constants (a tuple, list or set of them too)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {i.value for i in items if isinstance(i, ast.Constant) and i.value in names}


def head_type_comparisons(rel: str, names: set[str]) -> list[str]:
    """``rel:line`` of each comparison (``==``, ``!=``, ``in``, ``not in``, ``is``) with a head-type name."""
    found = []
    for node in ast.walk(_tree(rel)):
        if isinstance(node, ast.Compare):
            hits = set().union(*(_named_constants(x, names) for x in (node.left, *node.comparators)))
            if hits:
                found.append(f"{rel}:{node.lineno} compares with {sorted(hits)}")
    return found


def test_no_head_type_name_is_compared_outside_its_folder():
    from heads import registry

    names = set(registry.REGISTRY)
    assert {"medusa", "eagle", "eagle3"} <= names
    own = tuple(os.path.join("heads", name) + os.sep for name in names) + (
        os.path.join("heads", "registry.py"),
    )
    files = [
        rel for rel in _py_files(*PACKAGES, "scripts", "bench", "experiments") if not rel.startswith(own)
    ]
    assert len(files) > 50
    found = [hit for rel in files for hit in head_type_comparisons(rel, names)]
    assert not found, found
