"""EAGLE-2 dynamic draft trees (Li et al. 2024, "EAGLE-2: Faster Inference of Language Models with
Dynamic Draft Trees") on an EAGLE-1/2 head (`heads.eagle.EagleHead`) or an EAGLE-3 head
(`heads.eagle3.Eagle3Head`).

The draft layer keeps its own KV cache over *pairs* k = (token x_{k+1}, target feature f_k) at position
k (the convention of `heads.eagle`). Only pairs built from accepted tokens and the target's own
features are ever kept in it; the tree steps' KV (built from predicted features) is cropped away at
the end of every `propose`.

One `propose(root)`:

1. commit: one draft forward over the pairs that became known since the last step — the accepted
   tokens with the target features of their predecessors — plus the root pair (root, f_last). Its
   last output f̂ scores the root's children: log p = log_softmax(lm_head f̂).
2. expand (``depth - 1`` draft forwards): the frontier (``draft_top_k`` nodes) runs as one batch of
   pairs (node token, parent's f̂) at position root_pos + depth(node), with a tree mask against the
   draft cache (the committed prefix, plus the node's ancestors from earlier steps, plus itself).
   Each node's top ``draft_top_k`` children are scored by parent score + log p; the global top
   ``draft_top_k`` of those form the next frontier. Every scored child is a candidate.
3. rerank: keep the ``total_tokens - 1`` candidates of highest cumulative log-prob. A child never
   scores above its parent (log p <= 0) and a stable sort breaks ties toward the earlier-created
   parent, so every kept node's parent is kept; sorting the kept nodes by creation index orders
   parents before children. Siblings come from one top-k, so their tokens are distinct.

No Python loop runs over nodes (only over depth), and `propose` has no host sync: every shape is
known on the host, and the tree structure is built with ``structure_from_parents(max_depth=depth,
leaves_only=False)``, whose ops do not depend on tensor values.

`BatchEagle` does all of this for a batch of rows at once (each row its own pairs, frontier, tree);
`EagleProposer` is its one-row case, so both run the same code. With B > 1 the tree structure is
built per row (B small calls) and every 8th step reads the draft cache's fill back to close holes.

EAGLE-3 heads differ in three places only: the target feature of a pair is ``cat(aux)`` [3H], the
target's ``hidden_states`` at the head's ``aux_layer_ids`` (``aux_layers`` tells `generate` to return
them; the head fuses them through its ``fc``), while tree steps feed the draft's own outputs [H]; the
logits are over the head's draft vocabulary; and draft ids map to target ids through ``d2t``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from heads.graft import TargetOutput
from infer.attention import BatchTreeMask
from infer.cache import StaticDraftKV, StaticRaggedKV
from infer.compiled import compiled
from infer.draft import BatchProposer, Proposer, root_only_rows, row_of
from infer.settings import DEFAULTS
from infer.tree import DraftTree, structure_from_parents


class EagleProposer(Proposer):
    """EAGLE-2 dynamic-tree drafting.

    head: an `EagleHead` or `Eagle3Head`; embed / lm_head: the target's input embedding and lm_head
    modules (an `Eagle3Head` has its own lm_head and ignores the target's).
    depth: maximum draft depth (tree depth, root = 0); draft_top_k: frontier width and children per
    expanded node; total_tokens: tree size including the root.
    """

    def __init__(
        self,
        head: nn.Module,
        embed: nn.Module,
        lm_head: nn.Module,
        depth: int = DEFAULTS.depth,
        draft_top_k: int = DEFAULTS.draft_top_k,
        total_tokens: int = DEFAULTS.total_tokens,
        greedy_score_temperature: float = DEFAULTS.greedy_score_temperature,
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        if draft_top_k < 1:
            raise ValueError(f"draft_top_k must be >= 1, got {draft_top_k}")
        if total_tokens < 2:
            raise ValueError(
                f"total_tokens must be >= 2 (the root and at least one draft), got {total_tokens}"
            )
        self.head, self.embed, self.lm_head = head, embed, lm_head
        if not 0 < greedy_score_temperature <= 10:
            raise ValueError(f"greedy_score_temperature must be in (0, 10], got {greedy_score_temperature}")
        self.depth, self.total_tokens = depth, total_tokens
        self.greedy_score_temperature = greedy_score_temperature
        self.score_scale = 1.0  # 1 / the scores' temperature, set per generation by `decoding`
        # EAGLE-3: target features are the aux hidden states; draft ids map to target ids via d2t
        self.aux_layers = tuple(getattr(head.config, "aux_layer_ids", None) or ())
        self.d2t: Tensor | None = getattr(head, "d2t", None)
        n_vocab = self.d2t.shape[0] if self.d2t is not None else head.config.vocab_size
        self.top_k = min(draft_top_k, n_vocab)
        self._const: dict[tuple, tuple[Tensor, Tensor]] = {}  # `_constants`, per device, dtype and width
        self._rows: BatchEagle | None = None  # the one-row batch this proposer drafts with
        self.max_len = 0  # `plan`: prompt + new tokens expected, to size the static draft cache once

    def plan(self, max_len: int) -> None:
        self.max_len = max_len

    def decoding(self, temperature: float | None) -> None:
        """Tree scores are log_softmax(logits / t) with t = the sampling temperature, or, greedy (None),
        ``greedy_score_temperature``: a deterministic draft x is accepted with probability p_target(x)
        at that temperature (exact sampling), and iff it is the target's argmax (greedy), which the
        draft's T = 1 confidence understates (`infer.settings.InferSettings`). Only the tree's shape
        depends on it."""
        t = self.greedy_score_temperature if temperature is None else temperature
        self.score_scale = 1.0 / t

    @property
    def cache(self):
        """The draft layer's KV cache (a transformers ``Cache`` of one `infer.cache.FilledStaticLayer`),
        None before `start`."""
        return self._rows.kv.cache if self._rows is not None else None

    def _target_feats(self, hidden: Tensor, aux: tuple[Tensor, ...]) -> Tensor:
        """[..., H] last hidden state (EAGLE-1/2) or [..., 3H] cat of the aux states (EAGLE-3)."""
        return torch.cat(aux, dim=-1) if self.aux_layers else hidden

    @property
    def k(self) -> int:
        """The frontier width and children per node of this step: ``draft_top_k``, or 1 when ``width``
        asks for a chain (`infer.adaptive`)."""
        return self.top_k if self.width is None else min(self.width, self.top_k)

    def _constants(self, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """Built once per device, dtype and width K: (the additive self-attention block [K, K], 0 on the
        diagonal and ``finfo.min`` elsewhere; the depth of every candidate slot [K + (depth-1)·K²], in
        creation order)."""
        K = self.k
        key = (device, dtype, K)
        if key not in self._const:
            eye = torch.full((K, K), torch.finfo(dtype).min, dtype=dtype, device=device).fill_diagonal_(0)
            sizes = torch.tensor([K] + [K * K] * (self.depth - 1), device=device)
            depth = torch.arange(1, self.depth + 1, device=device).repeat_interleave(sizes)
            self._const[key] = (eye, depth)
        return self._const[key]

    def step(self, tokens: Tensor, feats: Tensor, pos: Tensor, mask: Tensor, cache, tail: int = 0,
             placeholders: int = 0) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        """`draft_step` with this proposer's head, embedding, lm_head, vocabulary map and top-k, under
        ``torch.compile`` when `compile` set a backend; then the inputs are made contiguous (a frontier's
        expanded features and positions have stride 0), so that strides do not multiply the graphs."""
        if self.backend is not None:
            tokens, feats, pos = tokens.contiguous(), feats.contiguous(), pos.contiguous()
        return compiled(draft_step, self.backend)(self.head, self.embed, self.lm_head, self.d2t, tokens, feats,
                                                  pos, mask, cache, self.k, tail, placeholders,
                                                  self.score_scale)  # fmt: skip

    def start(self, prompt_ids: Tensor, out: TargetOutput) -> None:
        """prompt_ids: [1, T]; out.hidden: [1, T, H] (out.aux for EAGLE-3). Pairs 0..T-2 are pending;
        f_{T-1} waits for the root."""
        self._rows = BatchEagle(self, max_len=self.max_len, one_row=True)
        self._rows.start(prompt_ids, out, torch.ones_like(prompt_ids, dtype=torch.bool))

    def advance(self, tokens: Tensor, hidden: Tensor, aux: tuple[Tensor, ...]) -> None:
        """tokens: [n] accepted nodes (root first); hidden: [n, H] the target's features at them (aux:
        its [n, H] states at ``aux_layers``, for EAGLE-3).

        New pairs (tokens[i], feature[i-1]) for i = 1..n-1; the root pair was consumed by `propose`.
        """
        n = torch.full((1,), tokens.shape[0], dtype=torch.long, device=tokens.device)
        self._rows.advance(tokens[None], hidden[None], tuple(a[None] for a in aux), n)

    def propose(self, root: Tensor, max_depth: int) -> DraftTree:
        """root: [] long, the token the target chose last step -> a `DraftTree` of depth <= min(depth, max_depth)."""
        return row_of(self._rows.propose(root.view(1), max_depth))

    def batched(self) -> BatchEagle:
        return BatchEagle(self, max_len=self.max_len, one_row=False)


def draft_step(head: nn.Module, embed: nn.Module, lm_head: nn.Module, d2t: Tensor | None, tokens: Tensor,
               feats: Tensor, pos: Tensor, mask: Tensor, cache, k: int, tail: int = 0,
               placeholders: int = 0, scale: float = 1.0) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """The EAGLE draft step: one draft-layer forward over T pairs (tokens [B, T], features [B, T, F] at
    positions ``pos`` [B, T], additive ``mask`` [B, 1, T + placeholders, S], the draft ``cache``
    extended in place) and the top-k of log_softmax(scale · lm_head f̂) at its last ``tail`` outputs
    (0: all; ``scale`` = 1 / the scores' temperature: the same tokens, other scores)
    -> (f̂ [B, t, H], log-probs [B, t, k], target token ids [B, t, k]; t = tail or T + placeholders).
    ``placeholders``: P-EAGLE's undrafted slots after the pairs (`infer.parallel_draft`). No host
    sync: every size is known on the host, so under ``torch.compile`` it traces as one graph."""
    extra = {"placeholders": placeholders} if placeholders else {}
    out = head(tokens, feats, embed, position_ids=pos, attention_mask=mask, cache=cache, **extra)
    if tail:
        out = out[:, -tail:]
    logits = head.logits(out, lm_head)
    top = torch.log_softmax(logits * scale if scale != 1.0 else logits, -1).topk(k, dim=-1)
    ids = top.indices if d2t is None else top.indices + d2t[top.indices]
    return out, top.values, ids


def commit_block(ok: Tensor) -> Tensor:
    """ok [B, m] (False: padding) -> [B, m, m] bool: pair i sees pair j <= i that is real, and itself (a
    padding pair sees itself only, so its softmax has a finite row)."""
    m = ok.shape[1]
    eye = torch.eye(m, dtype=torch.bool, device=ok.device)
    return torch.ones_like(eye).tril()[None] & ok[:, None, :] | eye[None]


def _additive(vis: Tensor, dtype: torch.dtype) -> Tensor:
    """[B, Q, S] bool (True = attend) -> the [B, 1, Q, S] additive mask the draft layer takes."""
    mask = torch.zeros(vis.shape, dtype=dtype, device=vis.device)
    return mask.masked_fill_(~vis, torch.finfo(dtype).min)[:, None]


PACK_SLACK = 32  # holes a batch's draft cache tolerates before `StaticRaggedKV.pack` closes them


class BatchDraftMasks:
    """The batched draft's additive masks in one `infer.attention.BatchTreeMask` per generation
    ([B, rows, capacity], rewritten in place, never re-allocated within ``rows`` queries), over a
    `StaticRaggedKV`'s slot positions (a slot is visible iff it holds a pair of the row).

    commit [B, 1, m, S + m]: the filled slots, then the m new pairs by `commit_block`. A commit of more
    than ``rows`` pairs (the prompt's, once per generation) gets a mask of its own instead of growing
    the buffer to [B, T, capacity]. tree [B, 1, Q, S + cols]: the filled slots, the tree block all
    ``finfo.min`` for the caller to fill in place (the tree's slot positions are set to -1 first: the
    draft's tree steps write KV after the committed slots without recording positions)."""

    def __init__(self, batch: int, rows: int, cols: int, device: torch.device, dtype: torch.dtype) -> None:
        self.rows = rows
        self.mask = BatchTreeMask(batch, rows, cols, device, additive=dtype)
        self.none: Tensor | None = None  # [B, rows, rows] all False: a tree block nobody sees yet

    def commit(self, kv: StaticRaggedKV, ok: Tensor, dtype: torch.dtype) -> Tensor:
        if ok.shape[1] > self.rows:
            return _additive(torch.cat([kv.visible(ok.shape[1]), commit_block(ok)], 2), dtype)
        return self.mask(kv.pos, commit_block(ok), kv.pos[:, :1])

    def tree(self, kv: StaticRaggedKV, queries: int, cols: int) -> Tensor:
        B, C = kv.pos.shape[0], kv.slots
        if self.none is None or self.none.shape[0] < B:
            self.none = torch.zeros(B, self.rows, self.rows, dtype=torch.bool, device=kv.buf.device)
        kv.reserve(cols)
        kv.buf[:, C : C + cols - queries] = -1  # not filled: invisible
        return self.mask(kv.buf[:, : C + cols - queries], self.none[:B, :queries, :queries], kv.pos[:, :1])


class BatchEagle(BatchProposer):
    """`EagleProposer` for a batch: the same EAGLE-2 drafting, every row at once.

    The draft cache is a `StaticRaggedKV` sized once per generation (`start`) with its masks in
    `BatchDraftMasks` (rows commit different numbers of pairs per step; a row's padding pairs become
    holes that no query attends); ``one_row`` (`EagleProposer`: one row, unpadded) a `StaticDraftKV`. ``pending_*`` [B, M] hold the pairs not yet committed,
    right-padded (``pending_ok`` False at padding). Every row expands its own frontier and reranks its
    own candidates; only the tree structure is built per row (`structure_from_parents` takes one tree).
    """

    def __init__(self, single: EagleProposer, max_len: int = 0, one_row: bool = False) -> None:
        self.single = single
        self.aux_layers = single.aux_layers
        self.max_len, self.one_row = max_len, one_row  # one_row: unpadded, on a `StaticDraftKV`
        self.kv: StaticRaggedKV | StaticDraftKV | None = None
        self.masks: BatchDraftMasks | None = None  # the batch's masks (not one_row)
        self.pairs: Tensor | None = None  # [B] pairs committed per row (the next pair's position)
        self.pending_tokens: Tensor | None = None  # [B, M]
        self.pending_feats: Tensor | None = None  # [B, M, F]
        self.pending_ok: Tensor | None = None  # [B, M] bool
        self.last_feat: Tensor | None = None  # [B, F]
        self.commits = 0

    def start(self, prompt_ids: Tensor, out: TargetOutput, valid: Tensor) -> None:
        """Pair t = (x_{t+1}, f_t) for t < T-1, real iff token t is (left-aligned rows).

        The draft cache is sized once: every pair of the generation (``max_len``, at least T + 256),
        one propose's tree block or P-EAGLE slots, and for a batch the holes `pack` tolerates
        (``PACK_SLACK``) plus the 8 commits between packs."""
        feats = self.single._target_feats(out.hidden, out.aux)
        feats = feats.masked_fill(~valid[..., None], 0)  # padding's features are never read; keep them finite
        B, T = prompt_ids.shape
        s, device = self.single, prompt_ids.device
        rows = max(s.top_k, 2 * s.depth + 2)  # queries of a tree step, a commit after one step
        cap = max(self.max_len, T + 256) + max((s.depth - 1) * s.top_k, s.depth)
        if self.one_row:
            self.kv = StaticDraftKV(cap, max(s.top_k, s.depth + 2), device)
        else:
            cap += PACK_SLACK + 8 * rows
            self.kv = StaticRaggedKV(prompt_ids.new_empty(B, 0), cap)
            self.masks = BatchDraftMasks(B, rows, cap, device, s.head.fc.weight.dtype)
        self.pairs = torch.zeros(B, dtype=torch.long, device=device)
        self.pending_tokens, self.pending_feats = prompt_ids[:, 1:], feats[:, :-1]
        self.pending_ok = valid[:, :-1]
        self.last_feat = feats[:, -1]

    def commit_mask(self, ok: Tensor, dtype: torch.dtype) -> Tensor:
        """ok [B, m] -> the [B, 1, m, slots + m] mask of a commit of m pairs (room reserved for them)."""
        if self.one_row:
            return self.kv.commit_mask(ok, dtype)
        self.kv.reserve(ok.shape[1])
        return self.masks.commit(self.kv, ok, dtype)

    def pack(self) -> None:
        """Every 8th commit of a batch, close the padding holes once they exceed ``PACK_SLACK`` (the
        check reads the fill back: a sync; one row has no holes)."""
        self.commits += 1
        if not self.one_row and self.commits % 8 == 0:
            self.kv.pack(slack=PACK_SLACK)

    def advance(self, tokens: Tensor, hidden: Tensor, aux: tuple[Tensor, ...], length: Tensor) -> None:
        """New pairs (tokens[b, i], feature[b, i-1]) for i = 1..length[b]-1."""
        feats = self.single._target_feats(hidden, aux)
        ok = torch.arange(tokens.shape[1] - 1, device=tokens.device) < (length - 1)[:, None]
        self._pend(tokens[:, 1:], feats[:, :-1], ok)
        self.last_feat = feats[torch.arange(feats.shape[0], device=feats.device), length - 1]

    def _pend(self, tokens: Tensor, feats: Tensor, ok: Tensor) -> None:
        """Append pairs [B, m] (``ok`` False: padding) to the pending ones."""
        self.pending_tokens = torch.cat([self.pending_tokens, tokens], 1)
        self.pending_feats = torch.cat([self.pending_feats, feats], 1)
        self.pending_ok = torch.cat([self.pending_ok, ok], 1)

    def select(self, rows: Tensor) -> None:
        self.kv.select(rows)
        for name in ("pairs", "pending_tokens", "pending_feats", "pending_ok", "last_feat"):
            setattr(self, name, getattr(self, name).index_select(0, rows))

    def _commit(self, root: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One draft forward over every row's pending pairs + its root pair -> f̂ at the root [B, H] and its
        `draft_step` top-k (log-probs, target ids [B, K]): the root's children."""
        s = self.single
        toks = torch.cat([self.pending_tokens, root[:, None]], 1)  # [B, m]
        feats = torch.cat([self.pending_feats, self.last_feat[:, None]], 1)
        ok = torch.cat([self.pending_ok, torch.ones_like(root, dtype=torch.bool)[:, None]], 1)
        pos = self.pairs[:, None] + ok.long().cumsum(1) - 1
        mask = self.commit_mask(ok, s.head.fc.weight.dtype)
        out, score, ids = s.step(toks, feats, pos.clamp(min=0), mask, self.kv.cache, tail=1)
        self.kv.extend(torch.where(ok, pos, -1))
        self.pairs = self.pairs + ok.sum(1)
        self.pending_tokens, self.pending_feats, self.pending_ok = toks[:, :0], feats[:, :0], ok[:, :0]
        self.pack()
        return out[:, 0], score[:, 0], ids[:, 0]

    def propose(self, root: Tensor, max_depth: int) -> DraftTree:
        """root: [B] -> a batch of `DraftTree` of depth <= min(depth, max_depth), total_tokens nodes each
        (fewer when there are fewer candidates)."""
        s, K, B = self.single, self.single.k, root.shape[0]
        D = min(s.depth, max_depth)
        if D <= 0:  # nothing to draft: keep the root pair for later
            self._pend(
                root[:, None], self.last_feat[:, None], torch.ones_like(root, dtype=torch.bool)[:, None]
            )
            return root_only_rows(root)
        f_root, top_score, top_tok = self._commit(root)  # [B, H], [B, K] x 2
        device, dtype = root.device, s.head.fc.weight.dtype
        eye, cand_depth = s._constants(device, dtype)
        cand_tok, cand_score = [top_tok], [top_score]
        cand_parent = [torch.full((B, K), -1, dtype=torch.long, device=device)]
        n_cand = K
        f_cid = torch.arange(K, device=device).expand(B, K)
        f_tok, f_score, f_feat = top_tok, top_score, f_root[:, None].expand(-1, K, -1)
        C, root_pos = self.kv.slots, self.pairs - 1
        if self.one_row:  # a view of its buffer, reset by `crop`
            mask = self.kv.tree_mask(K, (D - 1) * K, dtype)
        else:  # a view of the batch's mask buffer, rewritten by the next call
            mask = self.masks.tree(self.kv, K, (D - 1) * K)[:, 0]
        for d in range(1, D):  # as `EagleProposer.propose`, with a row dimension
            hi = C + d * K
            mask[:, :, hi - K : hi] = eye
            pos = (root_pos + d)[:, None].expand(-1, K)
            f_hat, child_score, child_tok = s.step(f_tok, f_feat, pos, mask[:, None, :, :hi], self.kv.cache)
            scores = (f_score[:, :, None] + child_score).reshape(B, -1)  # [B, K*K]
            tokens = child_tok.reshape(B, -1)
            cand_tok.append(tokens)
            cand_score.append(scores)
            cand_parent.append(f_cid.repeat_interleave(K, dim=1))
            n_cand += K * K
            if d == D - 1:
                break
            best = scores.topk(K, dim=-1).indices  # [B, K]
            pj = best // K
            f_cid = n_cand - K * K + best
            f_tok, f_score = tokens.gather(1, best), scores.gather(1, best)
            f_feat = f_hat.gather(1, pj[..., None].expand(-1, -1, f_hat.shape[-1]))
            mask[:, :, C:hi] = mask[:, :, C:hi].gather(1, pj[..., None].expand(-1, -1, hi - C))
        self.kv.crop(C)  # drop the tree steps' KV
        return self._rerank(root, torch.cat(cand_tok, 1), torch.cat(cand_score, 1), torch.cat(cand_parent, 1),
                            cand_depth[:n_cand], D)  # fmt: skip

    def _rerank(self, root, tok, score, parent, depth, D: int) -> DraftTree:
        """Every row's best total_tokens - 1 candidates ([B, n_cand] each) as its tree."""
        B, n_cand, device = tok.shape[0], tok.shape[1], tok.device
        n = min(self.single.total_tokens - 1, n_cand)
        keep = torch.sort(score, dim=1, descending=True, stable=True).indices[:, :n].sort(dim=1).values
        slot = torch.zeros(B, n_cand, dtype=torch.long, device=device)
        slot.scatter_(1, keep, torch.arange(1, n + 1, device=device).expand(B, n))
        kp = parent.gather(1, keep)
        minus = torch.full((B, 1), -1, dtype=torch.long, device=device)
        parents = torch.cat([minus, torch.where(kp >= 0, slot.gather(1, kp.clamp(min=0)), 0)], 1)
        depths = torch.cat([torch.zeros_like(minus), depth[keep]], 1)
        tokens = torch.cat([root[:, None], tok.gather(1, keep)], 1)
        per_row = [  # O(B) calls of a few tiny ops each
            structure_from_parents(p, d, max_depth=D, leaves_only=False)
            for p, d in zip(parents, depths, strict=True)
        ]
        ancestors, retrieve, sib_before = (torch.stack(t) for t in zip(*per_row, strict=True))
        return DraftTree(tokens, parents, depths, ancestors, retrieve, sib_before)
