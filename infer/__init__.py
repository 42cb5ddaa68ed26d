"""Inference: draft a tree with the heads, verify it in one target forward, keep the longest valid prefix.

import infer
model = infer.load("path/or/hub-id/of/target", heads="path/or/hub-id/of/heads")
out = infer.generate(model, input_ids, max_new_tokens=256)
out.sequences, out.stats.mean_accepted_length
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from infer.draft import MedusaProposer, Proposer
from infer.eagle_draft import EagleProposer
from infer.generate import GenerateOutput, GenerationStats, speculative_generate
from infer.support import check_attn_implementation, check_target
from infer.tree import build_tree, chain, default_tree

__all__ = [
    "GenerateOutput",
    "GenerationStats",
    "SpecModel",
    "build_tree",
    "chain",
    "default_tree",
    "generate",
    "load",
]


@dataclass
class SpecModel:
    """A frozen target plus draft heads that fit it. ``tree`` overrides the heads' default static tree.

    The heads are checked against the target: sizes (`heads.base.HeadConfig.check_target`) and, for heads
    that recorded their target, its architecture and weights fingerprint (``check_identity``; a mismatch
    is an error unless ``allow_other_target``, then a warning)."""

    target: nn.Module
    heads: nn.Module
    tree: list[list[int]] | None = None
    tokenizer: object | None = None
    allow_other_target: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.target, nn.Module) or not callable(
            getattr(self.target, "get_output_embeddings", None)
        ):
            raise ValueError(f"target must be a transformers causal LM, got {type(self.target).__name__}")
        if not isinstance(self.heads, nn.Module) or not hasattr(self.heads, "config"):
            raise ValueError(f"heads must be selfspec draft heads, got {type(self.heads).__name__}")
        check_target(self.target)  # ALiBi, recurrent layers, flash attention...: refused, not inexact
        self.heads.config.check_target(self.target)
        self.heads.config.check_identity(self.target, self.allow_other_target)
        if self.tree is not None:
            self.tree = self._checked_tree(self.tree)

    def _checked_tree(self, tree) -> list[list[int]]:
        """A static tree given by the caller, bounded like a ``tree.json`` (`heads.guard.check_paths`)."""
        from heads.guard import check_paths

        kind = self.heads.config.head_type
        if kind != "medusa":
            raise ValueError(
                f"tree= is for static-tree (medusa) heads; {kind!r} heads take depth/draft_top_k/total_tokens"
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
        """The heads' proposer. ``tree`` is for static-tree heads (Medusa); ``depth``/``draft_top_k``/
        ``total_tokens`` shape EAGLE-2 dynamic trees of EAGLE-1/2/3 heads. Unset arguments come from the
        heads' tuned ``tree.json`` (``heads.tree`` / ``heads.dynamic_tree``, `heads.base.read_tree`) if
        it exists, else the defaults (Medusa: `default_tree`; EAGLE: 6 / 8 / 48)."""
        from heads.guard import check_tree_budget

        kind = self.heads.config.head_type
        dynamic = {"depth": depth, "draft_top_k": draft_top_k, "total_tokens": total_tokens}
        dynamic = {k: v for k, v in dynamic.items() if v is not None}
        if kind in ("eagle", "eagle3"):
            if tree is not None:
                raise ValueError(
                    "EAGLE heads draft dynamic trees; use depth/draft_top_k/total_tokens, not tree"
                )
            check_tree_budget(dynamic, "generate")  # a draft_top_k beyond the draft vocab is clamped to it
            embed, lm_head = self.target.get_input_embeddings(), self.target.get_output_embeddings()
            tuned = getattr(self.heads, "dynamic_tree", None) or {}
            return EagleProposer(self.heads, embed, lm_head, **(tuned | dynamic))
        if dynamic:
            raise ValueError(f"{sorted(dynamic)} only apply to dynamic-tree (eagle) heads, not {kind!r}")
        if kind == "medusa":
            if tree is not None:
                tree = self._checked_tree(tree)
            paths = (
                tree
                or self.tree
                or getattr(self.heads, "tree", None)
                or default_tree(self.heads.config.num_heads)
            )
            return MedusaProposer(self.heads, self.target.get_output_embeddings(), paths)
        raise ValueError(f"no proposer for head type {kind!r}")


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
) -> SpecModel:
    """Load a frozen target (Hub id, local dir, ``demo`` / ``demo-tiny`` or model) and heads (Hub id,
    local dir or module). ``target`` omitted: the heads' ``base_model_name_or_path`` (the target they were
    trained on: a directory that exists here, a demo name or a Hub id), e.g. ``infer.load(heads="out/x")``.

    Heads trained for a target of another vocab or hidden size are rejected with a ``ValueError``.
    Heads trained on a target with a PEFT adapter (``config.target_adapter``) get the target loaded with
    that adapter in the same call (one saved inside the heads directory, as Medusa-2 saves its LoRA, or
    the recorded id/path), unless ``adapter`` names one; ``merge=True`` merges it into the weights.
    Heads and target with different adapters (or one with and one without) are a ``ValueError``.
    The adapter is only ever taken from inside the heads directory or from a Hub id (never a path the
    heads' config points to elsewhere: `heads.base.adapter_location`).

    Heads that recorded their target (architecture, embedding / lm_head fingerprint) refuse another one
    of the same sizes; ``allow_other_target=True`` loads them with a warning instead.
    """
    from heads import load_heads, load_target
    from heads.base import adapter_location, read_config, resolve_dir
    from heads.graft import resolve_demo_target

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
    if device is not None:
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"device={device!r} is not a torch device (e.g. 'cpu', 'cuda:0')") from e
    if isinstance(heads, str):
        heads_dir = resolve_dir(heads, heads_revision)
        recorded = read_config(heads_dir).get("target_adapter")
    else:
        heads_dir, recorded = None, getattr(heads.config, "target_adapter", None)
    check_attn_implementation(attn_implementation)  # before loading any weights
    if target is None:
        target = _recorded_target(
            heads_dir, heads, from_hub=isinstance(heads, str) and not os.path.isdir(heads)
        )
    if isinstance(target, str):
        target = resolve_demo_target(target)  # so the tokenizer below comes from the same directory
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
    else:
        if adapter is not None or merge:
            raise ValueError(
                "adapter=/merge= apply when the target is a name or path; for a model in memory, load it "
                "with heads.load_target(..., adapter=...) or wrap it in peft's PeftModel yourself"
            )
        tokenizer = None
    if isinstance(heads, str):
        heads = load_heads(heads_dir, target, allow_other_target=allow_other_target)
    p = next(target.parameters())
    heads = heads.to(device=p.device, dtype=p.dtype).eval()
    return SpecModel(target, heads, tree=tree, tokenizer=tokenizer, allow_other_target=allow_other_target)


def _recorded_target(heads_dir: str | None, heads, from_hub: bool = False) -> str:
    """The target named by the heads' ``base_model_name_or_path``: a demo name or Hub id, or a local
    directory that exists (the heads' own fingerprint check then refuses any other model). A local path
    recorded in heads downloaded from the Hub is not followed: it names someone else's disk."""
    from heads.base import read_config
    from heads.graft import DEMO_TARGETS, looks_local

    where = f"{heads_dir}/config.json" if heads_dir else "the heads' config"
    name = (
        read_config(heads_dir).get("base_model_name_or_path")
        if heads_dir
        else heads.config.base_model_name_or_path
    )
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where} names no target (base_model_name_or_path): pass target=")
    if name not in DEMO_TARGETS and looks_local(name) and from_hub:
        raise ValueError(
            f"{where} names a local path as its target ({name!r}), not followed for Hub heads: pass target="
        )
    if name not in DEMO_TARGETS and looks_local(name) and not os.path.isdir(os.path.expanduser(name)):
        raise ValueError(
            f"the heads were trained on {name!r} ({where}), which is not on this machine: pass target="
        )
    return name


def _maybe_tokenizer(name_or_path: str, revision: str | None):
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name_or_path, revision=revision)
    except Exception:  # a target without tokenizer files is still usable with token ids
        return None


