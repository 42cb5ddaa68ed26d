"""`generate`: self-speculative decoding with tree verification through the stock target model.

One step (for a batch, every row does the same with its own tree, path and length; see
`_decode_batch`):

    tree   = proposer.propose(root)                 # root = token the target chose last step
    logits = target(tree.tokens, 4D tree mask, position_ids = past + depth, cache)   # one forward
    path, n, bonus = accept(logits, tree)          # greedy | exact rejection sampling | typical
    emit tree.tokens[path[1:n]] + [bonus]; keep path's KV, drop the rest; root = bonus

Greedy output is token-identical to ``target.generate(do_sample=False)``; sampled output (``acceptance=
"exact"``) follows the target's warped distribution exactly. The only host sync per step is reading
the accepted tokens back (needed to stop at EOS / ``max_new_tokens`` and to size the cache).

``timing=True`` splits the wall-clock time into draft (the proposer), verify (target forwards and their
masks) and bookkeeping (the rest: acceptance, cache compaction, streaming); on CUDA it synchronises
around each section, so it is off by default to keep the loop at one host sync per step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from infer.adaptive import Adapter, Adaptive
from infer.arguments import Job, context_length, prepare
from infer.compiled import backend_of
from infer.cost import verify_seconds
from infer.draft import BatchProposer, Proposer
from infer.lookup import CorpusIndex, Lookup, chain_tensor, graft_chain
from infer.runner import BatchRunner, TreeRunner
from infer.settings import DEFAULTS, TREE_LIMITS
from infer.support import check_target
from infer.tree import DraftTree
from infer.verify import Acceptance, accept_exact, accept_greedy, accept_typical, sample_from

__all__ = ["GenerateOutput", "GenerationStats", "context_length", "speculative_generate"]


@dataclass
class GenerationStats:
    """accepted_lengths: tokens each verify step produced (accepted drafts + the bonus token), before
    truncation at EOS/max_new_tokens. ``mean_accepted_length`` (τ) counts the bonus token, as the
    Medusa and EAGLE papers do. ``num_target_forwards`` counts the prefill too.

    With ``generate(..., timing=True)`` (else None): ``total_time_s`` is the whole call;
    ``verify_time_s`` all target forwards with their tree masks, the prefill included;
    ``draft_time_s`` the proposer's ``start``/``propose``/``advance``; ``bookkeeping_time_s`` = total -
    draft - verify (config, acceptance, the host sync, cache compaction, streaming).

    A batch (or a padded prompt) also fills ``rows``: one `GenerationStats` per row with its own
    ``accepted_lengths`` (its τ), ``new_tokens`` and ``num_target_forwards`` (the batched forwards it
    took part in). The totals then cover all rows: ``accepted_lengths`` lists every row's steps, row
    after row (so ``mean_accepted_length`` is the total τ over row-steps), ``new_tokens`` is their
    sum and ``num_target_forwards`` counts batched forwards.

    ``tree_sizes``: the nodes each verify step verified (root included, prompt lookup's chain too; 1: no
    drafts, a plain decoding step, counted by ``steps_without_drafts``). ``lookup_accepted``: drafts
    accepted from the lookup chains (`infer.lookup`) rather than the heads' tree; ``corpus_accepted``:
    those of them from the corpus's chain. ``adaptive``
    (None with a fixed tree): what `infer.adaptive.Adapter` did, ``{"steps": {"tree"|"chain"|"none":
    steps}, "final": mode, "chain_depth": d}``."""

    accepted_lengths: list[int] = field(default_factory=list)
    num_target_forwards: int = 0
    new_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    draft_time_s: float | None = None
    verify_time_s: float | None = None
    total_time_s: float | None = None
    rows: list[GenerationStats] = field(default_factory=list)
    tree_sizes: list[int] = field(default_factory=list)
    adaptive: dict | None = None
    lookup_accepted: int = 0
    corpus_accepted: int = 0

    @property
    def steps_without_drafts(self) -> int:
        """Verify steps that verified the root alone: plain decoding steps."""
        return sum(n == 1 for n in self.tree_sizes)

    @property
    def mean_accepted_length(self) -> float:
        return sum(self.accepted_lengths) / max(len(self.accepted_lengths), 1)

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / max(self.num_target_forwards, 1)

    @property
    def tokens_per_s(self) -> float:
        t = self.prefill_s + self.decode_s
        return self.new_tokens / t if t > 0 else 0.0

    @property
    def bookkeeping_time_s(self) -> float | None:
        if self.total_time_s is None:
            return None
        return self.total_time_s - (self.draft_time_s or 0.0) - (self.verify_time_s or 0.0)


@dataclass
class GenerateOutput:
    # [B, T + new_tokens], the prompt as given (padding included) then each row's new tokens, a row that
    # stopped early (EOS) filled with the pad id, as transformers' generate returns
    sequences: Tensor
    stats: GenerationStats


class _Clock:
    """Draft / verify section timers. On CUDA with ``timing`` each boundary waits for the queued kernels
    (so it is off by default: the loop keeps one host sync per step)."""

    def __init__(self, timing: bool, device: torch.device) -> None:
        self.sync = torch.cuda.synchronize if timing and device.type == "cuda" else None
        self.draft_s = self.verify_s = 0.0

    def tick(self) -> float:
        if self.sync is not None:
            self.sync()
        return time.perf_counter()

    def draft(self, fn: Callable, *args):
        t = self.tick()
        result = fn(*args)
        self.draft_s += self.tick() - t
        return result

    def verify(self, fn: Callable, *args):
        t = self.tick()
        result = fn(*args)
        self.verify_s += self.tick() - t
        return result


@dataclass
class _Rule:
    """The acceptance rule of one generation (greedy when ``warp`` is None). Rules and ``sample_from``
    are looked up in this module when called, so a test can substitute one."""

    warp: object
    acceptance: str
    eps: float
    delta: float
    generator: torch.Generator | None

    def probs(self, logits: Tensor) -> Tensor:
        """[..., V] -> float32 warped probabilities (the warpers take 2-D scores)."""
        flat = self.warp(None, logits.reshape(-1, logits.shape[-1]).float())
        return torch.softmax(flat, dim=-1).view(logits.shape)

    def first(self, last: Tensor) -> Tensor:
        """last: [B, V] the prefill's last logits -> [B] each row's first new token."""
        if self.warp is None:
            return last.float().argmax(-1)
        return sample_from(self.probs(last), self.generator)

    def accept(self, logits: Tensor, tree: DraftTree) -> Acceptance:
        """logits [N+1, V] with one tree, [B, N+1, V] with a batch of trees."""
        if self.warp is None:
            return accept_greedy(logits, tree)
        if self.acceptance == "exact":
            return accept_exact(self.probs(logits), tree, self.generator)
        return accept_typical(self.probs(logits), tree, self.eps, self.delta, self.generator)


class _Row:
    """One row's new tokens and stats; ``emit`` appends up to the limit, stopping after the first EOS."""

    def __init__(self, job: Job, streamer=None) -> None:
        self.limit, self.eos, self.streamer = job.limit, job.eos, streamer
        self.new: list[int] = []
        self.stats = GenerationStats(num_target_forwards=1)

    def emit(self, tokens: list[int]) -> bool:
        """True when this row's generation is over."""
        done = False
        for i, tok in enumerate(tokens):
            if tok in self.eos or len(self.new) + i + 1 >= self.limit:
                tokens, done = tokens[: i + 1], True
                break
        self.new.extend(tokens)
        if self.streamer is not None and tokens:
            self.streamer.put(torch.tensor(tokens))
        return done

    def step(self, host: list[int], nodes: int) -> bool:
        """host: [n, bonus, path tokens...] of one verify step (root first) over a tree of ``nodes`` nodes
        -> `emit` of its tokens."""
        n = host[0]
        self.stats.num_target_forwards += 1
        self.stats.accepted_lengths.append(n)
        self.stats.tree_sizes.append(nodes)
        return self.emit(host[3 : 2 + n] + [host[1]])


