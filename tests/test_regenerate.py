"""Self-distillation data (train/regenerate.py, scripts/regenerate_data.py): batched left-padded
generation, text and chat rows rewritten by the target, resume after an interruption, clear errors.

The target is a tiny random Llama with the demo's tokenizer recipe (`demo.train_tokenizer`:
byte-level BPE, ``<|end|>`` eos, ChatML-like chat template) trained on a few lines here, so nothing
is downloaded or built. References are computed independently with ``target.generate`` on one
unpadded prompt at a time.
"""

from __future__ import annotations

import json
import os

import datasets
import pytest
import torch
from conftest import tiny_demo_llama

import demo
from train.data import DataConfig, DataError, build_datasets
from train.regen_generate import batch_plan, prompt_chars
from train.regenerate import INDEX_KEY, RegenConfig, generate_batch, read_done, regenerate, run

CODE = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i)\n",
    "import os\nimport sys\n\ndef main(argv):\n    return len(argv)\n",
]
TEXT_ROWS = [{"text": CODE[i % 4] * (1 + i % 3), "id": i} for i in range(7)]
CONVS = [
    [
        {"role": "system", "content": "You are a Python programmer."},
        {"role": "user", "content": "Write add."},
        {"role": "assistant", "content": "def add(a, b): return a + b"},
        {"role": "user", "content": "Now a class."},
        {"role": "assistant", "content": "class Point: pass"},
    ],
    [{"role": "user", "content": "Loop please."}, {"role": "assistant", "content": "for i in x: pass"}],
    [{"role": "user", "content": "No answer here."}],  # no assistant turn: skipped and counted
    [
        {"role": "assistant", "content": "a leading assistant turn, copied unchanged"},
        {"role": "user", "content": "import os?"},
        {"role": "assistant", "content": "import os"},
    ],
]
GPT = {"system": "system", "user": "human", "assistant": "gpt"}


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch, one_thread):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_datasets_cache"))
    datasets.disable_progress_bars()


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> str:
    """A 2-layer random Llama (hidden 32, context 96) + the demo tokenizer recipe, saved as a model dir."""
    model, tok = tiny_demo_llama(CODE * 8, 96)
    path = str(tmp_path_factory.mktemp("regen-target"))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def target(target_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(target_dir).eval().requires_grad_(False)
    return model, AutoTokenizer.from_pretrained(target_dir)


def write_jsonl(path, rows) -> str:
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def read_rows(path) -> dict[int, dict]:
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    out = {r[INDEX_KEY]: r for r in rows}
    assert len(out) == len(rows), "duplicate source indices"
    return out


def greedy(model, ids: list[int], n: int, eos: int | None = None) -> list[int]:
    """The reference: target.generate on one unpadded prompt."""
    out = model.generate(
        torch.tensor([ids]), do_sample=False, max_new_tokens=n, eos_token_id=eos, pad_token_id=0
    )
    new = out[0, len(ids) :].tolist()
    return new[: new.index(eos)] if eos in new else new


def cfg(tmp_path, data, name="out.jsonl", **kw) -> RegenConfig:
    kw = {"max_new_tokens": 6, "batch_size": 3, "prompt_tokens": 5, **kw}
    return RegenConfig(target="t", data=str(data), out=str(tmp_path / name), **kw)


def test_generate_batch_left_padding_matches_one_by_one_and_stops_at_eos(target):
    model, _ = target
    prompts = [[2, 10, 11, 12, 13, 14, 15], [2, 20], [2, 30, 31, 32]]  # different lengths: left padding
    free = generate_batch(model, prompts, max_new_tokens=8, eos=[299], pad_id=1)
    assert free == [greedy(model, p, 8) for p in prompts] and all(len(c) == 8 for c in free)
    # Make the token generated at step 3 of row 0 the eos: that row stops just before it, the others
    # are cut at their own first occurrence of it (if any), or run to max_new_tokens.
    stop = free[0][3]
    cut = generate_batch(model, prompts, max_new_tokens=8, eos=[stop], pad_id=1)
    assert cut == [c[: c.index(stop)] if stop in c else c for c in free]
    assert cut[0] == free[0][:3]
    assert generate_batch(model, prompts, max_new_tokens=8, eos=[stop], pad_id=1) == cut  # deterministic


def test_batch_plan_groups_prompts_of_similar_length():
    assert batch_plan([5, 1, 9, 1, 5, 2], 2) == [[1, 3], [5, 0], [4, 2]]
    assert batch_plan([0] * 5, 2) == [[0, 1], [2, 3], [4]]  # text rows: input order
    conv = [
        {"from": "gpt", "value": "x" * 50},
        {"from": "human", "value": "abc"},
        {"from": "gpt", "value": "yy"},
    ]
    assert prompt_chars(conv, "sharegpt") == 3 and prompt_chars("any text", "text") == 0


def test_text_rows_keep_the_prompt_and_continue_with_the_target(target, tmp_path):
    model, tok = target
    data = write_jsonl(tmp_path / "in.jsonl", TEXT_ROWS)
    c = cfg(tmp_path, data)
    report = regenerate(model, tok, datasets.Dataset.from_list(TEXT_ROWS), c, progress=False)
    assert (report.rows, report.written, report.done_before, report.skipped["no_assistant"]) == (7, 7, 0, 0)
    rows = read_rows(c.out)
    assert sorted(rows) == list(range(7))
    n_new = 0
    for i, row in rows.items():
        assert row["id"] == i  # other columns are kept
        prompt = tok(TEXT_ROWS[i]["text"])["input_ids"][:5]  # 5 tokens, BOS included
        new = greedy(model, prompt, 6, eos=tok.eos_token_id)
        n_new += len(new)
        assert row["text"] == tok.decode(prompt + new, skip_special_tokens=True)
        assert row["text"].startswith(tok.decode(prompt, skip_special_tokens=True))
        assert row["text"] != TEXT_ROWS[i]["text"]
    assert report.new_tokens == n_new
    # The output trains directly.
    train, ev = build_datasets(DataConfig(path=c.out, max_length=64), tok)
    assert len(train) + len(ev) == 7 and all(sum(m) == len(m) for m in train["loss_mask"])


@pytest.mark.parametrize("fmt", ["messages", "sharegpt"])
def test_chat_rows_regenerate_every_assistant_turn_in_order(target, tmp_path, fmt, caplog):
    model, tok = target
    if fmt == "messages":
        rows = [{"messages": conv} for conv in CONVS]
    else:
        rows = [
            {"conversations": [{"from": GPT[m["role"]], "value": m["content"]} for m in conv]}
            for conv in CONVS
        ]
    data = write_jsonl(tmp_path / "in.jsonl", rows)
    c = cfg(tmp_path, data, max_new_tokens=5, limit=None)
    report = run_with(target, c)
    assert (report.written, report.skipped["no_assistant"], report.skipped_rows) == (3, 1, [2])
    assert "no assistant turn" in caplog.text
    out = read_rows(c.out)
    assert sorted(out) == [0, 1, 3]
    key = "messages" if fmt == "messages" else "conversations"
    content = "content" if fmt == "messages" else "value"
    for i, row in out.items():
        turns, original = row[key], rows[i][key]
        assert [sorted(t) for t in turns] == [sorted(t) for t in original]  # same key spellings
        # Reference: regenerate turn by turn, each from the conversation so far (earlier answers
        # already replaced), rendered with the chat template.
        conv = [dict(m) for m in CONVS[i]]
        first = next(j for j, m in enumerate(conv) if m["role"] != "assistant")
        for j, m in enumerate(conv):
            if m["role"] != "assistant" or j < first:
                assert turns[j][content] == m["content"]  # system/user (and leading assistant) kept
                continue
            text = tok.apply_chat_template(conv[first:j], tokenize=False, add_generation_prompt=True)
            ids = tok(text, add_special_tokens=False)["input_ids"]
            m["content"] = tok.decode(greedy(model, ids, 5, eos=tok.eos_token_id), skip_special_tokens=True)
            assert turns[j][content] == m["content"] != CONVS[i][j]["content"]
    train, ev = build_datasets(DataConfig(path=c.out, max_length=96, eval_fraction=0.34), tok)
    assert len(train) + len(ev) == 3


def run_with(target, c: RegenConfig, **kw):
    model, tok = target
    from train.data import _load

    ds, src = _load(c.data, c.split)
    return regenerate(model, tok, ds, c, label=src.label, progress=False, **kw)


class Interrupt(Exception):
    pass


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_resume_after_interrupt_gives_the_same_rows(target, tmp_path, temperature):
    data = write_jsonl(tmp_path / "in.jsonl", TEXT_ROWS)
    whole = cfg(tmp_path, data, "whole.jsonl", temperature=temperature, seed=3, batch_size=2)
    run_with(target, whole)
    part = cfg(tmp_path, data, "part.jsonl", temperature=temperature, seed=3, batch_size=2)

    def stop_after_two(k, n):
        if k == 1:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_with(target, part, on_batch=stop_after_two)
    assert sorted(read_rows(part.out)) == [0, 1, 2, 3]  # batches 0 and 1 are on disk
    with open(part.out, "a") as f:  # a crash in the middle of writing the next row
        f.write('{"text": "def add(a, b):\\n    ret')
    report = run_with(target, part)
    assert (report.done_before, report.written) == (4, 3)
    assert read_rows(part.out) == read_rows(whole.out)  # same rows, same text, no duplicates
    again = run_with(target, part)  # nothing left to do
    assert (again.done_before, again.written) == (7, 0)
    if temperature > 0:  # sampled text really is seeded by the settings (not a greedy run in disguise)
        other = cfg(tmp_path, data, "other.jsonl", temperature=temperature, seed=4, batch_size=2)
        run_with(target, other)
        assert read_rows(other.out) != read_rows(whole.out)
    # A resume with settings that change the text is refused (a larger limit is fine: test_cli).
    with pytest.raises(ValueError, match="other settings.*max_new_tokens: 6 -> 7"):
        run_with(target, cfg(tmp_path, data, "part.jsonl", temperature=temperature, seed=3, max_new_tokens=7))


def test_errors(target, tmp_path):
    model, tok = target
    with pytest.raises(DataError, match="missing.jsonl: no such file or directory"):
        run(cfg(tmp_path, tmp_path / "missing.jsonl"))  # fails on the data, before loading any model
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match="empty.jsonl: file is empty"):
        run(cfg(tmp_path, tmp_path / "empty.jsonl"))
    with pytest.raises(DataError, match="dataset is empty"):
        regenerate(model, tok, datasets.Dataset.from_list([]), cfg(tmp_path, "x"), progress=False)
    odd = write_jsonl(tmp_path / "odd.jsonl", [{"prompt": "x", "answer": "y"}])
    with pytest.raises(DataError, match=r"unknown data format.*columns seen: \['prompt', 'answer'\]"):
        run_with(target, cfg(tmp_path, odd))
    lonely = write_jsonl(tmp_path / "lonely.jsonl", [{"messages": CONVS[2]}] * 2)
    with pytest.raises(DataError, match="no row has an assistant turn"):
        run_with(target, cfg(tmp_path, lonely))
    bad = write_jsonl(
        tmp_path / "bad.jsonl", [{"messages": CONVS[1]}, {"messages": [{"role": "x", "content": ""}]}]
    )
    with pytest.raises(DataError, match="bad.jsonl row 1: message 0 has unknown role 'x'"):
        run_with(target, cfg(tmp_path, bad))
    assert not os.path.exists(tmp_path / "out.jsonl")  # bad data fails before anything is written
    text = write_jsonl(tmp_path / "text.jsonl", TEXT_ROWS)
    with pytest.raises(
        ValueError, match="prompt_tokens \\+ max_new_tokens = 100 exceeds the target's context of 96"
    ):
        run_with(target, cfg(tmp_path, text, prompt_tokens=50, max_new_tokens=50))
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text('{"text": "not ours"}\n')
    with pytest.raises(DataError, match="foreign.jsonl line 1: not a row written by regenerate"):
        read_done(str(foreign))
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        cfg(tmp_path, text, temperature=-1)


