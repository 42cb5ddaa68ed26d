"""train.data: loading, format detection, chat-template loss masks, validation errors and collation.

Everything is offline: a tiny byte-level BPE is trained here and wrapped as a fast tokenizer, and the
chat templates are Jinja strings written below.
"""

from __future__ import annotations

import copy
import json
import logging
import re

import datasets
import pytest
import torch

from train.data import DataConfig, DataError, build_datasets, chat_mask, collate, load_raw, tokenize_dataset

SPECIALS = [
    "<pad>",
    "<s>",
    "</s>",
    "<|im_start|>",
    "<|im_end|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Llama-3 style: BOS written by the template, trimmed content, no newline after the end-of-turn token.
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# Phi-3 style: EOS only after the *last* message, so messages[:i+1] is not a prefix of the whole chat.
CHATML_EOS = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% else %}{{ eos_token }}{% endif %}"
)
# Qwen3 style: the last assistant turn gets an empty think block that earlier turns do not.
THINK = (
    "{% for m in messages %}{% if m['role'] == 'assistant' and loop.last %}"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n{{ m['content'] }}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEMPLATES = {"chatml": (CHATML, "<|im_end|>"), "llama3": (LLAMA3, "<|eot_id|>"),
             "chatml_eos": (CHATML_EOS, "<|im_end|>"), "think": (THINK, "<|im_end|>")}  # fmt: skip
# Not prefix-consistent: every line carries the number of messages.
COUNTING = (
    "{% for m in messages %}[{{ messages | length }}] {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

CORPUS = [
    "You are a helpful assistant.",
    "What is the capital of France? The capital of France is Paris.",
    "Write a short poem about the sea. The sea is wide and blue.",
    "Thanks! You are welcome, happy to help.",
    "def add(a, b): return a + b",
]

CONV = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "Write a short poem about the sea."},
    {"role": "assistant", "content": "The sea is wide,\nthe sea is blue."},
    {"role": "user", "content": "Thanks!"},
    {"role": "assistant", "content": "You are welcome. "},  # Llama-3's template trims this space
]
SHAREGPT_ROLE = {"system": "system", "user": "human", "assistant": "gpt"}


@pytest.fixture(autouse=True)
def _isolated_datasets_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_datasets_cache"))
    datasets.disable_progress_bars()


@pytest.fixture(scope="module")
def base_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    # Plain text gets a BOS from the post-processor; chat must not (the template writes it).
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=SPECIALS[3:],
    )


def with_template(tokenizer, template: str | None):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = template
    return tok


@pytest.fixture
def chatml(base_tokenizer):
    return with_template(base_tokenizer, CHATML)


def write_jsonl(path, rows) -> str:
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def sharegpt(conv):
    return [{"from": SHAREGPT_ROLE[m["role"]], "value": m["content"]} for m in conv]


def runs(ids, mask):
    """The masked-in tokens as maximal contiguous runs of ids."""
    out, cur = [], []
    for i, m in zip(ids, mask, strict=True):
        if m:
            cur.append(i)
        elif cur:
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def cfg(path, **kw) -> DataConfig:
    return DataConfig(path=str(path), **kw)


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"format": "alpaca"}, "format must be one of"),
        ({"max_length": 1}, "max_length must be an int >= 2"),
        ({"eval_fraction": 0.0}, r"eval_fraction must be in \(0, 1\)"),
        ({"eval_fraction": 1.0}, r"eval_fraction must be in \(0, 1\)"),
        ({"max_eval_examples": 0}, "max_eval_examples"),
        ({"max_examples": 0}, "max_examples"),
        ({"num_proc": 0}, "num_proc"),
        ({"path": "org/ds", "eval_path": "org/ds"}, "same dataset and split"),
    ],
)
def test_config_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        DataConfig(**kw)


# ----------------------------------------------------------------------------- formats and masks


