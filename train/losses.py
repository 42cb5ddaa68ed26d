"""Training metrics shared by every head type.

Each head type's own loss lives with the head (`heads.registry.Objective`, e.g. `heads.medusa.medusa_loss`);
Medusa-2's backbone terms live with its joint model (`train.medusa2`).
"""

from __future__ import annotations

import torch
from torch import Tensor


def simulated_accept_length(top1: Tensor) -> Tensor:
    """τ of a chain draft from per-position top-1 accuracies: ``1 + Σ_k Π_{j<=k} top1_j``.

    top1: [K], position k's top-1 accuracy (Medusa head k, EAGLE TTT step k). The product treats the
    positions' hits as independent, so this estimates the acceptance length of a greedy chain of K
    drafts, counting the bonus token (τ = tokens per target forward, docs/design.md §7).
    """
    return 1 + torch.cumprod(top1.double(), 0).sum()
