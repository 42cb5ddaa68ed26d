"""scripts/benchmark.py (`bench`) smoke test: a tiny random target with quickly built heads, 2 prompts, few tokens.

Checks the outputs' schema (results.json keys and types, results.md, a non-empty PNG) and that a greedy
method whose output differs from ``target.generate`` is caught (exit status 1, prompt and position
reported). Speed is never asserted.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import tiny_model

import bench as bench
import infer.runner
from bench import device_check, profile, side_by_side
from infer.settings import DEFAULTS


@pytest.fixture(scope="module")
def setup(tmp_path_factory, one_thread):
    """A tiny Llama with a byte-level BPE tokenizer (with the demo chat template), Medusa and EAGLE heads
    (random, saved as checkpoints) and a prompts file with one text row and one chat row."""
    from demo import train_tokenizer
    from heads import EagleHead, MedusaHeads, save_heads

    root = tmp_path_factory.mktemp("bench")
    texts = ["def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i, i * i)\n"] * 20
    tok = train_tokenizer(texts, vocab_size=300, max_length=256)
    model = tiny_model("llama", vocab_size=300)
    target = str(root / "target")
    model.config._name_or_path = target
    model.save_pretrained(target)
    tok.save_pretrained(target)
    torch.manual_seed(0)
    medusa = MedusaHeads.for_target(model, num_heads=2)
    for p in medusa.parameters():  # nonzero weights, so the heads disagree with the target sometimes
        p.data.normal_(0, 0.1)
    save_heads(medusa, str(root / "medusa"))
    save_heads(EagleHead.for_target(model), str(root / "eagle"))
    prompts = root / "prompts.jsonl"
    rows = [
        {"text": "def add(a, b):\n    return"},
        {"messages": [{"role": "user", "content": "for i in range(10):\n"}]},
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root, target, str(prompts)


def _common(root, target, prompts, out):
    return [
        "--target",
        target,
        "--prompts",
        f"toy={prompts}",
        "--dtype",
        "fp32",
        "--max-new-tokens",
        "6",
        "--threads",
        "1",
        "--out",
        str(out),
    ]


def test_outputs_schema(setup, tmp_path):
    root, target, prompts = setup
    argv = _common(root, target, prompts, tmp_path) + [
        "--heads",
        f"med={root / 'medusa'}",
        "--heads",
        str(root / "eagle"),
        "--tree",
        "default,4",
        "--total-tokens",
        "eagle:4,8",
        "--total-tokens",
        "med:99",  # a label of another head type: ignored for the EAGLE heads
        "--prompt-lookup",
        "2",
        "--verify-cost",
        "1,4",
        "--vs",
        "med [33 tok]:target.generate",
    ]
    report, status = bench.run(argv)
    assert status == 0 and report["ok"] is True and report["mismatches"] == []
    for name in (
        "results.json",
        "results.md",
        "speedup_vs_tree.png",
    ):
        assert os.path.getsize(tmp_path / name) > 0
    with open(tmp_path / "speedup_vs_tree.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["schema"] == bench.SCHEMA and on_disk["results"] == json.loads(
        json.dumps(report["results"])
    )
    for key in (
        "date",
        "command",
        "machine",
        "settings",
        "tau_definition",
        "speedup_definition",
        "peak_memory_kind",
        "prompt_sets",
        "verify_cost",
        "results",
        "comparisons",
        "mismatches",
        "ok",
    ):
        assert key in on_disk, key
    for key in ("cpu", "cores", "device", "torch", "transformers", "summary"):
        assert key in on_disk["machine"], key
    assert on_disk["prompt_sets"]["toy"]["n"] == 2
    assert set(on_disk["verify_cost"]["ratio_to_k1"]) == {"1", "4"}
    assert on_disk["verify_cost"]["ratio_to_k1"]["1"] == 1.0

    rows = on_disk["results"]
    # plain + prompt lookup + 2 Medusa trees + 2 EAGLE sizes, for greedy and sample
    assert len(rows) == 2 * 6
    assert {r["mode"] for r in rows} == {"greedy", "sample"}
    assert sorted({r["tree_size"] for r in rows if r["head_type"] == "eagle"}) == [4, 8]
    # Medusa with 2 heads: default_tree (32 drafts) and default_tree(4); sizes count the root
    assert sorted(r["tree_size"] for r in rows if r["head_type"] == "medusa" and r["mode"] == "greedy") == [
        5,
        33,
    ]
    for r in rows:
        assert r["n_prompts"] == 2 and r["new_tokens"] == 12
        assert isinstance(r["tau"], float) and r["tau"] >= 1.0
        assert sum(r["tau_histogram"].values()) > 0 and all(int(k) >= 1 for k in r["tau_histogram"])
        assert set(r["tau_quantiles"]) == {"p10", "p50", "p90"}
        tps = r["tokens_per_s"]
        assert 0 < tps["min"] <= tps["median"] <= tps["max"]
        assert r["speedup"]["total"] > 0 and r["speedup"]["median"] > 0
        lo, hi = r["speedup"]["ci95"]  # 2 prompts: a bootstrap interval over them
        assert 0 < lo <= hi
        assert r["efficiency"] == pytest.approx(r["speedup"]["total"] / r["tau"])
        assert r["peak_memory_mib"] > 0
        if r["kind"] == "heads":  # infer.generate(timing=True): the draft / verify / bookkeeping split
            split = r["time_split_s"]
            assert set(split) == {"draft", "verify", "bookkeeping", "total"}
            assert 0 < split["draft"] < split["total"] and 0 < split["verify"] < split["total"]
            # the tree adapted by default: one size per verify step, none above the method's tree and
            # prompt lookup's chain (infer.generate's default)
            used, most = r["tree_sizes_used"], r["tree_size"] + DEFAULTS.lookup
            assert sum(used["histogram"].values()) == sum(r["tau_histogram"].values())
            assert all(1 <= int(k) <= most for k in used["histogram"])
            assert used["steps_without_drafts"] == used["histogram"].get("1", 0)
            assert 1 <= used["mean"] <= most
        else:
            assert r["time_split_s"] is None and r["tree_sizes_used"] is None
        assert len(r["per_prompt"]) == 2
        if r["kind"] == "plain":
            assert r["tau"] == 1.0 and r["speedup"]["total"] == 1.0 and r["identical"] is None
        elif r["mode"] == "greedy":
            assert r["identical"] == 2  # fp32: every method reproduces target.generate exactly
    comps = on_disk["comparisons"]
    assert [(c["prompt_set"], c["mode"], c["a"], c["b"]) for c in comps] == [
        ("toy", mode, "med [33 tok]", "target.generate") for mode in ("greedy", "sample")
    ]
    for c in comps:
        row = next(r for r in rows if r["method"] == c["a"] and r["mode"] == c["mode"])
        assert c["ratio"] == pytest.approx(row["speedup"]["total"])  # against the baseline: the speedup
        assert c["ci95"] == pytest.approx(row["speedup"]["ci95"])
        assert 0 <= c["a_faster_on"] <= c["n_prompts"] == 2
        lo, hi = c["tau_diff_ci95"]  # against plain decoding (τ = 1 on every prompt)
        assert lo <= c["tau_a"] - 1.0 <= hi
    md = (tmp_path / "results.md").read_text()
    assert md.count("\n| toy |") == len(rows) + len(comps) and "Verify cost" in md
    assert md.count("verified/step") == sum(r["kind"] == "heads" for r in rows)
    assert "Paired comparisons" in md and "| τ A - τ B |" in md


def _eagle_rows(setup, tmp_path, *flags: str) -> dict:
    """A greedy run of the EAGLE heads' 8-token tree with ``flags``, without HF prompt lookup: its rows by
    method label."""
    root, target, prompts = setup
    argv = _common(root, target, prompts, tmp_path) + [
        "--heads",
        f"eagle={root / 'eagle'}",
        "--total-tokens",
        "8",
    ]
    report, status = bench.run([*argv, "--modes", "greedy", "--prompt-lookup", "0", *flags])
    assert status == 0 and report["ok"] is True
    return {r["method"]: r for r in report["results"]}


def test_adaptive_both_adds_the_fixed_tree(setup, tmp_path):
    """--adaptive both: each heads setting gets a second row, "<label> [N tok] fixed", that verifies its
    full tree at every step (infer.generate(adaptive=False)); the adaptive row is the default's. --lookup
    0,4: a row each without prompt lookup's chain and with a chain of up to 4 tokens."""
    rows = _eagle_rows(setup, tmp_path, "--adaptive", "both", "--lookup", "0,4")
    assert set(rows) == {
        "target.generate",
        "eagle [8 tok] no lookup",
        "eagle [8 tok] +lookup(4)",
        "eagle [8 tok] fixed no lookup",
        "eagle [8 tok] fixed +lookup(4)",
    }
    fixed = rows["eagle [8 tok] fixed no lookup"]["tree_sizes_used"]
    # the full tree every step; only a prompt's last token (one left to emit) is verified without drafts
    assert (
        set(fixed["histogram"]) <= {"8", "1"}
        and fixed["histogram"].get("1", 0) <= 2 < fixed["histogram"]["8"]
    )
    assert rows["eagle [8 tok] no lookup"]["tree_sizes_used"]["histogram"] != fixed["histogram"]  # adapted
    described = rows["eagle [8 tok] fixed +lookup(4)"]["tree"]  # each row names only its own settings
    assert ", fixed, lookup 4" in described and "lookup 0" not in described
    chained = rows["eagle [8 tok] fixed +lookup(4)"]["tree_sizes_used"]["histogram"]
    assert set(chained) <= {str(k) for k in (1, *range(8, 13))} and set(chained) - {"1", "8"}  # 8 + chain
    assert all(r["identical"] == 2 for r in rows.values() if r["kind"] == "heads")
    with pytest.raises(ValueError, match="--adaptive must be on, off, both or chains"):
        bench.BenchmarkOptions(adaptive="sometimes")
    with pytest.raises(ValueError, match="--lookup takes"):
        bench.BenchmarkOptions(lookup="0,x")