@pytest.mark.parametrize("template", sorted(TEMPLATES))
@pytest.mark.parametrize("fmt", ["messages", "sharegpt"])
def test_chat_mask_is_exactly_the_assistant_turns(tmp_path, base_tokenizer, template, fmt):
    text, end_of_turn = TEMPLATES[template]
    tok = with_template(base_tokenizer, text)
    row = {"messages": CONV} if fmt == "messages" else {"conversations": sharegpt(CONV), "id": "x"}
    if fmt == "messages":
        path = write_jsonl(tmp_path / "chat.jsonl", [row] * 3)
    else:
        path = str(tmp_path / "chat.parquet")
        datasets.Dataset.from_list([row] * 3).to_parquet(path)
    train, ev = build_datasets(cfg(path), tok)

    assert train.column_names == ev.column_names == ["input_ids", "loss_mask"]
    assert (len(train), len(ev)) == (2, 1) and train[0] == ev[0]
    ids, mask = train[0]["input_ids"], train[0]["loss_mask"]
    assert len(ids) == len(mask) and set(mask) == {0, 1}
    got = [tok.decode(r) for r in runs(ids, mask)]
    trim = "trim" in text
    want = [
        (m["content"].strip() if trim else m["content"]) + end_of_turn
        for m in CONV
        if m["role"] == "assistant"
    ]
    assert got == want
    # The unmasked tokens hold every role header and every user/system message, and nothing else is lost.
    rendered = tok.apply_chat_template(CONV, tokenize=False)
    assert tok.decode(ids) == rendered
    unmasked = tok.decode([i for i, m in zip(ids, mask, strict=True) if not m])
    for m in CONV:
        assert (m["content"] in unmasked) == (m["role"] != "assistant")
    assert "assistant" in unmasked and "assistant" not in "".join(got)
    # BOS appears once when the template writes it, and never otherwise (no add_special_tokens for chat).
    assert ids.count(tok.bos_token_id) == (1 if "bos_token" in text else 0)


def test_chat_mask_with_empty_assistant_content_keeps_end_of_turn(tmp_path, chatml):
    conv = [{"role": "user", "content": "Thanks!"}, {"role": "assistant", "content": ""}]
    conv += [{"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Bye!"}]
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": conv}])
    ds = tokenize_dataset(datasets.Dataset.from_list([{"messages": conv}]), chatml, cfg(path), path)
    ids, mask = ds[0]["input_ids"], ds[0]["loss_mask"]
    assert [chatml.decode(r) for r in runs(ids, mask)] == ["<|im_end|>", "Bye!<|im_end|>"]


def test_chat_mask_token_rules():
    # chars: header [0,4) | content [4,9) | " " | <eot> [10,15) | "\n" | <next> [16,20)
    offsets = [(0, 3), (3, 5), (5, 9), (9, 10), (10, 15), (15, 16), (16, 20)]
    ids = [1, 2, 3, 4, 99, 5, 98]
    # A token straddling the content start is in (it carries content), and so is everything up to
    # and including the first special token that ends within the turn.
    assert chat_mask(offsets, ids, [(4, 9, 20)], {98, 99}) == [0, 1, 1, 1, 1, 0, 0]
    assert chat_mask(offsets, ids, [(4, 9, 12)], {98, 99}) == [0, 1, 1, 0, 0, 0, 0]  # <eot> past the turn
    assert chat_mask(offsets, ids, [(4, 9, 20)], set()) == [0, 1, 1, 0, 0, 0, 0]  # no end-of-turn token
    assert chat_mask(offsets, ids, [(9, 9, 20)], {99}) == [0, 0, 0, 1, 1, 0, 0]  # empty content
    with_zero_width = [(0, 3), (3, 5), (4, 4), (5, 9), (9, 10), (10, 15)]
    assert chat_mask(with_zero_width, [1, 2, 7, 3, 4, 99], [(4, 9, 20)], {99}) == [0, 1, 1, 1, 1, 1]


