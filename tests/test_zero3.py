"""DeepSpeed ZeRO-3 (and ZeRO-2 where test_train.py has no such case) under `accelerate launch`, 2 CPU
processes: Medusa and EAGLE-3 heads train, one rank is killed with SIGKILL after a checkpoint, the run
resumes with --resume and ends with heads bit-identical to an uninterrupted run's, and the final heads
load with `heads.load_heads`. Medusa-2 (joint LoRA training) under ZeRO-3 is refused with its reason.

The kill: the launched script is train/train_heads.py's ``main`` behind a wrapper that sends SIGKILL to
rank 1 right after optimizer step ``KILL_AT`` (the step-2 checkpoint is complete, step 4's is not), as a
crashed or preempted worker would die; the launcher then stops rank 0. 4 steps, a checkpoint every 2.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import test_train
from safetensors.torch import load_file
from test_train import REPO, _assert_same_heads, _metrics, _overrides

pytestmark = [
    pytest.mark.slow,
    # the 2-layer tiny target has no 3 distinct layer inputs for EAGLE-3's aux layers (tested elsewhere)
    pytest.mark.filterwarnings("ignore:aux_layer_ids .* not strictly increasing:UserWarning"),
]

tiny_target, tiny_data = test_train.tiny_target, test_train.tiny_data  # session-scoped fixtures

KILL_AT = 3
KILLER = """\
import os, signal, sys
from train import train_heads

real_after_step = train_heads.after_step


def after_step(run, has_eval):
    real_after_step(run, has_eval)
    if run.step == {step} and run.accelerator.process_index == 1:
        os.kill(os.getpid(), signal.SIGKILL)


train_heads.after_step = after_step
train_heads.main(sys.argv[1:])
"""


def launch(stage: int, script: str, overrides: list[str], port: int) -> subprocess.CompletedProcess:
    """`accelerate launch --config_file configs/accelerate/deepspeed_zero{stage}.yaml --num_processes 2`
    of ``script`` on DeepSpeed's CPU accelerator, from the repository root (the yaml's paths are
    relative to it)."""
    cache = os.environ.get("SELFSPEC_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "selfspec")
    env = dict(
        os.environ,
        DS_ACCELERATOR="cpu",
        TORCH_EXTENSIONS_DIR=os.environ.get("TORCH_EXTENSIONS_DIR", os.path.join(cache, "torch_extensions")),
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
        PYTHONPATH=REPO,
    )
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", os.path.join(REPO, f"configs/accelerate/deepspeed_zero{stage}.yaml"),
        "--num_processes", "2", "--main_process_port", str(port), script, *overrides,
    ]  # fmt: skip
    return subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)


def run_overrides(target: str, data: str, out: str, head_type: str) -> list[str]:
    extra = {"train.max_steps": 4, "train.save_every": 2, "train.log_every": 1, "train.eval_every": 0}
    if head_type == "eagle3":
        extra |= {"heads.type": "eagle3", "heads.eagle3.draft_vocab_size": 64, "heads.eagle3.ttt_steps": 2,
                  "train.lr": 1e-2}  # fmt: skip
    return _overrides(target, data, out, **extra)  # keeps only the block of the run's head type


@pytest.mark.parametrize(
    ("stage", "head_type", "port"), [(3, "medusa", 29541), (3, "eagle3", 29543), (2, "eagle3", 29545)]
)
def test_kill_a_rank_then_resume_is_bit_identical(stage, head_type, port, tiny_target, tiny_data, tmp_path):
    from heads.base import load_heads
    from heads.graft import load_target

    full, killed = str(tmp_path / "full"), str(tmp_path / "killed")
    train_script = os.path.join(REPO, "train", "train_heads.py")
    proc = launch(stage, train_script, run_overrides(tiny_target, tiny_data, full, head_type), port)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    assert "2 process(es)" in log and f"DeepSpeed ZeRO-{stage}" in log, log[-3000:]

    killer = tmp_path / "killer.py"
    killer.write_text(KILLER.format(step=KILL_AT))
    proc = launch(stage, str(killer), run_overrides(tiny_target, tiny_data, killed, head_type), port)
    assert proc.returncode != 0, (proc.stdout + proc.stderr)[-3000:]
    assert os.listdir(os.path.join(killed, "checkpoints")) == ["step-2"]
    assert not os.path.exists(os.path.join(killed, "model.safetensors"))
    assert [r["step"] for r in _metrics(killed) if "train/loss" in r][-1] >= KILL_AT  # died after step 3

    proc = launch(stage, train_script, ["--resume", *run_overrides(tiny_target, tiny_data, killed, head_type)],
                  port)  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "resumed from" in proc.stdout and "at step 2" in proc.stdout, log[-6000:]
    assert [r["step"] for r in _metrics(killed) if "train/loss" in r] == [1, 2, 3, 4]
    _assert_same_heads(full, killed)

    target = load_target(tiny_target)
    heads = load_heads(killed, target)
    assert heads.config.head_type == head_type
    saved = load_file(os.path.join(killed, "model.safetensors"))
    state = heads.state_dict()
    for k, v in saved.items():
        assert state[k].dtype == v.dtype and (state[k] == v).all(), k


def test_medusa2_under_zero3_is_refused(tiny_target, tiny_data, tmp_path):
    """Joint LoRA training is refused under ZeRO-3 (its adapter would be partitioned), in one line."""
    out = str(tmp_path / "run")
    overrides = _overrides(tiny_target, tiny_data, out, **{"joint.enabled": "true", "joint.lora_r": 4})
    proc = launch(3, os.path.join(REPO, "train", "train_heads.py"), overrides, 29547)
    assert proc.returncode != 0
    assert (
        "error: joint training (joint.enabled) is not supported under DeepSpeed ZeRO-3 (untested: the LoRA "
        "backbone would be partitioned and its adapter would have to be gathered to save); use ZeRO-2"
    ) in proc.stderr, proc.stderr[-3000:]
    assert not os.path.exists(os.path.join(out, "checkpoints"))
