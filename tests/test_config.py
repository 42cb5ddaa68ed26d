"""Run configuration: defaults, YAML + dotted overrides, validation messages, the shipped recipes."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import types

import pytest
import yaml

from heads.eagle3.config import VARIANTS, Eagle3Config
from heads.medusa.config import MedusaRecipe
from heads.registry import REGISTRY
from train.config import RunConfig, head_blocks, load_config, resolve_demo, to_yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = sorted(glob.glob(os.path.join(REPO, "configs", "*.yaml")))


def _dotted_keys(d: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out |= _dotted_keys(v, f"{prefix}{k}.")
        else:
            out.add(prefix + k)
    return out


def _recipe_keys(cfg: RunConfig) -> set[str]:
    """Every key a recipe of ``cfg``'s head type writes: all of them, but only its own head block, and the
    Medusa-2 ``joint`` block only for head types it applies to."""
    d = dataclasses.asdict(cfg)
    d["heads"] = {"type": cfg.heads.type, cfg.heads.type: d["heads"][cfg.heads.type]}
    if not getattr(REGISTRY[cfg.heads.type], "joint_training", False):
        del d["joint"]
    return _dotted_keys(d)


T = "target.name_or_path=org/model"
D = "data.path=org/data"


def test_defaults():
    """No default target and no default data: a recipe names its own, and leaving either out is one line
    naming the key."""
    with pytest.raises(ValueError, match=r"^target.name_or_path is not set: give it in the recipe.*=\.\.\.$"):
        load_config(None, [D])
    with pytest.raises(
        ValueError, match=r"^data.path is not set: give it in the recipe or as data.path=\.\.\.$"
    ):
        load_config(None, [T])
    cfg = load_config(None, [T, D])
    assert isinstance(cfg, RunConfig)
    assert (cfg.train.lr, cfg.train.warmup_ratio, cfg.train.max_steps) == (1e-3, 0.1, -1)
    assert cfg.data.path == "org/data" and cfg.resume is None
    assert cfg.heads.medusa is None and cfg.heads.block == MedusaRecipe()  # an unset block: its defaults
    assert cfg.heads.head_kwargs() == {"num_heads": 4, "num_layers": 1, "lm_head": "target", "decay": 0.8}


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "target:\n  name_or_path: org/m\ndata:\n  path: org/d\ntrain:\n  lr: 2.0e-3\n  batch_size: 2\noutput_dir: out/a\n"
        "heads:\n  medusa:\n    num_heads: 2\n"
    )
    cfg = load_config(
        str(path), ["train.lr=1e-2", "output_dir=out/b", "train.betas=[0.9,0.95]", "resume=auto"]
    )
    assert cfg.train.lr == 1e-2 and cfg.output_dir == "out/b"  # overrides win over the file
    assert cfg.train.batch_size == 2 and cfg.heads.medusa.num_heads == 2  # the file wins over the defaults
    assert cfg.train.betas == [0.9, 0.95] and cfg.resume == "auto"
    assert cfg.train.grad_accum == 1  # untouched default


def test_to_yaml_round_trip(tmp_path):
    for extra in (["heads.medusa.num_heads=2"], ["heads.type=eagle3", "heads.eagle3.p_eagle.depths=4"]):
        cfg = load_config(None, [T, D, "train.lr=3e-4", "data.max_examples=10", *extra])
        path = tmp_path / "again.yaml"
        path.write_text(to_yaml(cfg))
        assert load_config(str(path)) == cfg


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        (["train.lrr=1"], ValueError, "unknown config key 'train.lrr'; did you mean 'train.lr'?"),
        (["trian.lr=1"], ValueError, "did you mean 'train'?"),
        (["train.lr=fast"], ValueError, "bad config value for 'train.lr'"),
        (["train.batch_size=2.5"], ValueError, "bad config value for 'train.batch_size'"),
        (["train.lr=-1"], ValueError, "train.lr must be > 0"),
        (["train.warmup_ratio=1.5"], ValueError, "train.warmup_ratio must be in [0, 1)"),
        (["train.max_steps=0"], ValueError, "train.max_steps must be > 0, or -1"),
        (["train.betas=[0.9]"], ValueError, "train.betas must be two numbers"),
        (["train.mixed_precision=fp8"], ValueError, "train.mixed_precision must be one of"),
        (["heads.medusa.decay=0"], ValueError, "heads.medusa: decay must be in (0, 1]"),
        (["heads.medusa.num_heads=0"], ValueError, "heads.medusa: num_heads must be >= 1"),
        (["heads.medusa.lm_head=mine"], ValueError, "bad config value for 'heads.medusa.lm_head'"),
        (["heads.type=nope"], ValueError, "heads.type 'nope' is unknown"),
        (
            ["heads.type=eagle3", "heads.eagle3.width=3"],
            ValueError,
            "unknown config key 'heads.eagle3.width'",
        ),
        # a key in the wrong block names the block it belongs in
        (["heads.num_heads=5"], ValueError, "'num_heads' is a key of heads.medusa, not of heads"),
        (
            ["heads.type=eagle3", "heads.eagle3.num_heads=5"],
            ValueError,
            "unknown config key 'heads.eagle3.num_heads': 'num_heads' is a key of heads.medusa, not of heads.eagle3",
        ),
        (["train.decay=0.5"], ValueError, "'decay' is a key of heads.medusa, not of train"),
        (["heads.ttt_steps=3"], ValueError, "'ttt_steps' is a key of heads.eagle3, not of heads"),
        (
            ["heads.type=eagle", "heads.medusa.num_heads=5"],
            ValueError,
            "heads.medusa is set but heads.type is 'eagle'",
        ),
        (["heads.type=eagle3", "heads.eagle3.variant=eagle4"], ValueError, "'heads.eagle3.variant'"),
        (
            ["heads.type=eagle3", "heads.eagle3.p_eagle.depths=1"],
            ValueError,
            "heads.eagle3.p_eagle.depths must be",
        ),
        (
            ["heads.type=eagle3", "heads.eagle3.ttt_steps=0"],
            ValueError,
            "heads.eagle3: ttt_steps must be >= 1",
        ),
        (["target.dtype=int8"], ValueError, "target.dtype must be one of"),
        (["target.name_or_path="], ValueError, "bad config value for 'target.name_or_path'"),
        (["data.format=xml"], ValueError, "data.format must be one of"),
        (["report_to=tensorboard"], ValueError, "report_to must be one of none, wandb"),
        (["resume=/nonexistent/ckpt"], FileNotFoundError, "resume: checkpoint directory not found"),
        (["lr"], ValueError, "overrides must look like key=value"),
    ],
)
def test_errors_name_the_key(overrides, error, message):
    with pytest.raises(error) as e:
        load_config(None, [T, D, *overrides])
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_yaml_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="config file not found"):
        load_config(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  lr: [1,\n")
    with pytest.raises(ValueError, match="is not valid YAML"):
        load_config(str(bad))
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("train:\n  learning_rate: 1.0e-3\n")
    with pytest.raises(ValueError, match="unknown config key 'train.learning_rate'"):
        load_config(str(unknown))


def test_every_trainable_head_type_has_a_block():
    """Each trainable registry entry has a typed block in `HeadsConfig`, whose defaults are its config's."""
    trainable = {n for n, e in REGISTRY.items() if getattr(e, "objective", None) is not None}
    blocks = head_blocks()
    assert set(blocks) == trainable
    for name, block in blocks.items():
        cls = REGISTRY[name].config
        assert cls(**block().head_kwargs()) == cls(), name


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_eagle3_variant_and_p_eagle(variant):
    """``variant`` names EAGLE-3.1's two options and ``p_eagle.depths`` is P-EAGLE's parallel_draft: the
    head config they build is the one the flags built."""
    cfg = load_config(None, [T, D, "heads.type=eagle3", f"heads.eagle3.variant={variant}"])
    kwargs = cfg.heads.head_kwargs()
    assert Eagle3Config(**kwargs).variant == variant and kwargs["parallel_draft"] == 0
    assert (kwargs["fc_norm"], kwargs["norm_output"]) == VARIANTS[variant]
    pe = load_config(None, [T, D, "heads.type=eagle3", "heads.eagle3.p_eagle.depths=6"]).heads.head_kwargs()
    assert pe["parallel_draft"] == 6 and Eagle3Config(**pe).unroll_steps == 6
    assert (
        load_config(None, [T, D, "heads.type=eagle3", "heads.eagle3.p_eagle={}"]).heads.eagle3.p_eagle.depths
        == 8
    )


