"""The recipes for the models users serve (configs/llama-3.1-8b-eagle3.yaml, configs/qwen3-8b-eagle3.yaml,
configs/llama-3.1-8b-eagle.yaml), at tiny scale.

Fast: every command of a recipe's header parses with the parser of what it runs (the script's own options
class, accelerate's launcher, train_heads' arguments, the run config), and the serve commands name the
recipe's model and the matching export directory. Slow: the recipe itself (loaded by `load_config`, with
the overrides a user would give: a local target and data, 2 steps, a draft vocabulary that fits the tiny
vocab) trains on a 3-layer random model of the recipe target's architecture (its transformers config class,
built from a small config; 3 layers: the fewest with EAGLE-3's three distinct aux layers, which the engines
need), is exported with the header's export commands, and is loaded by vLLM 0.33 and
SGLang 0.5.23 with the header's serve flags, through tests/test_engines.py's drivers, each engine run once for all three (cached engine venvs:
the first run installs them, which takes minutes).
"""

from __future__ import annotations

import json
import os
import shlex
import socket

import pytest
import torch
from test_train import WORDS, tiny_target  # noqa: F401  (the session fixture: a tiny model + tokenizer)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = ["llama-3.1-8b-eagle3", "qwen3-8b-eagle3", "llama-3.1-8b-eagle"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def header_commands(name: str) -> list[list[str]]:
    """The commands of a recipe's header (``#   cmd``, continued by a trailing backslash), as argv lists."""
    with open(os.path.join(REPO, "configs", f"{name}.yaml")) as f:
        lines = [line.rstrip("\n") for line in f if line.startswith("#")]
    commands, current = [], ""
    for line in lines:
        if not current and not (line.startswith("#   ") and line[4] != " "):
            continue  # prose
        current += line[1:].strip().rstrip("\\") + " "
        if not line.endswith("\\"):
            commands.append(shlex.split(current))
            current = ""
    return commands


def _starting(commands: list[list[str]], *prefix: str) -> list[list[str]]:
    return [c for c in commands if c[: len(prefix)] == list(prefix)]


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("name", RECIPES)
def test_header_commands_parse(name):
    """Each command of the header parses with what it runs, and the steps connect: the training config is
    this recipe, the data it reads is what regeneration writes, the exports read the trained heads, the
    servers load the exports for the recipe's model."""
    from accelerate.commands.launch import launch_command_parser

    from heads.config import parse_cli
    from heads.engine_export import ExportOptions
    from train.config import load_config
    from train.features import DumpOptions
    from train.regenerate import RegenConfig
    from train.train_heads import parse_args

    commands = header_commands(name)
    recipe = f"configs/{name}.yaml"
    cfg = load_config(os.path.join(REPO, recipe))
    for argv in commands:
        if argv[:2] == ["python", "-m"] or argv[0] == "vllm":
            continue  # the engines' flags: parsed by the engines themselves (the slow test)
        if argv[0] == "accelerate":
            args = launch_command_parser().parse_args(argv[2:])
            assert os.path.isfile(os.path.join(REPO, args.config_file)) and args.num_processes == 8
            script = parse_args(args.training_script_args)
            assert args.training_script == "train/train_heads.py" and script.config == recipe
            load_config(os.path.join(REPO, script.config), script.overrides)
            continue
        assert argv[0] == "python" and os.path.isfile(os.path.join(REPO, argv[1])), argv
        options = {
            "scripts/regenerate_data.py": RegenConfig,
            "scripts/dump_features.py": DumpOptions,
            "scripts/export_heads.py": ExportOptions,
        }[argv[1]]
        opts = parse_cli(options, [a.replace(recipe, os.path.join(REPO, recipe)) for a in argv[2:]])
        if options is RegenConfig:
            assert opts.target == cfg.target.name_or_path and opts.out == cfg.data.path
        if options is ExportOptions:
            assert opts.heads == cfg.output_dir
    exports = {
        _flag(c, "--to"): _flag(c, "--out") for c in _starting(commands, "python", "scripts/export_heads.py")
    }
    (vllm,) = _starting(commands, "vllm", "serve")
    spec = json.loads(_flag(vllm, "--speculative-config"))
    assert vllm[2] == cfg.target.name_or_path and spec["method"] == cfg.heads.type
    assert spec["model"] == exports["speculators" if cfg.heads.type == "eagle3" else "vllm"]
    (sglang,) = _starting(commands, "python", "-m", "sglang.launch_server")
    assert _flag(sglang, "--model-path") == cfg.target.name_or_path
    assert _flag(sglang, "--speculative-draft-model-path") == exports["sglang"]
    assert _flag(sglang, "--speculative-algorithm") == cfg.heads.type.upper()


