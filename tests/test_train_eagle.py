"""EAGLE-1/2 and EAGLE-3 heads through the one training loop (`train/train_heads.py`): the config picks the
head type; the run learns, logs per-step accuracy and the simulated acceptance length τ, saves the heads
of the best-τ eval, and those heads reload and decode greedily exactly like the target. Resume after a
kill gives the same heads as an uninterrupted run (EAGLE's feature noise included).

Reuses the tiny random Llama + BPE tokenizer and the cyclic-words data of `tests/test_train.py`.
"""

from __future__ import annotations

import json
import os

import pytest
import test_train
import torch
from conftest import reset_accelerate
from test_train import _assert_same_heads, _kill_after_checkpoint, _metrics, _overrides

# test_train's fixtures: the tiny target and data (session-scoped) and a fresh accelerate state per test.
tiny_target, tiny_data = test_train.tiny_target, test_train.tiny_data
_fresh_accelerate_state = test_train._fresh_accelerate_state


def _eagle_overrides(target: str, data: str, out: str, head_type: str, **extra) -> list[str]:
    base = {"heads.type": head_type, "train.lr": 1e-2, "train.max_steps": 24, "train.eval_every": 8}
    if head_type == "eagle3":
        base |= {"heads.eagle3.draft_vocab_size": 64, "heads.eagle3.ttt_steps": 3}
    base |= extra
    return _overrides(target, data, out, **base)


def _greedy_identity(out: str, target_path: str) -> None:
    import infer
    from heads.base import load_heads
    from heads.graft import load_target

    target = load_target(target_path)
    heads = load_heads(out, target)
    ids = torch.randint(3, 300, (1, 6), generator=torch.Generator().manual_seed(3))
    got = infer.generate(infer.SpecModel(target, heads), ids, max_new_tokens=16, do_sample=False)
    want = target.generate(ids, max_new_tokens=16, do_sample=False)
    assert torch.equal(got.sequences, want)


@pytest.mark.parametrize("head_type, vocab", [("eagle", None), ("eagle", 64), ("eagle3", None)])
def test_eagle_run_learns_selects_best_by_tau_and_generates(
    head_type, vocab, tiny_target, tiny_data, tmp_path, monkeypatch
):
    """``vocab``: EAGLE-1 with a reduced draft vocabulary (heads.eagle.draft_vocab_size; EAGLE-3 has 64)."""
    from heads.base import load_heads
    from heads.graft import load_target
    from train import train_heads

    # Make the step-8 eval the best by measured τ (what selects the heads when it is on, the default), so
    # the saved heads must come from the copy kept at step 8 (not the last step's weights in memory).
    real_measure = train_heads.measure_tau

    def measure_tau(run):
        got = real_measure(run)
        return got | {"measured_accept_length": got["measured_accept_length"] + 10.0 * (run.step == 8)}

    monkeypatch.setattr(train_heads, "measure_tau", measure_tau)
    out = str(tmp_path / "run")
    run = train_heads.start(
        train_heads.load_config(
            None,
            _eagle_overrides(
                tiny_target,
                tiny_data,
                out,
                head_type,
                **({f"heads.{head_type}.draft_vocab_size": vocab} if vocab else {}),
            ),
        )
    )
    train_heads.finish(run)
    monkeypatch.undo()

    records = _metrics(out)
    losses = [r["train/loss"] for r in records if "train/loss" in r]
    # EAGLE regresses features (much to learn); EAGLE-3's soft labels are the random target's near-uniform
    # distributions, whose entropy (~log 64) bounds its loss from below, so it can only fall a little.
    assert losses[-1] < (0.7 * losses[0] if head_type == "eagle" else losses[0] - 0.01), losses
    evals = {r["step"]: r for r in records if "eval/loss" in r}
    assert sorted(evals) == [8, 16, 24]
    K = 3 if head_type == "eagle3" else 1
    for r in evals.values():
        tops = [r[f"eval/step{k}_top1_vs_target"] for k in range(K)]
        tau = 1 + sum(torch.tensor(tops).cumprod(0).tolist())
        assert r["eval/sim_accept_length_vs_target"] == pytest.approx(tau)
        assert r["eval/measured_accept_length"] >= 1.0 + 10.0 * (r["step"] == 8)
        assert (
            (0 <= r["eval/step0_top1_vs_data"] <= 1)
            if head_type == "eagle"
            else "eval/step0_top1_vs_data" not in r
        )
    assert all("train/sim_accept_length" in r for r in records if "train/loss" in r)

    assert sorted(os.listdir(out)) == [
        ".selfspec_run.json",  # the run's identity (train/checkpoint.py)
        "README.md",
        "config.json",
        "eval_results.json",
        "metrics.jsonl",
        "model.safetensors",
        "train_config.yaml",
    ]  # fmt: skip  (output_dir/best is gone once the best heads are in place)
    with open(os.path.join(out, "eval_results.json")) as f:
        results = json.load(f)
    assert results["step"] == 8 and results["last"]["step"] == 24
    assert results["measured_tau"]["prompts"] == 4 and "dynamic tree" in results["measured_tau"]["tree"]
    assert results["loss"] == pytest.approx(evals[8]["eval/loss"])

    # The saved heads are the step-8 heads: re-evaluating them gives the step-8 eval loss.
    target = load_target(tiny_target)
    reloaded = load_heads(out, target)
    if head_type == "eagle3" or vocab:  # the vocab map: the 64 most frequent training labels
        assert int(reloaded.t2d.sum()) == 64
        torch.testing.assert_close(run.accelerator.unwrap_model(run.heads).t2d, reloaded.t2d)
    run.heads = reloaded
    assert train_heads.evaluate(run)["loss"] == pytest.approx(evals[8]["eval/loss"], rel=1e-5)
    _greedy_identity(out, tiny_target)