def test_registered_but_untrainable_head_type(monkeypatch):
    from heads.registry import REGISTRY

    medusa = REGISTRY["medusa"]  # an entry without a training objective is registered, not trainable
    monkeypatch.setitem(REGISTRY, "other", types.SimpleNamespace(config=medusa.config, module=medusa.module))
    with pytest.raises(ValueError, match="training 'other' heads is not implemented yet"):
        load_config(None, [T, D, "heads.type=other"])


def test_resolve_demo_names(monkeypatch):
    calls = []
    import demo

    monkeypatch.setattr(
        demo,
        "ensure_demo_target",
        lambda size, cache=None: calls.append(("target", size)) or f"/cache/target-{size}",
    )
    monkeypatch.setattr(
        demo,
        "ensure_demo_data",
        lambda size, cache=None: (
            calls.append(("data", size))
            or {"train": f"/cache/{size}/train.jsonl", "eval": f"/cache/{size}/eval.jsonl", "prompts": "p"}
        ),
    )

    cfg = load_config(None, ["target.name_or_path=demo-tiny", "data.path=demo-tiny"])
    out = resolve_demo(cfg)
    assert out.target.name_or_path == "/cache/target-tiny"
    assert (out.data.path, out.data.eval_path) == ("/cache/tiny/train.jsonl", "/cache/tiny/eval.jsonl")
    assert cfg.target.name_or_path == "demo-tiny"  # the input is not modified
    assert calls == [("target", "tiny"), ("data", "tiny")]

    calls.clear()
    other = resolve_demo(load_config(None, ["target.name_or_path=org/model", "data.path=demo"]))
    assert other.target.name_or_path == "org/model" and other.data.path == "/cache/full/train.jsonl"
    assert calls == [("data", "full")]


