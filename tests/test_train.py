"""The training run: the Medusa loss shift, a single-process run end to end, resume after a kill, wandb
offline, clear input errors, and (slow) 2-process DeepSpeed ZeRO-2 on CPU.

The target is a tiny random Llama with a tiny byte-level BPE tokenizer, saved with `save_pretrained`
once per session; the data is a JSONL of cyclic word sequences (token t determines t+2, so the heads
have something to learn).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from conftest import reset_accelerate

from heads.medusa import medusa_loss, medusa_stats

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch_zero2_two_processes(overrides: list[str], port: int, **env: str) -> subprocess.CompletedProcess:
    """`accelerate launch` of train/train_heads.py with configs/accelerate/deepspeed_zero2.yaml on 2 CPU
    processes (DeepSpeed's CPU accelerator, offline, one thread each), from the repo root because the
    yaml's paths are repo-relative."""
    cache = os.environ.get("SELFSPEC_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "selfspec")
    env = dict(
        os.environ,
        DS_ACCELERATOR="cpu",
        TORCH_EXTENSIONS_DIR=os.path.join(cache, "torch_extensions"),
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
        PYTHONPATH=REPO,
        **env,
    )
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", os.path.join(REPO, "configs/accelerate/deepspeed_zero2.yaml"),
        "--num_processes", "2", "--main_process_port", str(port),
        os.path.join(REPO, "train/train_heads.py"), *overrides,
    ]  # fmt: skip
    return subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)


WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]


# ---------------------------------------------------------------------------------------------- loss


def _logits_pointing_at(targets: torch.Tensor, V: int, scale: float = 20.0) -> torch.Tensor:
    """targets: [B, T] -> logits [B, T, V] with a large logit on each target id."""
    return torch.nn.functional.one_hot(targets, V).float() * scale


def test_medusa_loss_shift_hand_built():
    # B=1, T=7, ids 10..16: head 0 at t must predict ids[t+2], head 1 at t ids[t+3].
    V, T = 20, 7
    ids = torch.arange(10, 10 + T).view(1, T)
    mask = torch.ones(1, T, dtype=torch.long)
    right = torch.stack(
        [
            _logits_pointing_at(torch.roll(ids, -2, dims=1), V),  # head 0 -> t+2
            _logits_pointing_at(torch.roll(ids, -3, dims=1), V),  # head 1 -> t+3
        ]
    )
    loss, m = medusa_loss(right, ids, mask, decay=0.5)
    assert m["count"].tolist() == [T - 2, T - 3]  # positions whose target is inside the sequence
    assert m["top1"].tolist() == [1.0, 1.0] and m["top5"].tolist() == [1.0, 1.0]
    assert loss.item() < 1e-6
    # One position off (the target's own next token t+1, or t+3 for head 0): never right.
    wrong = torch.stack([_logits_pointing_at(torch.roll(ids, -1, dims=1), V), right[0]])
    _, m = medusa_loss(wrong, ids, mask, decay=0.5)
    assert m["top1"].tolist() == [0.0, 0.0]


def test_medusa_loss_mask_and_decay_weights():
    V, T = 8, 6
    ids = torch.tensor([[1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1]])
    # Row 0: only tokens 4 and 5 are targets; row 1: only token 2.
    mask = torch.tensor([[0, 0, 0, 0, 1, 1], [0, 0, 1, 0, 0, 0]])
    logits = torch.zeros(3, 2, T, V)  # uniform: CE = log V wherever scored
    loss, m = medusa_loss(logits, ids, mask, decay=0.8)
    # head k scores position t iff mask[t+2+k]: head0 -> row0 t=2,3 + row1 t=0; head1 -> row0 t=1,2; head2 -> t=0,1
    assert m["count"].tolist() == [3, 2, 2]
    assert torch.allclose(m["loss"], torch.full((3,), math.log(V)))
    assert math.isclose(loss.item(), math.log(V) * (1 + 0.8 + 0.64), rel_tol=1e-6)
    # Labels are the shifted ids: point head 0 at ids[t+2] only where the mask is on.
    logits[0, 0, 2, ids[0, 4]] = 10
    logits[0, 0, 3, ids[0, 5]] = 10
    logits[0, 1, 0, ids[1, 2]] = 10
    stats = medusa_stats(logits, ids, mask)
    assert stats["top1"][0].tolist() == [2.0, 1.0] and stats["count"][0].tolist() == [2.0, 1.0]


