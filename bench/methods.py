"""The ways to generate that a benchmark compares (`Method`): plain ``target.generate``, HF prompt lookup,
and ``infer.generate`` once per heads checkpoint and tree setting (`heads_methods`)."""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import os
import time
from dataclasses import dataclass, field

import torch

import infer
from bench.measure import ForwardRecorder, PeakMemory, sync
from heads import registry
from infer.adaptive import Adaptive
from infer.tree import default_tree, validate_paths

SAMPLE_TEMPERATURE = 0.7


@dataclass
class Run:
    """One method on one prompt. ``sequences`` [1, T + new]; ``steps``: tokens per decode forward;
    ``tree_sizes``: tokens verified per step, root included (heads only: the adapted tree's sizes)."""

    sequences: torch.Tensor
    new_tokens: int
    seconds: float
    steps: list[int] | None
    peak_mib: float
    draft_s: float | None = None
    verify_s: float | None = None
    total_s: float | None = None
    tree_sizes: list[int] | None = None


@dataclass
class Method:
    """A way to generate. ``kind``: "plain", "prompt_lookup" or "heads"."""

    label: str
    kind: str
    heads: str | None = None
    head_type: str | None = None
    tree_size: int | None = None  # tokens verified per step of the fixed tree, root included
    tree_desc: str | None = None
    options: dict = field(default_factory=dict)
    model: infer.SpecModel | None = None

    def run(self, target, ids: torch.Tensor, gc, seed: int, timing: bool, mem: PeakMemory) -> Run:
        device = ids.device
        sampling = bool(gc.do_sample)
        mem.reset()
        if self.kind == "heads":
            gen = torch.Generator(device=device).manual_seed(seed) if sampling else None
            kw = dict(self.options)
            if timing:
                kw["timing"] = True
            sync(device)
            t = time.perf_counter()
            out = infer.generate(
                self.model, ids, generation_config=gc, eos_token_id=eos_arg(gc), generator=gen, **kw
            )
            sync(device)
            seconds = time.perf_counter() - t
            st = out.stats
            return Run(
                out.sequences,
                st.new_tokens,
                seconds,
                list(st.accepted_lengths),
                mem.read_mib(),
                getattr(st, "draft_time_s", None),
                getattr(st, "verify_time_s", None),
                getattr(st, "total_time_s", None),
                list(st.tree_sizes),
            )
        if self.kind == "prompt_lookup":  # in the config: transformers deprecates config + kwargs
            gc = copy.deepcopy(gc)
            gc.prompt_lookup_num_tokens = self.options["prompt_lookup_num_tokens"]
        if sampling:
            torch.manual_seed(seed)
        with ForwardRecorder(target) if self.kind == "prompt_lookup" else contextlib.nullcontext() as rec:
            sync(device)
            t = time.perf_counter()
            seq = target.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gc)
            sync(device)
            seconds = time.perf_counter() - t
        n = seq.shape[1] - ids.shape[1]
        steps = rec.step_lengths(seq.shape[1]) if rec is not None else [1] * max(n - 1, 0)
        return Run(seq, n, seconds, steps, mem.read_mib())


def eos_arg(gc):
    """infer.generate treats a None eos as 'use the target's': pass [] to really disable it."""
    return gc.eos_token_id if gc.eos_token_id is not None else []


def generation_config(target, tokenizer, *, sampling: bool, max_new_tokens: int, stop_at_eos: bool):
    """One GenerationConfig for every method, so they decode with identical settings."""
    gc = copy.deepcopy(target.generation_config)
    gc.max_new_tokens = max_new_tokens
    gc.max_length = None
    gc.do_sample = sampling
    gc.temperature = SAMPLE_TEMPERATURE if sampling else None
    gc.top_p = None if not sampling else gc.top_p
    gc.top_k = None if not sampling else gc.top_k
    if not stop_at_eos:
        gc.eos_token_id = None
    if gc.pad_token_id is None:
        pad = getattr(tokenizer, "pad_token_id", None)
        gc.pad_token_id = pad if pad is not None else (getattr(tokenizer, "eos_token_id", None) or 0)
    return gc


def parse_list(value: str | None) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()] if value else []


def knob_for(values: list[str], label: str, labels: list[str], flag: str) -> list[str]:
    """The settings of a repeatable knob for the heads ``label``: a ``LABEL:LIST`` entry for it wins
    over a bare ``LIST`` entry (which applies to every heads without its own)."""
    own, common = None, None
    for v in values:
        head, sep, rest = v.partition(":")
        if sep and head in labels:
            if head == label:
                own = rest
        elif sep and not os.path.exists(v):
            raise ValueError(f"{flag} {v!r}: {head!r} is not a --heads label ({', '.join(labels)})")
        else:
            common = v
    return parse_list(own if own is not None else common)


