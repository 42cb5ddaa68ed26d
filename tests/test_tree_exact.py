"""Tree verification is exact on every architecture selfspec accepts, and refused on the others.

The logit-level check: a few verify steps of `infer.runner.TreeRunner` (the code `generate` runs) with
random trees on a tiny random model; every node's logits must equal those of a cache-free forward over
prefix + that node's root-to-node path (fp32), and each step accepts a random node's path, so the next
step checks the compacted cache too. Random parent pointers put siblings and cousins between a node
and its ancestors, so a model that took positions from cache slots instead of ``position_ids`` fails.

Architectures where this cannot hold (ALiBi, recurrent layers) and attention implementations that do
not apply a 4D mask are refused by `infer.load` / `SpecModel` / `speculative_generate` with one line
naming the reason; for each refused architecture the test also shows that the unguarded tree forward
really is wrong (mismatched logits or a crash), so no refusal is arbitrary.
"""

from __future__ import annotations

import os
from dataclasses import fields

import pytest
import torch
from conftest import ARCHS, tiny_config

import infer
from heads import MedusaHeads
from infer.draft import MedusaProposer
from infer.generate import speculative_generate
from infer.runner import BatchRunner, TreeRunner
from infer.support import unsupported_reason
from infer.tree import DraftTree, chain, structure_from_parents

VOCAB = 96
PAST, NODES, STEPS = 7, 12, 3

pytestmark = pytest.mark.usefixtures("one_thread")


def build(arch: str, attn: str = "eager", window: int | None = None):
    """A tiny random fp32 model of ``arch`` (conftest's ARCHS, plus ALiBi / recurrent architectures)."""
    import transformers as tf

    common = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    small = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2)
    extra = {
        "mpt": lambda: tf.MptConfig(d_model=32, n_heads=4, n_layers=2, max_seq_len=256, **common),
        "bloom": lambda: tf.BloomConfig(hidden_size=32, n_head=4, n_layer=2, **common),
        "falcon_alibi": lambda: tf.FalconConfig(**small, alibi=True, **common),
        "falcon": lambda: tf.FalconConfig(**small, alibi=False, **common),
        "mamba": lambda: tf.MambaConfig(hidden_size=32, num_hidden_layers=2, state_size=4, **common),
    }
    if arch == "qwen2_mixed":  # one full and one sliding-window (3) layer: the dict of two masks
        cfg = tiny_config("qwen2")
        cfg = tf.Qwen2Config(
            **{
                **cfg.to_dict(),
                "use_sliding_window": True,
                "sliding_window": 3,
                "max_window_layers": 1,
                "layer_types": None,
            }
        )
        assert cfg.layer_types == ["full_attention", "sliding_attention"]
    else:
        cfg = extra[arch]() if arch in extra else tiny_config(arch)
    if window is not None:
        cfg.sliding_window = window
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32)
    model.config._name_or_path = f"tiny-random-{arch}"
    return model.eval().requires_grad_(False)


def random_tree(root: int, g: torch.Generator, batchable: bool = False) -> DraftTree:
    """NODES nodes (root included) with random parents (parents[i] < i) and random tokens.
    ``batchable``: every node's root path in ``retrieve`` (of depth NODES - 1), so trees stack."""
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, NODES)]
    depth = [0] * NODES
    for i in range(1, NODES):
        depth[i] = depth[parents[i]] + 1
    parents_t, depth_t = torch.tensor(parents), torch.tensor(depth)
    kw = {"max_depth": NODES - 1, "leaves_only": False} if batchable else {}
    ancestors, retrieve, sib_before = structure_from_parents(parents_t, depth_t, **kw)
    tokens = torch.cat([torch.tensor([root]), torch.randint(3, VOCAB, (NODES - 1,), generator=g)])
    return DraftTree(tokens, parents_t, depth_t, ancestors, retrieve, sib_before)


def worst_error(runner: TreeRunner, seed: int = 0, past: int = PAST) -> float:
    """Max |logit difference| over every node of ``steps`` random trees, verified with ``runner``,
    against cache-free forwards over prefix + path."""
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(3, VOCAB, (past,), generator=g)
    target = runner.target
    worst = 0.0
    with torch.no_grad():
        out = runner.prefill(seq[None])
        ref = target(seq[None]).logits[0, -1]
        worst = max(worst, float((out.logits[0, -1] - ref).abs().max()))
        for _ in range(STEPS):
            tree = random_tree(int(torch.randint(3, VOCAB, (1,), generator=g)), g)
            logits = runner.verify(tree).logits[0]  # [N+1, V]
            assert logits.shape[0] == NODES
            for node in range(NODES):
                path = torch.nonzero(tree.ancestors[node]).flatten()  # root first
                ref = target(torch.cat([seq, tree.tokens[path]])[None]).logits[0, -1]
                worst = max(worst, float((logits[node] - ref).abs().max()))
            # accept the path to a random node (the deepest one on odd steps: compaction moves entries)
            last = int(torch.randint(0, NODES, (1,), generator=g))
            keep = torch.nonzero(tree.ancestors[last]).flatten()
            runner.accept(keep)
            seq = torch.cat([seq, tree.tokens[keep]])
            assert runner.past == seq.shape[0]
    return worst


