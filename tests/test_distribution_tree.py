"""Exact sampling end to end with Medusa trees: a branching tree at T = 1 and a chain under
temperature, top-k and top-p together (20k samples each, batch 1 and batched).

Split from `test_distribution.py` (which holds the law, the sampler and the chi-square helpers) so
that pytest-xdist's ``--dist loadfile`` can run the longest sampling tests on different workers."""

from __future__ import annotations

import pytest
from test_distribution import (
    ALPHA,
    E2E_SAMPLES,
    PATHS,
    chi2_pvalue,
    good_heads,
    sample_counts,
    small_target,
    target_law,
)

from infer.tree import chain

pytestmark = pytest.mark.usefixtures("one_thread")
small_target = small_target  # the module-scoped fixture, collected here too


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 4])
def test_generate_exact_branching_tree(small_target, batch):
    """T = 1, a branching tree (3 siblings, depth up to 2 with 3 new tokens), helpful heads, 20k samples
    (batch 4: each call samples 4 rows, padded left and right); 10k through the single-row loop, enough
    that accepting each sibling with p_v(x) instead of the residual's r_j(x) fails at p < 1e-200."""
    law = target_law(small_target, 3)
    samples = E2E_SAMPLES if batch > 1 else E2E_SAMPLES // 2
    counts, accepted = sample_counts(
        small_target, good_heads(small_target), PATHS, 3, samples, seed=0, batch=batch
    )
    assert sum(counts.values()) == samples
    assert max(accepted) == 2  # with 3 new tokens a step has room for one draft + the bonus
    assert sum(a > 1 for a in accepted) > samples // 6
    assert chi2_pvalue(counts, law) > ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 8])
def test_generate_exact_top_k_top_p(small_target, batch):
    """Temperature 0.6, top-k 3 and top-p 0.9 together: a token outside the warped support at any
    position (e.g. one node left unwarped) would be an impossible outcome. Both loops warp through one
    `_Rule`; batch 1 checks that the single-row loop applies it with a quarter of the draws (dropping
    top-p fails at p < 1e-20), batch 8 runs the full count. Here top-p alone keeps at most 3 tokens, so
    top-k binds in test_distribution's "top-k 3" case, not in this one."""
    warp = {"temperature": 0.6, "top_k": 3, "top_p": 0.9}
    law = target_law(small_target, 3, **warp)
    samples = E2E_SAMPLES if batch > 1 else E2E_SAMPLES // 4
    counts, accepted = sample_counts(
        small_target, good_heads(small_target), chain(2), 3, samples, seed=1, batch=batch, **warp
    )
    assert sum(counts.values()) == samples
    assert max(accepted) == 2
    assert chi2_pvalue(counts, law) > ALPHA