@torch.inference_mode()
def speculative_generate(
    target,
    proposer: Proposer,
    input_ids: Tensor,
    *,
    generation_config=None,
    max_new_tokens: int | None = None,
    do_sample: bool | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    streamer=None,
    acceptance: Literal["exact", "typical"] = DEFAULTS.acceptance,
    typical_eps: float = DEFAULTS.typical_eps,
    typical_delta: float = DEFAULTS.typical_delta,
    generator: torch.Generator | None = None,
    attention_mask_2d: Tensor | None = None,
    timing: bool = False,
    compile: bool | str = False,
    adaptive: Adaptive | None = None,
    lookup: int = 0,
    corpus: CorpusIndex | None = None,
) -> GenerateOutput:
    """The decoding loop, for any `Proposer`. See `infer.generate` for the user-facing arguments.
    input_ids [B, T] with ``attention_mask_2d`` [B, T] (0 = padding, left or right) for a batch.
    ``compile``: the verify forward (`infer.compiled.CompiledStep`) and the proposer's draft step run under
    ``torch.compile`` (True: inductor, a string: that dynamo backend), batches included; see `infer.generate`.
    ``adaptive`` (`infer.adaptive.Adaptive`; None: the proposer's fixed tree) adapts the tree of a batch
    of one row to the acceptance; ``lookup`` adds prompt lookup's chain of up to that many tokens to the
    tree of a batch of one row (`infer.lookup`; 0: none), and ``corpus``'s chain beside it."""
    backend = backend_of(compile)  # a bad value fails before any work
    lo, hi = TREE_LIMITS["lookup"]
    if isinstance(lookup, bool) or not isinstance(lookup, int) or not lo <= lookup <= hi:
        raise ValueError(
            f"lookup must be an int in [{lo}, {hi}] (prompt-lookup tokens; 0: off), got {lookup!r}"
        )
    t_start = time.perf_counter()
    overrides = {"max_new_tokens": max_new_tokens, "do_sample": do_sample, "temperature": temperature,
                 "top_k": top_k, "top_p": top_p, "eos_token_id": eos_token_id}  # fmt: skip
    job = prepare(target, input_ids, attention_mask_2d, generation_config, overrides, acceptance=acceptance,
                  typical_eps=typical_eps, typical_delta=typical_delta, generator=generator,
                  streamer=streamer, timing=timing)  # fmt: skip
    check_target(target)  # refuses what tree verification cannot do exactly, even with nothing to generate
    if lookup and job.batched:
        raise ValueError("lookup (prompt lookup) drafts for one unpadded row only; pass lookup=0 for a batch")
    rule = _Rule(job.warp, acceptance, typical_eps, typical_delta, generator)
    proposer.compile(backend)
    proposer.decoding((job.gc.temperature or 1.0) if job.sampling else None)
    clock = _Clock(timing, job.input_ids.device)
    if streamer is not None:
        streamer.put(job.input_ids.cpu())
    if job.limit == 0:
        seq, stats = job.input_ids.clone(), GenerationStats()
    elif job.batched:
        proposer.plan(job.input_ids.shape[1] + job.limit)  # sizes a batch's draft cache too
        seq, stats = _decode_batch(target, proposer.batched(), job, rule, clock, streamer, compile)
    else:
        seq, stats = _decode_one(
            target, proposer, job, rule, clock, streamer, compile, adaptive, lookup, corpus
        )
    if streamer is not None:
        streamer.end()
    if timing:
        stats.draft_time_s, stats.verify_time_s = clock.draft_s, clock.verify_s
        stats.total_time_s = time.perf_counter() - t_start
    return GenerateOutput(seq, stats)


