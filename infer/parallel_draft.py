"""P-EAGLE parallel drafting on an EAGLE-3 head trained with ``parallel_draft: K`` (`heads.eagle3`).

Where `infer.eagle_draft` runs one draft forward to commit the new pairs and then one per tree depth,
this proposer runs ONE draft forward per step: the pending pairs, the root pair (root, f_last) and
D - 1 placeholder slots (D = min(depth, K, max_depth)) go through the layer together, causally. The
output at the root scores depth 1 and the one at placeholder i depth i + 1: D marginals p_d [Vd]. The
placeholders do not know which token was drafted before them, so every node at depth d gets the same
children, the top ``draft_top_k`` of p_{d+1}; the tree is grown and reranked as EAGLE-2 does (each
depth's best ``draft_top_k`` nodes by cumulative log-probability expand, the best ``total_tokens - 1``
candidates are kept), and ``draft_top_k = 1`` gives a chain.

The draft cache stays exact: only the real pairs are committed (`StaticDraftKV.extend` over them); the
placeholders' KV and mask columns are dropped right after the forward (`StaticDraftKV.crop`), so the
next step's commit carries the accepted tokens with the target's real features, never a placeholder's
state. Lossless: the tree is only a proposal, verified by the target as any other.
"""

from __future__ import annotations

import torch
from torch import Tensor

from infer.draft import root_only_rows, row_of
from infer.eagle_draft import BatchEagle, EagleProposer
from infer.settings import DEFAULTS
from infer.tree import DraftTree


class ParallelProposer(EagleProposer):
    """`EagleProposer`'s interface for P-EAGLE heads: one draft forward per step (module docstring).

    depth is clamped to the head's ``parallel_draft`` (the slots it was trained for); draft_top_k and
    total_tokens shape the tree as for EAGLE-2. ``batched`` gives the same drafting for a batch.
    """

    def __init__(
        self,
        head,
        embed,
        lm_head,
        depth: int = 6,
        draft_top_k: int = 8,
        total_tokens: int = 48,
        greedy_score_temperature: float = DEFAULTS.greedy_score_temperature,
    ) -> None:
        K = int(getattr(head.config, "parallel_draft", 0) or 0)
        if K < 2:
            raise ValueError(
                "ParallelProposer needs EAGLE-3 heads trained with parallel_draft >= 2 (P-EAGLE: heads.eagle3.p_eagle)"
            )
        super().__init__(
            head, embed, lm_head, min(depth, K), draft_top_k, total_tokens, greedy_score_temperature
        )

    def start(self, prompt_ids: Tensor, out) -> None:
        self._rows = BatchParallel(self, max_len=self.max_len, one_row=True)
        self._rows.start(prompt_ids, out, torch.ones_like(prompt_ids, dtype=torch.bool))

    def propose(self, root: Tensor, max_depth: int) -> DraftTree:
        return row_of(self._rows.propose(root.view(1), max_depth))

    def batched(self) -> BatchParallel:
        return BatchParallel(self, max_len=self.max_len, one_row=False)


class BatchParallel(BatchEagle):
    """`ParallelProposer`'s drafting for a batch (a `StaticRaggedKV` and `BatchDraftMasks`) or one row
    (a `StaticDraftKV`); the pending pairs as `BatchEagle`'s."""

    def _commit_with_slots(self, root: Tensor, slots: int) -> tuple[Tensor, Tensor, Tensor]:
        """One draft forward over every row's pending pairs, its root pair and ``slots`` placeholders ->
        the outputs at the root and the placeholders [B, slots + 1, H] and their top-k (log-probs, target
        ids [B, slots + 1, K]), one `infer.eagle_draft.draft_step`; only the real pairs stay cached."""
        s, kv = self.single, self.kv
        B, device = root.shape[0], root.device
        toks = torch.cat([self.pending_tokens, root[:, None]], 1)  # [B, m], the root last in every row
        feats = torch.cat([self.pending_feats, self.last_feat[:, None]], 1)
        ok = torch.cat([self.pending_ok, torch.ones_like(root, dtype=torch.bool)[:, None]], 1)
        pos = self.pairs[:, None] + ok.long().cumsum(1) - 1
        slot_pos = pos[:, -1:] + torch.arange(1, slots + 1, device=device)  # after the root: depths 2..
        all_ok = torch.cat([ok, torch.ones(B, slots, dtype=torch.bool, device=device)], 1)
        mask = self.commit_mask(all_ok, s.head.fc.weight.dtype)
        out = s.step(toks, feats, torch.cat([pos.clamp(min=0), slot_pos], 1), mask, kv.cache, tail=slots + 1,
                     placeholders=slots)  # fmt: skip
        kv.extend(torch.where(ok, pos, -1))
        if self.one_row:  # its placeholder mask columns are reset (and their KV dropped) by crop
            kv.tree_end = kv.slots + slots
        kv.crop(kv.slots)
        self.pairs = self.pairs + ok.sum(1)
        self.pending_tokens, self.pending_feats, self.pending_ok = toks[:, :0], feats[:, :0], ok[:, :0]
        self.pack()
        return out

    def propose(self, root: Tensor, max_depth: int) -> DraftTree:
        """root: [B] -> a batch of `DraftTree` of depth <= min(depth, max_depth) (module docstring)."""
        s, K, B = self.single, self.single.k, root.shape[0]
        D = min(s.depth, max_depth)
        if D <= 0:  # nothing to draft: keep the root pair for later
            self._pend(
                root[:, None], self.last_feat[:, None], torch.ones_like(root, dtype=torch.bool)[:, None]
            )
            return root_only_rows(root)
        _, kid_score, kid_tok = self._commit_with_slots(root, D - 1)  # [B, D, K] x 2
        # every node of depth d gets the children kid_tok[:, d]
        device = root.device
        cand_tok, cand_score = [kid_tok[:, 0]], [kid_score[:, 0]]
        cand_parent = [torch.full((B, K), -1, dtype=torch.long, device=device)]
        f_cid, f_score, n_cand = torch.arange(K, device=device).expand(B, K), kid_score[:, 0], K
        for d in range(1, D):  # depth d+1: the frontier's K nodes x the K children of p_{d+1}
            scores = (f_score[:, :, None] + kid_score[:, d, None, :]).reshape(B, -1)  # [B, K*K]
            cand_tok.append(kid_tok[:, d].repeat(1, K))
            cand_score.append(scores)
            cand_parent.append(f_cid.repeat_interleave(K, dim=1))
            n_cand += K * K
            best = scores.topk(K, dim=-1).indices
            f_cid, f_score = n_cand - K * K + best, scores.gather(1, best)
        _, cand_depth = s._constants(device, s.head.fc.weight.dtype)
        return self._rerank(root, torch.cat(cand_tok, 1), torch.cat(cand_score, 1), torch.cat(cand_parent, 1),
                            cand_depth[:n_cand], D)  # fmt: skip
