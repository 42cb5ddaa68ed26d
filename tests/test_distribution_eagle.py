"""Exact sampling end to end with EAGLE-2 dynamic trees from EAGLE-1, EAGLE-1 with a reduced
draft vocabulary, and EAGLE-3 heads (batch 1 and batched).

Split from `test_distribution.py` (which holds the law, the sampler and the chi-square helpers) so
that pytest-xdist's ``--dist loadfile`` can run the longest sampling tests on different workers."""

from __future__ import annotations

import pytest
import torch
from test_distribution import PROMPT, V, check_eagle_law, small_target

pytestmark = pytest.mark.usefixtures("one_thread")
small_target = small_target  # the module-scoped fixture, collected here too


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("kind", ["eagle", "eagle-d2t", "eagle3"])
def test_generate_exact_eagle_proposers(small_target, kind, batch):
    """Exact rejection sampling with EAGLE-2 dynamic trees from untrained EAGLE and EAGLE-3 heads:
    T = 1 for EAGLE, T = 0.6 + top-k 3 + top-p 0.9 for EAGLE-3; 4000 samples of 3 tokens each.
    ``eagle-d2t``: EAGLE-1 with a draft vocabulary of 4 of the 6 tokens that leaves out the target's most
    likely first token (which the drafts then never propose, and sampling must still produce at its
    rate), at EAGLE-3's warping.

    This checks the dynamic-tree path (tree building, masks, draft cache, d2t) end to end. Its power
    against subtle acceptance-rule bugs is low (a bonus drawn from p instead of the residual gave
    p = 0.55 at 2000 samples here); the rule itself is tested with power above."""
    from heads import EagleHead, build_vocab_map
    from heads.eagle3 import Eagle3Head

    torch.manual_seed(0)
    if kind == "eagle-d2t":
        heads = EagleHead.for_target(small_target, draft_vocab_size=4).eval()
        with torch.no_grad():
            counts = torch.ones(V, dtype=torch.long)
            counts[small_target(PROMPT).logits[0, -1].argmax()] = 0
        heads.set_vocab_map(*build_vocab_map(counts, 4))
        assert not heads.t2d[small_target(PROMPT).logits[0, -1].argmax()]
    else:
        heads = (EagleHead if kind == "eagle" else Eagle3Head).for_target(small_target).eval()
    check_eagle_law(small_target, heads, kind, batch=batch)