def test_adaptive_chains_adds_a_row_with_unpriced_chains(setup, tmp_path):
    """--adaptive chains: each heads setting also gets a row, "<label> [N tok] unpriced", whose lookup
    chains are grafted at their full length every step (infer.Adaptive(chains=False)); the other row is
    the default's, with the chains priced. Both reproduce target.generate."""
    rows = _eagle_rows(setup, tmp_path, "--adaptive", "chains")
    assert set(rows) == {"target.generate", "eagle [8 tok]", "eagle [8 tok] unpriced"}
    assert "lookup chains unpriced" in rows["eagle [8 tok] unpriced"]["tree"]
    assert all(r["identical"] == 2 for r in rows.values() if r["kind"] == "heads")


def test_corpus_adds_a_row_with_the_corpus_chain(setup, tmp_path):
    """--corpus FILE: each heads row runs without and with infer.generate's corpus chain, both identical
    to target.generate; a corpus that is not a JSONL of rows fails before any run."""
    root, target, prompts = setup
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": "def add(a, b):\n    return a + b\n" * 3}) + "\n")
    argv = _common(root, target, prompts, tmp_path) + [
        "--heads",
        f"eagle={root / 'eagle'}",
        "--total-tokens",
        "8",
    ]
    report, status = bench.run([*argv, "--modes", "greedy", "--prompt-lookup", "0", "--corpus", str(corpus)])
    assert status == 0 and report["ok"] is True
    rows = {r["method"]: r for r in report["results"]}
    assert set(rows) == {"target.generate", "eagle [8 tok]", "eagle [8 tok] +corpus"}
    assert all(r["identical"] == 2 for r in rows.values() if r["kind"] == "heads")
    model = infer.load(target, heads=str(root / "eagle"), corpus=str(corpus))  # the same through infer.load
    assert model.corpus.num_tokens > 0 and model.corpus.continuation(model.corpus.tokens[:2].tolist(), 4)
    ids = model.tokenizer("def add(a, b):\n", return_tensors="pt").input_ids
    out = infer.generate(model, ids, max_new_tokens=8, do_sample=False, lookup=4)
    assert torch.equal(out.sequences, model.target.generate(ids, max_new_tokens=8, do_sample=False))
    with pytest.raises(ValueError, match="corpus= needs the target's tokenizer"):
        infer.load(model.target, heads=str(root / "eagle"), corpus=str(corpus))
    corpus.write_text("not json\n")
    with pytest.raises(ValueError, match="corpus.jsonl:1: not valid JSON"):
        bench.run([*argv, "--modes", "greedy", "--corpus", str(corpus)])