def test_demo_data_splits_resolve_to_the_demo_files(tmp_path, monkeypatch):
    from train import regenerate as R

    text = {s: str(tmp_path / f"{s}.jsonl") for s in ("train", "eval", "prompts")}
    chat = {"train-chat": str(tmp_path / "train-chat.jsonl"), "eval-chat": str(tmp_path / "eval-chat.jsonl")}
    monkeypatch.setattr(demo, "ensure_demo_data", lambda size, cache=None: text)
    monkeypatch.setattr(demo, "ensure_demo_chat_data", lambda size, cache=None: chat)
    for split, path in (text | chat).items():
        assert R.resolve_data(cfg(tmp_path, "demo", split=split)) == (path, "train")
    with pytest.raises(ValueError, match="demo data has splits train, eval, prompts, train-chat, eval-chat"):
        R.resolve_data(cfg(tmp_path, "demo", split="test"))


def test_chat_prompt_longer_than_the_context_is_skipped_and_counted(target, tmp_path, caplog):
    long = [{"role": "user", "content": "import os\n" * 40}, {"role": "assistant", "content": "ok"}]
    data = write_jsonl(tmp_path / "in.jsonl", [{"messages": CONVS[1]}, {"messages": long}])
    report = run_with(target, cfg(tmp_path, data))
    assert (report.written, report.skipped["too_long"], report.skipped_rows) == (1, 1, [1])
    assert "exceed the target's context of 96 tokens" in caplog.text and "1 rows" in report.summary()
    assert sorted(read_rows(tmp_path / "out.jsonl")) == [0]