def test_eagle_resume_after_kill_matches_uninterrupted_run(tiny_target, tiny_data, tmp_path, monkeypatch):
    from train import train_heads

    common = {"train.max_steps": 6, "train.save_every": 2, "train.eval_every": 3, "train.log_every": 1}
    full, killed = str(tmp_path / "full"), str(tmp_path / "killed")
    train_heads.main(_eagle_overrides(tiny_target, tiny_data, full, "eagle", **common))
    reset_accelerate()

    _kill_after_checkpoint(monkeypatch, train_heads, at_step=4)  # after the step-3 eval (best copy kept)
    with pytest.raises(KeyboardInterrupt):
        train_heads.main(_eagle_overrides(tiny_target, tiny_data, killed, "eagle", **common))
    monkeypatch.undo()
    reset_accelerate()
    train_heads.main(["--resume", *_eagle_overrides(tiny_target, tiny_data, killed, "eagle", **common)])
    steps = [r["step"] for r in _metrics(killed) if "train/loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6]
    _assert_same_heads(full, killed)
    with (
        open(os.path.join(full, "eval_results.json")) as f1,
        open(os.path.join(killed, "eval_results.json")) as f2,
    ):
        assert json.load(f1) == json.load(f2)


@pytest.mark.parametrize("head_type", ["eagle", "eagle3"])
def test_offline_features_give_the_online_loss(head_type, tiny_target, tiny_data, tmp_path, capsys):
    """scripts/dump_features.py -> FeatureShards -> collate_features: the same batch gives the same loss as
    running the target online; a second dump skips the finished shards; a run trains from the features."""
    from heads.config import parse_cli
    from train import features as dump_features
    from train import train_heads
    from train.config import load_config

    overrides = _eagle_overrides(tiny_target, tiny_data, str(tmp_path / "run"), head_type)
    cfg = load_config(None, overrides)
    feats = str(tmp_path / "features")
    # scripts/dump_features.py's command line: the training overrides plus --out/--shard-size.
    opts = parse_cli(dump_features.DumpOptions, ["--out", feats, "--shard-size", "12", *overrides])
    assert opts.run_config() == cfg and (opts.shard_size, opts.batch_size) == (12, 8)
    dump_features.dump_main(opts)
    assert "GiB" in capsys.readouterr().out
    shards = sorted(f for f in os.listdir(feats) if f.endswith(".safetensors"))
    assert shards == ["shard-00000.safetensors", "shard-00001.safetensors", "shard-00002.safetensors"]
    mtime = os.path.getmtime(os.path.join(feats, shards[0]))
    dump_features.dump(cfg, feats, shard_size=12)  # resumable: nothing left to do
    assert "written" not in capsys.readouterr().out
    assert os.path.getmtime(os.path.join(feats, shards[0])) == mtime

    run = train_heads.setup(cfg)
    run.heads.eval()  # no feature noise: the two losses must agree
    offline = train_heads.FeatureShards(feats, head_type)
    rows = [offline[i] for i in (0, 13, 30, 5)]  # across shards, with padding
    online = [run.train_dl.dataset[i] for i in (0, 13, 30, 5)]
    off_batch = train_heads.collate_features(rows, pad_token_id=0)
    on_batch = {k: off_batch[k] for k in ("input_ids", "attention_mask", "loss_mask")}
    assert [len(r["input_ids"]) for r in online] == [len(r["input_ids"]) for r in rows]
    with torch.no_grad():
        loss_on, m_on = train_heads.batch_loss(run, on_batch)
        loss_off, m_off = train_heads.batch_loss(run, off_batch)
    torch.testing.assert_close(loss_off, loss_on, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m_off["top1"], m_on["top1"])
    if head_type == "eagle3":  # only the draft vocabulary's logit columns are kept, plus the full argmax
        assert off_batch["logits"].shape[-1] == 64 and off_batch["top"].shape == off_batch["input_ids"].shape
        full = train_heads.target_forward(run, on_batch).logits
        real = on_batch["attention_mask"].bool()
        assert torch.equal(off_batch["top"][real], full.argmax(-1)[real])
        cols = run.heads.t2d.nonzero().view(-1)
        torch.testing.assert_close(off_batch["logits"][real], full[real][:, cols].to(off_batch["logits"].dtype))
        assert offline.meta["logit_columns"] == run.heads.t2d.nonzero().view(-1).tolist()
    reset_accelerate()

    ev = train_heads.train(cfg, features=feats)
    assert ev is not None and ev["count"][0] > 0
    if head_type == "eagle3":  # features kept for another draft vocabulary are refused before training
        reset_accelerate()
        meta_path = os.path.join(feats, "meta.json")
        with open(meta_path) as f:
            meta = json.load(f)
        meta["logit_columns"] = sorted(set(range(run.heads.t2d.numel())) - set(meta["logit_columns"]))[:64]
        with open(meta_path, "w") as f:
            json.dump(meta, f)
        with pytest.raises(ValueError, match="another draft vocabulary"):
            train_heads.setup(cfg, features=feats)
