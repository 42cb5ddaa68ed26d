"""Training runs fail safe: a run owns its output_dir, a resume reads nothing that can run code,
a full disk costs no checkpoint, and input problems are one line before any data is read.

Reuses the tiny random Llama + BPE tokenizer and the cyclic-words data of `tests/test_train.py`. Poisoned
files are pickles that would create a marker file if they were ever unpickled with code.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
import test_train
import torch
from conftest import reset_accelerate
from test_train import REPO, _kill_after_checkpoint, _metrics, _overrides

tiny_target, tiny_data = test_train.tiny_target, test_train.tiny_data
_fresh_accelerate_state = test_train._fresh_accelerate_state

SHORT = {"train.max_steps": 4, "train.save_every": 2, "train.eval_every": 2, "train.log_every": 1}


def _refusal(argv: list[str]) -> str:
    """Run train_heads.main(argv), which must refuse with one line; return it."""
    from train import train_heads

    with pytest.raises(SystemExit) as e:
        train_heads.main(argv)
    reset_accelerate()
    text = str(e.value.code)
    assert text.startswith("error: ") and "\n" not in text, text
    return text


def _tree_digest(path: str) -> dict[str, str]:
    """{relative path: sha256} of every file under ``path``."""
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = hashlib.sha256(f.read()).hexdigest()
    return out


def _no_data_loading(monkeypatch) -> None:
    """Fail the test if the run gets as far as reading (tokenizing) the data."""
    import train.data

    def forbidden(*args, **kwargs):
        raise AssertionError("the data was loaded before the error")

    monkeypatch.setattr(train.data, "build_datasets", forbidden)


def _killed_at_step_2(target: str, data: str, out: str, **extra) -> None:
    """A run of `SHORT` that dies right after its step-2 checkpoint."""
    from train import train_heads

    with pytest.MonkeyPatch.context() as mp:
        _kill_after_checkpoint(mp, train_heads, at_step=2)
        with pytest.raises(KeyboardInterrupt):
            train_heads.main(_overrides(target, data, out, **{**SHORT, **extra}))
    reset_accelerate()


# ---------------------------------------------------------------------------------------------- ownership


def test_a_run_owns_its_output_dir(tiny_target, tiny_data, tmp_path, monkeypatch):
    """A second run in a used output_dir is refused (same or other config) before any data is
    read, the first run's files untouched; overwrite=true wipes it and leaves only the new run's state."""
    from train import train_heads

    out = str(tmp_path / "run")
    _killed_at_step_2(tiny_target, tiny_data, out)
    before = _tree_digest(out)
    with monkeypatch.context() as mp:
        _no_data_loading(mp)
        other = _refusal(_overrides(tiny_target, tiny_data, out, **{**SHORT, "train.lr": 0.01}))
        same = _refusal(_overrides(tiny_target, tiny_data, out, **SHORT))
        resume_other = _refusal(
            ["--resume", *_overrides(tiny_target, tiny_data, out, **SHORT, **{"train.lr": 0.01})]
        )
    assert out in other and "different config (train.lr: 0.05 -> 0.01)" in other and "overwrite=true" in other
    assert "--resume" in same and "overwrite=true" in same
    assert "train.lr: 0.05 -> 0.01" in resume_other
    assert _tree_digest(out) == before

    # overwrite=true: the old run's checkpoints are gone; every checkpoint is the new run's.
    train_heads.main(_overrides(tiny_target, tiny_data, out, overwrite="true", **{**SHORT, "train.lr": 0.01}))
    reset_accelerate()
    steps = sorted(os.listdir(os.path.join(out, "checkpoints")))
    assert steps == ["step-2", "step-4"]
    for s in steps:
        with open(os.path.join(out, "checkpoints", s, "trainer_state.json")) as f:
            assert json.load(f)["config"]["train.lr"] == 0.01
    assert [r["step"] for r in _metrics(out) if "train/loss" in r] == [1, 2, 3, 4]  # no old run's rows


def test_resume_refuses_another_runs_checkpoint_naming_the_keys(
    tiny_target, tiny_data, tmp_path, monkeypatch
):
    """Resume=PATH of another run's checkpoint, and resume=auto after changing the head
    config (num_heads; EAGLE heads in a Medusa run's dir), name the differing keys in one line."""
    a = str(tmp_path / "a")
    _killed_at_step_2(tiny_target, tiny_data, a)
    step2 = os.path.join(a, "checkpoints", "step-2")
    with monkeypatch.context() as mp:
        _no_data_loading(mp)
        more_heads = _refusal(
            ["--resume", *_overrides(tiny_target, tiny_data, a, **SHORT, **{"heads.medusa.num_heads": 4})]
        )
        eagle = _refusal(
            [
                "--resume",
                *_overrides(tiny_target, tiny_data, a, **SHORT, **{"heads.type": "eagle"}),
            ]
        )
    assert "heads.medusa.num_heads: 3 -> 4" in more_heads, more_heads
    assert "heads.type: 'medusa' -> 'eagle'" in eagle, eagle
    # A new output_dir resuming from a's checkpoint with another config: refused when the checkpoint is read.
    b = str(tmp_path / "b")
    text = _refusal(
        _overrides(tiny_target, tiny_data, b, resume=step2, **SHORT, **{"heads.medusa.num_heads": 4})
    )
    assert (
        f"checkpoint {step2} belongs to a run with a different config (heads.medusa.num_heads: 3 -> 4" in text
    )


def test_unrelated_directory_is_refused_and_untouched(tiny_target, tiny_data, tmp_path, monkeypatch):
    """A non-empty directory that is no selfspec run is refused before any work, with or
    without overwrite=true, and none of its files changes."""
    mine = tmp_path / "my-project"
    mine.mkdir()
    (mine / "README.md").write_text("# my project\n")
    (mine / "notes.txt").write_text("do not lose me\n")
    before = _tree_digest(str(mine))
    _no_data_loading(monkeypatch)
    for extra in ({}, {"overwrite": "true"}):
        text = _refusal(_overrides(tiny_target, tiny_data, str(mine), **extra))
        assert str(mine) in text and "not a selfspec run" in text, text
    assert _tree_digest(str(mine)) == before and sorted(os.listdir(mine)) == ["README.md", "notes.txt"]


def test_resuming_a_finished_run_is_a_no_op(tiny_target, tiny_data, tmp_path, monkeypatch, capsys):
    """--resume on a finished run whose best-τ step was not the last (output_dir/best is gone)
    says so in one line and exits 0, changing nothing."""
    from train import train_heads

    real_evaluate = train_heads.evaluate
    monkeypatch.setattr(  # the step-2 eval is the best by τ, so the saved heads come from best/
        train_heads,
        "evaluate",
        lambda run: (
            (ev := real_evaluate(run)) | {"sim_accept_length": ev["sim_accept_length"] + 5 * (run.step == 2)}
        ),
    )
    out = str(tmp_path / "run")
    short = SHORT | {"eval.measured_tau_prompts": 0}  # the best heads by the simulated τ (patched)
    train_heads.main(_overrides(tiny_target, tiny_data, out, **short))
    reset_accelerate()
    with open(os.path.join(out, "eval_results.json")) as f:
        assert json.load(f)["step"] == 2  # the case that crashed: best step 2, last step 4
    before = _tree_digest(out)
    capsys.readouterr()
    assert train_heads.main(["--resume", *_overrides(tiny_target, tiny_data, out, **short)]) is None
    said = capsys.readouterr().out.strip().splitlines()
    assert said == [
        f"output_dir {out} holds the finished run (step 4): nothing to resume; its heads are in place (overwrite=true trains again)"
    ]
    assert _tree_digest(out) == before


# ---------------------------------------------------------------------------------------------- poisoned files


class _Poison:
    """Unpickled with code, creates ``marker`` (open(marker, "w"))."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _rng_state(marker: str) -> dict:
    return {"step": 0, "random_state": _Poison(marker), "numpy_random_seed": None,
            "torch_manual_seed": torch.get_rng_state()}  # fmt: skip


# kind -> (file written into the step-2 checkpoint, what it holds, files removed first)
POISONS = {
    "scheduler (accelerate's custom_checkpoint_0.pkl)": ("custom_checkpoint_0.pkl", lambda m: {"last_epoch": _Poison(m)}, ()),
    "rng state": ("random_states_0.pkl", _rng_state, ()),
    "optimizer": ("optimizer.bin", lambda m: {"state": {0: _Poison(m)}, "param_groups": []}, ()),
    "model (pickle fallback)": ("pytorch_model.bin", lambda m: {"w": _Poison(m)}, ("model.safetensors",)),
    "sampler / other pickle": ("sampler.bin", lambda m: _Poison(m), ()),
    "scheduler.json as a pickle": ("scheduler.json", lambda m: _Poison(m), ()),
    "trainer_state.json as a pickle": ("trainer_state.json", lambda m: _Poison(m), ()),
}  # fmt: skip


@pytest.fixture(scope="module")
def killed_run(tiny_target, tiny_data, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("killed") / "run")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _killed_at_step_2(tiny_target, tiny_data, out)
    finally:
        torch.set_num_threads(n)
    return out


def test_the_poison_does_run_when_unpickled(tmp_path):
    """The poisoned files of the next test are live: an unsafe torch.load creates the marker."""
    marker, path = tmp_path / "marker", tmp_path / "p.pkl"
    torch.save(_rng_state(str(marker)), path)
    torch.load(path, weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("kind", list(POISONS))
def test_resume_never_unpickles_code(kind, killed_run, tiny_target, tiny_data, tmp_path):
    """A poisoned file of each kind a resume reads is refused in one line naming it (an RNG
    state is not silently skipped), and nothing is executed."""
    name, content, remove = POISONS[kind]
    out, marker = str(tmp_path / "run"), str(tmp_path / "marker")
    shutil.copytree(killed_run, out)
    step2 = os.path.join(out, "checkpoints", "step-2")
    for r in remove:
        os.remove(os.path.join(step2, r))
    torch.save(content(marker), os.path.join(step2, name))
    text = _refusal(["--resume", *_overrides(tiny_target, tiny_data, out, **SHORT)])
    assert not os.path.exists(marker)
    assert name in text, text
    assert ("refusing" in text) or ("not valid JSON" in text) or ("not a scheduler state" in text), text


def test_a_clean_copy_of_the_killed_run_resumes(killed_run, tiny_target, tiny_data, tmp_path):
    """The checkpoint the poison tests start from resumes (output_dir may move: it is not the identity)."""
    from train import train_heads

    out = str(tmp_path / "moved")
    shutil.copytree(killed_run, out)
    train_heads.main(["--resume", *_overrides(tiny_target, tiny_data, out, **SHORT)])
    assert [r["step"] for r in _metrics(out) if "train/loss" in r] == [1, 2, 3, 4]


# ---------------------------------------------------------------------------------------------- disk full


def _mount_tmpfs(path: str, options: str) -> bool:
    os.makedirs(path, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return (
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", path], capture_output=True).returncode
        == 0
    )


def _fill(directory: str) -> str:
    """Write a file until the filesystem is full (ENOSPC); return its path."""
    path = os.path.join(directory, "filler")
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return path


def test_disk_full_during_a_checkpoint(tiny_target, tiny_data, tmp_path, monkeypatch):
    """The filesystem fills up after the step-2 checkpoint; the step-4 one fails in the real
    write path. One line says "No space left on device" and names the checkpoint; the partial
    .tmp-step-4 is gone, step-2 is intact, and after space is freed --resume finishes the run."""
    from train import train_heads

    disk = str(tmp_path / "disk")
    mounted = _mount_tmpfs(disk, "size=4m")
    real_save = train_heads.save_checkpoint
    real_torch_save = torch.save
    filler: list[str] = []

    def no_space(obj, f, *a, **k):  # without a mount (not root): the RNG state write hits ENOSPC half-way
        with open(f, "wb") as fh:
            fh.write(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))

    def save_then_fill(run):
        path = real_save(run)
        if run.step == 2:
            if mounted:
                filler.append(_fill(disk))
            else:
                monkeypatch.setattr(torch, "save", no_space)
        return path

    try:
        out = os.path.join(disk, "run")
        monkeypatch.setattr(train_heads, "save_checkpoint", save_then_fill)
        extra = {**SHORT, "train.max_steps": 6, "train.log_every": 100, "train.eval_every": 0}
        before = None
        with pytest.raises(SystemExit) as e:
            train_heads.main(_overrides(tiny_target, tiny_data, out, **extra))
        reset_accelerate()
        text = str(e.value.code)
        step2, step4 = (os.path.join(out, "checkpoints", s) for s in ("step-2", "step-4"))
        assert "\n" not in text and "No space left on device" in text and step4 in text, text
        assert f"the previous checkpoint {step2} is kept" in text
        assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["step-2"]  # no .tmp-step-4
        before = _tree_digest(step2)
        monkeypatch.setattr(torch, "save", real_torch_save)
        monkeypatch.setattr(train_heads, "save_checkpoint", real_save)
        for f in filler:
            os.remove(f)
        assert _tree_digest(step2) == before
        train_heads.main(["--resume", *_overrides(tiny_target, tiny_data, out, **extra)])
        assert os.path.isfile(os.path.join(out, "model.safetensors"))
    finally:
        reset_accelerate()
        if mounted:
            subprocess.run(["umount", "-l", disk], check=False)


# ---------------------------------------------------------------------------------------------- early checks


def test_context_length_is_checked_before_the_data(tiny_target, tiny_data, tmp_path, monkeypatch):
    """Data.max_length beyond the target's context, from its config, before tokenizing."""
    _no_data_loading(monkeypatch)
    text = _refusal(_overrides(tiny_target, tiny_data, str(tmp_path / "run"), **{"data.max_length": 4096}))
    assert "data.max_length=4096 exceeds the target's max_position_embeddings=128" in text
    assert not os.path.exists(tmp_path / "run")  # nothing is written before every check has passed


def test_a_refused_run_leaves_an_existing_output_dir_unchanged(tiny_target, tiny_data, tmp_path):
    """A refusal after the output_dir checks (here: the data) changes nothing in an empty output_dir or in
    the dir of a run that stopped before its first checkpoint."""
    out = tmp_path / "run"
    out.mkdir()
    _refusal(_overrides(tiny_target, str(tmp_path / "missing.jsonl"), str(out)))
    assert os.listdir(out) == []
    (out / ".selfspec_run.json").write_text(json.dumps({"run_id": "x", "config": {}, "status": "running"}))
    before = _tree_digest(str(out))
    _refusal(_overrides(tiny_target, str(tmp_path / "missing.jsonl"), str(out)))
    assert _tree_digest(str(out)) == before


def test_read_only_output_dir_is_checked_before_the_data(tiny_target, tiny_data, tmp_path, monkeypatch):
    """An existing read-only output_dir fails before any data is read (a read-only mount,
    which also stops root; a chmod 555 directory when not root)."""
    ro = str(tmp_path / "ro")
    mounted = _mount_tmpfs(ro, "ro,size=64k")
    if not mounted:
        if os.geteuid() == 0:
            pytest.skip("root without mount(8): a read-only directory cannot be made")
        os.chmod(ro, 0o555)
    try:
        _no_data_loading(monkeypatch)
        text = _refusal(_overrides(tiny_target, tiny_data, ro))
        assert f"output_dir {ro!r} is not writable" in text, text
    finally:
        if mounted:
            subprocess.run(["umount", "-l", ro], check=False)
        else:
            os.chmod(ro, 0o755)


def test_a_run_that_stopped_before_any_checkpoint_leaves_the_dir_free(tiny_target, tiny_data, tmp_path):
    """A run that stopped before its first checkpoint (here: killed in its first step) does not lock the
    dir: the corrected run, a different config, starts there without overwrite=true."""
    from train import train_heads

    out = str(tmp_path / "run")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(train_heads, "fit", lambda run: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            train_heads.main(_overrides(tiny_target, tiny_data, out, **{"train.lr": 0.01}))
    reset_accelerate()
    assert os.path.isfile(os.path.join(out, ".selfspec_run.json"))
    train_heads.main(_overrides(tiny_target, tiny_data, out, **{"train.max_steps": 2}))
    assert os.path.isfile(os.path.join(out, "model.safetensors"))


# ---------------------------------------------------------------------------------------------- processes


def _env(**extra: str) -> dict[str, str]:
    cache = os.environ.get("SELFSPEC_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "selfspec")
    return dict(os.environ, PYTHONPATH=REPO, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu",
                TORCH_EXTENSIONS_DIR=os.path.join(cache, "torch_extensions"), **extra)  # fmt: skip


@pytest.mark.slow
def test_launcher_errors_are_one_line(tiny_target, tiny_data, tmp_path):
    """With the real launchers: `accelerate launch --quiet` (single process): the training
    script's line only. `python -m train.launch` (accelerate's launcher, in-process): a config typo is one
    line before any process starts, and an input error found by the 2 DeepSpeed processes is one line
    (no CalledProcessError / ChildFailedError traceback, no torch elastic report), exit status 1."""
    key_typo = ["--config", "configs/demo-medusa-tiny.yaml", "train.max_stepz=3"]
    quiet = ["--quiet", "--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no",
             "--dynamo_backend", "no"]  # fmt: skip
    ds2 = ["--config_file", "configs/accelerate/deepspeed_zero2.yaml", "--num_processes", "2",
           "--main_process_port", "29547"]  # fmt: skip
    accelerate = [sys.executable, "-m", "accelerate.commands.launch"]
    wrapper = [sys.executable, "-m", "train.launch"]
    missing = str(tmp_path / "missing.jsonl")
    cases = [
        (accelerate + quiet + ["train/train_heads.py", *key_typo], "unknown config key 'train.max_stepz'"),
        (wrapper + ds2 + ["train/train_heads.py", *key_typo], "unknown config key 'train.max_stepz'"),
        (
            wrapper + ds2 + ["train/train_heads.py", *_overrides(tiny_target, missing, str(tmp_path / "o"))],
            f"error: {missing}: no such file or directory",
        ),
    ]
    for cmd, message in cases:
        proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1 and message in lines[0], (cmd, proc.stderr[-3000:])


def _heads_digest(out: str) -> str:
    with open(os.path.join(out, "model.safetensors"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.mark.slow
def test_kill_9_at_random_moments_then_resume_is_bit_identical(tiny_target, tiny_data, tmp_path):
    """Fault test: `kill -9` a real training process during a checkpoint write (the moment a .tmp-step-N
    directory appears) and at a random step, resume each time with --resume, and end with the same bytes
    of heads and the same eval as an uninterrupted run, every step logged once."""
    import random
    import time

    extra = {"train.max_steps": 40, "train.save_every": 5, "train.eval_every": 10, "train.log_every": 1,
             "train.save_total_limit": 2}  # fmt: skip
    full, killed = str(tmp_path / "full"), str(tmp_path / "killed")
    script = [sys.executable, os.path.join(REPO, "train", "train_heads.py")]
    proc = subprocess.run([*script, *_overrides(tiny_target, tiny_data, full, **extra)], env=_env(),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]

    rng = random.Random(12)
    ckpts = os.path.join(killed, "checkpoints")

    def steps_logged() -> int:
        # A resume that finds no complete checkpoint wipes the stopped run's files (metrics.jsonl too), so
        # the file can vanish between any check and the open.
        try:
            with open(os.path.join(killed, "metrics.jsonl")) as f:
                return sum(1 for _ in f)
        except FileNotFoundError:
            return 0

    def during_write() -> bool:
        try:
            return any(n.startswith(".tmp-step-") for n in os.listdir(ckpts))
        except FileNotFoundError:
            return False

    for k in range(2):  # 1: while a checkpoint is being written; 2: after a random number of new log lines
        later = steps_logged() + rng.randint(3, 15)
        trigger = during_write if k == 0 else (lambda later=later: steps_logged() >= later)
        p = subprocess.Popen([*script, "--resume", *_overrides(tiny_target, tiny_data, killed, **extra)],
                             env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        deadline = time.time() + 240
        while not (fired := trigger()) and p.poll() is None and time.time() < deadline:
            time.sleep(0.0005)
        assert fired and p.poll() is None, "the run ended before the moment to kill it"
        p.kill()  # SIGKILL
        p.wait()
    proc = subprocess.run([*script, "--resume", *_overrides(tiny_target, tiny_data, killed, **extra)],
                          env=_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0 and "resumed from" in proc.stdout, proc.stderr[-3000:]
    assert _heads_digest(full) == _heads_digest(killed)
    with (
        open(os.path.join(full, "eval_results.json")) as f1,
        open(os.path.join(killed, "eval_results.json")) as f2,
    ):
        assert json.load(f1) == json.load(f2)
    assert [r["step"] for r in _metrics(killed) if "train/loss" in r] == list(range(1, 41))
    assert not any(n.startswith(".tmp-") for n in os.listdir(ckpts))


def test_overwrite_and_resume_together_are_refused(tmp_path):
    from train.config import load_config

    with pytest.raises(
        ValueError, match="overwrite=true deletes the run in output_dir, resume='auto' continues it"
    ):
        load_config(
            None,
            [
                "target.name_or_path=org/model",
                "data.path=org/data",
                f"output_dir={tmp_path}",
                "overwrite=true",
                "resume=auto",
            ],
        )


def test_enum_member_by_name_loads_and_other_getattr_is_refused(tmp_path):
    import deepspeed  # noqa: F401  (its classes are allow-listed once it is loaded)
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    from train.checkpoint import safe_torch_load

    class ByName:  # pickles as getattr(ZeroStageEnum, "gradients"), as some DeepSpeed shards hold it
        def __init__(self, cls, name):
            self.args = (cls, name)

        def __reduce__(self):
            return getattr, self.args

    good, bad = tmp_path / "good.pt", tmp_path / "bad.pt"
    torch.save({"zero_stage": ByName(ZeroStageEnum, "gradients")}, good)
    assert safe_torch_load(str(good))["zero_stage"] is ZeroStageEnum.gradients
    torch.save({"x": ByName(LossScaler, "__init__")}, bad)  # a step towards __globals__: refused
    with pytest.raises(ValueError, match="refusing to load"):
        safe_torch_load(str(bad))


def test_training_silences_torchs_no_cuda_runtime_warning(tmp_path):
    """A CUDA build of torch on a machine with a CUDA toolkit and no GPU warns "No CUDA runtime is found"
    whenever DeepSpeed asks for CUDA_HOME; in the training processes that line would precede (and break)
    a one-line error. CUDA_HOME points at an existing folder so torch takes that branch on any machine."""
    code = (
        "import torch, train.train_heads, torch.utils.cpp_extension as c\n"
        "assert not torch.cuda.is_available()\n"
        "c._find_cuda_home()\n"
    )
    env = dict(_env(), CUDA_HOME=str(tmp_path), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "No CUDA runtime" not in proc.stderr, proc.stderr[-2000:]
