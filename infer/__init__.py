"""Inference: draft a tree with the heads, verify it in one target forward, keep the longest valid prefix.

import infer
model = infer.load("path/or/hub-id/of/target", heads="path/or/hub-id/of/heads")
out = infer.generate(model, input_ids, max_new_tokens=256)
out.sequences, out.stats.mean_accepted_length
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers import AutoTokenizer

from heads import gguf, load_heads, load_target, registry, targets
from heads.base import adapter_location, read_config, resolve_dir
from heads.graft import looks_local
from heads.guard import check_sizes
from infer.adaptive import Adaptive
from infer.draft import MedusaProposer, Proposer
from infer.eagle_draft import EagleProposer
from infer.generate import GenerateOutput, GenerationStats, speculative_generate
from infer.lookup import CorpusIndex
from infer.parallel_draft import ParallelProposer
from infer.prompts import read_corpus
from infer.settings import InferSettings, check_paths, check_tree_budget, heads_defaults, read_settings
from infer.support import check_attn_implementation, check_target
from infer.tree import build_tree, chain, default_tree

__all__ = [
    "Adaptive",
    "CorpusIndex",
    "GenerateOutput",
    "GenerationStats",
    "InferSettings",
    "SpecModel",
    "build_tree",
    "chain",
    "default_tree",
    "generate",
    "load",
]


def _dynamic(cls: type) -> Callable[[nn.Module, nn.Module, dict], Proposer]:
    return lambda heads, target, shape: cls(
        heads, target.get_input_embeddings(), target.get_output_embeddings(), **shape
    )


# The proposer each registry entry names (`heads.registry.HeadType.proposer_for`), built from the heads,
# the target and the tree shape: {"tree": paths} for static trees, the EAGLE-2 budget for dynamic ones.
PROPOSERS: dict[str, Callable[[nn.Module, nn.Module, dict], Proposer]] = {
    "static_tree": lambda heads, target, shape: MedusaProposer(
        heads, target.get_output_embeddings(), shape["tree"]
    ),
    "eagle": _dynamic(EagleProposer),
    "parallel": _dynamic(ParallelProposer),
}


@dataclass
class SpecModel:
    """A frozen target plus draft heads that fit it, and the inference settings to draft with.

    ``settings`` (`infer.settings.InferSettings`): the defaults of `generate` (the tuned tree or EAGLE-2
    budget, the acceptance rule); `load` reads those saved with the heads, otherwise the library's.
    ``tree`` overrides the settings' static tree. The heads are checked against the target: sizes
    (`heads.base.HeadConfig.check_target`) and, for heads that recorded their target, its architecture
    and weights fingerprint (``check_identity``; a mismatch is an error unless ``allow_other_target``,
    then a warning). ``corpus`` (`infer.lookup.CorpusIndex`): text to draft from by lookup beside
    prompt lookup, e.g. the heads' training data (`load`'s ``corpus=``)."""

    target: nn.Module
    heads: nn.Module
    tree: list[list[int]] | None = None
    tokenizer: object | None = None
    allow_other_target: bool = False
    settings: InferSettings | None = None
    corpus: CorpusIndex | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.target, nn.Module) or not callable(
            getattr(self.target, "get_output_embeddings", None)
        ):
            raise ValueError(f"target must be a transformers causal LM, got {type(self.target).__name__}")
        if not isinstance(self.heads, nn.Module) or not hasattr(self.heads, "config"):
            raise ValueError(f"heads must be selfspec draft heads, got {type(self.heads).__name__}")
        if self.settings is None:
            self.settings = InferSettings(**heads_defaults(self.heads.config))
        elif not isinstance(self.settings, InferSettings):
            raise ValueError(f"settings must be infer.InferSettings, got {type(self.settings).__name__}")
        check_target(self.target)  # ALiBi, recurrent layers, flash attention...: refused, not inexact
        self.heads.config.check_target(self.target)
        self.heads.config.check_identity(self.target, self.allow_other_target)
        self.settings.check_heads(self.heads.config)
        if self.tree is not None:
            self.tree = self._checked_tree(self.tree)
        if self.corpus is not None and not isinstance(self.corpus, CorpusIndex):
            raise ValueError(f"corpus must be an infer.CorpusIndex, got {type(self.corpus).__name__}")

    def _checked_tree(self, tree) -> list[list[int]]:
        """A static tree given by the caller, bounded like a saved one (`infer.settings.check_paths`)."""
        kind = self.heads.config.head_type
        if registry.of(self.heads).tree != "static":
            raise ValueError(
                f"tree= is for static-tree (Medusa) heads; {kind!r} heads take depth/draft_top_k/total_tokens"
            )
        return check_paths(tree, "tree", self.heads.config.num_heads, self.heads.config.vocab_size)

    def proposer(
        self,
        tree: list[list[int]] | None = None,
        *,
        depth: int | None = None,
        draft_top_k: int | None = None,
        total_tokens: int | None = None,
    ) -> Proposer:
        """The heads' proposer (`PROPOSERS`, by the heads' registry entry). ``tree`` is for static-tree
        heads (Medusa); ``depth``/``draft_top_k``/``total_tokens`` shape EAGLE-2 dynamic trees of
        EAGLE-1/2/3 heads. Unset arguments come from ``self.tree``, then ``self.settings`` (tuned ones
        saved with the heads, else the defaults: Medusa `default_tree`; EAGLE 6 / 8 / 48)."""
        entry = registry.of(self.heads)
        dynamic = {"depth": depth, "draft_top_k": draft_top_k, "total_tokens": total_tokens}
        dynamic = {k: v for k, v in dynamic.items() if v is not None}
        if entry.tree == "dynamic":
            if tree is not None:
                raise ValueError(
                    "EAGLE heads draft dynamic trees; use depth/draft_top_k/total_tokens, not tree"
                )
            check_tree_budget(dynamic, "generate")  # a draft_top_k beyond the draft vocab is clamped to it
            shape = self.settings.budget() | dynamic
            shape["greedy_score_temperature"] = self.settings.greedy_score_temperature
        else:
            if dynamic:
                kinds = sorted(e.name for e in registry.REGISTRY.values() if e.tree == "dynamic")
                raise ValueError(
                    f"{sorted(dynamic)} only apply to dynamic-tree (EAGLE) heads {kinds}, not {entry.name!r}"
                )
            paths = self._checked_tree(tree) if tree is not None else None
            num_heads, nodes = self.heads.config.num_heads, self.settings.default_tree_nodes
            shape = {"tree": paths or self.tree or self.settings.tree or default_tree(num_heads, nodes)}
        name = entry.proposer_for(self.heads.config)
        build = PROPOSERS.get(name)
        if build is None:
            raise ValueError(f"{entry.name} heads name proposer {name!r}; infer has {sorted(PROPOSERS)}")
        return build(self.heads, self.target, shape)


def load(
    target: str | nn.Module | None = None,
    heads: str | nn.Module | None = None,
    *,
    dtype: str | torch.dtype | None = "auto",
    device: str | torch.device | None = None,
    attn_implementation: str | None = None,
    revision: str | None = None,
    heads_revision: str | None = None,
    tree: list[list[int]] | None = None,
    adapter: str | None = None,
    adapter_revision: str | None = None,
    merge: bool = False,
    allow_other_target: bool = False,
    corpus: str | None = None,
) -> SpecModel:
    """Load a frozen target (Hub id, local dir, ``demo`` / ``demo-tiny`` or model) and heads (Hub id,
    local dir or module). ``target`` omitted: the heads' ``base_model_name_or_path`` (the target they were
    trained on: a directory that exists here, a demo name or a Hub id), e.g. ``infer.load(heads="out/x")``.

    Heads from a directory bring the inference settings saved next to them (``inference.json`` from
    `infer.tune_tree`: `infer.settings.read_settings`), checked before the
    target is loaded; heads given as a module get the defaults.

    Heads trained for a target of another vocab or hidden size are rejected with a ``ValueError``.
    Heads trained on a target with a PEFT adapter (``config.target_adapter``) get the target loaded with
    that adapter in the same call (one saved inside the heads directory, as Medusa-2 saves its LoRA, or
    the recorded id/path), unless ``adapter`` names one; ``merge=True`` merges it into the weights.
    Heads and target with different adapters (or one with and one without) are a ``ValueError``.
    The adapter is only ever taken from inside the heads directory or from a Hub id (never a path the
    heads' config points to elsewhere: `heads.base.adapter_location`).
    Heads that recorded their target (architecture, embedding / lm_head fingerprint) refuse another one
    of the same sizes; ``allow_other_target=True`` loads them with a warning instead.

    ``corpus``: a JSONL of chat or text rows (e.g. the heads' training data), read whole
    (`infer.prompts.read_corpus`) into the `infer.CorpusIndex` that `generate` drafts from.
    """
    device = _check_load_args(target, heads, merge, allow_other_target, device, corpus)
    settings = None
    if isinstance(heads, str):
        heads_dir = resolve_dir(heads, heads_revision)
        raw = read_config(heads_dir)
        recorded = raw.get("target_adapter")
        settings = _saved_settings(heads_dir, raw)  # a bad inference.json fails before any weight loads
    else:
        heads_dir, recorded = None, getattr(heads.config, "target_adapter", None)
    check_attn_implementation(attn_implementation)  # before loading any weights
    if target is None:
        target = _recorded_target(
            heads_dir, heads, from_hub=isinstance(heads, str) and not os.path.isdir(heads)
        )
    tokenizer = None
    if isinstance(target, str):
        target = targets.resolve(target)  # so the tokenizer below comes from the same directory
        if adapter is None and recorded is not None:
            adapter = adapter_location(heads_dir, recorded)
        tokenizer = _maybe_tokenizer(target, revision)
        target = load_target(
            target,
            revision=revision,
            dtype=dtype,
            device=device,
            attn_implementation=attn_implementation,
            adapter=adapter,
            adapter_revision=adapter_revision,
            merge=merge,
        )
    elif adapter is not None or merge:
        raise ValueError(
            "adapter=/merge= apply when the target is a name or path; for a model in memory, load it "
            "with heads.load_target(..., adapter=...) or wrap it in peft's PeftModel yourself"
        )
    if isinstance(heads, str):
        heads = load_heads(heads_dir, target, allow_other_target=allow_other_target)
        if settings is None:  # imported (original / engine-format) heads: their config is built on load
            settings = read_settings(heads_dir, heads.config)
    p = next(target.parameters())
    heads = heads.to(device=p.device, dtype=p.dtype).eval()
    corpus = _corpus_index(corpus, tokenizer)
    return SpecModel(target, heads, tree, tokenizer, allow_other_target, settings, corpus)


def _check_load_args(target, heads, merge, allow_other_target, device, corpus) -> torch.device | None:
    """`load`'s arguments checked before anything is read; returns ``device`` as a torch device."""
    if corpus is not None and not (isinstance(corpus, str) and os.path.isfile(corpus)):
        raise ValueError(f"corpus= must be a JSONL file of chat or text rows, got {corpus!r}")
    if heads is None:
        raise ValueError("heads= is required: a Hub id, a directory or heads")
    for name, value, kinds in (("target", target, "a Hub id, a directory or a model"),
                               ("heads", heads, "a Hub id, a directory or heads")):  # fmt: skip
        if name == "target" and value is None:  # the heads' base_model_name_or_path (`_recorded_target`)
            continue
        if not isinstance(value, (str, nn.Module)) or isinstance(value, str) and not value:
            raise ValueError(f"{name} must be {kinds}, got {repr(value)[:60]}")
    if not isinstance(merge, bool) or not isinstance(allow_other_target, bool):
        raise ValueError("merge= and allow_other_target= must be True or False")
    if device is None:
        return None
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device={device!r} is not a torch device (e.g. 'cpu', 'cuda:0')") from e


def _corpus_index(path: str | None, tokenizer) -> CorpusIndex | None:
    if path is None:
        return None
    if tokenizer is None:
        raise ValueError("corpus= needs the target's tokenizer: pass the target as a name or directory")
    return CorpusIndex(read_corpus(path, tokenizer))


def _corpus_for(model: SpecModel, corpus) -> CorpusIndex | None:
    """`generate`'s ``corpus``: None / True: the model's; False: none; or an `infer.CorpusIndex`."""
    if corpus is None or corpus is True:
        return model.corpus
    if corpus is False:
        return None
    if isinstance(corpus, CorpusIndex):
        return corpus
    raise ValueError(f"corpus must be True, False or an infer.CorpusIndex, got {type(corpus).__name__}")


def _saved_settings(heads_dir: str, raw: dict) -> InferSettings | None:
    """The settings saved with selfspec heads, read against their config before any weight is loaded
    (sizes bounded first, `heads.guard.check_sizes`); None for a foreign checkpoint (no ``head_type``)."""
    if "head_type" not in raw:
        return None
    try:
        entry = registry.get(raw["head_type"])
    except ValueError as e:
        raise ValueError(f"{heads_dir}: {e}") from None
    check_sizes(raw, os.path.join(heads_dir, "config.json"))
    return read_settings(heads_dir, entry.config.from_dict(raw))


def _recorded_target(heads_dir: str | None, heads, from_hub: bool = False) -> str:
    """The target named by the heads' ``base_model_name_or_path``: a demo name or Hub id, or a local
    directory that exists (the heads' own fingerprint check then refuses any other model). A local path
    recorded in heads downloaded from the Hub is not followed: it names someone else's disk."""
    where = f"{heads_dir}/config.json" if heads_dir else "the heads' config"
    # heads trained on a built-in GGUF release name it (its Hub model has other, unquantised weights)
    name = gguf.target_name(read_config(heads_dir) if heads_dir else heads.config.to_dict())
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where} names no target (base_model_name_or_path): pass target=")
    if not targets.is_builtin(name) and looks_local(name) and from_hub:
        raise ValueError(
            f"{where} names a local path as its target ({name!r}), not followed for Hub heads: pass target="
        )
    if not targets.is_builtin(name) and looks_local(name) and not os.path.isdir(os.path.expanduser(name)):
        raise ValueError(
            f"the heads were trained on {name!r} ({where}), which is not on this machine: pass target="
        )
    return name


def _maybe_tokenizer(name_or_path: str, revision: str | None):
    try:
        return AutoTokenizer.from_pretrained(name_or_path, revision=revision)
    except Exception:  # a target without tokenizer files is still usable with token ids
        return None


def generate(
    model: SpecModel,
    input_ids: Tensor,
    *,
    tree: list[list[int]] | None = None,
    depth: int | None = None,
    draft_top_k: int | None = None,
    total_tokens: int | None = None,
    acceptance: str | None = None,
    typical_eps: float | None = None,
    typical_delta: float | None = None,
    attention_mask: Tensor | None = None,
    adaptive: bool | Adaptive | None = None,
    lookup: int | None = None,
    corpus: bool | CorpusIndex | None = None,
    **options,
) -> GenerateOutput:
    """Generate with speculative decoding; arguments follow transformers' ``generate``.

    input_ids: [B, T] (or [T]); ``attention_mask`` [B, T] of 0/1 marks padding (left or right, as
    transformers' tokenizers pad). Each row drafts its own tree, accepts its own path and stops on its
    own (EOS, ``max_new_tokens``); a finished row leaves the batch. Defaults come from the target's
    ``generation_config``, then ``generation_config``, then the keyword arguments. ``do_sample=False``:
    greedy, every row token-identical to ``target.generate`` of its prompt alone. ``do_sample=True``:
    ``acceptance="exact"`` (default) samples exactly from the target's temperature/top-k/top-p
    distribution; ``"typical"`` uses Medusa's typical acceptance (``p(x) > min(eps, delta·exp(-H(p)))``),
    faster but not lossless. ``streamer``: batch size 1. Returns ``sequences`` [B, T + new] (the prompt
    as given, then each row's new tokens, pad ids after its EOS) and ``stats`` (``stats.rows``: per row).
    ``tree`` (static trees: Medusa) or ``depth``/``draft_top_k``/``total_tokens`` (EAGLE-2 dynamic trees:
    max draft depth, frontier width and children per node, tree size with the root) shape the drafts.
    Unset, the drafting and acceptance arguments come from ``model.settings`` (`infer.settings.InferSettings`:
    tuned ones saved with the heads, else exact acceptance, ε 0.09, δ 0.3). ``timing=True`` fills
    ``stats.draft_time_s``/``verify_time_s``/``total_time_s`` (on CUDA it synchronises per section).
    ``compile=True`` (or a dynamo backend name, e.g. ``"aot_eager"``; default False) runs the target's
    verify forward and the heads' draft step (Medusa: heads + lm_head + top-k; EAGLE-1/2/3 and P-EAGLE:
    one draft-layer forward + lm_head + top-k) under ``torch.compile(dynamic=True)``, for batches too;
    the prefill and the bookkeeping between steps stay eager, and the output is the same tokens. The
    graphs are compiled by the first calls (minutes with inductor on a CPU) and reused by later
    generations (a new batch size or tree size can add a graph): `infer.compiled`, ``results/compile/``.

    ``adaptive`` (default on, for batch size 1): the tree follows the acceptance seen during the
    generation, shrinking to a chain or to plain decoding steps while drafts do not pay for their
    verify cost and growing back when they do, priced with this machine's measured verify-cost curve
    (`infer.adaptive`, `infer.cost`); ``stats.tree_sizes`` / ``stats.adaptive`` report what it did.
    ``adaptive=False`` keeps the tree fixed; an `infer.Adaptive` sets its costs and pace. With
    ``compile`` the default is a fixed tree (every new tree shape is a new graph to compile; pass
    ``adaptive=True`` to adapt anyway). The output is the same tokens (greedy) and the same
    distribution (exact sampling) whatever the tree.

    ``lookup`` (default ``model.settings.lookup``, 8, for one unpadded row without ``compile``; 0 for a
    batch): every tree also holds prompt lookup's drafts, the up to ``lookup`` tokens that followed the
    text's last 3, 2 or 1 tokens where they occurred before in the prompt or the output (`infer.lookup`).
    One verify forward checks both and the longest accepted path wins; ``stats.lookup_accepted``
    counts the drafts it gave. ``lookup=0``: the heads' tree alone. ``corpus`` (default ``model.corpus``;
    False: none): a corpus's chain too, what most often followed the last tokens there (`infer.lookup`).
    """
    if adaptive is None:
        adaptive = not options.get("compile")
    if lookup is None:
        rows = input_ids.shape[0] if isinstance(input_ids, Tensor) and input_ids.dim() == 2 else 1
        padded = isinstance(attention_mask, Tensor) and not bool(attention_mask.all())
        lookup = model.settings.lookup if rows == 1 and not padded and not options.get("compile") else 0
    if isinstance(adaptive, bool):
        adaptive = Adaptive() if adaptive else None
    elif not isinstance(adaptive, Adaptive):
        raise ValueError(f"adaptive must be True, False or infer.Adaptive, got {type(adaptive).__name__}")
    s = model.settings
    return speculative_generate(
        model.target,
        model.proposer(tree, depth=depth, draft_top_k=draft_top_k, total_tokens=total_tokens),
        input_ids,
        acceptance=s.acceptance if acceptance is None else acceptance,
        typical_eps=s.typical_eps if typical_eps is None else typical_eps,
        typical_delta=s.typical_delta if typical_delta is None else typical_delta,
        attention_mask_2d=attention_mask,
        adaptive=adaptive,
        lookup=lookup,
        corpus=_corpus_for(model, corpus),
        **options,
    )
