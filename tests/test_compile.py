"""``compile=``: the verify step and the Medusa / EAGLE draft steps under torch.compile keep greedy identity,
trace without graph breaks, and are compiled once per process, not once per generation.

Dynamo's ``eager`` backend traces the same graphs inductor would compile (inductor itself, with heads
that accept: test_compile_inductor.py). Compiled graphs are counted with dynamo's cache entries (one per
compiled graph of a code object) over every copy of each step function, graph breaks with its counters."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from conftest import tiny_model
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import counters

import infer
from heads import Eagle3Head, EagleHead, MedusaHeads
from infer.attention import ATTN_IMPLEMENTATION, attention_implementation
from infer.compiled import _steps, compiled, compiled_step
from infer.draft import medusa_topk
from infer.eagle_draft import draft_step
from infer.runner import TreeRunner
from infer.tree import chain, tree_buffers

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:aux_layer_ids .* not strictly increasing:UserWarning"),
]
EAGLE_TREE = {"depth": 4, "draft_top_k": 4, "total_tokens": 16}


def _graphs_of(fn) -> int:
    return len(_debug_get_cache_entry_list(getattr(fn, "_torchdynamo_orig_callable", fn).__code__))


def graphs() -> list[int]:
    """Compiled graphs so far of the verify step, the Medusa step and the EAGLE step: over every
    target's and head's copy of the step function (`infer.compiled.fresh_copy`)."""
    verify = [step.fn for per_target in _steps.values() for step in per_target.values()]
    drafts = [compiled(fn, "eager").copies.values() for fn in (medusa_topk, draft_step)]
    return [sum(_graphs_of(f) for f in fns) for fns in (verify, *drafts)]


def target_and_spec(kind: str):
    target = tiny_model("llama", attn="sdpa")
    target.generation_config.eos_token_id = None
    torch.manual_seed(1)
    if kind == "medusa":
        return (
            target,
            infer.SpecModel(target, MedusaHeads.for_target(target, num_heads=3).eval(), tree=chain(3)),
            {},
        )
    if kind == "peagle":  # P-EAGLE: one draft forward per step over the pairs and 3 placeholder slots
        head = Eagle3Head.for_target(target, draft_layer="llama", parallel_draft=3).eval()
    else:
        head = (EagleHead if kind == "eagle" else Eagle3Head).for_target(target, draft_layer="llama").eval()
    return target, infer.SpecModel(target, head), EAGLE_TREE


def prompt(length: int, seed: int) -> torch.Tensor:
    return torch.randint(3, 90, (1, length), generator=torch.Generator().manual_seed(seed))


def no_hooks(target) -> bool:
    modules = [target.model, *target.model.layers]
    return not any(m._forward_hooks or m._forward_pre_hooks for m in modules)


def test_verify_step_reused_across_generations():
    """The second generation (same length) and a third (another prompt length, more new tokens) compile
    nothing new: the verify step and the Medusa step are reused; no hook is left on the target; the
    per-target step is one object and does not keep the target alive."""
    torch._dynamo.reset()
    target, spec, _ = target_and_spec("medusa")
    news = []
    for length, n, seed in ((9, 24, 0), (9, 24, 1), (13, 30, 2)):
        before = graphs()
        ids = prompt(length, seed)
        out = infer.generate(spec, ids, max_new_tokens=n, do_sample=False, compile="eager")
        news.append([b - a for a, b in zip(before, graphs(), strict=True)])
        assert torch.equal(
            out.sequences, target.generate(ids, do_sample=False, max_new_tokens=n, pad_token_id=0)
        )
        assert no_hooks(target)
    assert news[0][0] >= 1 and news[0][1] >= 1  # the first generation compiled both steps
    assert news[1] == [0, 0, 0] and news[2] == [0, 0, 0], news
    assert compiled_step(target, (), "eager") is compiled_step(target, (), "eager")
    alive = weakref.ref(target)
    del target, spec, out
    gc.collect()
    assert alive() is None


def test_compiled_step_outputs_equal_eager():
    """Logits, last hidden state and aux states of a compiled verify forward equal the eager forward's, in a
    first runner and in a second one (new cache, the step reused): the graphs return the states the hooks
    catch, not stale ones."""
    target = tiny_model("llama", attn="sdpa")
    aux = (0, 1, -1)
    for seed in (0, 1):
        tree = tree_buffers(chain(3)).draft(torch.tensor(4 + seed), torch.tensor([[5], [6], [7]]) + seed)
        outs = []
        for compile in (False, "eager"):
            runner = TreeRunner(target, aux, max_len=40, compile=compile)
            runner.prefill(prompt(9 + seed, seed))
            outs.append(runner.verify(tree))
        eager, comp = outs
        torch.testing.assert_close(comp.logits, eager.logits)
        torch.testing.assert_close(comp.hidden, eager.hidden)
        assert len(comp.aux) == 3
        for a, b in zip(comp.aux, eager.aux, strict=True):
            torch.testing.assert_close(a, b)
    assert no_hooks(target)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle3", "peagle"])
def test_draft_steps_compiled_without_graph_breaks(kind):
    """Batch 1: greedy output under compile="eager" equals target.generate's; the verify step and the draft
    step were compiled, and dynamo met no graph break anywhere in them."""
    torch._dynamo.reset()
    counters.clear()
    target, spec, tree = target_and_spec(kind)
    ids = prompt(9, 0)
    out = infer.generate(spec, ids, max_new_tokens=24, do_sample=False, compile="eager", **tree)
    assert torch.equal(
        out.sequences, target.generate(ids, do_sample=False, max_new_tokens=24, pad_token_id=0)
    )
    verify, medusa, eagle = graphs()
    assert verify >= 1 and (medusa if kind == "medusa" else eagle) >= 1
    assert not counters["graph_break"], dict(counters["graph_break"])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_batch_compiled_same_as_eager(kind):
    """A left-padded batch of 3 prompts of different lengths: the same sequences and per-row accepted lengths
    as the eager batched path (itself tested token-identical to target.generate per row, test_batch.py),
    with no graph break."""
    torch._dynamo.reset()
    counters.clear()
    target, spec, tree = target_and_spec(kind)
    rows = [prompt(9 + j, j)[0] for j in range(3)]
    ids = torch.zeros(3, 11, dtype=torch.long)
    mask = torch.zeros(3, 11, dtype=torch.long)
    for j, r in enumerate(rows):
        ids[j, 11 - len(r) :], mask[j, 11 - len(r) :] = r, 1
    args = dict(attention_mask=mask, max_new_tokens=20, do_sample=False, **tree)
    ref = infer.generate(spec, ids, **args)
    out = infer.generate(spec, ids, compile="eager", **args)
    assert torch.equal(out.sequences, ref.sequences)
    assert [r.accepted_lengths for r in out.stats.rows] == [r.accepted_lengths for r in ref.stats.rows]
    assert graphs()[0] >= 1
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_verify_step_traces_as_one_graph():
    """`torch._dynamo.explain` of one 3-node verify forward: one graph, no break."""
    target = tiny_model("llama", attn="sdpa")
    runner = TreeRunner(target, (), max_len=40)
    runner.prefill(prompt(9, 0))
    step = compiled_step(target, (0,), "eager")
    tokens = torch.tensor([[5, 6, 7]])
    mask = runner.mask(torch.ones(3, 3, dtype=torch.bool).tril(), runner.past)
    with attention_implementation(target, ATTN_IMPLEMENTATION), step.hooks():
        explained = torch._dynamo.explain(step._forward)(
            target, tokens, mask, runner.past + torch.arange(3)[None], runner.cache
        )
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    assert no_hooks(target)


def test_compile_option_checked():
    target = tiny_model("llama", attn="sdpa")
    spec = infer.SpecModel(target, MedusaHeads.for_target(target, num_heads=2).eval(), tree=chain(2))
    for bad in (1.5, ""):
        with pytest.raises(ValueError, match="compile must be"):
            infer.generate(spec, torch.tensor([[4, 5, 6]]), max_new_tokens=2, compile=bad)


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "attn"), [("gpt2", "sdpa"), ("gemma3_text", "sdpa"), ("qwen2_moe", "sdpa"),
                                            ("gemma2", "eager")])  # fmt: skip
def test_compiled_steps_on_other_architectures(arch, attn):
    """Learned positions (GPT-2), mixed sliding / full layers on a growing cache (Gemma-3), mixture of experts
    (Qwen2-MoE), soft-capping with eager attention (Gemma-2): EAGLE drafting with compile="eager" stays
    token-identical to target.generate and dynamo meets no graph break."""
    torch._dynamo.reset()
    counters.clear()
    target = tiny_model(arch, attn=attn)
    target.generation_config.eos_token_id = None
    torch.manual_seed(1)
    spec = infer.SpecModel(target, EagleHead.for_target(target, draft_layer="llama").eval())
    ids = prompt(9, 0)
    out = infer.generate(spec, ids, max_new_tokens=16, do_sample=False, compile="eager", **EAGLE_TREE)
    assert torch.equal(
        out.sequences, target.generate(ids, do_sample=False, max_new_tokens=16, pad_token_id=0)
    )
    assert graphs()[0] >= 1 and graphs()[2] >= 1
    assert not counters["graph_break"], dict(counters["graph_break"])