class _Corrupting(bench.Method):
    """target.generate with the 3rd new token replaced: a greedy method that is wrong."""

    def run(self, target, ids, gc, seed, timing, mem):
        r = bench.Method("x", "plain").run(target, ids, gc, seed, timing, mem)
        pos = ids.shape[1] + 2
        r.sequences = r.sequences.clone()
        r.sequences[0, pos] = (r.sequences[0, pos] + 1) % target.config.vocab_size
        return r


def test_greedy_mismatch_is_reported(setup, tmp_path, capsys):
    root, target, prompts = setup
    argv = _common(root, target, prompts, tmp_path) + [
        "--modes",
        "greedy",
        "--prompt-lookup",
        "0",
        "--verify-cost",
        "",
    ]
    report, status = bench.run(argv, extra_methods=[_Corrupting("broken", "plain-corrupt")])
    assert status == 1 and report["ok"] is False
    mm = report["mismatches"]
    assert [(m["method"], m["prompt_index"], m["position"], m["near_tie"]) for m in mm] == [
        ("broken", 0, 2, False),
        ("broken", 1, 2, False),
    ]
    assert mm[0]["logit_margin"] > 0
    assert "GREEDY MISMATCH" in capsys.readouterr().err
    row = next(r for r in report["results"] if r["method"] == "broken")
    assert row["identical"] == 0
    assert "BUG" in (tmp_path / "results.md").read_text()


