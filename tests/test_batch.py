"""Batched `infer.generate`: prompts of different lengths, left- or right-padded with an attention mask.

Every row must be token-identical to ``target.generate`` of its prompt ALONE (fp32, greedy), with drafts
that are accepted deep and by different amounts in different rows (so rows' KV lengths diverge and the
shared slot axis gets holes), for Medusa (static trees), EAGLE and EAGLE-3 (dynamic trees); rows stop
on their own (EOS, max tokens) and leave the batch; per-row and total stats add up. The distribution
tests on a batch are in test_distribution.py (parametrized by batch size).
"""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import ARCHS
from test_draft_layer import target as draft_target
from test_draft_layer import trained as trained_draft
from test_generate import model, prompt, spec

import infer
from infer.cache import StaticRaggedKV
from infer.draft import Proposer
from infer.generate import speculative_generate
from infer.runner import BatchRunner

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 96


def extra_prompt(length: int, seed: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, (length,), generator=torch.Generator().manual_seed(seed))


def prompts() -> list[torch.Tensor]:
    """Test_generate's two prompts (the trained Medusa heads were fitted to their continuations: long
    accepts) and two others of other lengths (shorter accepts): rows accept different amounts."""
    return [prompt(0)[0], prompt(1)[0], extra_prompt(8, 7), extra_prompt(3, 8)]


