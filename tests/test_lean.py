"""`heads.graft.run_target_lean` (the inference forward): the same logits, last hidden state and aux
states as `run_target`, but only the last position's logits and only the requested layers' states."""

from __future__ import annotations

import pytest
import torch
from conftest import ARCHS, tiny_model

from heads.graft import num_layers, run_target, run_target_lean

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("arch", [*ARCHS, "opt"])
def test_lean_forward_matches_full(arch):
    target = tiny_model(arch, num_layers=3)
    ids = torch.randint(3, 96, (1, 13), generator=torch.Generator().manual_seed(0))
    aux = (0, 2, num_layers(target), -2)
    with torch.no_grad():
        full = run_target(target, ids, aux_layers=aux)
        lean = run_target_lean(target, ids, aux_layers=aux)
        every = run_target_lean(target, ids, aux_layers=aux, logits_to_keep=0)
    assert lean.logits.shape == (1, 1, 96)
    torch.testing.assert_close(lean.logits[:, -1], full.logits[:, -1], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(every.logits, full.logits, atol=1e-6, rtol=1e-6)
    for out in (lean, every):
        assert torch.equal(out.hidden, full.hidden)
        assert len(out.aux) == len(aux)
        for got, ref in zip(out.aux, full.aux, strict=True):
            assert torch.equal(got, ref)
    with pytest.raises(ValueError, match="out of range"):
        run_target_lean(target, ids, aux_layers=(7,))


def opt_with_project_out(attn: str) -> torch.nn.Module:
    """A random OPT-350m-shaped target: project_in / project_out around a wider decoder, so the final
    state (the decoder's output, the LM head's input) is narrower than the layers' states."""
    import transformers as tf

    cfg = tf.OPTConfig(
        vocab_size=96,
        hidden_size=32,
        ffn_dim=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        word_embed_proj_dim=16,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return tf.OPTForCausalLM._from_config(cfg, attn_implementation=attn).eval().requires_grad_(False)


def test_lean_forward_catches_opts_projected_state():
    """OPT's causal LM calls its decoder past the base model; the final state comes after project_out."""
    target = opt_with_project_out("eager")
    ids = torch.randint(3, 96, (1, 13), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = run_target(target, ids, aux_layers=(0, 3))
        lean = run_target_lean(target, ids, aux_layers=(0, 3))
    assert lean.hidden.shape == (1, 13, 16) and torch.equal(lean.hidden, full.hidden)
    assert all(torch.equal(a, b) for a, b in zip(lean.aux, full.aux, strict=True))


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_medusa_on_opt_is_lossless_with_drafts_accepted(attn):
    """Medusa on OPT through the lean forward: greedy output token-identical to target.generate, with
    drafts accepted (zero-initialised heads draft the target's next token again: accepted on repeats)."""
    import heads
    import infer

    target = opt_with_project_out(attn)
    head = heads.MedusaHeads.for_target(target, num_heads=3).eval()
    model = infer.SpecModel(target, head)
    longest = 0
    for seed in (0, 1):
        ids = torch.randint(3, 96, (1, 8), generator=torch.Generator().manual_seed(seed))
        out = infer.generate(model, ids, max_new_tokens=24, adaptive=False)  # the fixed tree's accepts
        assert torch.equal(out.sequences, target.generate(ids, max_new_tokens=24, do_sample=False))
        longest = max(longest, *out.stats.accepted_lengths)
    assert longest >= 2
