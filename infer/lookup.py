"""Prompt lookup as one more branch of the heads' tree.

Prompt lookup (Saxena 2023; transformers' ``prompt_lookup_num_tokens``) drafts by copying: find the last
few tokens earlier in the prompt or the output, and propose the tokens that followed them there. It
needs no model, and it is right where the answer repeats its context (code signatures, quoted
questions, lists), which is often where the heads are weakest. `graft_chain` adds its k tokens to the
heads' tree as one more branch, so one verify forward checks both and the longest accepted path wins.

    index = NgramIndex(prompt_ids, max_ngram=3)     # host, once per generation
    chain = index.continuation(k)                   # host list of <= k tokens, after every step
    tree = graft_chain(tree, chain_tensor(chain, device))  # device ops, no host sync
    index.extend(emitted)                           # the step's accepted tokens and the bonus

`Lookup` holds both sources of one generation and gives their chains per step.

`CorpusIndex` drafts the same way from a fixed corpus instead of the running text: the target's own
answers that the heads trained on (REST, He et al. 2024: retrieval from a datastore). A chat model
repeats its own phrasing across answers, so the text that followed the last few tokens elsewhere in
what it wrote is often what it writes next. Its chain is grafted as one more branch beside prompt
lookup's.

Verification is unchanged, so the output is too: greedy stays token-identical and exact sampling
stays exact (`infer.verify.accept_exact` treats the chain as deterministic drafts like any other; a
chain node that repeats an earlier sibling's token gets probability 0 there).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from infer.tree import DraftTree, structure_from_parents

LOOKUP_NGRAM = 3  # the longest suffix searched for: 3 tokens, then 2, then 1 (transformers searches 2, 1)


class NgramIndex:
    """The token history of one generation (host ints) with, for every n-gram of up to ``max_ngram``
    tokens, where its first occurrence ends: a lookup is a few dict reads, whatever the history's length.

    continuation(k): the longest suffix of the history (``max_ngram`` tokens down to 1) that occurred
    before, and the up to k tokens that followed its first occurrence; [] when no suffix did."""

    def __init__(self, tokens: Iterable[int] = (), max_ngram: int = LOOKUP_NGRAM) -> None:
        if max_ngram < 1:
            raise ValueError(f"max_ngram must be >= 1, got {max_ngram}")
        self.max_ngram = max_ngram
        self.tokens: list[int] = []
        self.first_end: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        for tok in tokens:
            self.tokens.append(int(tok))
            end = len(self.tokens)
            for n in range(1, min(self.max_ngram, end) + 1):
                self.first_end.setdefault(tuple(self.tokens[end - n :]), end)

    def continuation(self, k: int) -> list[int]:
        return self.find(k)[1]

    def find(self, k: int) -> tuple[int, list[int]]:
        """(n, continuation(k)): n the length of the suffix matched (0: none)."""
        length = len(self.tokens)
        for n in range(min(self.max_ngram, length), 0, -1):
            end = self.first_end.get(tuple(self.tokens[length - n :]))
            if end is not None and end < length:  # the suffix itself is no match: nothing follows it
                return n, self.tokens[end : end + k]
        return 0, []


def chain_tensor(tokens: list[int], device: torch.device) -> Tensor:
    """[m] long on ``device``. On CUDA the copy goes from pinned memory without blocking: a plain
    host-to-device copy would wait for every kernel queued before it, a host sync per step."""
    t = torch.tensor(tokens, dtype=torch.long)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def graft_chain(tree: DraftTree, chain: Tensor) -> DraftTree:
    """The tree with a chain of drafts added under its root: nodes N+1 .. N+m.

    tree: one `DraftTree` of N+1 nodes (depth <= D = ``retrieve.shape[-1] - 1``); chain: [m] long token ids
    on the tree's device, the chain's first token a child of the root. Returns a `DraftTree` of N+1+m
    nodes whose first N+1 are the input's.

    Where the chain's first j tokens already spell a path of the tree (root -> t_1 -> ... -> t_j), the
    chain's next token hangs under t_j, so a path that both propose is verified once and the chain
    extends it; its first j nodes then stay as a copy of that path under the root, never accepted
    (greedy takes the first of equal paths; exact sampling gives a repeated sibling token probability 0).
    The walk is j vector ops over the nodes, on the device, with no host sync; the tree then keeps a
    static size for a given m.
    """
    m, n1 = chain.shape[0], tree.num_nodes
    device = tree.tokens.device
    depth_limit = tree.retrieve.shape[-1] - 1
    at = torch.zeros((), dtype=torch.long, device=device)  # the deepest node on the chain's path so far
    matched = torch.zeros((), dtype=torch.long, device=device)
    alive = torch.ones((), dtype=torch.bool, device=device)
    for j in range(min(m, depth_limit)):
        hit = (tree.parents == at) & (tree.tokens == chain[j])  # [N+1]: at most one (siblings differ)
        alive = alive & hit.any()
        at = torch.where(alive, hit.long().argmax(), at)
        matched = matched + alive.long()
    idx = torch.arange(m, device=device)
    chained = torch.where(idx == 0, 0, n1 + idx - 1)  # the copy: root -> N+1 -> N+2 -> ...
    parents = torch.cat([tree.parents, torch.where(idx == matched, at, chained)])
    depth = torch.cat([tree.depth, idx + 1])
    ancestors, retrieve, sib_before = structure_from_parents(
        parents, depth, max_depth=max(depth_limit, m), leaves_only=False
    )
    return DraftTree(torch.cat([tree.tokens, chain]), parents, depth, ancestors, retrieve, sib_before)


class CorpusIndex:
    """A fixed corpus of token documents, searchable by the last ``max_ngram`` .. ``min_ngram`` tokens of
    a history; a lookup is two binary searches and a few small tensor ops on the host.

    Every position p of the concatenated documents is keyed by its next ``n_max`` tokens, packed into one
    int64 (token + 1 in ``bits`` bits each, 0 past a document's end, so no n-gram spans two documents),
    and the keys are sorted once. The positions where an n-gram s occurs form the range of keys that
    start with s. continuation(history, k): for the longest suffix of ``history`` (``n_max`` tokens down to
    ``min_ngram``) found in the corpus, the up to k tokens that most often followed it: at each depth the
    most frequent next token among the occurrences that agree with the chain so far (REST's majority
    path over its retrieved continuations), over at most ``max_occurrences`` occurrences, evenly spaced
    in the sorted range.

    tokens: documents as lists of ids (token ids >= 0). n_max = min(max_ngram, 63 // bits): 3 for a
    vocabulary under 2^21. Memory: 24 bytes per corpus token (tokens, sorted keys, order: int64).
    """

    def __init__(
        self,
        documents: Iterable[Iterable[int]],
        max_ngram: int = LOOKUP_NGRAM,
        min_ngram: int = 1,
        max_occurrences: int = 64,
    ) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        pieces = [torch.tensor([*doc, -1], dtype=torch.long) for doc in documents]
        flat = torch.cat(pieces) if pieces else torch.full((1,), -1, dtype=torch.long)
        if int(flat.min()) < -1:
            raise ValueError("corpus token ids must be >= 0")
        self.bits = max(1, (int(flat.max()) + 1).bit_length())
        self.n_max = min(max_ngram, 63 // self.bits)
        if self.n_max < min_ngram:
            raise ValueError(f"token ids up to {int(flat.max())} leave no room for {min_ngram}-grams")
        self.min_ngram, self.max_occurrences = min_ngram, max_occurrences
        self.tokens = flat  # [L]: documents, each followed by -1
        self.num_tokens = int((flat >= 0).sum())
        length = flat.shape[0]
        key = torch.zeros(length, dtype=torch.long)
        live = torch.ones(length, dtype=torch.bool)  # no document end seen yet at offsets 0..i
        for i in range(self.n_max):
            shifted = torch.full((length,), -1, dtype=torch.long)
            shifted[: length - i] = flat[i:]
            live &= shifted >= 0
            key = (key << self.bits) | torch.where(live, shifted + 1, 0)
        self.sorted_keys, self.order = torch.sort(key)

    def _range(self, gram: list[int]) -> tuple[int, int]:
        """[lo, hi) in the sorted keys of the positions where ``gram`` (1..n_max tokens) starts."""
        prefix = 0
        for t in gram:
            prefix = (prefix << self.bits) | (t + 1)
        shift = self.bits * (self.n_max - len(gram))
        bounds = torch.tensor([prefix << shift, (prefix + 1) << shift])
        lo, hi = torch.searchsorted(self.sorted_keys, bounds).tolist()
        return lo, hi

    def continuation(self, history: list[int], k: int) -> list[int]:
        return self.find(history, k)[1]

    def find(self, history: list[int], k: int) -> tuple[int, list[int]]:
        """(n, continuation(history, k)): n the length of the suffix matched (0: none)."""
        for n in range(min(self.n_max, len(history)), self.min_ngram - 1, -1):
            gram = history[len(history) - n :]
            if min(gram) < 0 or max(gram) + 1 >= 1 << self.bits:  # a token the corpus does not hold
                continue
            lo, hi = self._range(gram)
            if hi > lo:
                return n, self._majority(lo, hi, n, k)
        return 0, []

    def _majority(self, lo: int, hi: int, n: int, k: int) -> list[int]:
        count = min(hi - lo, self.max_occurrences)
        picks = lo + torch.arange(count) * (hi - lo) // count
        starts = self.order[picks] + n  # [m]: where each occurrence's continuation starts
        at = (starts[:, None] + torch.arange(k)).clamp(max=self.tokens.shape[0] - 1)
        follow = self.tokens[at]  # [m, k]
        follow = torch.where(torch.cumprod(follow >= 0, 1).bool(), follow, -1)  # cut at the document's end
        chain: list[int] = []
        agree = torch.ones(count, dtype=torch.bool)
        for j in range(k):
            col = follow[:, j][agree]
            col = col[col >= 0]
            if col.numel() == 0:
                break
            tok = int(torch.mode(col).values)  # ties: the smallest id
            chain.append(tok)
            agree &= follow[:, j] == tok
        return chain


class Lookup:
    """The chains grafted beside the heads' tree in one generation: prompt lookup's over the running text
    (`NgramIndex`), then ``corpus``'s (`CorpusIndex`, optional). chains(k) -> (prompt lookup's, the
    corpus's): up to k tokens each, cut to ``price``'s lengths (`infer.adaptive.ChainPrice`, optional), []
    where a source found none or where the chain is a prefix of the other's (it would add only nodes that
    repeat the other's). `observe` gives the price each step's outcome."""

    def __init__(self, prompt: Iterable[int], corpus: CorpusIndex | None = None, price=None) -> None:
        self.index, self.corpus, self.price = NgramIndex(prompt), corpus, price
        self.found: list[tuple[int, int, list[int], int]] = []  # (source, order, chain, grafted)

    @property
    def tokens(self) -> list[int]:
        return self.index.tokens

    def extend(self, tokens: Iterable[int]) -> None:
        self.index.extend(tokens)

    def chains(self, k: int) -> tuple[list[int], list[int]]:
        found = [self.index.find(k) if k > 0 else (0, [])]
        if self.corpus is not None:
            found.append(self.corpus.find(self.index.tokens[-self.corpus.n_max :], k) if k > 0 else (0, []))
        cut = [len(chain) for _, chain in found]
        if self.price is not None:  # the other chain's grafted length is a guess: its full one
            for s, (order, _) in enumerate(found):
                cut[s] = min(cut[s], self.price.length(s, order, sum(cut) - cut[s]))
        self.found = [
            (s, order, chain, m) for s, ((order, chain), m) in enumerate(zip(found, cut, strict=True))
        ]
        own, other = found[0][1][: cut[0]], (found[1][1][: cut[1]] if len(found) > 1 else [])
        if other[: len(own)] == own:
            return [], other
        return own, ([] if own[: len(other)] == other else other)

    def observe(self, emitted: list[int], on_path: list[int], nodes: int, heads_nodes: int) -> None:
        """A verify step's outcome for the price (`infer.adaptive.ChainPrice.observe`)."""
        if self.price is not None:
            self.price.observe(self.found, emitted, on_path, nodes, heads_nodes)
