"""The built-in demo target (the `demo` package): corpus split, tiny build, reload, chat template, determinism."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

import demo
import demo.target


@pytest.fixture(scope="module")
def tiny_builds(tmp_path_factory) -> tuple[str, str]:
    """The tiny target built twice, in two separate caches (the determinism check needs both)."""
    a = demo.ensure_demo_target("tiny", seed=0, cache=str(tmp_path_factory.mktemp("cache_a")))
    b = demo.ensure_demo_target("tiny", seed=0, cache=str(tmp_path_factory.mktemp("cache_b")))
    return a, b


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("SELFSPEC_CACHE", str(tmp_path))
    assert demo.cache_dir() == str(tmp_path)
    monkeypatch.delenv("SELFSPEC_CACHE")
    assert demo.cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "selfspec")


def test_stdlib_split_disjoint_and_clean():
    train, heldout = demo.stdlib_files("train"), demo.stdlib_files("heldout")
    assert train and heldout
    assert not set(train) & set(heldout)
    assert train == sorted(train, key=demo.relpath) and train == demo.stdlib_files("train")
    assert 0.01 < len(heldout) / (len(train) + len(heldout)) < 0.15
    for path in train + heldout:
        parts = demo.relpath(path).split("/")
        assert path.endswith(".py")
        assert not {"test", "tests", "idle_test", "site-packages"} & set(parts), path
    with pytest.raises(ValueError):
        demo.stdlib_files("test")  # type: ignore[arg-type]


def test_lr_schedule():
    spec = demo.SPECS["tiny"]
    lrs = [demo.lr_at(s, spec) for s in range(spec.steps)]
    assert lrs[spec.warmup_steps - 1] == pytest.approx(spec.lr)
    assert max(lrs) == pytest.approx(spec.lr)
    assert lrs[-1] >= spec.min_lr_ratio * spec.lr and lrs[-1] < 0.2 * spec.lr


def test_tiny_target_loads_offline(tiny_builds):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_builds[0]
    for name in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "demo_info.json",
    ):
        assert os.path.isfile(os.path.join(path, name)), name
    assert not [n for n in os.listdir(os.path.dirname(path)) if ".tmp-" in n]  # no leftover temp dirs
    with open(os.path.join(path, "demo_info.json")) as f:
        info = json.load(f)
    assert info["size"] == "tiny" and info["layers"] == 2 and info["tokens_trained"] > 0
    assert info["heldout_loss"] < 6.0  # below uniform over 512 tokens (6.24): it learned something

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.dtype == torch.float32
    assert model.config.vocab_size == len(tok)
    assert model.generation_config.eos_token_id == tok.eos_token_id == model.config.eos_token_id
    ids = tok("def add(a, b):\n    return a + b\n", return_tensors="pt")["input_ids"]
    assert ids[0, 0].item() == tok.bos_token_id
    assert tok.decode(ids[0], skip_special_tokens=True) == "def add(a, b):\n    return a + b\n"
    out = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 5) or out[0, -1].item() == tok.eos_token_id


def test_tiny_chat_template(tiny_builds):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_builds[0])
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "def f():\n"},
        {"role": "assistant", "content": "    return 1\n"},
    ]
    text = tok.apply_chat_template(msgs[:2], tokenize=False, add_generation_prompt=True)
    assert text == "<s><|system|>Be brief.<|end|>\n<|user|>def f():\n<|end|>\n<|assistant|>"
    assert not tok.apply_chat_template(msgs[:2], tokenize=False).endswith("<|assistant|>")
    ids = tok.apply_chat_template(msgs[:2], add_generation_prompt=True, return_dict=True)["input_ids"]
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert ids[-1] == tok.convert_tokens_to_ids("<|assistant|>")
    for special in ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>"):
        assert len(tok(special, add_special_tokens=False)["input_ids"]) == 1, special
    # The assistant mask covers the assistant's content and its <|end|>, nothing of the prompt.
    full = tok.apply_chat_template(msgs, return_dict=True, return_assistant_tokens_mask=True)
    mask, ids = full["assistant_masks"], full["input_ids"]
    assistant = [t for t, m in zip(ids, mask, strict=True) if m]
    assert tok.decode(assistant) == "    return 1\n<|end|>"
    with pytest.raises(Exception, match="unsupported role"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_tiny_build_deterministic(tiny_builds):
    a, b = tiny_builds
    wa, wb = load_file(os.path.join(a, "model.safetensors")), load_file(os.path.join(b, "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    with open(os.path.join(a, "tokenizer.json")) as fa, open(os.path.join(b, "tokenizer.json")) as fb:
        assert fa.read() == fb.read()


def test_cached_reuse_and_force(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(
        demo.target,
        "_spawn_build",
        lambda out, size, seed, precision: calls.append(out) or open(os.path.join(out, "x"), "w").close(),
    )
    p1 = demo.ensure_demo_target("tiny", seed=3, cache=str(tmp_path))
    p2 = demo.ensure_demo_target("tiny", seed=3, cache=str(tmp_path))
    assert p1 == p2 == os.path.join(str(tmp_path), "demo-target-tiny-s3") and len(calls) == 1
    demo.ensure_demo_target("tiny", seed=3, cache=str(tmp_path), force=True)
    assert len(calls) == 2 and os.path.isfile(os.path.join(p1, "x"))
    assert sorted(os.listdir(tmp_path)) == [".demo-target-tiny-s3.lock", "demo-target-tiny-s3"]


def _fake_build(calls: list, precision_built: str):
    def build(out, size, seed, precision):
        calls.append(precision)
        info = {"recipe_version": demo.RECIPE_VERSION, "precision": precision_built}
        with open(os.path.join(out, "demo_info.json"), "w") as f:
            json.dump(info, f)

    return build


def test_stale_builds_are_rebuilt(tmp_path, monkeypatch, capsys):
    """Another recipe version, or an explicit precision the cache was not trained in, rebuilds; fast reuses."""
    calls: list[str] = []
    monkeypatch.setattr(demo.target, "_spawn_build", _fake_build(calls, "fp32"))
    path = demo.ensure_demo_target("tiny", cache=str(tmp_path))
    assert calls == ["fast"] and demo.target.stale_reason(path) is None
    demo.ensure_demo_target("tiny", cache=str(tmp_path), precision="fp32")  # what it was trained in: reused
    assert calls == ["fast"]
    demo.ensure_demo_target("tiny", cache=str(tmp_path), precision="bf16")
    assert calls == ["fast", "bf16"] and "trained in fp32, bf16 was asked for" in capsys.readouterr().err
    with open(os.path.join(path, "demo_info.json"), "w") as f:
        json.dump({"recipe_version": demo.RECIPE_VERSION - 1, "precision": "fp32"}, f)
    assert "recipe version" in demo.target.stale_reason(path)
    demo.ensure_demo_target("tiny", cache=str(tmp_path))
    assert calls == ["fast", "bf16", "fast"] and demo.target.stale_reason(path) is None
    with pytest.raises(ValueError, match="precision must be fast, bf16 or fp32"):
        demo.ensure_demo_target("tiny", cache=str(tmp_path), precision="fp16")


AMD_EPYC = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx avx2 avx512f avx512_vnni\n\n"
INTEL_AMX = "processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile avx512_bf16 amx_int8\n"
ARM_BF16 = "processor\t: 0\nFeatures\t: fp asimd sve i8mm bf16 bti\nCPU implementer\t: 0x41\n"


@pytest.mark.parametrize(
    ("cpuinfo", "flags", "name"),
    [
        (AMD_EPYC, [], "fp32"),
        (INTEL_AMX, ["amx_bf16", "avx512_bf16"], "bf16"),
        (INTEL_AMX.replace(" amx_bf16", ""), ["avx512_bf16"], "bf16"),
        (ARM_BF16, ["bf16"], "bf16"),
        (ARM_BF16.replace(" bf16", ""), [], "fp32"),
        ("flags\t: avx512_bf16_fake xbf16\n", [], "fp32"),  # whole words only
        ("model name\t: bf16 amx_bf16\n", [], "fp32"),  # only the flags / Features lines count
        ("", [], "fp32"),
    ],
)
def test_cpu_precision_from_cpuinfo(cpuinfo, flags, name):
    from demo.precision import cpu_bf16_flags, cpu_precision

    assert cpu_bf16_flags(cpuinfo) == flags
    chosen = cpu_precision(cpuinfo)
    assert chosen.name == name and chosen.line.startswith(f"precision: {name} (")
    assert chosen.dtype == {"bf16": torch.bfloat16, "fp32": torch.float32}[name]


def test_precision_explicit_overrides_and_unknown_platforms(monkeypatch):
    from demo import precision

    assert precision.cpu_precision(None).name == "fp32"  # not Linux / unreadable: bf16 not confirmed
    monkeypatch.setattr(precision, "_read_cpuinfo", lambda: AMD_EPYC)
    precision._machine_precision.cache_clear()
    try:
        assert precision.fast_precision("fast", "cpu").name == "fp32"
        assert precision.fast_precision("bf16", "cpu") == precision.Precision("bf16", "asked for explicitly")
        assert precision.fast_precision("float32", "cpu").name == "fp32"
        monkeypatch.setattr(precision, "_read_cpuinfo", lambda: INTEL_AMX)
        precision._machine_precision.cache_clear()
        assert precision.fast_precision("fast", "cpu").name == "bf16"
        with pytest.raises(ValueError, match="got 'fp16'"):
            precision.fast_precision("fp16")
    finally:
        precision._machine_precision.cache_clear()


def test_interrupted_build_leaves_nothing(tmp_path, monkeypatch):
    def boom(out, size, seed, precision):
        open(os.path.join(out, "config.json"), "w").close()
        raise KeyboardInterrupt

    monkeypatch.setattr(demo.target, "_spawn_build", boom)
    with pytest.raises(KeyboardInterrupt):
        demo.ensure_demo_target("tiny", cache=str(tmp_path))
    assert os.listdir(tmp_path) == [".demo-target-tiny-s0.lock"]


def test_demo_data(tmp_path):
    files = demo.ensure_demo_data("tiny", seed=0, cache=str(tmp_path))
    assert set(files) == {"train", "eval", "prompts"}
    rows = {}
    for split, path in files.items():
        with open(path) as f:
            rows[split] = [json.loads(line)["text"] for line in f]
        assert rows[split] and all(t.strip() for t in rows[split]), split
    assert len(rows["train"]) == demo.DATA_ROWS["tiny"][0]
    assert not set(rows["train"]) & set(rows["eval"])
    assert all(t.startswith(("def ", "async def ", "@")) for t in rows["prompts"])
    assert not any(t.endswith("\n") for t in rows["prompts"])  # a bare trailing newline reads as end-of-file
    # Prompts come from held-out files: each signature line is in one of them.
    heldout = "".join(demo.read_source(p) for p in demo.stdlib_files("heldout"))
    for prompt in rows["prompts"]:
        header = next(line for line in prompt.split("\n") if line.startswith(("def ", "async def ")))
        assert header in heldout, header
    assert demo.ensure_demo_data("tiny", seed=0, cache=str(tmp_path)) == files  # cached


def test_demo_chat_data_is_the_chunks_as_conversations(tmp_path):
    files = demo.ensure_demo_data("tiny", seed=0, cache=str(tmp_path))
    chat = demo.ensure_demo_chat_data("tiny", seed=0, cache=str(tmp_path))
    assert set(chat) == {"train-chat", "eval-chat"}
    for split in ("train", "eval"):
        with open(files[split]) as f:
            texts = [json.loads(line)["text"] for line in f]
        with open(chat[f"{split}-chat"]) as f:
            convs = [json.loads(line)["messages"] for line in f]
        assert len(convs) == len(texts)
        for text, messages in zip(texts, convs, strict=True):
            roles = [m["role"] for m in messages]
            assert roles in (["user", "assistant"], ["system", "user", "assistant"])
            if roles[0] == "system":
                assert messages[0]["content"] == demo.SYSTEM_PROMPT
            user, answer = messages[-2]["content"], messages[-1]["content"]
            assert user.endswith("\n") and answer  # the user gives the first lines, the assistant the rest
            assert user + answer == text.rstrip("\n")
            assert 2 <= user.count("\n") <= 6
    with open(chat["train-chat"]) as f:
        n_system = sum(json.loads(line)["messages"][0]["role"] == "system" for line in f)
    assert 0 < n_system < demo.DATA_ROWS["tiny"][0] / 2  # about a quarter
    assert demo.ensure_demo_chat_data("tiny", seed=0, cache=str(tmp_path)) == chat  # cached


def test_make_reports_the_cached_builds(tiny_builds, capsys):
    """scripts/make_demo_target.py's code: finds the cached target (no rebuild), builds the data, prints both."""
    from demo.make import MakeDemoOptions, make

    cache = os.path.dirname(tiny_builds[0])
    before = os.path.getmtime(os.path.join(tiny_builds[0], "model.safetensors"))
    out = make(MakeDemoOptions(size="tiny", cache=cache))
    assert out["target"] == tiny_builds[0] and out["info"]["size"] == "tiny" and "spec" not in out["info"]
    assert (
        os.path.getmtime(os.path.join(tiny_builds[0], "model.safetensors")) == before
    )  # reused, not rebuilt
    assert set(out["data"]) == {"train", "eval", "prompts"}
    printed = capsys.readouterr().out
    assert f"target: {tiny_builds[0]}" in printed and f"({demo.DATA_ROWS['tiny'][0]} rows)" in printed
    with pytest.raises(ValueError, match="--size must be one of full, tiny"):
        MakeDemoOptions(size="huge")


