"""`heads.graft.run_target_lean` (the inference forward): the same logits, last hidden state and aux
states as `run_target`, but only the last position's logits and only the requested layers' states."""

from __future__ import annotations

import pytest
import torch
from conftest import ARCHS, tiny_model

from heads.graft import num_layers, run_target, run_target_lean

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("arch", ARCHS)
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