def _decode_one(target, proposer: Proposer, job: Job, rule: _Rule, clock: _Clock, streamer, compile: bool | str,
                adaptive: Adaptive | None = None, lookup: int = 0,
                corpus: CorpusIndex | None = None):  # fmt: skip
    """Batch size 1 without padding, on `TreeRunner` (static KV, tree attention) -> (sequences, stats);
    with ``adaptive`` the tree follows the acceptance (`infer.adaptive`), with ``lookup`` every tree
    gains prompt lookup's chain and ``corpus``'s (`infer.lookup`)."""
    ids = job.input_ids
    runner = TreeRunner(target, proposer.aux_layers, max_len=ids.shape[1] + job.limit, compile=compile,
                        checked=True)  # fmt: skip
    adapter = None
    if adaptive is not None and proposer.depth > 0:
        verify_s = adaptive.verify_s if adaptive.verify_s is not None else verify_seconds(target)
        adapter = Adapter(adaptive, verify_s, proposer.depth)
    seq, stats = _loop_one(runner, proposer, job, rule, clock, streamer, adapter, lookup, corpus)
    proposer.width = None
    if adapter is not None:
        stats.adaptive = adapter.summary()
    return seq, stats


def _propose(proposer: Proposer, root: Tensor, cap: int, look: Lookup | None, k: int):
    """The heads' tree, with the lookup chains of up to k tokens grafted on (`infer.lookup.Lookup`: host
    lookups, the last step's host sync made the history known) -> (tree, the heads' node count, the
    corpus chain's first node: the node count when it has none)."""
    own, other = look.chains(k) if look is not None else ([], [])
    own, other = (chain_tensor(c, root.device) if c else None for c in (own, other))
    tree = proposer.propose(root, cap)
    heads_nodes = tree.num_nodes
    if own is not None:
        tree = graft_chain(tree, own)
    corpus_from = tree.num_nodes
    if other is not None:
        tree = graft_chain(tree, other)
    return tree, heads_nodes, corpus_from


