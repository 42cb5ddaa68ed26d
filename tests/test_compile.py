"""``compile=``: the verify step under torch.compile keeps greedy identity, with no graph break inside it."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

import infer
from heads import MedusaHeads
from infer.attention import ATTN_IMPLEMENTATION, attention_implementation
from infer.runner import CompiledStep, TreeRunner
from infer.tree import chain

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow
def test_compiled_verify_greedy_identity_and_no_graph_break():
    """Dynamo's ``eager`` backend traces the same graph inductor would compile (inductor itself takes
    minutes on this CPU: `results/compile/`); greedy output must equal target.generate's, and the step's
    one graph must have no break."""
    target = tiny_model("llama", attn="sdpa")
    target.generation_config.eos_token_id = None
    torch.manual_seed(1)
    heads = MedusaHeads.for_target(target, num_heads=3).eval()
    ids = torch.randint(3, 90, (1, 9), generator=torch.Generator().manual_seed(0))
    ref = target.generate(ids, do_sample=False, max_new_tokens=24, pad_token_id=0)
    spec = infer.SpecModel(target, heads, tree=chain(3))
    out = infer.generate(spec, ids, max_new_tokens=24, do_sample=False, compile="eager")
    assert torch.equal(out.sequences, ref)
    assert not target.base_model._forward_hooks  # the compiled step's hooks are removed after the call

    runner = TreeRunner(target, (), max_len=40)
    runner.prefill(ids)
    step = CompiledStep(target, (), runner.cache, "eager")
    try:
        tokens = torch.tensor([[5, 6, 7]])
        mask = runner.mask(torch.ones(3, 3, dtype=torch.bool).tril(), runner.past)
        with attention_implementation(target, ATTN_IMPLEMENTATION):
            explained = torch._dynamo.explain(step._forward)(tokens, mask, runner.past + torch.arange(3)[None])
    finally:
        step.close()
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


def test_compile_option_checked():
    target = tiny_model("llama", attn="sdpa")
    spec = infer.SpecModel(target, MedusaHeads.for_target(target, num_heads=2).eval(), tree=chain(2))
    with pytest.raises(ValueError, match="compile must be"):
        infer.generate(spec, torch.tensor([[4, 5, 6]]), max_new_tokens=2, compile=1.5)