def test_cli(target_dir, tmp_path, capsys):
    """scripts/regenerate_data.py's command line: `RegenConfig` through `heads.config.parse_cli`, then
    `train.regenerate.cli`."""
    import types

    from heads.config import parse_cli
    from train.regenerate import cli as regen_cli

    cli = types.SimpleNamespace(main=lambda argv: regen_cli(parse_cli(RegenConfig, argv)))
    data = write_jsonl(tmp_path / "in.jsonl", TEXT_ROWS)
    out = str(tmp_path / "cli.jsonl")
    args = [
        "--target",
        target_dir,
        "--data",
        data,
        "--out",
        out,
        "--max-new-tokens",
        "4",
        "--batch-size",
        "4",
    ]
    cli.main([*args, "--limit", "5", "--prompt-tokens", "6", "--device", "cpu"])
    assert sorted(read_rows(out)) == list(range(5))
    cli.main([*args, "--prompt-tokens", "6", "--device", "cpu"])  # a larger limit continues the file
    assert sorted(read_rows(out)) == list(range(7))
    printed = capsys.readouterr().out
    assert "2 rows written this run, 5 already there" in printed
    assert json.loads(printed.splitlines()[-1])["skipped"] == {"no_assistant": 0, "too_long": 0}
    with pytest.raises(SystemExit, match="error: .*nope.jsonl: no such file or directory"):
        cli.main(["--target", target_dir, "--data", str(tmp_path / "nope.jsonl"), "--out", out])