def _runs(tokens_seconds):
    return [bench.Run(None, n, s, None, 1.0) for n, s in tokens_seconds]


def test_bootstrap_interval_of_the_rate_ratio():
    base = _runs([(10, 1.0), (10, 2.0), (10, 4.0), (10, 1.5)])
    same = bench.bootstrap_ratio_ci(base, base)
    assert same == pytest.approx([1.0, 1.0])
    twice = _runs([(10, s / 2) for _, s in [(10, 1.0), (10, 2.0), (10, 4.0), (10, 1.5)]])
    assert bench.bootstrap_ratio_ci(twice, base) == pytest.approx([2.0, 2.0])  # 2x on every prompt
    mixed = _runs([(10, 0.5), (10, 2.0), (10, 1.0), (10, 3.0)])  # 2x, 1x, 4x, 0.5x
    lo, hi = bench.bootstrap_ratio_ci(mixed, base)
    point = (40 / 6.5) / (40 / 8.5)
    assert lo < point < hi and lo >= 0.5 and hi <= 4.0
    assert bench.bootstrap_ratio_ci(mixed, base) == [lo, hi]  # deterministic
    assert bench.bootstrap_ratio_ci(mixed[:1], base[:1]) is None  # one prompt: no interval


def test_bootstrap_interval_of_the_tau_difference():
    """τ A - τ B over resampled prompts, each τ pooled (Σ emitted / Σ decode forwards), prompts paired."""

    def runs(step_lists):
        return [bench.Run(None, sum(s), 1.0, s, 1.0) for s in step_lists]

    base = runs([[1, 2, 3], [2, 2], [4, 1, 1, 2], [3]])
    assert bench.bootstrap_tau_diff_ci(base, base) == pytest.approx([0.0, 0.0])
    plus_one = runs([[2, 3, 4], [3, 3], [5, 2, 2, 3], [4]])  # one more token on every step
    assert bench.bootstrap_tau_diff_ci(plus_one, base) == pytest.approx([1.0, 1.0])
    mixed = runs([[5, 5, 5], [1, 1], [4, 1, 1, 2], [1]])  # ahead on prompt 0, behind on 1 and 3
    lo, hi = bench.bootstrap_tau_diff_ci(mixed, base)
    point = 26 / 10 - 21 / 10
    assert lo < point < hi and lo < 0 < hi  # a lead that one prompt carries is not significant
    assert bench.bootstrap_tau_diff_ci(mixed, base) == [lo, hi]  # deterministic
    assert bench.bootstrap_tau_diff_ci(mixed[:1], base[:1]) is None  # one prompt: no interval
    assert bench.bootstrap_tau_diff_ci(_runs([(3, 1.0), (3, 1.0)]), base[:2]) is None  # no step counts
    assert bench.bootstrap_tau_diff_ci(runs([[2], []]), base[:2]) is None  # a prompt with no decode step
    c = bench.compare({"method": "a", "tau": 2.5}, {"method": "b", "tau": 2.1}, mixed, base)
    assert c["tau_diff_ci95"] == [lo, hi]


