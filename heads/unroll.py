"""The training-time-test unroll of an EAGLE draft through its own decoder layer with a KV cache
(`heads.eagle.EagleHead.ttt_unroll`; the layer itself is `heads.draft_layer`)."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import DynamicCache


def cached_unroll(
    head: nn.Module, input_ids: Tensor, features: Tensor, embed: nn.Module, pair_mask: Tensor | None, steps: int
) -> Tensor:  # fmt: skip
    """The training-time-test unroll of an EAGLE draft (EAGLE-3 paper, §3.3) on its own features, through the
    head's ordinary forward with a KV cache: [K, B, N, H] outputs o^j_k, K = ``steps``.

    input_ids: [B, N + K - 1] with input_ids[:, k] = x_{k+1} (step j reads input_ids[:, j : j + N]);
    features: [B, N, F] the target's features of the N pairs (last hidden state for EAGLE-1/2, the aux
    states for EAGLE-3); pair_mask: [B, N] (1 = both tokens of the pair are real) or None (all real).
    Step 0 runs the pairs (x_{k+1}, f_k) causally at positions k; step j >= 1 runs (x_{k+1+j}, o^{j-1}_k)
    at position k + j and attends to the step-0 keys of pairs <= k and to pair k's own keys at steps
    1..j: the attention a depth-(j+1) tree path gets at inference (``infer.eagle_draft``). Output j at
    pair k predicts the feature whose logits score token k+2+j. Memory O(K² N²) for the masks.
    """
    B, N = features.shape[:2]
    if input_ids.shape != (B, N + steps - 1):
        raise ValueError(
            f"TTT input_ids must be [B, N + K - 1] = {(B, N + steps - 1)}, got {input_ids.shape}"
        )
    device, dtype = features.device, head.fc.weight.dtype
    pair = pair_mask.bool() if pair_mask is not None else torch.ones(B, N, dtype=torch.bool, device=device)
    cache = DynamicCache()
    out = head(input_ids[:, :N], features, embed, attention_mask=pair.long(), cache=cache)
    outs = [out]
    k = torch.arange(N, device=device)
    prefix = (k[None, :] <= k[:, None])[None] & pair[:, None, :]  # [B, N, N] step-0 keys
    eye = torch.eye(N, dtype=torch.bool, device=device).expand(B, N, N)
    neg = torch.finfo(dtype).min
    for j in range(1, steps):
        allowed = torch.cat([prefix] + [eye] * j, 2)  # step 0, steps 1..j-1, this step
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, neg)
        out = head(
            input_ids[:, j : j + N],
            out,
            embed,
            position_ids=(k + j)[None],
            attention_mask=mask[:, None],
            cache=cache,
        )
        outs.append(out)
    return torch.stack(outs)