def test_demo_generate_compares_three_ways_and_checks_exactness_in_both_dtypes(tmp_path, capsys):
    """scripts/demo_generate.py's code, timed in bf16: the table has target.generate, prompt lookup and the
    heads with τ and efficiency; exactness is checked in fp32 (all identical) and reported for bf16."""
    from bench import side_by_side
    from heads import MedusaHeads, load_target, save_heads

    torch.set_num_threads(1)
    target = load_target(demo.resolve("demo-tiny"))
    torch.manual_seed(0)
    heads = MedusaHeads.for_target(target, num_heads=2)
    heads.config.record_target(target)
    save_heads(heads, str(tmp_path / "heads"))
    argv = ["--target", "demo-tiny", "--heads", str(tmp_path / "heads"), "--prompts", "2"]
    rows = side_by_side.main(
        [*argv, "--max-new-tokens", "8", "--dtype", "bf16", "--out", str(tmp_path / "o")]
    )
    out = capsys.readouterr().out
    assert "precision: bf16 (asked for explicitly)" in out
    assert "| method (bf16, greedy) | tokens/s (median) | speedup | τ | efficiency |" in out
    assert (
        "| target.generate |" in out
        and "| prompt lookup (3) |" in out
        and "| heads (medusa, static tree) + lookup (8) |" in out
    )
    assert "exactness (fp32, untimed): greedy output token-identical to target.generate: identical outputs 2/2" in out
    assert "exactness (bf16): " in out
    assert len(rows) == 2 and all(r["identical"] and r["tau"] >= 1 for r in rows)
    report = json.loads((tmp_path / "o" / "results.json").read_text())
    assert set(report["exactness"]) == {"bf16", "fp32"} and report["precision"]["name"] == "bf16"
    assert [r["method"] for r in report["results"]][:2] == ["target.generate", "prompt lookup (3)"]
    bf16 = report["exactness"]["bf16"]
    assert bf16["row"]["identical"] + len(bf16["mismatches"]) == 2  # each divergence listed with its margin
    assert all(m["logit_margin"] is not None for m in bf16["mismatches"])
