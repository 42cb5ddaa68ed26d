"""Heads trained on the built-in real target load in vLLM 0.33 and SGLang 0.5.23. Slow.

The shipped recipe ``configs/smollm2-eagle31.yaml`` (EAGLE-3.1, a 4096-token draft vocabulary) and, with
``heads.type=eagle heads.eagle.bias=false``, EAGLE-1 train for 2 steps (batch 2, 64 tokens, fp32) on the
real target `smollm2-135m-instruct` (fetched and dequantised once: tests/test_real_target.py's
fixtures) over a few rows the target wrote itself (its greedy answers to a few questions). The heads are
exported with `heads.engine_export.export` (EAGLE-3: the recipe header's ``--to speculators`` command and
``sglang``; EAGLE-1: ``vllm`` and ``sglang``), every export must name the Hub model
``HuggingFaceTB/SmolLM2-135M-Instruct``, and each export is loaded against the dequantised checkpoint by
the engine's own code through tests/test_engines.py's drivers and verdict (vLLM with the header's serve
flags; SGLang with the documented ones): every draft parameter loaded, no checkpoint tensor dropped, the
vocab map inside the target's 49152 ids, the captured hidden states the heads' ``aux_layer_ids``. Each
engine runs once for the exports of both heads.
"""

from __future__ import annotations

import json
import os

import pytest
import test_engines
from conftest import reset_accelerate
from test_real_target import HUB, real, real_dir  # noqa: F401  (module fixtures: the fetched real target)
from test_recipes import _free_port, _serve_args, _starting, header_commands

RECIPE = "smollm2-eagle31"
QUESTIONS = [
    "Write a Python function that reverses a string.",
    "Explain what a hash table is.",
    "Give three tips for writing clear emails.",
    "What is the difference between a list and a tuple in Python?",
    "Describe how a bicycle works.",
]
ENGINES = ("vllm-0.33.0", "sglang-0.5.23")

