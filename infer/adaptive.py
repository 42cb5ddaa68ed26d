"""Adaptive speculation: shrink the draft tree to a chain, or to no drafts at all, while drafts do not pay
for their verify cost, and grow it back when they do.

Rates are tokens per unit of target time, the unit being one plain decoding step (a 1-token verify):

    plain (no drafts):        1
    tree of k nodes, depth D: τ̄_tree / (c(k) + g_tree·D)        τ̄: mean accepted length, bonus included
    chain of depth d:         (1 + α + … + α^d) / (c(d+1) + g_chain·d)

c(k) = verify_s[k-1] / verify_s[0] is the measured verify-cost curve (`infer.cost`), g a mode's draft
cost per depth level over verify_s[0] (timed on the host per propose, or given for the full tree), and
α the per-depth acceptance of a chain: with L drafts accepted of a chain of depth d, L successes
and one failure if L < d, so α = ΣL / Σ(L + [L < d]) (the maximum-likelihood estimate of a geometric
run). The chain's depth is the d that maximises its rate. α and τ̄_tree pool every step seen so far,
each step's weight shrinking by (1 - 1/``memory``) per later step (about ``memory`` steps of evidence): a
4-step window alone is too noisy to judge good drafts by (with α = 0.5, one such window in five accepts
at most one draft, and pricing each window alone left decoding plain on 20-25% of the steps of heads that
pay; results/smollm2-eagle31/adaptive-memory/), while a first window of useless drafts, far below the bar,
still drops them at once.

`ChainPrice` prices the lookup chains grafted beside the tree (`infer.lookup.Lookup`) the same way, one
position at a time: position j of a source's chain (its depth-j node) stays while the tokens it adds per
step beat what its verify cost would buy at the rate decoding runs at.

A generation starts with a chain of the tree's depth (its draft costs one node per level, so useless or
slow drafts cost little before they are found out) and tries the tree after one window if the chain pays.
Every ``every`` steps the current mode is priced, sooner when even all its window's remaining steps
accepting every draft could not beat the mode below (`Adapter._hopeless`: expensive drafts leave after one
or two steps). Draft costs are kept per mode (a chain drafts one node per level, an EAGLE tree its whole
frontier). The tree drops to the better of a chain (priced with the tree's α, an optimistic guess the
chain's own window then checks) and plain decoding; a chain drops to plain decoding when it does not beat
plain by ``margin``. A mode below the tree probes the next one up for one window after ``probe`` steps; a
probe that does not beat its base by ``margin`` goes back and doubles that wait (up to ``max_probe``), one
that does stays. With useless drafts this costs the first steps and one or two steps per probe, whose
waits double; drafts too slow to pay even when always right are not probed again before ``max_probe``
steps.

Everything the adapter reads is on the host already (the accepted lengths of the step's one host sync,
the tree's size, host timers), so it adds no device sync. The output does not depend on the tree:
greedy output stays token-identical and exact sampling stays exact, since every step's tree is chosen
from the past only (`infer.verify` is exact for any tree).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

NONE, CHAIN, TREE = 0, 1, 2
MODES = ("none", "chain", "tree")


@dataclass(frozen=True)
class Adaptive:
    """Options of ``infer.generate(adaptive=...)`` (``True``: these defaults; ``False``: the fixed tree).

    verify_s: seconds of verifying k = 1.. tokens ([k-1]), None: `infer.cost.verify_seconds` (measured
    on this machine once per device, dtype and target shape, then cached); draft_s: seconds of one
    propose of the full tree, in the same unit, None: timed on the host each step (on CUDA that is the
    launch time); every: steps per decision; probe / max_probe: steps before a mode below the tree
    tries the next one up, first and at most (doubling after each failed try); margin: how much a mode
    must beat the one below it (plain decoding: rate 1) to be kept; memory: steps of acceptance evidence
    the rates are priced from (each step's weight decays by 1 - 1/memory per step)."""

    verify_s: Sequence[float] | None = None
    draft_s: float | None = None
    every: int = 4
    probe: int = 16
    max_probe: int = 256
    margin: float = 0.03
    memory: int = 16
    chains: bool = True

    def __post_init__(self) -> None:
        for name in ("every", "probe", "max_probe", "memory"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"Adaptive.{name} must be an int >= 1, got {v!r}")
        if self.max_probe < self.probe:
            raise ValueError(f"Adaptive.max_probe ({self.max_probe}) must be >= probe ({self.probe})")
        if not 0 <= self.margin < 1:
            raise ValueError(f"Adaptive.margin must be in [0, 1), got {self.margin!r}")
        if self.verify_s is not None and (not self.verify_s or any(not v > 0 for v in self.verify_s)):
            raise ValueError("Adaptive.verify_s must be positive seconds for k = 1, 2, ...")
        if self.draft_s is not None and not self.draft_s >= 0:
            raise ValueError(f"Adaptive.draft_s must be >= 0 seconds, got {self.draft_s!r}")


class Adapter:
    """One generation's adaptive state (module docstring). Per step: `shape` before the propose,
    `observe` after the host sync.

    verify_s: non-decreasing seconds of verifying k = 1.. tokens; depth: the full tree's depth D."""

    def __init__(self, opts: Adaptive, verify_s: Sequence[float], depth: int) -> None:
        self.opts, self.depth = opts, max(int(depth), 1)
        base = verify_s[0]
        self.cost = [max(v / base, 1.0) for v in verify_s]  # c(k) = cost[k-1] >= c(1)
        self.base_s = base
        self.mode, self.chain_depth = CHAIN, self.depth  # a full-depth chain first: the cheapest probe
        self.window: list[tuple[int, int, int]] = []  # (accepted, nodes, drafted depth) this window
        given = None if opts.draft_s is None else opts.draft_s / base / self.depth
        self.draft_level: dict[int, float | None] = {TREE: given, CHAIN: None}  # per depth level drafted
        self.tree_nodes = self.depth + 1  # the full tree's size, as last seen
        self.alpha = {CHAIN: [0.0, 0.0], TREE: [0.0, 0.0]}  # [ΣL, Σtrials], decayed per step
        self.tree_tau = [0.0, 0.0]  # the tree's [Σaccepted, Σsteps], decayed per step
        self.keep = 1.0 - 1.0 / opts.memory
        self.rate = {NONE: 1.0, CHAIN: None, TREE: None}
        # steps before probing this mode: the tree right after a first chain window that pays
        self.wait = {CHAIN: opts.probe, TREE: opts.every}
        self.since, self.probing_from = 0, None
        self.modes_used = {name: 0 for name in MODES}  # steps per mode, for the stats
        self._t, self._skip = 0.0, True
        self.chains: ChainPrice | None = None

    def c(self, k: int) -> float:
        """Relative cost of verifying k tokens (extrapolated past the measured curve)."""
        if k <= len(self.cost):
            return self.cost[k - 1]
        slope = self.cost[-1] - self.cost[-2] if len(self.cost) > 1 else 0.0
        return self.cost[-1] + slope * (k - len(self.cost))

    def shape(self) -> tuple[int, int | None]:
        """(max_depth, width) to draft now: width 1 drafts a chain, None the full tree."""
        self._t = time.perf_counter()
        if self.mode == NONE:
            return 0, None
        return (self.chain_depth, 1) if self.mode == CHAIN else (self.depth, None)

    def drafted(self) -> None:
        """Called right after the propose: its host time, per depth level drafted, feeds ``draft``. The
        first propose after the prompt or a mode change is not timed: an EAGLE draft then also runs its
        layer over every pair that waited (the prompt's, or those of the plain decoding steps)."""
        if self._skip or self.opts.draft_s is not None or self.mode == NONE:
            self._skip = False
            return
        per_level = (time.perf_counter() - self._t) / self.base_s / self.shape_depth()
        old = self.draft_level[self.mode]
        self.draft_level[self.mode] = per_level if old is None else 0.8 * old + 0.2 * per_level

    def draft(self, mode: int) -> float:
        """A mode's draft cost per depth level, in plain steps. A chain not timed yet is priced as the
        tree's per node (EAGLE drafts every frontier node at each level; a Medusa chain costs more than
        that, which its own timing then shows)."""
        own = self.draft_level[mode]
        if own is not None or mode == TREE:
            return own or 0.0
        tree = self.draft_level[TREE] or 0.0
        return tree * self.depth / max(self.tree_nodes - 1, self.depth)

    def shape_depth(self) -> int:
        return self.chain_depth if self.mode == CHAIN else self.depth

    def observe(self, accepted: int, nodes: int, drafted: int) -> None:
        """One verify step: ``accepted`` tokens (bonus included) from a tree of ``nodes`` nodes (root
        included) and depth ``drafted`` (0: no drafts)."""
        self.modes_used[MODES[self.mode]] += 1
        self.since += 1
        for stat in (*self.alpha.values(), self.tree_tau):  # acceptance drifts with the text
            stat[0], stat[1] = stat[0] * self.keep, stat[1] * self.keep
        if self.mode == NONE:
            if self.since >= self.wait[CHAIN] and self._can_pay():
                self._switch(CHAIN, probe=True)
            elif self.since >= self.wait[CHAIN]:  # drafts too slow to ever pay: look again much later
                self.since, self.wait[CHAIN] = 0, self.opts.max_probe
            return
        self.window.append((accepted, nodes, drafted))
        if self.mode == TREE:
            self.tree_nodes = max(self.tree_nodes, nodes)
            self.tree_tau[0] += accepted
            self.tree_tau[1] += 1
        if drafted:
            L = accepted - 1
            stat = self.alpha[self.mode]
            stat[0] += L
            stat[1] += L + (L < drafted)
        if len(self.window) >= self.opts.every or self._hopeless():
            self._decide()

    def _bar(self) -> float:
        """The rate the current mode must beat: its probe's base, else plain decoding."""
        base = 1.0 if self.probing_from is None else self.rate[self.probing_from] or 1.0
        return base * (1 + self.opts.margin)

    def _hopeless(self) -> bool:
        """True when the window cannot reach `_bar` even if every draft of its remaining steps were
        accepted: then there is no need to pay for those steps (expensive drafts leave after one or two)."""
        win, every = self.window, self.opts.every
        depth = max(d for _, _, d in win)
        best_tau = (sum(a for a, _, _ in win) + (every - len(win)) * (depth + 1)) / every
        best = best_tau / (self.c(max(n for _, n, _ in win)) + self.draft(self.mode) * depth)
        return best < self._bar()

    def _can_pay(self) -> bool:
        """Whether a chain accepting every draft would beat plain decoding at the draft's cost."""
        dl = self.draft(CHAIN)
        return any(
            (d + 1) / (self.c(d + 1) + dl * d) > 1 + self.opts.margin for d in range(1, self.depth + 1)
        )

    def _alpha(self, mode: int) -> float:
        s, n = self.alpha[mode]
        return s / n if n else 0.0

    def _chain(self, alpha: float) -> tuple[int, float]:
        """The best chain depth for acceptance ``alpha`` and its rate."""
        per_level = self.draft(CHAIN)
        best = (1, -1.0)
        for d in range(1, self.depth + 1):
            tau = sum(alpha**i for i in range(d + 1))
            rate = tau / (self.c(d + 1) + per_level * d)
            if rate > best[1]:
                best = (d, rate)
        return best

    def _decide(self) -> None:
        m, win = self.mode, self.window
        if m == CHAIN:
            self.chain_depth, r = self._chain(self._alpha(CHAIN))
        else:
            nodes, depth = max(n for _, n, _ in win), max(d for _, _, d in win) or 1
            r = self.tree_tau[0] / self.tree_tau[1] / (self.c(nodes) + self.draft(m) * depth)
        self.rate[m] = r
        self.window = []
        if self.probing_from is not None:  # a probe ended: keep it only if it beat its base
            base, bar = self.probing_from, self._bar()
            self.probing_from = None
            if r > bar:
                self.wait[m] = self.opts.probe
                self.since = 0
            else:
                self.wait[m] = min(2 * self.wait[m], self.opts.max_probe)
                self._switch(base)
            return
        lower = {NONE: 1.0 + self.opts.margin}
        if m == TREE:
            d, rate = self._chain(self._alpha(CHAIN) if self.alpha[CHAIN][1] else self._alpha(TREE))
            lower[CHAIN] = rate * (1 + self.opts.margin)
        best = max(lower, key=lower.get)
        if lower[best] > r:
            if best == CHAIN:
                self.chain_depth = d
            self._switch(best)
        elif m == CHAIN and self.since >= self.wait[TREE]:
            self._switch(TREE, probe=True)

    def _switch(self, mode: int, probe: bool = False) -> None:
        if probe:
            self.probing_from = self.mode
            if mode == CHAIN:  # try the depth the last acceptance seen prices best, at least 1
                self.chain_depth = self._chain(self._alpha(CHAIN))[0]
        self.mode, self.since, self.window, self._skip = mode, 0, [], True

    def price_chains(self, k: int) -> ChainPrice | None:
        """A `ChainPrice` for lookup chains of up to k tokens on this verify-cost curve, kept for the
        summary; None with ``chains=False``."""
        if self.opts.chains:
            self.chains = ChainPrice(self.c, k, self.opts.memory)
        return self.chains

    def summary(self) -> dict:
        """What the adapter did: steps per mode, the mode it ended in, the lookup chains' mean lengths."""
        out = {"steps": dict(self.modes_used), "final": MODES[self.mode], "chain_depth": self.chain_depth}
        return out if self.chains is None else {**out, **self.chains.summary()}


class ChainPrice:
    """The length of each lookup chain (`infer.lookup.Lookup`: prompt lookup's, then the corpus's) to
    graft beside the tree, priced from the steps seen so far, per class: the chain's source and the
    length n of the suffix it matched (3, 2 or 1 tokens). A 3-token match is far more often right than a
    1-token one (on the target's own answers, prompt lookup's first token is right 79% of the time after
    a 3-token match and 15% after a 1-token one: results/smollm2-chain-price/), so each class earns its
    own length. Per step: `length` for each chain before the graft, `observe` after the host sync.

    Position j of a chain is its depth-j node. Its value w_j is the tokens it adds per step in its class
    where the chain has a j-th token: ``gain_j / seen_j``, decayed per step like `Adapter`'s rates, with a
    prior of weight ``prior`` at w_{j-1} (w_0 = 1, so a class starts at full length). A grafted position
    gains when the accepted path's depth-j node is that chain's (a position the tree already held never
    is: `infer.lookup.graft_chain` hangs the chain under it). A position not grafted is still seen, for
    free, from the E tokens the step emitted (accepted drafts, then the bonus): with v = the length of the
    chain's common prefix with them, it would have gained exactly when v >= j = E (the chain also holds
    the bonus, one token past the path), nothing when v < min(j, E), and ρ^(j-E) when v = E < j, where
    ρ is the class's measured rate of a next token being right after right ones (where a step shows
    it). So a class cut to length 0 comes back when its chains start matching, without a probe.

    Its cost is δ = the verify-cost curve's mean slope over the ``k`` nodes past the heads' last tree and
    the other chain; a token that costs δ buys r·δ tokens at the running rate r = Σ emitted / Σ c(nodes)
    (decayed). The length is the m in 0..k that maximises Σ_{j<=m} (w_j - r·δ).

    cost: c(n), the relative cost of verifying n nodes (`Adapter.c`); k: the chains' full length."""

    def __init__(self, cost: Callable[[int], float], k: int, memory: int = 16, prior: float = 0.25) -> None:
        self.cost, self.k, self.prior = cost, k, prior
        self.keep = 1.0 - 1.0 / memory
        # per class (source, order): seen_j and gain_j for j = 1..k, and ρ's [Σ right, Σ shown], decayed
        self.classes: dict[tuple[int, int], tuple[list[float], list[float], list[float]]] = {}
        self.rate = [0.0, 0.0]  # [Σ emitted, Σ c(nodes)], decayed
        self.heads_nodes = 1
        self.offered: dict[int, int] = {}  # Σ tokens grafted per source, for the summary
        self.steps = 0

    def length(self, source: int, order: int, other: int = 0) -> int:
        """Tokens to graft of a chain of ``source`` that matched an ``order``-token suffix, beside
        ``other`` tokens of the other chain."""
        if (source, order) not in self.classes:
            return self.k
        base = self.heads_nodes + other
        delta = (self.cost(base + self.k) - self.cost(base)) / self.k
        bar = delta * (self.rate[0] / self.rate[1] if self.rate[1] else 1.0)
        seen, gain, _ = self.classes[source, order]
        best, best_net, net, w = 0, 0.0, 0.0, 1.0
        for j in range(1, self.k + 1):
            w = (gain[j] + self.prior * w) / (seen[j] + self.prior)
            net += w - bar
            if net > best_net:
                best, best_net = j, net
        return best

    def observe(self, found: Sequence[tuple[int, int, Sequence[int], int]], emitted: Sequence[int],
                on_path: Sequence[int], nodes: int, heads_nodes: int) -> None:  # fmt: skip
        """One step. found: (source, order, chain as found (up to k tokens), tokens grafted) per chain
        looked up; emitted: the step's accepted draft tokens, then the bonus; on_path: for depth 1.. of
        the accepted path, the source of its node (0: the heads' tree, 1 + s: chain s); nodes: the tree
        verified; heads_nodes: the heads' tree alone."""
        keep, e = self.keep, len(emitted)
        self.rate[0] = self.rate[0] * keep + e
        self.rate[1] = self.rate[1] * keep + self.cost(nodes)
        self.steps, self.heads_nodes = self.steps + 1, heads_nodes
        for stats in self.classes.values():
            for column in stats:
                column[:] = [x * keep for x in column]
        for s, order, chain, m in found:
            self.offered[s] = self.offered.get(s, 0) + m
            if not chain:
                continue
            fresh = ([0.0] * (self.k + 1), [0.0] * (self.k + 1), [0.0, 0.0])
            seen, gain, rho = self.classes.setdefault((s, order), fresh)
            v = 0
            while v < min(len(chain), e) and chain[v] == emitted[v]:
                v += 1
            for j in range(1, len(chain) + 1):
                if j <= m:
                    got = j <= len(on_path) and on_path[j - 1] == s + 1
                elif v < min(j, e):
                    got = False
                elif j <= e:
                    got = j == e
                else:  # it matched every emitted token: valid on to j with probability ρ^(j-e)
                    got = (rho[0] / rho[1] if rho[1] else 0.5) ** (j - e)
                seen[j] += 1.0
                gain[j] += got
            rho[0] += max(v - 1, 0)  # next tokens right after right ones, where the step shows them
            rho[1] += max(min(v + 1, e, len(chain)) - 1, 0)

    def summary(self) -> dict:
        """The mean tokens each source's chain was grafted with per step (0 where it found none)."""
        n = max(self.steps, 1)
        return {"chain_mean": [round(self.offered[s] / n, 2) for s in sorted(self.offered)]}
