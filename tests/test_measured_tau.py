"""The held-out eval scores the heads against the target's own argmax, and measures τ with
`infer.generate` on held-out prompts (logged, in eval_results.json and the model card)."""

from __future__ import annotations

import json
import os

import pytest
import test_train
import torch
from test_train import _metrics, _overrides

# test_train's fixtures: the tiny target and data (session-scoped) and a fresh accelerate state per test.
tiny_target, tiny_data = test_train.tiny_target, test_train.tiny_data
_fresh_accelerate_state = test_train._fresh_accelerate_state


def test_medusa_top1_vs_target_reads_the_targets_argmax_one_position_back():
    """The eval scores a data-basis loss (Medusa's) against the target by giving it the target's greedy
    tokens as labels (`train.evaluation.target_tokens`)."""
    from heads.medusa import medusa_loss
    from train.evaluation import target_tokens

    V = 5
    choice = torch.tensor([[3, 1, 4, 1, 0, 2]])  # the target's pick for token s+1 at position s
    target_logits = torch.nn.functional.one_hot(choice, V).float()  # [1, T, V]
    # Head 0 at t predicts token t+2, i.e. the target's pick at t+1; head 1 (t+3) the pick at t+2.
    head0 = torch.nn.functional.one_hot(torch.tensor([[1, 4, 0, 0, 0, 0]]), V).float()  # right at t=0,1
    head1 = torch.nn.functional.one_hot(torch.tensor([[4, 0, 3, 0, 0, 0]]), V).float()  # right at t=0
    logits = torch.stack([head0, head1])  # [K=2, 1, T, V]
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 1]])  # scored: head 0 at t=0..3, head 1 at t=0..2
    acc = medusa_loss(logits, target_tokens(target_logits), loss_mask)[1]["top1"]
    # head 0: t=0 (pick 1 ✓), t=1 (4 ✓), t=2 (pick 1, drew 0 ✗), t=3 (pick 0 ✓) -> 3/4; head 1: t=0 ✓ only.
    assert acc.tolist() == pytest.approx([3 / 4, 1 / 3])


def test_eval_prompts_cut_chat_rows_before_the_answer_and_text_rows_at_the_prefix():
    from train.evaluation import eval_prompts

    rows = [
        {"input_ids": list(range(10, 20)), "loss_mask": [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]},  # chat
        {"input_ids": list(range(10, 30)), "loss_mask": [0] + [1] * 19},  # text
        {"input_ids": [5, 6], "loss_mask": [0, 1]},  # text, too short for 8 tokens: half of it
    ]
    got = eval_prompts(rows, n=5, prompt_tokens=8)
    assert [p.tolist() for p in got] == [[list(range(10, 14))], [list(range(10, 18))], [[5]]]
    assert len(eval_prompts(rows, n=1, prompt_tokens=8)) == 1