def padded(rows: list[torch.Tensor], side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T] ids (pad id 0) and the 0/1 attention mask, padded on ``side``."""
    T = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        sl = slice(T - len(r), T) if side == "left" else slice(0, len(r))
        ids[i, sl], mask[i, sl] = r, 1
    return ids, mask


@functools.cache
def _alone(target, row: tuple[int, ...], n: int, eos: int | None) -> list[int]:
    kw = {"eos_token_id": eos} if eos is not None else {}
    out = target.generate(torch.tensor([row]), do_sample=False, max_new_tokens=n, pad_token_id=0, **kw)
    return out[0, len(row) :].tolist()


def check_rows(target, out, rows, ids, n: int, eos: int | None = None, pad: int = 0) -> None:
    """Each row = target.generate of that prompt alone, then padding; stats per row and in total."""
    T = ids.shape[1]
    assert out.sequences.shape[0] == len(rows)
    assert torch.equal(out.sequences[:, :T], ids)  # the prompts come back as given
    st = out.stats
    assert len(st.rows) == len(rows)
    for i, r in enumerate(rows):
        ref = _alone(target, tuple(r.tolist()), n, eos)
        got = out.sequences[i, T:].tolist()
        assert got[: len(ref)] == ref, f"row {i}"
        assert all(t == pad for t in got[len(ref) :]), f"row {i} is not padded after its end"
        rs = st.rows[i]
        assert rs.new_tokens == len(ref)
        assert rs.num_target_forwards == 1 + len(rs.accepted_lengths)
        assert sum(rs.accepted_lengths) >= len(ref) - 1 and all(a >= 1 for a in rs.accepted_lengths)
    assert st.new_tokens == sum(r.new_tokens for r in st.rows)
    assert st.accepted_lengths == [a for r in st.rows for a in r.accepted_lengths]
    assert st.num_target_forwards == 1 + max(len(r.accepted_lengths) for r in st.rows)
    assert st.mean_accepted_length == pytest.approx(sum(st.accepted_lengths) / max(len(st.accepted_lengths), 1))


def diverged(out) -> bool:
    """Some step where two rows accepted different numbers of tokens (their KV lengths differ)."""
    acc = [r.accepted_lengths for r in out.stats.rows]
    return any(len({a[k] for a in acc if len(a) > k}) > 1 for k in range(max(map(len, acc))))


# ----------------------------------------------------------------------------------------------- Medusa


@pytest.mark.parametrize("kind", ["trained", "trained_own"])
@pytest.mark.parametrize(("arch", "side"), [(a, ("left", "right")[i % 2]) for i, a in enumerate(ARCHS)])
def test_batch_greedy_identity_medusa(arch, kind, side):
    """Every architecture, one padding side each (alternating), partial and deep accepts."""
    key = (arch,)
    m, rows, n = spec(key, kind), prompts(), 30
    ids, mask = padded(rows, side)
    out = infer.generate(m, ids, attention_mask=mask, max_new_tokens=n)
    check_rows(model(*key), out, rows, ids, n)
    assert diverged(out)
    if kind == "trained_own":
        assert max(out.stats.accepted_lengths) >= 4  # deep accepts (the default tree has depth 4)


@pytest.mark.parametrize(("arch", "attn", "window"), [("llama", "sdpa", None), ("qwen3", "sdpa", None),
                                                       ("gpt2", "sdpa", None), ("mistral", "eager", 3),
                                                       ("gemma2", "eager", 3), ("mistral", "sdpa", 3)])  # fmt: skip
def test_batch_identity_tree_attention_and_sliding_windows(arch, attn, window):
    """sdpa targets (`infer.attention.tree_attention`, boolean per-row masks) and sliding windows
    narrower than the trees (the window is by position, not slot: holes do not count)."""
    key = (arch, attn, torch.float32, window)
    m, rows, n = spec(key, "trained_own"), prompts(), 30
    ids, mask = padded(rows, "left")
    out = infer.generate(m, ids, attention_mask=mask, max_new_tokens=n)
    check_rows(model(*key), out, rows, ids, n)


def test_rows_stop_on_their_own():
    """An EOS early in one row's continuation: that row ends (padded after it) and leaves the batch,
    the others run to max_new_tokens; the batch is no longer than needed."""
    key = ("llama",)
    target, rows, n = model(*key), prompts(), 30
    eos = _alone(target, tuple(rows[0].tolist()), n, None)[6]
    m = spec(key, "trained_own")
    ids, mask = padded(rows, "right")
    out = infer.generate(m, ids, attention_mask=mask, max_new_tokens=n, eos_token_id=eos)
    check_rows(target, out, rows, ids, n, eos=eos)  # filled with the config's pad id (0)
    first = out.stats.rows[0]
    assert first.new_tokens <= 7 and first.num_target_forwards < max(
        r.num_target_forwards for r in out.stats.rows
    )
    assert out.sequences.shape[1] == ids.shape[1] + max(r.new_tokens for r in out.stats.rows)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_rows_ending_together(n):
    """Few new tokens: every row's last step has no room for drafts (a root-only tree per row, each its
    own root) and all rows end in the same step."""
    key = ("llama",)
    m, rows = spec(key, "random"), prompts()
    ids, mask = padded(rows, "left")
    out = infer.generate(m, ids, attention_mask=mask, max_new_tokens=n)
    check_rows(model(*key), out, rows, ids, n)


@pytest.mark.parametrize("acceptance", ["typical", "exact"])
def test_batch_sampling_at_low_temperature_is_greedy(acceptance):
    """Sampled acceptance rules on a batch, at T -> 0 (the target's distribution one-hot): every row is
    the greedy output alone, with drafts accepted (typical: Medusa's rule; exact: rejection sampling)."""
    key = ("qwen3",)
    m, rows, n = spec(key, "trained"), prompts(), 24
    ids, mask = padded(rows, "right")
    out = infer.generate(m, ids, attention_mask=mask, max_new_tokens=n, do_sample=True, temperature=1e-5,
                         acceptance=acceptance, generator=torch.Generator().manual_seed(0))  # fmt: skip
    check_rows(model(*key), out, rows, ids, n)
    assert out.stats.mean_accepted_length > 1.5


def test_batch_of_identical_prompts_and_one_row():
    """Identical rows give identical output; one row with a mask gives the unbatched output."""
    m = spec(("qwen2",), "trained")
    p = prompt(1)
    batch = infer.generate(m, p.repeat(3, 1), max_new_tokens=20)
    single = infer.generate(m, p, max_new_tokens=20, adaptive=False)  # a batch's fixed tree, alone
    assert all(torch.equal(row, single.sequences[0]) for row in batch.sequences)
    assert batch.stats.rows[0].accepted_lengths == single.stats.accepted_lengths


def _storage(runner: BatchRunner) -> tuple:
    """(rows, the data pointers of every KV buffer, the slot-position buffer and every mask buffer)."""
    kv, mask = runner.kv, runner.mask
    cache = tuple(t.data_ptr() for layer in kv.cache.layers for t in (layer.keys, layer.values))
    masks = tuple(t.data_ptr() for t in (*mask.vis.values(), *mask.add.values(), mask.filled))
    return runner.next_pos.shape[0], cache, kv.buf.data_ptr(), masks


@pytest.mark.parametrize("slack", [None, 0])
@pytest.mark.parametrize("key", [("llama", "sdpa", torch.float32, None), ("gemma2", "eager", torch.float32, 3)])
def test_batch_cache_and_masks_are_written_in_place(monkeypatch, key, slack):
    """The batched loop allocates its KV, slot positions and masks once per generation: at every verify
    step the target's cache layers, the position buffer and the mask buffers (boolean for tree
    attention; additive, sliding and full, for gemma2's mixed layers) are the same storage; the KV and
    position buffers are re-allocated once when a finished row leaves the batch, the masks never.
    slack=0 packs at every hole (the packing copy is in place too). The rows stay exact."""
    target, rows, n = model(*key), prompts(), 30
    seen: list[tuple] = []
    prefill, verify = BatchRunner.prefill, BatchRunner.verify

    def spy_prefill(self, *args):
        if slack is not None:
            self.slack = slack
        return prefill(self, *args)

    def spy_verify(self, tree):
        out = verify(self, tree)
        assert isinstance(self.kv, StaticRaggedKV)
        seen.append(_storage(self))
        return out

    monkeypatch.setattr(BatchRunner, "prefill", spy_prefill)
    monkeypatch.setattr(BatchRunner, "verify", spy_verify)
    ids, mask = padded(rows, "left")
    out = infer.generate(spec(key, "trained_own"), ids, attention_mask=mask, max_new_tokens=n)
    check_rows(target, out, rows, ids, n)
    assert diverged(out)  # holes: rows' accepted paths moved by different amounts
    sizes = [s[0] for s in seen]
    assert sizes[0] == len(rows) and sizes[-1] < len(rows) and sorted(sizes, reverse=True) == sizes
    for size in set(sizes):
        group = {s for s in seen if s[0] == size}
        assert len(group) == 1, f"buffers re-allocated between steps at batch size {size}"
    assert sizes.count(len(rows)) >= 3 and len(set(seen)) == len(set(sizes))
    assert len({s[3] for s in seen}) == 1  # the mask buffers serve the smaller batch too


def test_proposer_without_batch_form_is_named():
    class OneRow(Proposer):
        pass

    ids, mask = padded(prompts()[:2], "left")
    with pytest.raises(NotImplementedError, match="OneRow drafts for batch size 1 only"):
        speculative_generate(model("llama"), OneRow(), ids, attention_mask_2d=mask, max_new_tokens=4)


# ------------------------------------------------------------------------------------------- EAGLE heads


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt2"])
def test_batch_greedy_identity_eagle_random(arch):
    """Untrained EAGLE-1/2 heads (drafts mostly rejected) on the default dynamic tree."""
    from heads import EagleHead

    target = model(arch)
    torch.manual_seed(1)
    m = infer.SpecModel(target, EagleHead.for_target(target, draft_layer="llama").eval())
    rows, n = prompts(), 20
    ids, mask = padded(rows, "left")
    out = infer.generate(m, ids, attention_mask=mask, max_new_tokens=n, depth=4, draft_top_k=4, total_tokens=16)
    check_rows(target, out, rows, ids, n)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize(("arch", "side"), [("llama", "left"), ("gemma3_text", "right"), ("phi3", "left")])
def test_batch_greedy_identity_eagle_trained(arch, side, kind):
    """EAGLE / EAGLE-3 heads trained a few steps on the target's own text (test_draft_layer): deep,
    per-row different accepts through batched EAGLE-2 trees; gemma3_text has a window (8) shorter than
    the contexts, mixed with full layers."""
    target = draft_target(arch)
    m = infer.SpecModel(target, trained_draft(kind, arch, steps=40))
    rows = [extra_prompt(6, 100), extra_prompt(6, 101), extra_prompt(9, 5), extra_prompt(4, 6)]
    ids, mask = padded(rows, side)
    n = 40
    for k, total in ((8, 48), (2, 20)):  # the default tree, and a narrow one that reaches depth 6
        out = infer.generate(m, ids, attention_mask=mask, max_new_tokens=n, draft_top_k=k, total_tokens=total)
        check_rows(target, out, rows, ids, n)
        assert diverged(out)
    assert max(out.stats.accepted_lengths) >= 5, out.stats.accepted_lengths



def draft_storage(proposer) -> tuple:
    """(rows, the data pointers of the draft cache's KV buffers, its slot-position buffer and its mask
    buffers) of a batched EAGLE / P-EAGLE proposer."""
    kv, masks = proposer.kv, proposer.masks
    assert isinstance(kv, StaticRaggedKV) and len(kv.cache.layers) == 1
    cache = tuple(t.data_ptr() for layer in kv.cache.layers for t in (layer.keys, layer.values))
    bufs = (*masks.mask.vis.values(), *masks.mask.add.values(), masks.mask.filled, masks.none)
    return kv.pos.shape[0], cache, kv.buf.data_ptr(), tuple(t.data_ptr() for t in bufs if t is not None)


def check_draft_in_place(monkeypatch, batch_cls, m, ids, mask, n: int, pack: bool) -> object:
    """Generate with a spy on ``batch_cls.propose`` and on the draft head's inputs: the draft's cache,
    slot positions and masks keep their storage through every step at each batch size (KV and
    positions re-allocated once when a row leaves, masks never), every draft forward after the
    prompt's commit reads its mask from the mask buffer, and with ``pack`` (no holes tolerated) the
    packing moves happen in place. Returns the generate output."""
    import infer.eagle_draft as eagle_draft

    if pack:
        monkeypatch.setattr(eagle_draft, "PACK_SLACK", 0)
    seen, masks, current = [], [], {}
    propose, take = batch_cls.propose, StaticRaggedKV.take
    moves = []

    def spy_propose(self, root, max_depth):
        current["p"] = self
        tree = propose(self, root, max_depth)
        seen.append(draft_storage(self))
        return tree

    def spy_take(self, *args):
        if self is getattr(current.get("p"), "kv", None):
            moves.append(1)
        return take(self, *args)

    def spy_head(module, args, kwargs):
        masks.append(kwargs["attention_mask"].untyped_storage().data_ptr())

    monkeypatch.setattr(batch_cls, "propose", spy_propose)
    monkeypatch.setattr(StaticRaggedKV, "take", spy_take)
    hook = m.heads.register_forward_pre_hook(spy_head, with_kwargs=True)
    try:
        out = infer.generate(m, ids, attention_mask=mask, max_new_tokens=n)
    finally:
        hook.remove()
    sizes = [s[0] for s in seen]
    assert sizes[0] == ids.shape[0] and sizes[-1] < ids.shape[0] and sorted(sizes, reverse=True) == sizes
    for size in set(sizes):
        assert len({s for s in seen if s[0] == size}) == 1, f"draft buffers re-allocated at batch size {size}"
    assert max(map(sizes.count, sizes)) >= 3 and len({s[3] for s in seen}) == 1
    buffers = {t.untyped_storage().data_ptr() for t in current["p"].masks.mask.add.values()}
    assert len(masks) >= 3 and all(ptr in buffers for ptr in masks[1:]), "a mask built per step"
    assert bool(moves) == pack
    return out


@pytest.mark.parametrize("pack", [False, True])
def test_batch_eagle_draft_cache_and_masks_are_written_in_place(monkeypatch, pack):
    """`BatchEagle`'s draft cache is a `StaticRaggedKV` and its masks one `BatchTreeMask`, allocated
    once per generation (`check_draft_in_place`); the rows stay exact."""
    from infer.eagle_draft import BatchEagle

    target = draft_target("llama")
    m = infer.SpecModel(target, trained_draft("eagle", "llama", steps=40))
    rows = [extra_prompt(6, 100), extra_prompt(6, 101), extra_prompt(9, 5), extra_prompt(4, 6)]
    ids, mask = padded(rows, "left")
    out = check_draft_in_place(monkeypatch, BatchEagle, m, ids, mask, 30, pack)
    check_rows(target, out, rows, ids, 30)
    assert diverged(out)