def tiny_of(model: str, vocab: int):
    """A 3-layer random model of ``model``'s architecture: its transformers config class with small sizes
    (and the family's own features: Llama-3.1's llama3 RoPE scaling, Qwen3's separate head_dim)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    small = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                 pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)  # fmt: skip
    if model.startswith("meta-llama/Llama-3.1"):
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}  # fmt: skip
        config = LlamaConfig(rope_theta=500000.0, rope_scaling=rope, **small)
    elif model.startswith("Qwen/Qwen3-"):
        config = Qwen3Config(head_dim=32, rope_theta=1000000.0, **small)
    else:
        raise AssertionError(f"no tiny architecture for {model}")
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(config)
    m.config.architectures = [type(m).__name__]
    return m


def _sharegpt(path: str, n: int = 24) -> None:
    with open(path, "w") as f:
        for i in range(n):
            words = [WORDS[(i + j) % len(WORDS)] for j in range(16)]
            turns = [
                {"from": "human", "value": " ".join(words[:4])},
                {"from": "gpt", "value": " ".join(words[4:])},
            ]
            f.write(json.dumps({"conversations": turns}) + "\n")


def _serve_args(argv: list[str], target: str, drafts: dict[str, str]) -> str:
    """The header's serve command as the engine drivers take it: local paths, plus the CPU test's flags."""
    if argv[0] == "vllm":
        spec = json.loads(_flag(argv, "--speculative-config"))
        spec["model"] = drafts[spec["model"]]
        rest = [
            a if i != argv.index("--speculative-config") + 1 else json.dumps(spec) for i, a in enumerate(argv)
        ]
        cpu = ["--skip-tokenizer-init", "--dtype", "float32", "--max-model-len", "64", "--enforce-eager"]
        return shlex.join(["--model", target, *rest[3:], *cpu])
    args = argv[3:]
    args[args.index("--model-path") + 1] = target
    draft = args.index("--speculative-draft-model-path") + 1
    args[draft] = drafts[args[draft]]
    return shlex.join([*args, "--device", "cpu", "--skip-tokenizer-init", "--dtype", "float32"])


def _train_and_export(name: str, tokenizer_dir: str, tmp) -> tuple[str, dict[str, dict], dict]:
    """Train ``name``'s recipe for 2 steps on a tiny model of its target's architecture, export with the
    header's commands: (head, {engine: case}, expected aux layers)."""
    import test_engines
    from transformers import AutoTokenizer

    from heads.base import load_heads
    from heads.config import parse_cli
    from heads.engine_export import ExportOptions, export
    from train import train_heads
    from train.config import load_config

    recipe = os.path.join(REPO, "configs", f"{name}.yaml")
    model = load_config(recipe).target.name_or_path
    target = str(tmp / "target")
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(target)
    tiny_of(model, len(tok)).save_pretrained(target)
    data = str(tmp / "data.jsonl")
    _sharegpt(data)

    out = str(tmp / "heads")
    overrides = [
        f"target.name_or_path={target}", "target.dtype=float32", f"data.path={data}", "data.max_length=48",
        "data.num_proc=1", "data.eval_fraction=0.25", "train.max_steps=2", "train.batch_size=2",
        "train.grad_accum=1", "train.mixed_precision='no'", "train.num_workers=0", "train.eval_every=0",
        "train.save_every=0", "eval.measured_tau_prompts=0", f"output_dir={out}",
    ]  # fmt: skip
    cfg = load_config(recipe, overrides)
    if cfg.heads.type == "eagle3":  # the recipe's 32k draft vocabulary exceeds the tiny vocab
        cfg = load_config(recipe, [*overrides, "heads.eagle3.draft_vocab_size=64"])
    train_heads.train(cfg)
    heads = load_heads(out)
    assert heads.config.base_model_name_or_path and heads.config.head_type == cfg.heads.type

    commands = header_commands(name)
    drafts = {}
    for argv in _starting(commands, "python", "scripts/export_heads.py"):
        opts = parse_cli(ExportOptions, argv[2:])
        local = str(tmp / os.path.basename(opts.out))
        export(parse_cli(ExportOptions, [*argv[2:], f"heads={out}", f"out={local}"]))
        drafts[opts.out] = local

    head = "eagle31" if getattr(heads.config, "variant", None) == "eagle3.1" else cfg.heads.type
    method = cfg.heads.type
    by_engine = {}
    for engine, argv in (("vllm-0.33.0", _starting(commands, "vllm", "serve")[0]),
                         ("sglang-0.5.23", _starting(commands, "python", "-m", "sglang.launch_server")[0])):  # fmt: skip
        case = {"id": f"{name}-{engine}", "method": method, "serve_args": _serve_args(argv, target, drafts)}
        if method == "eagle":
            case["fc_check"] = test_engines._fc_check(heads, load_target_for(target))
        if method == "eagle3":
            case["fuse_check"] = test_engines._fuse_check(heads)
        by_engine[engine] = case
    expected = {c["id"]: list(heads.aux_layer_ids) for c in by_engine.values()} if method == "eagle3" else {}
    return head, by_engine, expected


@pytest.fixture(scope="module")
def recipes_loaded(tiny_target, tmp_path_factory, one_thread):  # noqa: F811
    """Every recipe trained and exported, then each engine started once for all of them:
    name -> [(case id, head, the engine's result row, expected aux layers)]."""
    import test_engines
    from conftest import reset_accelerate

    tmp = tmp_path_factory.mktemp("recipes")
    prepared, by_engine = {}, {}
    for name in RECIPES:
        (tmp / name).mkdir()
        prepared[name] = _train_and_export(name, tiny_target, tmp / name)
        reset_accelerate()  # each training run starts from a clean accelerate state
        for engine, case in prepared[name][1].items():
            by_engine.setdefault(engine, []).append(case)
    rows = {}
    for engine, cases in sorted(by_engine.items()):  # one engine process for all the recipes' exports
        rows.update(test_engines._run_engine(engine, cases, str(tmp), _free_port()))
    return {
        name: [(c["id"], head, rows[c["id"]], expected) for _, c in sorted(cases.items())]
        for name, (head, cases, expected) in prepared.items()
    }


@pytest.mark.slow
@pytest.mark.engines
@pytest.mark.parametrize("name", RECIPES)
def test_recipe_trains_exports_and_engines_load(name, recipes_loaded):
    import test_engines

    assert len(recipes_loaded[name]) == 2  # vLLM and SGLang
    for cid, head, row, expected in recipes_loaded[name]:
        ok, text = test_engines._verdict((cid, head), row, expected)
        assert ok, f"{cid}: {text}\n{row.get('traceback', '')}"


def _free_port() -> int:
    with socket.socket() as s:  # other test processes may hold fixed ports
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_target_for(path: str):
    from heads.graft import load_target

    return load_target(path, dtype="float32")