def generate(
    model: SpecModel,
    input_ids: Tensor,
    *,
    max_new_tokens: int | None = None,
    do_sample: bool | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    streamer=None,
    generation_config=None,
    acceptance: Literal["exact", "typical"] = "exact",
    typical_eps: float = 0.09,
    typical_delta: float = 0.3,
    tree: list[list[int]] | None = None,
    generator: torch.Generator | None = None,
    attention_mask: Tensor | None = None,
    depth: int | None = None,
    draft_top_k: int | None = None,
    total_tokens: int | None = None,
    timing: bool = False,
) -> GenerateOutput:
    """Generate with speculative decoding; arguments follow transformers' ``generate``.

    input_ids: [B, T] (or [T]); ``attention_mask`` [B, T] of 0/1 marks padding (left or right, as
    transformers' tokenizers pad). Each row drafts its own tree, accepts its own path and stops on its
    own (EOS, ``max_new_tokens``); a finished row leaves the batch. Defaults come from the target's
    ``generation_config``, then ``generation_config``, then the keyword arguments. ``do_sample=False``:
    greedy, every row token-identical to ``target.generate`` of its prompt alone. ``do_sample=True``:
    ``acceptance="exact"`` (default) samples exactly from the target's temperature/top-k/top-p
    distribution; ``"typical"`` uses Medusa's typical acceptance (``p(x) > min(eps, delta·exp(-H(p)))``),
    faster but not lossless. ``streamer`` (batch size 1 only) gets ``put``/``end`` calls like
    transformers' ``TextStreamer``. Returns ``sequences`` [B, T + new] (the prompt as given, then each
    row's new tokens, padded with the pad id after a row's EOS) and ``stats`` (``stats.rows``: per row).
    ``tree`` (static trees: Medusa) or ``depth``/``draft_top_k``/``total_tokens`` (EAGLE-2 dynamic trees:
    max draft depth, frontier width and children per node, tree size with the root) shape the drafts.
    ``timing=True`` fills ``stats.draft_time_s``/``verify_time_s``/``total_time_s`` (None otherwise;
    on CUDA it synchronises around each section, so leave it off when not measuring).
    """
    return speculative_generate(
        model.target,
        model.proposer(tree, depth=depth, draft_top_k=draft_top_k, total_tokens=total_tokens),
        input_ids,
        generation_config=generation_config,
        max_new_tokens=max_new_tokens,
        do_sample=do_sample,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_token_id=eos_token_id,
        streamer=streamer,
        acceptance=acceptance,
        typical_eps=typical_eps,
        typical_delta=typical_delta,
        generator=generator,
        attention_mask_2d=attention_mask,
        timing=timing,
    )