@pytest.mark.parametrize("path", RECIPES, ids=os.path.basename)
def test_shipped_recipes(path):
    """Each recipe loads, says how to launch it, writes down every key that applies to its head type (no
    other head type's block, no Medusa-2 ``joint`` block for heads it does not apply to), comments every
    key, and every repository path its comments cite exists."""
    name = os.path.relpath(path, REPO)
    cfg = load_config(path)
    with open(path) as f:
        lines = f.read().splitlines()
    assert lines[0].startswith("# ")
    launch = [line for line in lines if line.startswith("#") and "train/train_heads.py" in line]
    assert launch and any(f"--config {name}" in line for line in lines if line.startswith("#")), name
    with open(path) as f:
        written = _dotted_keys(yaml.safe_load(f))
    assert written == _recipe_keys(cfg), written ^ _recipe_keys(cfg)
    for line in lines:
        if (
            line.strip()
            and not line.lstrip().startswith("#")
            and ":" in line
            and not line.rstrip().endswith(":")
        ):
            assert "#" in line, f"{name}: uncommented key: {line!r}"
    comments = " ".join(line.split("#", 1)[1] for line in lines if "#" in line)
    cited = re.findall(
        r"\b(?:heads|train|infer|scripts|configs|docs|results|tests|demo)/[\w./-]*\w/?", comments
    )
    missing = [p for p in cited if not os.path.exists(os.path.join(REPO, p))]
    assert not missing, f"{name} cites paths that do not exist: {missing}"
    assert REGISTRY[cfg.heads.type].objective is not None  # trainable


def test_recipe_values():
    tiny = load_config(os.path.join(REPO, "configs/demo-medusa-tiny.yaml"))
    demo = load_config(os.path.join(REPO, "configs/demo-medusa.yaml"))
    assert (tiny.target.name_or_path, tiny.data.path, tiny.report_to) == ("demo-tiny", "demo-tiny", "none")
    assert (demo.target.name_or_path, demo.data.path, demo.report_to) == ("demo", "demo", "none")
    # the recipes for served models: EAGLE-3.1 (and EAGLE-1 without fc bias, vLLM's layout), bf16, ShareGPT
    for name, model, variant in [
        ("llama-3.1-8b-eagle3", "meta-llama/Llama-3.1-8B-Instruct", "eagle3.1"),
        ("qwen3-8b-eagle3", "Qwen/Qwen3-8B", "eagle3.1"),
        ("llama-3.1-8b-eagle", "meta-llama/Llama-3.1-8B-Instruct", None),
    ]:
        cfg = load_config(os.path.join(REPO, f"configs/{name}.yaml"))
        assert (cfg.target.name_or_path, cfg.target.dtype, cfg.train.mixed_precision) == (
            model,
            "bf16",
            "bf16",
        )
        assert cfg.data.format == "sharegpt" and cfg.output_dir == f"out/{name}"
        kwargs = cfg.heads.head_kwargs()
        if variant:
            assert Eagle3Config(**kwargs).variant == variant and kwargs["parallel_draft"] == 0
        else:
            assert (
                cfg.heads.type == "eagle" and kwargs["bias"] is False and kwargs["draft_vocab_size"] is None
            )


@pytest.mark.parametrize("stage", [2, 3])
def test_accelerate_deepspeed_configs(stage):
    path = os.path.join(REPO, f"configs/accelerate/deepspeed_zero{stage}.yaml")
    with open(path) as f:
        text = f.read()
    acc = yaml.safe_load(text)
    assert acc["distributed_type"] == "DEEPSPEED"
    assert "mixed_precision" not in acc  # accelerate rejects it next to a deepspeed_config_file
    assert acc["deepspeed_config"]["zero3_init_flag"] is False
    assert "--num_processes 2" in text and "DS_ACCELERATOR=cpu" in text
    with open(os.path.join(REPO, acc["deepspeed_config"]["deepspeed_config_file"])) as f:
        ds = json.load(f)  # the path is relative to the repo root, where launches start
    assert ds["zero_optimization"]["stage"] == stage
    assert ds["bf16"]["enabled"] == "auto"  # follows train.mixed_precision
    if stage == 3:
        assert ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