def test_leading_assistant_turns_are_dropped(chatml):
    conv = [CONV[2], CONV[3], CONV[4]]  # starts with an answer to nothing
    ds = tokenize_dataset(datasets.Dataset.from_list([{"messages": conv}]), chatml, cfg("d.jsonl"), "d.jsonl")
    ids, mask = ds[0]["input_ids"], ds[0]["loss_mask"]
    assert chatml.decode(ids) == chatml.apply_chat_template(conv[1:], tokenize=False)
    assert [chatml.decode(r) for r in runs(ids, mask)] == [CONV[4]["content"] + "<|im_end|>"]


def test_text_format(tmp_path, base_tokenizer):
    rows = [{"text": s, "meta": i} for i, s in enumerate(CORPUS * 8)]  # 40 rows
    path = write_jsonl(tmp_path / "text.jsonl", rows)
    train, ev = build_datasets(cfg(path, eval_fraction=0.1), base_tokenizer, seed=0)
    assert train.column_names == ["input_ids", "loss_mask"]
    assert (len(train), len(ev)) == (36, 4)
    for ex in list(train) + list(ev):
        assert ex["input_ids"][0] == base_tokenizer.bos_token_id
        assert ex["input_ids"].count(base_tokenizer.bos_token_id) == 1
        assert ex["loss_mask"] == [1] * len(ex["input_ids"])
    texts = {base_tokenizer.decode(ex["input_ids"][1:]) for ex in ev}
    assert texts <= set(CORPUS)
    # Seeded: same split again, a different one for another seed.
    again = build_datasets(cfg(path, eval_fraction=0.1), base_tokenizer, seed=0)[1]
    assert again["input_ids"] == ev["input_ids"]


def test_auto_prefers_chat_and_explicit_format_needs_its_column(tmp_path, chatml):
    path = write_jsonl(tmp_path / "both.jsonl", [{"text": "hello", "messages": CONV}] * 2)
    raw = load_raw(cfg(path))[0]
    auto = tokenize_dataset(raw, chatml, cfg(path), path)
    assert 0 in auto[0]["loss_mask"]
    as_text = tokenize_dataset(raw, chatml, cfg(path, format="text"), path)
    assert chatml.decode(as_text[0]["input_ids"]) == "<s>hello" and set(as_text[0]["loss_mask"]) == {1}
    with pytest.raises(DataError, match=r"both\.jsonl: format 'sharegpt' needs a 'conversations' column"):
        tokenize_dataset(raw, chatml, cfg(path, format="sharegpt"), path)


@pytest.mark.parametrize(
    "n, fraction, max_eval, want", [(40, 0.1, 256, 4), (40, 0.1, 3, 3), (5, 0.01, 256, 1)]
)
def test_eval_split_sizes(tmp_path, base_tokenizer, n, fraction, max_eval, want):
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": f"row {i} says hello"} for i in range(n)])
    c = cfg(path, eval_fraction=fraction, max_eval_examples=max_eval)
    train, ev = build_datasets(c, base_tokenizer)
    assert (len(train), len(ev)) == (n - want, want)
    raw_train, raw_ev = load_raw(c)
    assert (len(raw_train), len(raw_ev)) == (n - want, want)


def test_eval_path_and_max_examples(tmp_path, base_tokenizer):
    train_path = write_jsonl(tmp_path / "train.jsonl", [{"text": f"train row {i}"} for i in range(30)])
    eval_path = write_jsonl(tmp_path / "eval.jsonl", [{"text": f"eval row {i}"} for i in range(20)])
    c = cfg(train_path, eval_path=eval_path, max_examples=10, max_eval_examples=5)
    train, ev = build_datasets(c, base_tokenizer, seed=3)
    assert len(train) == 10 and len(ev) == 5
    assert [base_tokenizer.decode(x[1:]) for x in train["input_ids"]] == [f"train row {i}" for i in range(10)]
    assert all(base_tokenizer.decode(x[1:]).startswith("eval row") for x in ev["input_ids"])
    assert build_datasets(c, base_tokenizer, seed=3)[1]["input_ids"] == ev["input_ids"]


