"""Run configuration: defaults, YAML + dotted overrides, validation messages, the shipped recipes."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import types

import pytest
import yaml

from heads.registry import REGISTRY
from train.config import HeadsConfig, RunConfig, load_config, resolve_demo, to_yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = sorted(glob.glob(os.path.join(REPO, "configs", "*.yaml")))


def _dotted_fields(cls, prefix: str = "") -> set[str]:
    out = set()
    for f in dataclasses.fields(cls):
        sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if sub is not None and dataclasses.is_dataclass(sub):
            out |= _dotted_fields(sub, f"{prefix}{f.name}.")
        else:
            out.add(prefix + f.name)
    return out


def _dotted_keys(d: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in d.items():
        if isinstance(v, dict) and v and k != "options":
            out |= _dotted_keys(v, f"{prefix}{k}.")
        else:
            out.add(prefix + k)
    return out


def test_defaults():
    cfg = load_config()
    assert isinstance(cfg, RunConfig)
    assert (cfg.train.lr, cfg.train.warmup_ratio, cfg.train.decay, cfg.train.max_steps) == (
        1e-3,
        0.1,
        0.8,
        -1,
    )
    assert cfg.target.name_or_path == "demo" and cfg.data.path == "demo" and cfg.resume is None
    assert cfg.heads.head_kwargs() == {"num_heads": 4, "num_layers": 1, "lm_head": "target"}


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  lr: 2.0e-3\n  batch_size: 2\noutput_dir: out/a\nheads:\n  num_heads: 2\n")
    cfg = load_config(
        str(path), ["train.lr=1e-2", "output_dir=out/b", "train.betas=[0.9,0.95]", "resume=auto"]
    )
    assert cfg.train.lr == 1e-2 and cfg.output_dir == "out/b"  # overrides win over the file
    assert cfg.train.batch_size == 2 and cfg.heads.num_heads == 2  # the file wins over the defaults
    assert cfg.train.betas == [0.9, 0.95] and cfg.resume == "auto"
    assert cfg.train.grad_accum == 1  # untouched default


def test_to_yaml_round_trip(tmp_path):
    cfg = load_config(None, ["train.lr=3e-4", "heads.num_heads=2", "data.max_examples=10"])
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
        (["train.decay=0"], ValueError, "train.decay must be in (0, 1]"),
        (["heads.num_heads=0"], ValueError, "num_heads must be >= 1"),
        (["heads.lm_head=mine"], ValueError, "lm_head must be 'target'"),
        (["heads.type=nope"], ValueError, "heads.type 'nope' is unknown"),
        (["heads.options.width=3"], ValueError, "heads.options has keys ['width']"),
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
        load_config(None, overrides)
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


def test_heads_options_reach_other_head_types(monkeypatch):
    """A new head type needs no new fields here: its own keywords go through heads.options."""
    from heads.base import HeadConfig
    from heads.registry import REGISTRY

    @dataclasses.dataclass
    class FakeConfig(HeadConfig):
        head_type = "fake"
        depth: int = 1
        num_layers: int = 1

        def __post_init__(self):
            if self.depth < 1:
                raise ValueError("depth must be >= 1")

    fake = types.SimpleNamespace(config=FakeConfig, module=object, objective=object())  # trainable
    monkeypatch.setitem(REGISTRY, "fake", fake)
    h = HeadsConfig(type="fake", num_layers=2, options={"depth": 3})
    assert h.head_kwargs() == {"num_layers": 2, "depth": 3}
    with pytest.raises(ValueError, match="heads.num_heads does not apply to 'fake' heads"):
        HeadsConfig(type="fake", num_heads=5)
    with pytest.raises(ValueError, match="heads: depth must be >= 1"):
        HeadsConfig(type="fake", options={"depth": 0})
    with pytest.raises(ValueError, match="valid: \\['depth'\\]"):
        HeadsConfig(type="fake", options={"width": 0})


def test_registered_but_untrainable_head_type(monkeypatch):
    from heads.registry import REGISTRY

    medusa = REGISTRY["medusa"]  # an entry without a training objective is registered, not trainable
    monkeypatch.setitem(REGISTRY, "other", types.SimpleNamespace(config=medusa.config, module=medusa.module))
    with pytest.raises(ValueError, match="training 'other' heads is not implemented yet"):
        load_config(None, ["heads.type=other"])


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
    """Each recipe loads, says how to launch it, writes down every key, and comments every key."""
    name = os.path.relpath(path, REPO)
    cfg = load_config(path)
    with open(path) as f:
        lines = f.read().splitlines()
    assert lines[0].startswith("# ")
    launch = [line for line in lines if line.startswith("#") and "train/train_heads.py" in line]
    assert launch and any(f"--config {name}" in line for line in lines if line.startswith("#")), name
    with open(path) as f:
        written = _dotted_keys(yaml.safe_load(f))
    assert written == _dotted_fields(RunConfig), written ^ _dotted_fields(RunConfig)
    for line in lines:
        if (
            line.strip()
            and not line.lstrip().startswith("#")
            and ":" in line
            and not line.rstrip().endswith(":")
        ):
            assert "#" in line, f"{name}: uncommented key: {line!r}"
    assert REGISTRY[cfg.heads.type].objective is not None  # trainable


def test_recipe_values():
    tiny = load_config(os.path.join(REPO, "configs/demo-medusa-tiny.yaml"))
    demo = load_config(os.path.join(REPO, "configs/demo-medusa.yaml"))
    llama = load_config(os.path.join(REPO, "configs/llama-3-8b-medusa.yaml"))
    assert (tiny.target.name_or_path, tiny.data.path, tiny.report_to) == ("demo-tiny", "demo-tiny", "none")
    assert (demo.target.name_or_path, demo.data.path, demo.report_to) == ("demo", "demo", "none")
    # Medusa-1: lr 1e-3, cosine with 10% warm-up, bf16, 5 heads of 1 layer.
    assert (llama.train.lr, llama.train.warmup_ratio, llama.train.mixed_precision) == (1e-3, 0.1, "bf16")
    assert (llama.heads.num_heads, llama.heads.num_layers, llama.target.dtype) == (5, 1, "bf16")
    assert (
        llama.target.name_or_path == "meta-llama/Meta-Llama-3-8B-Instruct" and llama.data.format == "sharegpt"
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