pytestmark = [pytest.mark.slow, pytest.mark.engines, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def data(real, tmp_path_factory) -> str:  # noqa: F811
    """A chat JSONL of the target's own greedy answers (32 new tokens) to ``QUESTIONS``: 4 train rows and
    1 held out at ``eval_fraction=0.25``."""
    target, tok = real
    path = str(tmp_path_factory.mktemp("data") / "train.jsonl")
    with open(path, "w") as f:
        for q in QUESTIONS:
            chat = [{"role": "user", "content": q}]
            ids = tok.apply_chat_template(
                chat, add_generation_prompt=True, return_tensors="pt", return_dict=True
            )
            out = target.generate(ids["input_ids"], do_sample=False, max_new_tokens=32)
            answer = tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
            f.write(json.dumps({"messages": [*chat, {"role": "assistant", "content": answer}]}) + "\n")
    return path


def _train(data: str, out: str, extra: list[str]):
    from heads.base import load_heads
    from train import train_heads
    from train.config import load_config

    overrides = [
        "target.dtype=float32", f"data.path={data}", "data.max_length=64", "data.num_proc=1",
        "data.eval_fraction=0.25", "train.max_steps=2", "train.batch_size=2", "train.grad_accum=1",
        "train.mixed_precision='no'", "train.num_workers=0", "train.eval_every=0", "train.save_every=0",
        "eval.measured_tau_prompts=0", f"output_dir={out}", *extra,
    ]  # fmt: skip
    cfg = load_config(os.path.join(test_engines.ROOT, "configs", f"{RECIPE}.yaml"), overrides)
    train_heads.train(cfg)
    return cfg, load_heads(out)


def _exports(head: str, heads_dir: str, target: str, tmp) -> dict[str, tuple[str, str]]:
    """engine -> (export dir, serve args against the local checkpoint ``target``): EAGLE-3.1 through the
    recipe header's export and ``vllm serve`` commands, the rest with tests/test_engines.py's flags."""
    from heads.config import parse_cli
    from heads.engine_export import ExportOptions, export

    commands = header_commands(RECIPE)
    method = "eagle" if head == "eagle" else "eagle3"
    formats = {"vllm-0.33.0": "vllm" if method == "eagle" else "speculators", "sglang-0.5.23": "sglang"}
    out = {}
    for engine, to in formats.items():
        draft = str(tmp / f"{head}-{to}")
        export(ExportOptions(heads=heads_dir, to=to, out=draft))
        out[engine] = (draft, test_engines.serve_args(engine, method, target, draft))
    if method == "eagle3":
        (argv,) = _starting(commands, "python", "scripts/export_heads.py")
        header = parse_cli(ExportOptions, argv[2:])
        assert header.to == "speculators"
        (serve,) = _starting(commands, "vllm", "serve")
        assert serve[2] == HUB
        draft = out["vllm-0.33.0"][0]
        out["vllm-0.33.0"] = (draft, _serve_args(serve, target, {header.out: draft}))
    return out


def _named_model(draft: str) -> str | None:
    """The Hub model an export names: speculators' verifier, else ``base_model_name_or_path``."""
    with open(os.path.join(draft, "config.json")) as f:
        config = json.load(f)
    verifier = config.get("speculators_config", {}).get("verifier", {})
    return verifier.get("name_or_path") if verifier else config.get("base_model_name_or_path")


HEADS = ("eagle31", "eagle")


@pytest.fixture(scope="module")
def loaded(real, real_dir, data, tmp_path_factory):  # noqa: F811
    """Both heads trained and exported, then each engine started once for all their exports:
    head -> (training config, heads, {engine: (case id, export dir, the engine's result row)}, expected)."""
    tmp = tmp_path_factory.mktemp("real-engines")
    trained, by_engine, exports, expected = {}, {}, {}, {}
    for head in HEADS:
        extra = ["heads.type=eagle", "heads.eagle3=null", "heads.eagle.bias=false"] if head == "eagle" else []
        cfg, heads = _train(data, str(tmp / head), extra)
        reset_accelerate()  # each training run starts from a clean accelerate state
        trained[head] = (cfg, heads)
        method = cfg.heads.type
        for engine, (draft, args) in sorted(_exports(head, str(tmp / head), real_dir, tmp).items()):
            cid = f"real-{head}-{engine}"
            case = {"id": cid, "method": method, "serve_args": args}
            if method == "eagle":
                case["fc_check"] = test_engines._fc_check(heads, real[0])
            else:
                case["fuse_check"] = test_engines._fuse_check(heads)
                expected[cid] = list(heads.aux_layer_ids)
            by_engine.setdefault(engine, []).append(case)
            exports.setdefault(head, {})[engine] = (cid, draft)
    rows = {}
    for engine, cases in sorted(by_engine.items()):  # one engine process for all its cases
        rows.update(test_engines._run_engine(engine, cases, str(tmp), _free_port()))
    return {
        head: (*trained[head], {e: (cid, d, rows[cid]) for e, (cid, d) in exports[head].items()}, expected)
        for head in HEADS
    }


@pytest.mark.parametrize("head", HEADS)
def test_real_target_heads_load_in_engines(head, loaded):
    cfg, heads, engines, expected = loaded[head]
    assert heads.config.base_model_name_or_path == HUB
    assert heads.config.head_type == cfg.heads.type == ("eagle" if head == "eagle" else "eagle3")
    if head == "eagle31":
        assert heads.config.variant == "eagle3.1" and heads.config.draft_vocab_size == 4096
    assert sorted(engines) == sorted(ENGINES)
    for engine, (cid, draft, row) in sorted(engines.items()):
        assert _named_model(draft) == HUB, f"{engine}: {draft}/config.json names {_named_model(draft)!r}"
        ok, text = test_engines._verdict((cid, head), row, expected)
        assert ok, f"{cid}: {text}\n{row.get('traceback', '')}"
        assert row["target_vocab"] == 49152, row  # the engine built the real target