def test_directory_of_shards(tmp_path, chatml):
    shards = tmp_path / "shards"
    shards.mkdir()
    write_jsonl(shards / "a.jsonl", [{"messages": CONV}] * 3)
    write_jsonl(shards / "b.jsonl", [{"messages": CONV}] * 2 + [{"messages": CONV[:2]}])
    with pytest.raises(DataError, match=r"shards/b\.jsonl row 2: conversation has no assistant turn"):
        build_datasets(cfg(shards), chatml)
    write_jsonl(shards / "b.jsonl", [{"messages": CONV}] * 2)
    train, ev = build_datasets(cfg(shards), chatml)
    assert len(train) + len(ev) == 5


def test_directory_mixing_text_and_chat_files(tmp_path, chatml):
    """Each file is tokenized in its own format (text: every token a label; chat: the assistant turns), in
    file order, extra columns ignored; a sampled eval set over such a directory maps rows back to files."""
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    write_jsonl(mixed / "a-text.jsonl", [{"text": f"text row {i}", "id": i} for i in range(4)])
    write_jsonl(mixed / "b-chat.jsonl", [{"messages": CONV}] * 3)
    write_jsonl(mixed / "c-text.jsonl", [{"text": "last row"}])
    chat_only = tokenize_dataset(datasets.Dataset.from_list([{"messages": CONV}]), chatml, cfg(mixed), "x")[0]
    train, _ = build_datasets(cfg(mixed, eval_fraction=0.5, max_eval_examples=1), chatml, seed=0)
    both = build_datasets(cfg(mixed, max_examples=6, eval_path=str(mixed), eval_split="x"), chatml)[0]
    rows = [both[i] for i in range(len(both))]
    assert [chatml.decode(r["input_ids"][1:]) for r in rows[:4]] == [f"text row {i}" for i in range(4)]
    assert all(all(r["loss_mask"]) for r in rows[:4])
    assert [r["input_ids"] for r in rows[4:]] == [chat_only["input_ids"]] * 2
    assert [r["loss_mask"] for r in rows[4:]] == [chat_only["loss_mask"]] * 2 and not all(rows[4]["loss_mask"])
    assert len(train) == 7
    write_jsonl(mixed / "b-chat.jsonl", [{"messages": CONV}] * 2 + [{"messages": CONV[:2]}])
    with pytest.raises(DataError, match=r"mixed/b-chat\.jsonl row 2: conversation has no assistant turn"):
        train_file = write_jsonl(tmp_path / "t.jsonl", [{"text": "a train row"}] * 2)
        build_datasets(cfg(train_file, eval_path=str(mixed), max_eval_examples=7), chatml)


# ----------------------------------------------------------------------------- truncation and dropping


def test_truncation_and_dropping(tmp_path, chatml, caplog):
    long_text = " ".join(CORPUS)
    rows = [{"text": long_text}, {"text": ""}, {"text": "hi there"}]
    path = "t.jsonl"
    with caplog.at_level(logging.WARNING, logger="train.data"):
        ds = tokenize_dataset(datasets.Dataset.from_list(rows), chatml, cfg(path, max_length=8), path)
    assert [len(x) for x in ds["input_ids"]] == [8, len(chatml("hi there")["input_ids"])]
    assert "dropped 1 of 3" in caplog.text

    # Chat: truncation cuts the mask with the ids; a conversation whose first answer lies beyond
    # max_length has no loss token left and is dropped.
    full = tokenize_dataset(datasets.Dataset.from_list([{"messages": CONV}]), chatml, cfg(path), "x")[0]
    first = full["loss_mask"].index(1)
    cut = tokenize_dataset(
        datasets.Dataset.from_list([{"messages": CONV}, {"messages": CONV[1:3]}]),
        chatml,
        cfg(path, max_length=first + 3),
        "x",
    )
    assert len(cut) == 2 and cut[0]["input_ids"] == full["input_ids"][: first + 3]
    assert cut[0]["loss_mask"] == full["loss_mask"][: first + 3] and sum(cut[0]["loss_mask"]) == 3
    with pytest.raises(DataError, match=r"x: no usable examples: all 1 have fewer than 2 tokens or no loss"):
        tokenize_dataset(
            datasets.Dataset.from_list([{"messages": CONV}]), chatml, cfg(path, max_length=first), "x"
        )


