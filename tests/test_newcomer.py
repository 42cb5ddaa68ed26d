"""What a newcomer trips on. The README's `accelerate launch` is quiet; the demo target's names
work wherever a target is accepted; `infer.load(heads=dir)` finds the target the heads were trained on."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SINGLE = os.path.join("configs", "accelerate", "single_process.yaml")
NOISE = "had defaults used instead"


def _launch(tmp_path, *config: str) -> subprocess.CompletedProcess:
    """The real `accelerate launch` of a one-line script, with no accelerate config of the user's
    (HF_HOME points to an empty directory, so ~/.cache/huggingface/accelerate is not read)."""
    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *config, str(script)]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=True)


def test_shipped_single_process_config_makes_accelerate_launch_quiet(tmp_path):
    assert NOISE in _launch(tmp_path).stderr  # what a newcomer saw
    quiet = _launch(tmp_path, "--config_file", SINGLE)
    assert quiet.stdout.strip() == "hello" and NOISE not in quiet.stderr, quiet.stderr
    readme = open(os.path.join(REPO, "README.md")).read()
    first = readme.split("## Set-up: two commands", 1)[1].split("```bash\n", 1)[1].split("\n", 1)[0]
    # --quiet: a config error is the training script's one line, without the launcher's traceback
    assert f"accelerate launch --quiet --config_file {SINGLE} train/train_heads.py" in first


@pytest.fixture(scope="module")
def demo_heads(tmp_path_factory):
    """Medusa heads (untrained) for the tiny demo target, saved the way training saves them."""
    from heads.base import save_heads
    from heads.graft import load_target
    from heads.medusa import MedusaHeads
    from heads.targets import resolve

    path = resolve("demo-tiny")
    target = load_target(path)
    torch.manual_seed(0)
    heads = MedusaHeads.for_target(target, num_heads=2)
    heads.config.record_target(target)
    out = tmp_path_factory.mktemp("heads")
    save_heads(heads, str(out))
    return str(out), path


def _with_base(directory: str, base: str | None, out) -> str:
    """A copy of the heads in ``directory`` whose config records ``base`` as the target."""
    import json
    import shutil

    shutil.copytree(directory, out)
    cfg_path = os.path.join(out, "config.json")
    cfg = json.load(open(cfg_path))
    cfg["base_model_name_or_path"] = base
    json.dump(cfg, open(cfg_path, "w"))
    return str(out)


def _greedy_same(model) -> None:
    ids = torch.tensor([[1, 5, 9, 11]])
    got = __import__("infer").generate(model, ids, max_new_tokens=8, do_sample=False).sequences
    assert torch.equal(got, model.target.generate(ids, max_new_tokens=8, do_sample=False))


def test_infer_load_accepts_the_demo_names(demo_heads):
    import infer

    directory, path = demo_heads
    model = infer.load("demo-tiny", heads=directory, dtype="float32")
    assert os.path.samefile(model.target.config._name_or_path, path) and model.tokenizer is not None
    _greedy_same(model)


def test_infer_load_finds_the_target_from_the_heads(demo_heads, tmp_path):
    import infer

    directory, path = demo_heads
    model = infer.load(heads=directory, dtype="float32")  # the recorded path exists here
    assert os.path.samefile(model.target.config._name_or_path, path)
    _greedy_same(model)
    named = infer.load(heads=_with_base(directory, "demo-tiny", tmp_path / "named"), dtype="float32")
    assert os.path.samefile(named.target.config._name_or_path, path)
    with pytest.raises(ValueError, match="which is not on this machine: pass target="):
        infer.load(heads=_with_base(directory, "/nowhere/target", tmp_path / "gone"))
    with pytest.raises(ValueError, match="names no target"):
        infer.load(heads=_with_base(directory, None, tmp_path / "none"))
    with pytest.raises(ValueError, match="heads= is required"):
        infer.load("demo-tiny")
    # heads from a Hub snapshot never send the loader to a path on this disk
    from infer import _recorded_target

    with pytest.raises(ValueError, match="not followed for Hub heads"):
        _recorded_target(str(_with_base(directory, path, tmp_path / "hub")), None, from_hub=True)


def test_scripts_accept_the_demo_names(demo_heads):
    from infer.head_accuracy import load_all  # what eval_heads.py and tune_tree.py load with

    directory, path = demo_heads
    heads, target, tokenizer, _ = load_all(directory, "demo-tiny", "float32")
    assert os.path.samefile(target.config._name_or_path, path) and len(tokenizer) > 0