def _loop_one(runner: TreeRunner, proposer: Proposer, job: Job, rule: _Rule, clock: _Clock, streamer,
              adapter: Adapter | None = None, lookup: int = 0,
              corpus: CorpusIndex | None = None):  # fmt: skip
    ids = job.input_ids
    row = _Row(job, streamer)
    index = Lookup(ids[0].tolist(), corpus, adapter and adapter.price_chains(lookup)) if lookup else None
    proposer.plan(ids.shape[1] + job.limit)
    t0 = clock.tick()
    out = clock.verify(runner.prefill, ids)
    root = rule.first(out.logits[:, -1])[0]
    clock.draft(proposer.start, ids, out)
    done = row.emit([int(root)])
    if index is not None:
        index.extend(row.new)
    t1 = time.perf_counter()
    depth, proposer.width = (1 << 30, None) if adapter is None else adapter.shape()
    while not done:
        cap = min(depth, job.limit - len(row.new) - 1)
        tree, heads_nodes, corpus_from = clock.draft(
            _propose, proposer, root, cap, index, min(lookup, job.limit - len(row.new) - 1)
        )
        if adapter is not None:
            adapter.drafted()
        out = clock.verify(runner.verify, tree)
        acc = rule.accept(out.logits[0], tree)  # [N+1, V]
        # the one host sync of the step: length, bonus, path tokens (root first), path nodes
        host = torch.cat(
            [acc.length.view(1), acc.next_token.view(1), tree.tokens[acc.path.clamp(min=0)], acc.path]
        ).tolist()
        keep = acc.path[: host[0]]
        runner.accept(keep)
        clock.draft(
            proposer.advance, tree.tokens[keep], out.hidden[0, keep], tuple(a[0, keep] for a in out.aux)
        )
        done = row.step(host, tree.num_nodes)
        # the source of each accepted draft's node: the heads' tree 0, prompt lookup's chain 1, corpus 2
        width = acc.path.shape[0]
        on_path = [
            0 if n < heads_nodes else 1 + (n >= corpus_from) for n in host[3 + width : 2 + width + host[0]]
        ]
        from_heads = on_path.count(0)
        row.stats.lookup_accepted += host[0] - 1 - from_heads
        row.stats.corpus_accepted += on_path.count(2)
        if index is not None:
            index.extend(row.new[len(index.tokens) - ids.shape[1] :])
            index.observe(host[3 : 2 + host[0]] + host[1:2], on_path, tree.num_nodes, heads_nodes)
        root = acc.next_token
        if adapter is not None:  # decided from host values only: no sync
            adapter.observe(from_heads + 1, heads_nodes, cap)
            depth, proposer.width = adapter.shape()
    row.stats.prefill_s, row.stats.decode_s = t1 - t0, time.perf_counter() - t1
    row.stats.new_tokens = len(row.new)
    return torch.cat([ids, torch.tensor([row.new], dtype=ids.dtype, device=ids.device)], 1), row.stats