def test_vs_labels_are_checked():
    labels = [
        "target.generate",
        "medusa [33 tok]",
        "medusa-tuned [19 tok]",
        "eagle [16 tok]",
        "eagle [32 tok]",
    ]
    assert bench.parse_pairs(["medusa-tuned [19 tok]:medusa [33 tok]"], labels) == [
        ("medusa-tuned [19 tok]", "medusa [33 tok]")
    ]
    # a --heads label names the one method it became
    assert bench.parse_pairs(["medusa-tuned:medusa", "eagle [16 tok]:target.generate"], labels) == [
        ("medusa-tuned [19 tok]", "medusa [33 tok]"),
        ("eagle [16 tok]", "target.generate"),
    ]
    with pytest.raises(ValueError, match="takes LABEL_A:LABEL_B"):
        bench.parse_pairs(["medusa"], labels)
    with pytest.raises(ValueError, match="no method labelled 'eagle3'"):
        bench.parse_pairs(["eagle3:medusa"], labels)
    with pytest.raises(
        ValueError, match=r"'eagle' is ambiguous, name one of \['eagle \[16 tok\]', 'eagle \[32 tok\]'\]"
    ):
        bench.parse_pairs(["eagle:medusa"], labels)


def test_device_check_small_end_to_end(tmp_path, one_thread):
    """scripts/gpu_check.py's code on the tiny config: greedy identity with the oracle draft (accepted
    deep), a verify-cost row per k for both attention paths, the report written where --out says."""
    out = tmp_path / "new-dir" / "gpu_check.json"
    assert device_check.main(["--small", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["ok"] is True and report["failures"] == {"mismatched_prompts": [], "shallow_prompts": []}
    assert len(report["identity"]) == 2 and all(r["identical"] for r in report["identity"])
    assert all(r["tau"] >= 2.0 for r in report["identity"])  # the oracle's drafts were accepted deep
    rows = report["verify_cost"]["rows"]
    assert [r["k"] for r in rows] == list(range(1, 9)) and report["verify_cost"]["cut_at_k"] is None
    for r in rows:
        assert min(r["tree_attention_ms"], r["float_mask_ms"], r["decode1_ms"]) > 0
    assert report["syncs"]["measured"] is False  # CPU: no sync debug mode


def test_device_check_fails_when_verification_breaks(tmp_path, monkeypatch, one_thread):
    """The check can fail: keeping the KV of the first tree nodes instead of the accepted path (the
    oracle puts a wrong sibling first at every level) changes the output, and the script exits 1."""
    real = infer.runner.compact
    monkeypatch.setattr(
        infer.runner, "compact", lambda cache, past, keep: real(cache, past, torch.arange(keep.shape[0]))
    )
    out = tmp_path / "gpu_check.json"
    assert device_check.main(["--small", "--max-k", "2", "--out", str(out)]) == 1
    report = json.loads(out.read_text())
    assert report["ok"] is False and report["failures"]["mismatched_prompts"] == [0, 1]
    assert all(r["first_difference"] >= 0 for r in report["identity"])


@pytest.fixture(scope="module")
def tiny_demo_heads(tmp_path_factory):
    """Random Medusa heads for the tiny demo target (built and cached on first use)."""
    from heads import MedusaHeads, load_target, save_heads
    from heads.targets import resolve

    target = load_target(resolve("demo-tiny"))
    torch.manual_seed(0)
    heads = MedusaHeads.for_target(target, num_heads=2)
    heads.config.record_target(target)
    out = tmp_path_factory.mktemp("tiny-heads")
    save_heads(heads, str(out))
    return str(out)


def test_demo_generate_and_profile_run(tiny_demo_heads, tmp_path, one_thread, capsys):
    """scripts/demo_generate.py and scripts/profile_generate.py's code on the tiny demo target."""
    common = ["--target", "demo-tiny", "--heads", tiny_demo_heads, "--prompts", "2", "--max-new-tokens", "6"]
    rows = side_by_side.main([*common, "--threads", "1", "--dtype", "fp32"])
    assert len(rows) == 2 and all(r["identical"] for r in rows) and all(r["tau"] >= 1 for r in rows)
    out = capsys.readouterr().out
    assert (
        "exactness (fp32): greedy output token-identical to target.generate: identical outputs 2/2 prompts"
        in out
    )
    assert (
        "exactness (bf16, untimed): greedy output token-identical" in out
    )  # timed in fp32: bf16 counted too
    out = tmp_path / "profile.json"
    results = profile.main(
        [*common, "--dtype", "fp32", "--repeats", "1", "--threads", "1", "--json", str(out)]
    )
    assert json.loads(out.read_text())["speed"] == json.loads(json.dumps(results["speed"]))
    assert (
        set(results["speed"]) == {"target.generate", "medusa"}
        and results["speed"]["medusa"]["identical"] == "2/2"
    )
    split = results["split"]["medusa"]
    assert split["steps"] > 0 and split["verify"] > 0 and split["draft"] > 0
    capsys.readouterr()
    with pytest.raises(SystemExit):
        side_by_side.main(["--target", "demo-tiny"])
    assert "--heads is required" in capsys.readouterr().err  # one line, before any loading


def test_demo_generate_runs_on_the_heads_own_target(tiny_demo_heads, tmp_path, monkeypatch, one_thread):
    """Without --target, scripts/demo_generate.py and scripts/profile_generate.py compare on the target the
    heads were trained on: the demo target with its held-out prompts, any other target on MT-Bench's first
    turns. A demo target named for heads of another model is refused with one line before it is built."""
    import shutil

    from bench.prompt_sets import MT_BENCH, demo_size
    from heads import MedusaHeads, load_target, save_heads
    from heads.targets import resolve

    assert demo_size(tiny_demo_heads, None) == "tiny" and demo_size(tiny_demo_heads, "demo-tiny") == "tiny"
    monkeypatch.setattr(
        side_by_side.demo, "resolve", lambda *a, **k: pytest.fail("the demo target was built")
    )
    refused = r"error: these heads \(vocab 512, hidden 64\) were trained on .*demo-target-tiny-s0', not the 'demo' target"
    for script in (side_by_side, profile):
        with pytest.raises(SystemExit, match=refused):
            script.main(["--heads", tiny_demo_heads, "--target", "demo"])
    monkeypatch.undo()

    other = str(tmp_path / "my-chat-model")  # another target: the tiny demo's weights under another name
    shutil.copytree(resolve("demo-tiny"), other)
    target = load_target(other)
    torch.manual_seed(0)
    heads = MedusaHeads.for_target(target, num_heads=2)
    heads.config.record_target(target)
    save_heads(heads, str(tmp_path / "heads"))
    assert demo_size(str(tmp_path / "heads"), None) is None
    argv = ["--heads", str(tmp_path / "heads"), "--prompts", "2", "--max-new-tokens", "4", "--dtype", "fp32"]
    rows = side_by_side.main([*argv, "--no-bf16-check", "--threads", "1", "--out", str(tmp_path / "o")])
    report = json.loads((tmp_path / "o" / "results.json").read_text())
    assert report["prompts_path"] == MT_BENCH and len(rows) == 2 and all(r["identical"] for r in rows)
    results = profile.main([*argv, "--repeats", "1", "--threads", "1"])
    assert results["speed"]["medusa"]["identical"] == "2/2"


def test_load_prompts_serves_tune_tree_and_the_benchmark(setup, tmp_path):
    """One loader: text rows cut to their first max_tokens tokens, chat rows (OpenAI or ShareGPT turns)
    rendered up to the first assistant turn with the generation prompt, ``skip``/``n`` pick rows; held-out
    data (load_prompts) needs an answer in each chat row, bare benchmark prompts (render_prompt) do not."""
    from transformers import AutoTokenizer

    from infer.prompts import load_prompts, read_prompts, render_prompt

    _, target, _ = setup
    tok = AutoTokenizer.from_pretrained(target)
    path = tmp_path / "p.jsonl"
    chat = [{"role": "user", "content": "def f():\n"}, {"role": "assistant", "content": "    return 1"}]
    share = [{"from": "human", "value": "for i in x:\n"}, {"from": "gpt", "value": "    pass"}]
    rows = [{"text": "def add(a, b):\n    return a + b\n" * 4}, {"messages": chat}, {"conversations": share}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")

    def rendered(messages):
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tok(text, add_special_tokens=False, return_tensors="pt").input_ids

    text_ids, chat_ids, share_ids = load_prompts(str(path), tok, n=3, max_tokens=5)
    assert torch.equal(text_ids, tok(rows[0]["text"], return_tensors="pt").input_ids[:, :5])
    assert torch.equal(chat_ids, rendered(chat[:1]))
    assert torch.equal(share_ids, rendered([{"role": "user", "content": "for i in x:\n"}]))
    assert [p.shape for p in load_prompts(str(path), tok, n=5, skip=1)] == [chat_ids.shape, share_ids.shape]
    whole = render_prompt(read_prompts(str(path))[0], tok, "row 1")  # the benchmark: text rows whole
    assert whole.shape[1] > 5
    bare = {"messages": chat[:1]}  # a benchmark prompt: no answer
    assert torch.equal(render_prompt(bare, tok, "row 1"), chat_ids)
    path.write_text(json.dumps(bare) + "\n")
    with pytest.raises(ValueError, match="p.jsonl row 0: conversation has no assistant turn"):
        load_prompts(str(path), tok, n=1)
    with pytest.raises(ValueError, match="no rows after the first 1"):
        load_prompts(str(path), tok, n=1, skip=1)
    path.write_text(json.dumps({"prompt": "x"}) + "\n")
    with pytest.raises(ValueError, match="row 0: prompts need a non-empty 'text' field or a chat 'messages'"):
        load_prompts(str(path), tok, n=1)
    path.write_text('{"text": "x"}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"p.jsonl:2: each line must be a JSON object"):
        read_prompts(str(path))


def test_target_step_measurements_and_table(one_thread):
    """scripts/bench_target_step.py's measuring code in-process (the script runs each in a subprocess):
    one prefill per way, one verify row per context with every way and the 1-token decode."""
    from bench import target_step

    prefill = [target_step.prefill_child(way, 16, repeats=1) for way in ("full", "lean")]
    assert [p["way"] for p in prefill] == ["full", "lean"] and all(p["time_s"] > 0 for p in prefill)
    (row,) = target_step.verify_child([16], repeats=1)
    assert row["context"] == 16 and row["tree_nodes"] == 16
    for way in [*(f"verify_{w}" for w in target_step.VERIFY_WAYS), "decode1"]:
        assert row[f"{way}_ms"] > 0 and row[f"{way}_min_ms"] <= row[f"{way}_ms"]
    results = {"command": "x", "machine": "m", "prefill": prefill, "verify": [row]}
    md = target_step._markdown(results, [16])
    assert "| 16 |" in md and md.count("\n| 16 |") == 2