# ----------------------------------------------------------------------------- bad input


def test_missing_and_empty_files(tmp_path, chatml):
    for missing in [str(tmp_path / "nope.jsonl"), "./nope.parquet", "a/b/c", "~/nope.json"]:
        with pytest.raises(DataError, match=re.escape(missing) + ": no such file or directory"):
            load_raw(cfg(missing))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match=r"empty\.jsonl: file is empty"):
        build_datasets(cfg(empty), chatml)
    empty.write_text("\n\n")
    with pytest.raises(DataError, match=r"empty\.jsonl: file is empty"):
        build_datasets(cfg(empty), chatml)
    (tmp_path / "data.csv").write_text("text\nhello\n")
    with pytest.raises(DataError, match=r"data\.csv: unsupported file type"):
        build_datasets(cfg(tmp_path / "data.csv"), chatml)
    good = write_jsonl(tmp_path / "good.jsonl", [{"text": "hello world"}] * 4)
    with pytest.raises(DataError, match=r"missing\.jsonl: no such file"):
        build_datasets(cfg(good, eval_path=str(tmp_path / "missing.jsonl")), chatml)
    empty_parquet = str(tmp_path / "empty.parquet")
    datasets.Dataset.from_dict({"text": []}).to_parquet(empty_parquet)
    with pytest.raises(DataError, match=r"empty\.parquet: file is empty"):
        build_datasets(cfg(empty_parquet), chatml)


def test_unreachable_hub_id(chatml):
    with pytest.raises(DataError, match=r"someorg/missing \(split train\): could not load Hub dataset"):
        build_datasets(cfg("someorg/missing"), chatml)


def test_invalid_json_row(tmp_path, chatml):
    path = tmp_path / "data.jsonl"
    path.write_text('{"text": "a b"}\n\n{"text": "c d"}\n{"text": \n')
    with pytest.raises(DataError, match=r"data\.jsonl row 2: invalid JSON"):
        build_datasets(cfg(path), chatml)


BAD_ROWS = [
    ({"messages": CONV[:2]}, "conversation has no assistant turn"),
    ({"messages": []}, "conversation must be a non-empty list"),
    ({"messages": CONV[:2] + [{"role": "tool", "content": "42"}]}, "message 2 has unknown role 'tool'"),
    ({"conversations": [{"from": "human", "value": "hi"}, {"from": "bot", "value": "yo"}]}, "message 1 has unknown role 'bot'"),
    ({"messages": [CONV[1], {"role": "assistant", "content": None}]}, r"message 1 content is not a string \(got NoneType\)"),
    ({"messages": [CONV[1], {"role": "assistant", "content": 7}]}, r"message 1 content is not a string \(got int\)"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}, CONV[2]]}, r"message 0 content is not a string \(got list\)"),
    ({"messages": [{"content": "hi"}, CONV[2]]}, "message 0 has no role"),
    ({"text": None}, r"'text' is not a string \(got NoneType\)"),
]  # fmt: skip


@pytest.mark.parametrize("bad, match", BAD_ROWS)
def test_bad_row_names_file_and_row(tmp_path, chatml, bad, match):
    column = next(iter(bad))
    good = (
        {"text": "hello world"}
        if column == "text"
        else {column: CONV if column == "messages" else sharegpt(CONV)}
    )
    path = write_jsonl(tmp_path / "data.jsonl", [good, good, good, bad, good])
    with pytest.raises(DataError, match=r"data\.jsonl row 3: " + match):
        build_datasets(cfg(path), chatml)


def test_unknown_format_lists_formats_and_columns(tmp_path, chatml):
    path = write_jsonl(tmp_path / "data.jsonl", [{"prompt": "a", "completion": "b"}] * 3)
    with pytest.raises(DataError, match=r"data\.jsonl: unknown data format; accepted formats: text .*sharegpt .*messages .*columns seen: \['prompt', 'completion'\]"):  # fmt: skip
        build_datasets(cfg(path), chatml)


