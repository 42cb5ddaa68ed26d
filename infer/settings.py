"""Inference settings: every default of drafting and verification in one validated dataclass.

`InferSettings` holds what `infer.generate` drafts and accepts with when the caller does not say:
the static tree of static-tree heads (Medusa), the EAGLE-2 budget of dynamic-tree heads (depth,
draft_top_k, total_tokens), and the acceptance rule with typical acceptance's ε / δ. It is a
`heads.config` dataclass, so scripts load it from YAML or ``key=value`` overrides like every other
config (``heads.config.load(InferSettings, overrides=["total_tokens=32"])``).

Settings tuned for one set of heads (`infer.tune_tree`) are saved next to them as ``inference.json``
(`write_settings`) and read back by `infer.load` (`read_settings`).
Everything read from a checkpoint is bounded here before it is used (`TREE_LIMITS`, `check_paths`,
`check_tree_budget`): sizes within the limits and within what the heads can give (ranks below the
vocabulary, depth at most the number of Medusa heads, ``draft_top_k`` at most the draft vocabulary).
Whether a head type drafts a static or a dynamic tree is its registry entry's ``tree``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from heads import registry
from heads.base import INFERENCE_NAME
from heads.guard import inside, short_list
from heads.io import atomic_text
from infer.tree import validate_paths

SETTINGS_NAME = INFERENCE_NAME  # "inference.json": what `infer.tune_tree` writes next to the heads

# Draft-tree budgets: EAGLE-2 uses depth 6, top-k 10, 60 tokens; Medusa trees have 30-64 nodes.
TREE_LIMITS: dict[str, tuple[int, int]] = {
    "depth": (1, 64),
    "draft_top_k": (1, 1024),
    "total_tokens": (2, 4096),
    "paths": (0, 4096),  # number of nodes of a static tree
    "lookup": (0, 64),  # prompt-lookup tokens beside the tree (`infer.lookup`)
}
BUDGET_KEYS = ("depth", "draft_top_k", "total_tokens")
ACCEPTANCE = ("exact", "typical")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _short(v: Any, n: int = 60) -> str:
    text = repr(v)
    return text if len(text) <= n else text[:n] + "..."


def _check_range(where: str, key: str, v: Any, lo: int, hi: int) -> None:
    if not _is_int(v) or not lo <= v <= hi:
        raise ValueError(f"{where}: {key!r} must be an int in [{lo}, {hi}], got {_short(v)}")


def check_tree_budget(budget: dict[str, Any], where: str, draft_vocab: int | None = None) -> None:
    """EAGLE-2 budget (``depth``, ``draft_top_k``, ``total_tokens``; absent keys skipped) within
    `TREE_LIMITS`; ``draft_top_k`` also at most ``draft_vocab`` (the heads cannot rank more tokens than
    they predict)."""
    for key in BUDGET_KEYS:
        if key not in budget:
            continue
        lo, hi = TREE_LIMITS[key]
        if key == "draft_top_k" and draft_vocab:
            hi = min(hi, int(draft_vocab))
        _check_range(where, key, budget[key], lo, hi)


def check_paths(paths: Any, where: str, num_heads: int, vocab: int) -> list[list[int]]:
    """A static (Medusa) tree: a list of at most ``TREE_LIMITS['paths']`` rank paths, each at most
    ``num_heads`` deep, with ranks in [0, vocab - 1]; prefix-closed (`infer.tree.validate_paths`)."""
    lo, hi = TREE_LIMITS["paths"]
    if not isinstance(paths, (list, tuple)) or not all(
        isinstance(p, (list, tuple)) and all(_is_int(r) for r in p) for p in paths
    ):
        raise ValueError(f"{where}: the tree must be a list of lists of int ranks, got {_short(paths)}")
    if not lo <= len(paths) <= hi:
        raise ValueError(f"{where}: the tree has {len(paths)} nodes; allowed: [{lo}, {hi}]")
    depth = max((len(p) for p in paths), default=0)
    if depth > num_heads:
        raise ValueError(
            f"{where}: tree depth {depth} needs {depth} Medusa heads, these heads have {num_heads}"
        )
    worst = max((r for p in paths for r in p), default=0)
    if worst >= vocab:
        raise ValueError(
            f"{where}: tree rank {worst} is beyond the vocabulary; ranks must be in [0, {vocab - 1}]"
        )
    try:
        validate_paths(paths)
    except ValueError as e:
        raise ValueError(f"{where}: invalid tree: {e}") from e
    return [list(p) for p in paths]


@dataclass
class InferSettings:
    """Drafting and acceptance defaults of `infer.generate` (each overridden by its argument).

    tree: static-tree heads' rank paths (prefix-closed, `infer.tree`); None = `infer.tree.default_tree`
        of ``default_tree_nodes`` nodes for the heads' number of Medusa heads.
    depth / draft_top_k / total_tokens: dynamic-tree heads' EAGLE-2 budget (Li et al. 2024): maximum
        draft depth, frontier width and children per expanded node, tree size with the root.
    acceptance: ``"exact"`` (lossless rejection sampling) or ``"typical"`` (Medusa's typical
        acceptance, Cai et al. 2024: a draft x is kept iff p(x) > min(typical_eps, typical_delta·e^{-H(p)}),
        faster, not lossless); greedy decoding ignores it.
    greedy_score_temperature: how dynamic-tree heads score tree nodes in greedy decoding: by
        log_softmax(draft logits / t). EAGLE-2 ranks nodes by the draft's confidence as a stand-in for
        their acceptance probability; the draft learns the target's T = 1 distribution, but a greedy
        step accepts a node iff it is the target's argmax. A target whose argmax is stable while its
        distribution is flat gets top-1 drafts accepted far more often than their T = 1 probability
        says. t < 1 sharpens the scores toward that (deeper trees where the draft's top-1 leads);
        sampled decoding scores at the sampling temperature instead. Only the tree's shape changes,
        never what is accepted.
    lookup: prompt lookup's drafts added to every step's tree as one more branch (`infer.lookup`):
        up to this many tokens that followed the text's last 3, 2 or 1 tokens where they occurred
        before, in the prompt or the output. 0: the heads' tree alone.
    """

    tree: list[list[int]] | None = field(default=None, metadata={"help": "static tree rank paths"})
    default_tree_nodes: int = field(default=32, metadata={"help": "nodes of the untuned default tree"})
    depth: int = field(default=6, metadata={"help": "EAGLE-2 maximum draft depth"})
    draft_top_k: int = field(default=8, metadata={"help": "EAGLE-2 frontier width / children per node"})
    total_tokens: int = field(default=48, metadata={"help": "EAGLE-2 tree size, root included"})
    acceptance: str = field(default="exact", metadata={"help": "exact (lossless) or typical (lossy)"})
    typical_eps: float = field(default=0.09, metadata={"help": "typical acceptance ε, in [0, 1]"})
    typical_delta: float = field(default=0.3, metadata={"help": "typical acceptance δ, >= 0"})
    greedy_score_temperature: float = field(
        default=0.5,
        metadata={"help": "EAGLE tree scores in greedy decoding: log_softmax(logits / t), t in (0, 10]"},
    )
    lookup: int = field(
        default=8, metadata={"help": "prompt-lookup tokens added to every tree (infer.lookup); 0: none"}
    )

    def __post_init__(self) -> None:
        where = "inference settings"
        if self.tree is not None:
            self.tree = check_paths(self.tree, where, TREE_LIMITS["depth"][1], 1 << 22)
        _check_range(where, "default_tree_nodes", self.default_tree_nodes, 1, TREE_LIMITS["paths"][1])
        _check_range(where, "lookup", self.lookup, *TREE_LIMITS["lookup"])
        check_tree_budget({k: getattr(self, k) for k in BUDGET_KEYS}, where)
        if self.acceptance not in ACCEPTANCE:
            raise ValueError(
                f"{where}: acceptance must be 'exact' or 'typical', got {_short(self.acceptance)}"
            )
        for key, ok, what in (
            ("typical_eps", lambda v: 0 <= v <= 1, "a number in [0, 1]"),
            ("typical_delta", lambda v: v >= 0, "a number >= 0"),
            ("greedy_score_temperature", lambda v: 0 < v <= 10, "a number in (0, 10]"),
        ):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not ok(v):
                raise ValueError(f"{where}: {key} must be {what}, got {_short(v)}")

    def budget(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in BUDGET_KEYS}

    def check_heads(self, config, where: str = "inference settings") -> None:
        """Refuse a static tree these heads cannot draft (``config``: a `heads.base.HeadConfig`): a tree
        for dynamic-tree heads, or one deeper than the Medusa heads or ranking beyond the vocabulary.
        (A ``draft_top_k`` beyond the draft vocabulary is clamped by the proposer; saved settings are
        bounded by it when read, `read_settings`.)"""
        if self.tree is None:
            return
        if registry.get(config.head_type).tree != "static":
            raise ValueError(
                f"{where}: {config.head_type} heads draft dynamic trees; a static tree does not apply"
            )
        check_paths(self.tree, where, config.num_heads, config.vocab_size)


DEFAULTS = InferSettings()  # the library's defaults, for signatures elsewhere in infer (read-only)


def heads_defaults(config) -> dict[str, Any]:
    """The defaults that depend on the heads, under any saved settings: their registry entry's
    ``draft_defaults`` (`heads.registry.HeadType`; e.g. P-EAGLE heads draft their K depths)."""
    fn = registry.get(config.head_type).draft_defaults
    return dict(fn(config)) if fn is not None else {}


def draft_vocab(config) -> int:
    """How many tokens the heads rank: the draft vocabulary (EAGLE-3) or the target's."""
    return getattr(config, "draft_vocab", None) or config.vocab_size


def _read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {str(e)[:200]}") from e


def _settings_file(path: str, config) -> dict[str, Any]:
    """An ``inference.json``: any `InferSettings` fields (plus an ignored ``"tuning"`` record), each
    type- and bound-checked before the dataclass is built."""
    raw = _read_json(path)
    known = [f.name for f in dataclasses.fields(InferSettings)]
    if not isinstance(raw, dict) or set(raw) - set(known) - {"tuning"}:
        found = (
            short_list(sorted(set(raw) - set(known) - {"tuning"}))
            if isinstance(raw, dict)
            else type(raw).__name__
        )
        raise ValueError(f"{path}: unknown inference settings {found}; known: {', '.join(known)}")
    raw = {k: v for k, v in raw.items() if k != "tuning"}
    static = registry.get(config.head_type).tree == "static"
    wrong = sorted(set(raw) & ({"tree", "default_tree_nodes"} if not static else set(BUDGET_KEYS)))
    if wrong:
        kind = "dynamic-tree (EAGLE)" if static else "static-tree (Medusa)"
        raise ValueError(f"{path}: {wrong} only apply to {kind} heads, not {config.head_type}")
    if "tree" in raw:
        raw["tree"] = check_paths(raw["tree"], path, config.num_heads, config.vocab_size)
    check_tree_budget(raw, path, draft_vocab=draft_vocab(config))
    return raw


def read_settings(directory: str | None, config) -> InferSettings:
    """The settings saved next to heads in ``directory`` (``inference.json``), validated against the
    heads' ``config``, over the library's defaults and the heads' own (`heads_defaults`); those alone
    where there is none (or no directory: heads built in memory). A bad file raises a one-line
    ``ValueError`` naming it."""
    defaults = heads_defaults(config)
    if directory is None:
        return InferSettings(**defaults)
    path = inside(directory, SETTINGS_NAME)
    if not os.path.isfile(path):
        return InferSettings(**defaults)
    fields = _settings_file(path, config)
    try:
        return InferSettings(**(defaults | fields))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None


def write_settings(directory: str, values: dict[str, Any], tuning: dict[str, Any] | None = None) -> str:
    """Save tuned settings (a dict of `InferSettings` fields: only those tuned, so library defaults of
    the others still apply) and the ``tuning`` record behind them as ``<directory>/inference.json``,
    atomically. Returns the path."""
    InferSettings(**values)  # refuse what could not be read back
    path = os.path.join(directory, SETTINGS_NAME)
    doc = dict(values) | ({"tuning": tuning} if tuning is not None else {})
    atomic_text(path, json.dumps(doc, indent=1) + "\n")
    return path