# --adaptive: the rows per tree setting, each (label suffix, description suffix, infer.generate's
# adaptive= for it, None: its default)
DEFAULT_ROW = ("", "", None)
FIXED_ROW = (" fixed", ", fixed", False)
UNPRICED_ROW = (" unpriced", ", lookup chains unpriced", Adaptive(chains=False))
ADAPTIVE = {
    "on": (DEFAULT_ROW,),
    "off": (FIXED_ROW,),
    "both": (DEFAULT_ROW, FIXED_ROW),
    "chains": (DEFAULT_ROW, UNPRICED_ROW),
}


def heads_methods(options, target, heads_specs: list[tuple[str, str]], corpus=None) -> list[Method]:
    """One Method per (heads, tree setting). Medusa: ``--tree`` (sizes, 'default' or a JSON file of
    paths); EAGLE/EAGLE-3: ``--total-tokens`` (sizes or 'default') with ``--depth``/``--draft-top-k``.
    Both flags repeat and take ``LABEL:LIST`` to set one heads' sweep. Which knob applies is the head
    type's ``tree`` kind in the registry (``static`` / ``dynamic``). ``options``: `BenchmarkOptions`.
    ``corpus`` (`infer.CorpusIndex`, ``--corpus``): every configuration twice, without and with it."""
    methods = []
    labels = [label for label, _ in heads_specs]
    for label, directory in heads_specs:
        model = infer.load(target, heads=directory)
        kind, tree_kind = model.heads.config.head_type, registry.of(model.heads).tree

        def add(size: int, desc: str, kwargs: dict, label=label, kind=kind, model=model) -> None:
            for suffix, tail, adapt in ADAPTIVE[options.adaptive]:  # e.g. "<label> [N tok] fixed"
                for look, corp in itertools.product(
                    parse_list(options.lookup), [False, True] if corpus else [None]
                ):
                    name, more = f"{label} [{size} tok]{suffix}", tail
                    kw = kwargs if adapt is None else {**kwargs, "adaptive": adapt}
                    if look != "default":  # "+lookup(k)" / "no lookup" unless the default
                        name += f" +lookup({look})" if int(look) else " no lookup"
                        kw, more = {**kw, "lookup": int(look)}, more + f", lookup {look}"
                    if corp is not None:  # --corpus: a row without it, then "+corpus"
                        kw = {**kw, "corpus": corpus if corp else False}
                        if corp:
                            name, more = name + " +corpus", more + ", corpus"
                    methods.append(Method(name, "heads", label, kind, size, desc + more, kw, model))

        if tree_kind == "static":
            for opt in knob_for(options.tree, label, labels, "--tree") or ["default"]:
                # "default" is what infer.generate uses: a tree saved with the heads, else default_tree.
                if opt == "default":
                    tree, desc = None, "saved tree" if getattr(model.heads, "tree", None) else "default_tree"
                elif opt.isdigit():
                    tree, desc = default_tree(model.heads.config.num_heads, int(opt)), f"default_tree({opt})"
                else:
                    if not os.path.isfile(opt):
                        raise FileNotFoundError(f"--tree {opt!r}: not a size, 'default' or a JSON file")
                    with open(opt) as f:
                        tree = json.load(f)
                    tree = tree["tree"] if isinstance(tree, dict) else tree
                    validate_paths(tree)
                    desc = os.path.basename(opt)
                size = len(model.proposer(tree).tree) + 1
                add(size, f"static {desc}, {size - 1} drafts", {"tree": tree} if tree is not None else {})
        else:  # "dynamic"
            for opt in knob_for(options.total_tokens, label, labels, "--total-tokens") or ["default"]:
                kw = {"depth": options.depth, "draft_top_k": options.draft_top_k}
                if opt != "default":
                    if not opt.isdigit():
                        raise ValueError(f"--total-tokens: {opt!r} is not an integer or 'default'")
                    kw["total_tokens"] = int(opt)
                kw = {k: v for k, v in kw.items() if v is not None}
                prop = model.proposer(**kw)
                size = prop.total_tokens
                add(size, f"EAGLE-2 dynamic, depth {prop.depth}, top-k {prop.top_k}, {size} tokens", kw)
    return methods