def test_medusa_run_logs_measured_tau_both_accuracies_and_reports_them(tiny_target, tiny_data, tmp_path):
    from train import train_heads
    from train.config import load_config

    out = str(tmp_path / "run")
    cfg = load_config(
        None,
        _overrides(tiny_target, tiny_data, out, **{"train.max_steps": 4, "train.eval_every": 2})
        + ["eval.measured_tau_prompts=2", "eval.measured_tau_new_tokens=12"],
    )
    run = train_heads.start(cfg)
    rng = torch.get_rng_state()
    measured = train_heads.measure_tau(run)
    assert torch.equal(torch.get_rng_state(), rng)  # resume stays bit-identical
    assert measured["measured_tau"]["prompts"] == 2 and measured["measured_accept_length"] >= 1.0
    assert run.accelerator.unwrap_model(run.heads).training  # the training copy was not switched
    train_heads.finish(run)

    evals = [r for r in _metrics(out) if "eval/loss" in r]
    assert [r["step"] for r in evals] == [2, 4]
    for r in evals:
        assert r["eval/measured_accept_length"] >= 1.0
        for k in range(3):
            assert 0 <= r[f"eval/head{k}_top1_vs_target"] <= 1 and 0 <= r[f"eval/head{k}_top1_vs_data"] <= 1
        tops = torch.tensor([r[f"eval/head{k}_top1_vs_target"] for k in range(3)], dtype=torch.float64)
        assert r["eval/sim_accept_length_vs_target"] == pytest.approx(float(1 + tops.cumprod(0).sum()))
        assert "eval/sim_accept_length_vs_data" in r
    with open(os.path.join(out, "eval_results.json")) as f:
        results = json.load(f)
    assert (
        results["measured_tau"]
        == {
            "prompts": 2,
            "max_new_tokens": 12,
            "decoding": "greedy",
            "tree": results["measured_tau"]["tree"],
            "prompt_source": results["measured_tau"]["prompt_source"],
        }
        and "static tree" in results["measured_tau"]["tree"]
    )
    assert results["top1"] == results["top1_vs_target"]  # the accuracy the simulated τ uses
    card = open(os.path.join(out, "README.md")).read()
    assert f"Measured acceptance length τ = {results['measured_accept_length']:.3f}" in card
    assert "top-1 vs target" in card and "top-1 vs data" in card

    # The logged τ is infer.generate's on the same prompts: the final eval's (step 4) with the heads in
    # memory, eval_results.json's with the heads saved to output_dir.
    from heads import load_heads
    from train.evaluation import eval_prompts

    prompts = eval_prompts(run.eval_dl.dataset, 2, cfg.eval.measured_tau_prompt_tokens)
    assert len(prompts) == 2
    final = registry_module(run)
    assert evals[-1]["eval/measured_accept_length"] == pytest.approx(
        generate_tau(run.target, final, prompts, 12)
    )
    saved = load_heads(out, run.target)
    assert results["measured_accept_length"] == pytest.approx(generate_tau(run.target, saved, prompts, 12))


def registry_module(run):
    """A fresh eval-mode copy of the run's heads as they are now."""
    from heads import registry

    heads = registry.get(run.head_config.head_type).module(run.head_config)
    heads.load_state_dict(run.accelerator.unwrap_model(run.heads).state_dict())
    return heads.eval()


def generate_tau(target, heads, prompts: list, new_tokens: int) -> float:
    """Σ accepted tokens / Σ verify steps of greedy `infer.generate` over ``prompts`` (each [1, T])."""
    import infer

    accepted = steps = 0
    with torch.no_grad():
        for ids in prompts:
            out = infer.generate(
                infer.SpecModel(target, heads),
                ids,
                max_new_tokens=new_tokens,
                do_sample=False,
                adaptive=False,
                lookup=0,
            )
            accepted += sum(out.stats.accepted_lengths)
            steps += len(out.stats.accepted_lengths)
    return accepted / steps


def test_measured_tau_on_a_prompt_file_reads_its_rows_after_skip(tiny_target, tiny_data, tmp_path):
    """``eval.measured_tau_prompts_file``: the logged τ is measured on the prompts the
    benchmark reads (a prompts JSONL, whole rows), skipping its first rows; a missing file fails at setup."""
    from transformers import AutoTokenizer

    from train import train_heads
    from train.config import load_config

    texts = [
        "def alpha(x):\n    return",
        "def beta(y):\n    y = y + 1",
        "class Gamma:\n    def",
        "import os\n",
    ]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = str(tmp_path / "run")
    base = _overrides(tiny_target, tiny_data, out, **{"train.max_steps": 2, "train.eval_every": 2})
    tau = [
        "eval.measured_tau_prompts=2",
        "eval.measured_tau_new_tokens=8",
        "eval.measured_tau_prompts_skip=1",
    ]
    run = train_heads.start(load_config(None, base + tau + [f"eval.measured_tau_prompts_file={path}"]))
    tok = AutoTokenizer.from_pretrained(tiny_target)
    assert [p.tolist() for p in run.tau_prompts] == [
        tok(t, return_tensors="pt").input_ids.tolist() for t in texts[1:3]
    ]
    measured = train_heads.measure_tau(run)
    assert measured["measured_tau"]["prompts"] == 2
    assert measured["measured_tau"]["prompt_source"].startswith("prompts.jsonl rows 1 on")
    train_heads.finish(run)

    missing = (
        base
        + tau
        + [f"eval.measured_tau_prompts_file={tmp_path / 'nope.jsonl'}", f"output_dir={tmp_path}/r2"]
    )
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        train_heads.start(load_config(None, missing))
