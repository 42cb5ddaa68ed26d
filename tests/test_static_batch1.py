"""Batch 1 on every architecture verifies on buffers allocated once per generation.

Sliding-window, mixed full / sliding and eager targets (the ones `infer.runner.TreeRunner` does not
serve with transformers' ``StaticCache`` and the boolean `infer.attention.TreeMask`) keep their KV in
`infer.cache.new_filled_cache` and their masks in a one-row `infer.attention.BatchTreeMask`: through a
whole generation every cache buffer and every mask buffer keeps its storage, every mask the target
gets is a view of those buffers, and the output stays token-identical to ``target.generate`` (fp32,
with deep accepts, so compaction moves entries, and windows narrower than the generation and the tree).
"""

from __future__ import annotations

import pytest
import torch
from test_generate import prompt, reference, spec
from test_tree_exact import build, worst_error

import infer
from infer.attention import BatchTreeMask
from infer.cache import FilledStaticLayer
from infer.runner import TreeRunner

pytestmark = pytest.mark.usefixtures("one_thread")

F32 = torch.float32


def _buffers(runner: TreeRunner) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the data pointers of every KV buffer, those of every mask buffer) of ``runner``."""
    layers = runner.cache.layers
    assert layers and all(isinstance(layer, FilledStaticLayer) for layer in layers)
    mask = runner.mask
    assert isinstance(mask, BatchTreeMask) and mask.filled.shape[0] == 1
    cache = tuple(t.data_ptr() for layer in layers for t in (layer.keys, layer.values))
    return cache, tuple(t.data_ptr() for t in (*mask.vis.values(), *mask.add.values(), mask.filled))


@pytest.mark.parametrize(
    ("key", "kinds"),
    [
        (("mistral", "sdpa", F32, 3), (2, 0, 1)),  # tree attention: one boolean sliding mask (full + window)
        (("gemma2", "eager", F32, 3), (2, 2, 2)),  # eager, mixed layers: additive full + sliding, a dict
        (("llama", "eager", F32, None), (1, 1, 1)),  # eager, full attention: one additive mask
    ],
)
def test_batch1_cache_and_masks_are_written_in_place(monkeypatch, key, kinds):
    """kinds: (boolean buffers, additive buffers, masks handed to the target per step)."""
    seen, steps = [], []
    verify, make_mask = TreeRunner.verify, TreeRunner._mask

    def spy_verify(self, tree):
        out = verify(self, tree)
        seen.append(_buffers(self))
        return out

    def spy_mask(self, tree, q_pos):
        mask = make_mask(self, tree, q_pos)
        given = list(mask.values()) if isinstance(mask, dict) else [mask]
        buffers = {t.untyped_storage().data_ptr() for t in (*self.mask.vis.values(), *self.mask.add.values())}
        assert all(m.untyped_storage().data_ptr() in buffers for m in given), "a mask built per step"
        steps.append((len(self.mask.vis), len(self.mask.add), len(given)))
        return mask

    monkeypatch.setattr(TreeRunner, "verify", spy_verify)
    monkeypatch.setattr(TreeRunner, "_mask", spy_mask)
    m = spec(key, "trained_own")
    for i, n in enumerate((40, 23)):
        seen.clear()
        out = infer.generate(m, prompt(i), max_new_tokens=n, adaptive=False)
        assert out.sequences.tolist() == reference(key, i, n).tolist(), f"{key} prompt {i}"
        assert len(seen) >= 3 and len(set(seen)) == 1, "buffers re-allocated between verify steps"
        assert max(out.stats.accepted_lengths) >= 3  # deep accepts: compaction moved entries
    assert steps and set(steps) == {kinds}


@pytest.mark.parametrize(("arch", "attn", "window"), [("mistral", "eager", 3), ("qwen2_mixed", "sdpa", None)])
def test_batch1_buffers_grow_when_a_tree_outgrows_the_plan(arch, attn, window):
    """Planned for no generation at all (64 slots), a tree after a 60-token prompt outgrows the cache
    and the mask buffer: both grow once and every node stays exact."""
    runner = TreeRunner(build(arch, attn, window), max_len=0)
    assert worst_error(runner, past=60) < 1e-4
    assert runner.cache.layers[0].max_cache_len > 64
    assert runner.mask.filled.shape[1] > 64


def test_batch1_dynamic_cache_stays_exact():
    """``static=False`` (a growing ``DynamicCache``, as `infer.cost` uses) with the same in-place
    masks, on mixed full / sliding layers."""
    from transformers import DynamicCache

    runner = TreeRunner(build("gemma2", "eager", 3), static=False)
    assert isinstance(runner.cache, DynamicCache)
    assert worst_error(runner) < 1e-4