EXACT = (
    [(a, "eager", None) for a in ARCHS]
    + [(a, "sdpa", None) for a in ARCHS if a != "gemma2"]
    + [("falcon", "eager", None), ("falcon", "sdpa", None)]
    + [("gemma2", "eager", 3), ("mistral", "eager", 3), ("mistral", "sdpa", 2)]
    + [("qwen2_mixed", "eager", None), ("qwen2_mixed", "sdpa", None)]
)


@pytest.mark.parametrize(("arch", "attn", "window"), EXACT)
def test_every_node_matches_cache_free_forward(arch, attn, window):
    err = worst_error(TreeRunner(build(arch, attn, window)))
    assert err < 1e-4, f"{arch} {attn} window={window}: logits off by {err}"


def worst_error_batch(runner: BatchRunner, seed: int = 0) -> float:
    """`worst_error` for `BatchRunner`: three rows of different prompt lengths (left-padded), each its
    own random tree per step and its own accepted path (so rows' KV lengths diverge and the shared slot
    axis gets holes, packed every step here), the middle row leaving the batch after the second step."""
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(3, VOCAB, (n,), generator=g) for n in (PAST, PAST - 4, PAST + 2)]
    T = max(len(s) for s in seqs)
    ids = torch.stack([torch.cat([torch.zeros(T - len(s), dtype=torch.long), s]) for s in seqs])
    valid = ids > 0
    target, worst = runner.target, 0.0
    runner.slack = 0  # pack whenever there is a hole, so packing is checked too
    with torch.no_grad():
        out = runner.prefill(ids, valid)
        for b, s in enumerate(seqs):
            ref = target(s[None]).logits[0, -1]
            worst = max(worst, float((out.logits[b, -1] - ref).abs().max()))
        for step in range(STEPS):
            trees = [random_tree(int(torch.randint(3, VOCAB, (1,), generator=g)), g, True) for _ in seqs]
            batch = DraftTree(*(torch.stack([getattr(t, f.name) for t in trees]) for f in fields(DraftTree)))
            logits = runner.verify(batch).logits  # [B, N+1, V]
            for b, (s, tree) in enumerate(zip(seqs, trees, strict=True)):
                for node in range(NODES):
                    path = torch.nonzero(tree.ancestors[node]).flatten()
                    ref = target(torch.cat([s, tree.tokens[path]])[None]).logits[0, -1]
                    worst = max(worst, float((logits[b, node] - ref).abs().max()))
            keeps = [torch.nonzero(t.ancestors[int(torch.randint(0, NODES, (1,), generator=g))]).flatten()
                     for t in trees]  # fmt: skip
            L = max(len(k) for k in keeps)
            path = torch.stack([torch.cat([k, k.new_full((L - len(k),), -1)]) for k in keeps])
            runner.accept(path, torch.tensor([len(k) for k in keeps]), [len(k) for k in keeps])
            seqs = [torch.cat([s, t.tokens[k]]) for s, t, k in zip(seqs, trees, keeps, strict=True)]
            if step == 1:
                runner.select([0, 2])
                seqs = [seqs[0], seqs[2]]
    return worst


@pytest.mark.parametrize(("arch", "attn", "window"), EXACT)
def test_every_node_of_every_row_matches_cache_free_forward(arch, attn, window):
    """The batched runner: per-row positions, masks and holes leave every node of every row exact."""
    err = worst_error_batch(BatchRunner(build(arch, attn, window)))
    assert err < 1e-4, f"{arch} {attn} window={window}: batched logits off by {err}"


@pytest.mark.parametrize(("arch", "attn"), [("llama", "sdpa"), ("qwen2_mixed", "eager")])
def test_batched_buffers_grow_when_a_tree_outgrows_the_plan(monkeypatch, arch, attn):
    """Planned for a 4-node tree after the prompt, the batched runner's static KV, slot positions and
    masks (boolean; additive full + sliding) must grow at the first 13-node tree, and stay exact."""
    monkeypatch.setattr("infer.runner.TREE_SLOTS", 4)
    runner = BatchRunner(build(arch, attn), max_len=0)
    assert worst_error_batch(runner) < 1e-4
    assert runner.kv.capacity > PAST + 2 + 4 and runner.kv.cache.layers[0].max_cache_len == runner.kv.capacity
    assert runner.mask.vis["full_attention"].shape[1] >= NODES