def _left_aligned(ids: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """[B, T] left- or right-padded -> the same rows left-padded (every row's last token at T-1)."""
    order = torch.sort(valid.to(torch.int8), dim=1, stable=True).indices  # padding first, tokens in order
    return ids.gather(1, order), valid.gather(1, order)


def _at(x: Tensor, idx: Tensor) -> Tensor:
    """x [B, N+1, H], idx [B, L] -> [B, L, H]: each row's entries at its own node indices."""
    return x.gather(1, idx[..., None].expand(-1, -1, x.shape[-1]))


def _decode_batch(target, proposer: BatchProposer, job: Job, rule: _Rule, clock: _Clock, streamer,
                  compile: bool | str = False):  # fmt: skip
    """A batch of rows of different lengths on `BatchRunner` -> (sequences, stats). Each row drafts,
    accepts and stops on its own; a finished row leaves the batch (target cache and proposer) at once."""
    ids, valid = _left_aligned(job.input_ids, job.valid)
    runner = BatchRunner(target, proposer.aux_layers, max_len=ids.shape[1] + job.limit, compile=compile,
                         checked=True)  # fmt: skip
    rows = [_Row(job, streamer) for _ in range(ids.shape[0])]
    live = list(range(len(rows)))  # the input row of each batch row
    stats = GenerationStats(rows=[r.stats for r in rows])
    t0 = clock.tick()
    out = clock.verify(runner.prefill, ids, valid)
    root = rule.first(out.logits[:, -1])  # [B]
    clock.draft(proposer.start, ids, out, valid)
    done = [rows[i].emit([t]) for i, t in zip(live, root.tolist(), strict=True)]
    stats.num_target_forwards, t1 = 1, time.perf_counter()
    while True:
        if any(done):  # finished rows stop costing work
            alive = [j for j, d in enumerate(done) if not d]
            live = [live[j] for j in alive]
            if not live:
                break
            runner.select(alive)
            index = torch.tensor(alive, dtype=torch.long, device=ids.device)
            proposer.select(index)
            root = root.index_select(0, index)
        tree = clock.draft(proposer.propose, root, max(job.limit - len(rows[i].new) for i in live) - 1)
        out = clock.verify(runner.verify, tree)
        acc = rule.accept(out.logits, tree)  # [B, N+1, V]
        # the one host sync of the step: every row's length, bonus and path tokens
        host = torch.cat(
            [acc.length[:, None], acc.next_token[:, None], tree.tokens.gather(1, acc.path.clamp(min=0))], 1
        ).tolist()
        keep = acc.path[:, : max(h[0] for h in host)]  # [B, L]
        runner.accept(keep, acc.length, [h[0] for h in host])
        idx = keep.clamp(min=0)
        clock.draft(proposer.advance, tree.tokens.gather(1, idx), _at(out.hidden, idx),
                    tuple(_at(a, idx) for a in out.aux), acc.length)  # fmt: skip
        stats.num_target_forwards += 1
        done = [rows[i].step(h, tree.tokens.shape[1]) for i, h in zip(live, host, strict=True)]
        root = acc.next_token
    stats.prefill_s, stats.decode_s = t1 - t0, time.perf_counter() - t1
    for r in rows:
        r.stats.new_tokens = len(r.new)
    stats.accepted_lengths = [n for r in rows for n in r.stats.accepted_lengths]
    stats.tree_sizes = [n for r in rows for n in r.stats.tree_sizes]
    stats.new_tokens = sum(r.stats.new_tokens for r in rows)
    width = max(len(r.new) for r in rows)
    new = torch.tensor([r.new + [job.pad_id] * (width - len(r.new)) for r in rows], dtype=ids.dtype)
    return torch.cat([job.input_ids, new.to(ids.device)], 1), stats
