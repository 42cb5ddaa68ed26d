"""Medusa heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple
Decoding Heads").

Head k (k = 0..K-1) reads the target's last post-norm hidden state h_t and predicts token t+2+k; the
target's own lm_head already predicts t+1. Each head is ``num_layers`` residual blocks
``h <- h + SiLU(W h + b)`` (separate modules, W and b zero-initialised so a fresh head equals the target's
next-token predictor) followed by logits from the target's frozen lm_head (``lm_head="target"``, the
cheap default) or from a trainable per-head copy of it (``lm_head="own"``).

Training loss (`medusa_loss`): the cross-entropy of head k against token t+2+k, masked to tokens whose
``loss_mask`` is 1 (assistant tokens), averaged per head over its valid positions, and summed over heads
with weight ``decay**k``.

Files: `config` (`MedusaConfig`), `module` (`MedusaHeads`), `loss` (`medusa_loss`), `formats` (the vLLM
and original-Medusa exports and imports); this file registers the head type (`heads.registry`).
"""

from __future__ import annotations

from heads.medusa.config import MedusaConfig
from heads.medusa.formats import EXPORT_NOTES, EXPORTS, detect, import_state
from heads.medusa.loss import IGNORE, OBJECTIVE, medusa_labels, medusa_loss, medusa_stats
from heads.medusa.module import MedusaHeads, ResBlock
from heads.registry import HeadType, register


def _predicts(k: int) -> str:
    # Draft token k+1 follows the target's own next token; head k reads h_t and predicts t+2+k.
    return f"t+{k + 2} (draft token {k + 1})"


register(
    HeadType(
        name="medusa",
        config=MedusaConfig,
        module=MedusaHeads,
        objective=OBJECTIVE,
        proposer="static_tree",
        tree="static",
        joint_training=True,  # Medusa-2 (`train.medusa2`)
        exports=EXPORTS,
        import_state=import_state,
        detect=detect,
        export_notes=EXPORT_NOTES,
        title="Medusa",
        tags=("medusa",),
        predicts=_predicts,
    )
)

__all__ = [
    "IGNORE",
    "MedusaConfig",
    "MedusaHeads",
    "ResBlock",
    "medusa_labels",
    "medusa_loss",
    "medusa_stats",
]