def test_template_problems(tmp_path, base_tokenizer):
    path = write_jsonl(tmp_path / "data.jsonl", [{"messages": CONV}] * 2)
    with pytest.raises(
        DataError, match=r"data\.jsonl row 0: the chat template is not prefix-consistent at message 2"
    ):
        build_datasets(cfg(path), with_template(base_tokenizer, COUNTING))
    with pytest.raises(DataError, match=r"data\.jsonl: messages data needs a chat template"):
        build_datasets(cfg(path), with_template(base_tokenizer, None))
    upper = CHATML.replace("{{ m['content'] }}", "{{ m['content'] | upper }}")
    with pytest.raises(
        DataError, match=r"row 0: the chat template does not render assistant message 2 verbatim"
    ):
        build_datasets(cfg(path), with_template(base_tokenizer, upper))
    failing = (
        "{% if messages | length > 3 %}{{ raise_exception('roles must alternate') }}{% endif %}" + CHATML
    )
    with pytest.raises(
        DataError, match=r"data\.jsonl row 0: the chat template failed .*roles must alternate"
    ):
        build_datasets(cfg(path), with_template(base_tokenizer, failing))


def test_num_proc(tmp_path, chatml):
    rows = [{"messages": CONV}] * 6
    path = write_jsonl(tmp_path / "data.jsonl", rows)
    one = tokenize_dataset(datasets.Dataset.from_list(rows), chatml, cfg(path), path)
    two = tokenize_dataset(datasets.Dataset.from_list(rows), chatml, cfg(path, num_proc=2), path)
    assert one["input_ids"] == two["input_ids"] and one["loss_mask"] == two["loss_mask"]
    bad = write_jsonl(tmp_path / "bad.jsonl", rows[:5] + [{"messages": CONV[:2]}])
    with pytest.raises(DataError, match=r"bad\.jsonl row 5: conversation has no assistant turn"):
        build_datasets(cfg(bad, num_proc=2), chatml)


# ----------------------------------------------------------------------------- collate


def test_collate_right_pads():
    batch = [
        {"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]},
        {"input_ids": [8], "loss_mask": [1], "extra": "ignored"},
        {"input_ids": [9, 10], "loss_mask": [1, 0]},
    ]
    out = collate(batch, pad_token_id=0)
    assert set(out) == {"input_ids", "attention_mask", "loss_mask"}
    for v in out.values():
        assert v.shape == (3, 3) and v.dtype == torch.long
    assert out["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0], [9, 10, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0]]
    assert out["loss_mask"].tolist() == [[0, 1, 1], [1, 0, 0], [1, 0, 0]]
    assert collate(batch, pad_token_id=3, pad_to_multiple_of=4)["input_ids"].shape == (3, 4)
    with pytest.raises(ValueError, match="pad_token_id is None"):
        collate(batch, pad_token_id=None)
    with pytest.raises(ValueError, match="loss_mask has 1 entries for 2 tokens"):
        collate([{"input_ids": [1, 2], "loss_mask": [1]}], pad_token_id=0)


def test_collate_on_built_dataset(tmp_path, chatml):
    path = write_jsonl(tmp_path / "data.jsonl", [{"messages": CONV[i:]} for i in range(0, 6, 2)] * 4)
    train, _ = build_datasets(cfg(path, eval_fraction=0.2), chatml)
    loader = torch.utils.data.DataLoader(
        train, batch_size=4, collate_fn=lambda b: collate(b, chatml.pad_token_id)
    )
    batch = next(iter(loader))
    lengths = batch["attention_mask"].sum(1)
    assert batch["input_ids"].shape[1] == int(lengths.max())
    assert (batch["loss_mask"] <= batch["attention_mask"]).all()
    assert (batch["input_ids"][batch["attention_mask"] == 0] == chatml.pad_token_id).all()