def test_batched_dynamic_cache_stays_exact():
    """``static=False`` (a growing ``DynamicCache``, the layout before the static one) with the same
    in-place masks, on mixed full / sliding layers."""
    err = worst_error_batch(BatchRunner(build("qwen2_mixed", "eager"), static=False))
    assert err < 1e-4, f"dynamic batched cache: logits off by {err}"


def test_static_cache_is_written_in_place_and_grows_when_needed():
    """An sdpa target verifies through transformers' StaticCache: exact at every node, the same
    buffers step after step, and a generation longer than planned grows them once, still exact."""
    from transformers import StaticCache

    runner = TreeRunner(build("llama", "sdpa"), max_len=40)  # 40 + 64 slots
    assert isinstance(runner.cache, StaticCache) and runner.static
    assert worst_error(runner) < 1e-4
    layer = runner.cache.layers[0]
    ptr, size = layer.keys.data_ptr(), layer.max_cache_len
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        while runner.past + NODES <= size:
            runner.verify(random_tree(7, g))
            runner.accept(torch.tensor([0]))
            assert layer.keys.data_ptr() == ptr
    runner = TreeRunner(build("llama", "sdpa"), max_len=0)  # 64 slots: the first tree after 60 overflows
    assert worst_error(runner, past=60) < 1e-4
    assert runner.cache.layers[0].max_cache_len > 64


def test_recurrent_layer_types_are_refused_as_recurrent():
    """transformers >= 5.25 marks Mamba-style layers only by layer type ("linear_attention"), without the
    model's _is_stateful flag: that alone must give the recurrent refusal."""
    target = build("llama")
    assert unsupported_reason(target) is None
    target.config.layer_types = ["full_attention", "linear_attention"]
    assert "recurrent" in unsupported_reason(target)


REFUSED = {
    "mpt": "ALiBi",
    "bloom": "ALiBi",
    "falcon_alibi": "ALiBi",
    "mamba": "recurrent",
}
# How each refused architecture breaks without the refusal: (error raised inside transformers' own code,
# its message), or None where the tree forward runs and is wrong (checked numerically).
BREAKS_WITHOUT_REFUSAL = {
    "mpt": None,
    "bloom": (ValueError, "too many values to unpack"),  # build_alibi_tensor on the 4D tree mask
    "falcon_alibi": (ValueError, "too many values to unpack"),
    "mamba": (IndexError, "list index out of range"),  # the attention cache has no state for its layers
}


@pytest.mark.parametrize("arch", sorted(REFUSED))
def test_inexact_architectures_are_refused(arch, monkeypatch):
    target = build(arch)
    heads = MedusaHeads.for_target(target, num_heads=2)
    msg = rf"cannot verify draft trees on target 'tiny-random-{arch}': .*{REFUSED[arch]}"
    with pytest.raises(ValueError, match=msg):
        infer.SpecModel(target, heads)
    with pytest.raises(ValueError, match=msg):
        infer.load(target, heads)
    proposer = MedusaProposer(heads, target.get_output_embeddings(), chain(2))
    with pytest.raises(ValueError, match=msg):
        speculative_generate(target, proposer, torch.tensor([[5, 6, 7]]), max_new_tokens=4)
    # the refusal is needed: without it the tree forward is wrong, or crashes in the model's own code
    monkeypatch.setattr("infer.runner.check_target", lambda model: None)
    breaks = BREAKS_WITHOUT_REFUSAL[arch]
    if breaks is None:
        err = worst_error(TreeRunner(target))
        assert err > 1e-3, f"{arch} looks exact ({err}); lift its refusal"
        return
    with pytest.raises(breaks[0], match=breaks[1]) as e:
        worst_error(TreeRunner(target))
    where = e.traceback[-1].path
    assert f"{os.sep}transformers{os.sep}" in str(where), f"raised in {where}, not in the model's code"


@pytest.mark.parametrize("attn", ["flash_attention_2", "flex_attention"])
def test_attention_without_tree_masks_is_refused(attn):
    target = build("llama")
    # loading with it needs the kernel installed; the check reads only this
    target.config._attn_implementation = attn
    heads = MedusaHeads.for_target(target, num_heads=2)
    with pytest.raises(ValueError, match=rf"attn_implementation='{attn}' cannot apply a tree .*eager, sdpa"):
        infer.SpecModel(target, heads)
    # by name: refused before the weights are loaded (the path does not even exist)
    with pytest.raises(ValueError, match=rf"attn_implementation='{attn}' cannot apply a tree .*eager, sdpa"):
        infer.load("/nonexistent/target", heads, attn_implementation=attn)