def test_medusa_loss_short_sequence_keeps_every_head_in_the_graph():
    logits = torch.zeros(3, 1, 3, 5, requires_grad=True)  # T=3: only head 0 (t=0 -> token 2) has a target
    loss, m = medusa_loss(logits, torch.tensor([[1, 2, 3]]), torch.ones(1, 3), decay=0.8)
    loss.backward()
    assert m["count"].tolist() == [1, 0, 0] and logits.grad is not None
    assert logits.grad[0, 0, 0].abs().sum() > 0 and logits.grad[1:].abs().sum() == 0


# ---------------------------------------------------------------------------------------------- fixtures


def _text_row(i: int, n_words: int = 24) -> dict:
    return {"text": " ".join(WORDS[(i + j) % len(WORDS)] for j in range(n_words))}


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory) -> str:
    """A 2-layer random Llama (hidden 32) + a byte-level BPE tokenizer, saved like any HF model dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = str(tmp_path_factory.mktemp("tiny-target"))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([_text_row(i)["text"] for i in range(len(WORDS))], trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("tiny-data") / "train.jsonl")
    with open(path, "w") as f:
        for i in range(40):
            f.write(json.dumps(_text_row(i)) + "\n")
    return path


@pytest.fixture(autouse=True)
def _fresh_accelerate_state(fresh_accelerate):
    """Each in-process run builds its own Accelerator; accelerate keeps singleton state between them."""
    yield


def _overrides(target: str, data: str, out: str, **extra) -> list[str]:
    base = {
        "target.name_or_path": target,
        "target.attn_implementation": "eager",
        "data.path": data,
        "data.max_length": 48,
        "data.eval_fraction": 0.2,  # 8 of 40 rows held out
        "heads.medusa.num_heads": 3,
        "train.batch_size": 4,
        "train.lr": 5e-2,
        "train.max_steps": 30,
        "train.eval_every": 0,
        "train.save_every": 0,
        "train.log_every": 5,
        "output_dir": out,
    }
    base.update(extra)
    if base.get("heads.type", "medusa") != "medusa":  # a recipe holds only the block of its head type
        base = {k: v for k, v in base.items() if not k.startswith("heads.medusa.")}
    return [f"{k}={v}" for k, v in base.items()]


def _metrics(out: str) -> list[dict]:
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _heads_logits(heads, target, ids: torch.Tensor) -> torch.Tensor:
    from heads.graft import run_target

    with torch.no_grad():
        hidden = run_target(target, ids).hidden
        return heads(hidden.to(next(heads.parameters()).dtype), target.get_output_embeddings())


# ---------------------------------------------------------------------------------------------- runs


def test_single_process_run_learns_and_saves_reloadable_heads(tiny_target, tiny_data, tmp_path):
    from heads.base import load_heads
    from heads.graft import load_target
    from train import train_heads
    from train.config import load_config

    out = str(tmp_path / "run")
    run = train_heads.start(load_config(None, _overrides(tiny_target, tiny_data, out)))
    ev = train_heads.finish(run)

    train_losses = [r["train/loss"] for r in _metrics(out) if "train/loss" in r]
    assert len(train_losses) == 6 and train_losses[-1] < 0.8 * train_losses[0], train_losses
    assert ev is not None and len(ev["top1"]) == 3 and ev["count"][0] > 0
    assert sorted(os.listdir(out)) == [
        ".selfspec_run.json", "README.md", "config.json", "eval_results.json", "metrics.jsonl",
        "model.safetensors", "train_config.yaml",
    ]  # fmt: skip
    with open(os.path.join(out, "eval_results.json")) as f:
        assert json.load(f)["step"] == 30

    target = load_target(tiny_target)
    reloaded = load_heads(out, target)
    trained = run.accelerator.unwrap_model(run.heads)
    ids = torch.randint(3, 300, (2, 16))
    torch.testing.assert_close(_heads_logits(reloaded, target, ids), _heads_logits(trained, target, ids))
    # The final eval used those weights: a fresh eval of the reloaded heads gives the same accuracy.
    run.heads = reloaded
    again = train_heads.evaluate(run)
    assert again["top1"] == pytest.approx(ev["top1"]) and again["count"] == ev["count"]


def _kill_after_checkpoint(monkeypatch, train_heads, at_step: int) -> None:
    """Make the run die (like a kill -9 would) right after the step-``at_step`` checkpoint is complete."""
    real_save = train_heads.save_checkpoint

    def save_then_die(run):
        path = real_save(run)
        if run.step == at_step:
            raise KeyboardInterrupt(path)
        return path

    monkeypatch.setattr(train_heads, "save_checkpoint", save_then_die)


def _assert_same_heads(out_a: str, out_b: str) -> None:
    from safetensors.torch import load_file

    a, b = (
        load_file(os.path.join(out_a, "model.safetensors")),
        load_file(os.path.join(out_b, "model.safetensors")),
    )
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)


def _trainer_state(out: str, step: int) -> dict:
    with open(os.path.join(out, "checkpoints", f"step-{step}", "trainer_state.json")) as f:
        return json.load(f)


def test_resume_after_kill_mid_epoch_matches_uninterrupted_run(
    tiny_target, tiny_data, tmp_path, monkeypatch, capsys
):
    """Kill right after the step-2 checkpoint (half-way through epoch 0), resume with --resume, and end with
    the same heads as a run that was never interrupted: same step, optimizer, scheduler, RNG, data order."""
    from train import train_heads

    # 32 train rows / batch 4 = 8 micro-batches = 4 optimizer steps per epoch with grad_accum 2.
    common = {"train.max_steps": 6, "train.grad_accum": 2, "train.save_every": 2, "train.save_total_limit": 2,
              "train.eval_every": 3, "train.log_every": 1}  # fmt: skip
    full, killed = str(tmp_path / "full"), str(tmp_path / "killed")
    train_heads.main(_overrides(tiny_target, tiny_data, full, **common))
    assert sorted(os.listdir(os.path.join(full, "checkpoints"))) == [
        "step-4",
        "step-6",
    ]  # limit 2 dropped step-2
    reset_accelerate()

    _kill_after_checkpoint(monkeypatch, train_heads, at_step=2)
    with pytest.raises(KeyboardInterrupt):
        train_heads.main(_overrides(tiny_target, tiny_data, killed, **common))
    monkeypatch.undo()
    reset_accelerate()
    assert not os.path.exists(os.path.join(killed, "model.safetensors"))
    assert os.listdir(os.path.join(killed, "checkpoints")) == ["step-2"]
    state = _trainer_state(killed, 2)
    assert (state["step"], state["epoch"], state["batches_in_epoch"]) == (2, 0, 4)

    capsys.readouterr()
    train_heads.main(["--resume", *_overrides(tiny_target, tiny_data, killed, **common)])
    assert "resumed from" in capsys.readouterr().out
    steps = [r["step"] for r in _metrics(killed) if "train/loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6]  # 1-2 before the kill, 3-6 after: no step repeated or skipped
    _assert_same_heads(full, killed)
    with (
        open(os.path.join(full, "eval_results.json")) as f1,
        open(os.path.join(killed, "eval_results.json")) as f2,
    ):
        assert json.load(f1) == json.load(f2)


def test_resume_from_end_of_epoch_checkpoint(tiny_target, tiny_data, tmp_path, monkeypatch):
    """A checkpoint on the last step of an epoch resumes at the start of the next epoch (resume=auto)."""
    from train import train_heads

    # 32 train rows / batch 8 = 4 steps per epoch.
    common = {"train.max_steps": 6, "train.save_every": 4, "train.save_total_limit": 0, "train.batch_size": 8}
    full, killed = str(tmp_path / "full"), str(tmp_path / "killed")
    train_heads.main(_overrides(tiny_target, tiny_data, full, **common))
    reset_accelerate()

    _kill_after_checkpoint(monkeypatch, train_heads, at_step=4)
    with pytest.raises(KeyboardInterrupt):
        train_heads.main(_overrides(tiny_target, tiny_data, killed, **common))
    monkeypatch.undo()
    reset_accelerate()
    state = _trainer_state(killed, 4)
    assert (state["step"], state["epoch"], state["batches_in_epoch"]) == (4, 0, 4)

    train_heads.main(_overrides(tiny_target, tiny_data, killed, resume="auto", **common))
    _assert_same_heads(full, killed)


def test_wandb_offline(tiny_target, tiny_data, tmp_path, monkeypatch):
    from train import train_heads

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = str(tmp_path / "run")
    train_heads.main(
        _overrides(tiny_target, tiny_data, out, report_to="wandb", run_name="t", **{"train.max_steps": 3})
    )
    runs = [d for d in os.listdir(os.path.join(tmp_path, "wandb")) if d.startswith("offline-run-")]
    assert len(runs) == 1
    files = os.listdir(os.path.join(tmp_path, "wandb", runs[0]))
    assert any(f.endswith(".wandb") for f in files), files


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"target.name_or_path": "/nonexistent/model"}, "error: target model directory not found"),
        (
            {"data.path": "/nonexistent/data.jsonl"},
            "error: /nonexistent/data.jsonl: no such file or directory",
        ),
        ({"train.lr": "fast"}, "error: bad config value for 'train.lr'"),
        ({"train.max_stepz": 3}, "did you mean 'train.max_steps'"),
        ({"data.max_length": 4096}, "exceeds the target's max_position_embeddings=128"),
    ],
)
def test_input_errors_are_one_line(tiny_target, tiny_data, tmp_path, extra, message):
    from train import train_heads

    with pytest.raises(SystemExit) as e:
        train_heads.main(_overrides(tiny_target, tiny_data, str(tmp_path / "run"), **extra))
    text = str(e.value.code)
    assert message in text and "\n" not in text, text


def test_bad_data_row_is_one_line(tiny_target, tmp_path):
    from train import train_heads

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "alpha beta gamma delta"}\n{"text": 3}\n')
    with pytest.raises(SystemExit) as e:
        train_heads.main(_overrides(tiny_target, str(bad), str(tmp_path / "run")))
    assert str(e.value.code).startswith("error: ") and "row 1" in str(e.value.code)


# ---------------------------------------------------------------------------------------------- multi-process


# Top-level names a train/ module must never take: `python train/train_heads.py` (and `accelerate launch`
# of it) puts train/ first on sys.path, where train/X.py would be imported for any `import X`.
_TOP_LEVEL = {
    "accelerate", "configs", "datasets", "deepspeed", "demo", "evaluate", "heads", "huggingface_hub", "infer",
    "numpy", "omegaconf", "peft", "safetensors", "scripts", "setup", "tests", "tokenizers", "torch", "tqdm",
    "train", "transformers", "wandb", "yaml",
}  # fmt: skip


def test_no_train_module_shadows_a_top_level_module():
    """train/ runs as a script without a sys.path edit, so none of its modules may share a name
    with the standard library, an installed or project top-level package, or a well-known one above."""
    import importlib.machinery

    train_dir = os.path.join(REPO, "train")
    names = [n[:-3] for n in os.listdir(train_dir) if n.endswith(".py") and n != "__init__.py"]
    names += [n for n in os.listdir(train_dir) if os.path.isfile(os.path.join(train_dir, n, "__init__.py"))]
    elsewhere = [p for p in sys.path if os.path.abspath(p or os.curdir) != train_dir]
    assert "train_heads" in names and "state" in names  # the listing is train/'s
    for name in names:
        assert name not in sys.stdlib_module_names, f"train/{name} shadows the standard library's {name}"
        assert name not in _TOP_LEVEL, f"train/{name} shadows the package {name}"
        found = importlib.machinery.PathFinder.find_spec(name, elsewhere)
        assert found is None, f"train/{name} shadows {found.origin or found.submodule_search_locations}"


def test_no_package_module_edits_sys_path():
    """No module of the packages edits sys.path (the EAGLE-3 speed benchmark's import of the
    user's checkout of the original trainer is done by its script, scripts/bench_eagle3_train.py)."""
    import re

    for package in ("heads", "train", "infer", "demo"):
        for root, _, files in os.walk(os.path.join(REPO, package)):
            for name in sorted(f for f in files if f.endswith(".py")):
                with open(os.path.join(root, name)) as f:
                    edits = re.findall(r"sys\.path(?:\.insert|\.append|\[0\]\s*=|\s*=)", f.read())
                assert not edits, (os.path.join(root, name), edits)


@pytest.mark.slow
def test_train_heads_runs_as_a_script_and_as_a_module():
    """`python train/train_heads.py` (train/ first on sys.path) and `python -m train.train_heads` import
    everything they need without a sys.path edit."""
    for how in ([os.path.join(REPO, "train", "train_heads.py")], ["-m", "train.train_heads"]):
        proc = subprocess.run(
            [sys.executable, *how, "--help"],
            env=dict(os.environ, PYTHONPATH=REPO), cwd=REPO, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0 and "--features" in proc.stdout, (how, proc.stderr[-3000:])


@pytest.mark.slow
def test_deepspeed_zero2_two_processes_on_cpu(tiny_target, tiny_data, tmp_path):
    """`accelerate launch` with configs/accelerate/deepspeed_zero2.yaml, 2 CPU processes, bf16 via DeepSpeed."""
    from safetensors.torch import load_file

    from heads.base import load_heads
    from heads.graft import load_target

    out = str(tmp_path / "run")
    overrides = _overrides(tiny_target, tiny_data, out, **{"train.max_steps": 6, "train.save_every": 3,
                                                           "train.mixed_precision": "bf16", "report_to": "wandb"})  # fmt: skip
    wandb_env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    # How long it takes is a benchmark's question (scripts/bench_zero2_launch.py), not a pass/fail one.
    proc = launch_zero2_two_processes(overrides, port=29533, **wandb_env)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    # Both ranks really split the data: the setup line reports 2 processes and each rank saw half the batches.
    assert "2 process(es)" in log, log[-3000:]
    assert "DeepSpeed ZeRO-2" in log and "precision bf16" in log
    assert os.path.isdir(os.path.join(out, "checkpoints", "step-6", "pytorch_model"))  # DeepSpeed's own state
    # 32 train rows / (2 processes x batch 4) = 4 steps per epoch.
    with open(os.path.join(out, "checkpoints", "step-3", "trainer_state.json")) as f:
        state = json.load(f)
    assert state["num_processes"] == 2 and state["batches_in_epoch"] == 3
    with open(os.path.join(out, "checkpoints", "step-6", "trainer_state.json")) as f:
        assert json.load(f)["epoch"] == 1

    target = load_target(tiny_target)
    heads = load_heads(out, target)
    saved = load_file(os.path.join(out, "model.safetensors"))
    state_dict = heads.state_dict()
    assert saved.keys() == state_dict.keys()
    for k in saved:
        torch.testing.assert_close(state_dict[k], saved[k].to(state_dict[k].dtype))
    assert any(
        saved[k].abs().sum() > 0 for k in saved if k.endswith("linear.weight")
    )  # trained, not the zero init

    from heads.medusa import MedusaHeads

    manual = MedusaHeads(heads.config)
    manual.load_state_dict(saved)
    ids = torch.randint(3, 300, (2, 16))
    torch.testing.assert_close(_heads_logits(heads, target, ids), _heads_logits(manual, target, ids))
    runs = [d for d in os.listdir(os.path.join(tmp_path, "wandb")) if d.startswith("offline-run-")]
    assert len(runs) == 1  # only rank 0 logs

    # Resume under DeepSpeed (resume=PATH of step 3 into a new output_dir): every shard DeepSpeed reads goes
    # through a weights-only load (train/checkpoint.py), and the run ends with the same heads.
    import deepspeed  # noqa: F401  (its checkpoint classes are allow-listed once it is loaded)

    from train import checkpoint as ckpt

    step3 = os.path.join(out, "checkpoints", "step-3")
    ckpt.verify_checkpoint(step3, 2)  # DeepSpeed's real shards pass with the allow-list
    again = str(tmp_path / "again")
    proc = launch_zero2_two_processes(
        [*overrides[:-1], f"output_dir={again}", f"resume={step3}", "report_to=none"], port=29534
    )
    assert proc.returncode == 0 and f"resumed from {step3} at step 3" in proc.stdout, (
        proc.stdout + proc.stderr
    )[-6000:]
    _assert_same_heads(out, again)

    # A poisoned ZeRO shard: refused by the check before load_state and by DeepSpeed's patched loader itself.
    import glob
    import types

    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
    from test_reliability_train import _Poison

    marker = str(tmp_path / "marker")
    (shard,) = glob.glob(os.path.join(step3, "pytorch_model", "*zero_pp_rank_1_mp_rank_00_optim_states.pt"))
    engine = types.SimpleNamespace(checkpoint_engine=TorchCheckpointEngine())
    ckpt.safe_deepspeed_loads(engine)
    assert "optimizer_state_dict" in engine.checkpoint_engine.load(shard)  # the real shard loads
    torch.save({"optimizer_state_dict": _Poison(marker)}, shard)
    for load in (engine.checkpoint_engine.load, lambda _: ckpt.verify_checkpoint(step3, 2)):
        with pytest.raises(ValueError, match="refusing to load .*zero_pp_rank_1_mp_rank_00_optim_states.pt"):
            load(shard)
    assert not os.path.exists(marker)
