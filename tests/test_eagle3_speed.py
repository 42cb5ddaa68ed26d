"""The EAGLE-3 training-speed harness (`bench.eagle3_speed`) on a tiny target: the step it times is the
real training step (the loss goes down), the split covers the parts and adds up, memory is counted.
No timing value is asserted. The comparison with the original trainer needs its checkout and is not
run here."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from bench.eagle3_speed import PARTS, bench_batch, interleave, our_step, paired_ratios, part_split
from heads import Eagle3Head

pytestmark = pytest.mark.usefixtures("one_thread")


def test_split_and_interleave_on_a_tiny_target():
    target = tiny_model("llama", num_layers=4)
    torch.manual_seed(0)
    head = Eagle3Head.for_target(target, draft_vocab_size=64, ttt_steps=3).train()
    batch = bench_batch(2, 24, 96, prompt=4)
    assert batch["loss_mask"][:, :4].sum() == 0 and batch["attention_mask"].all()
    split = part_split(target, head, batch, steps=2)
    assert list(split) == [*PARTS, "total"]
    assert all(split[p]["s"] >= 0 for p in PARTS if p != "draft logits + loss")
    assert sum(split[p]["s"] for p in PARTS) == pytest.approx(split["total"]["s"])
    assert split["target logits (full vocab)"]["MiB"] == pytest.approx(2 * 24 * 96 * 4 / 2**20)
    assert split["TTT unroll"]["MiB"] > 0 and split["draft logits + loss"]["MiB"] > 0
    one = part_split(target, head, batch, steps=1)
    assert one["TTT unroll"]["MiB"] == split["TTT unroll"]["MiB"]  # one step's bytes, whatever the steps
    step = our_step(target, head, lr=3e-3)
    losses = [step(batch) for _ in range(4)]
    assert losses[-1] < losses[0]
    res = interleave({"a": step, "b": our_step(target, head)}, batch, rounds=1)
    assert len(res["a"]["s"]) == len(res["b"]["cpu_s"]) == 1 and res["a"]["tokens_per_s"] > 0
    assert paired_ratios(res, "a", "b")["min"] > 0
