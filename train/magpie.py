"""Prompts without a dataset: the target writes the user turns itself (Magpie, Xu et al. 2024), mixed with
code prompts from the Python sources installed here (`train.code_prompts`).

A chat model has learned what its users write. Rendering the chat template up to where the user's text
begins (the system prompt, if any, and the user header) and sampling from the target there yields a
user turn; sampling stops at the template's end-of-turn token. `user_prefix` derives that prefix for
any template: it renders a conversation whose one user message is a sentinel string and cuts the text
at the sentinel; the end-of-turn token is the first token after the sentinel when it is a special
token (ChatML's ``<|im_end|>``, Llama 3's ``<|eot_id|>``), plus the target's eos ids.

Filters, in sample order: a turn must have ended (end-of-turn within ``max_tokens``), have at least
``min_tokens`` tokens, be new (exact text), and be new once normalised (lowercased, runs of non-word
characters collapsed to one space, first `NEAR_CHARS` characters): near-duplicates are the common
failure of sampled instructions.

Output: ``OUT`` holds ``n`` rows ``{"messages": [user turn, empty assistant turn], "source", "origin"}``,
``round(n * code_fraction)`` of them code prompts, in a seeded shuffled order; the empty assistant turn
is what ``scripts/regenerate_data.py --data OUT`` regenerates. ``OUT`` is written atomically once
complete.

Resuming: sampled turns go to ``OUT.samples`` (one JSON line per batch, fsync'ed), batch ``k`` sampled
with seed ``(seed, k)`` from ``batch_size`` copies of the same prefix, so its text does not depend on
where a run was interrupted. A rerun skips the batches on disk; the settings that change the samples are
in ``OUT.meta`` and a resume with others is refused. ``n``, ``code_fraction`` and ``min_tokens`` only
select from the samples, so they may change between runs (a larger ``n`` samples more batches).
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import sysconfig
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from heads.config import option
from heads.io import atomic_text, check_settings
from train.code_prompts import code_prompts, code_request, source_roots
from train.regen_generate import eos_ids, generate_batch
from train.regenerate import RunReport, TargetOptions, load_target_and_tokenizer

logger = logging.getLogger(__name__)

SENTINEL = "SELFSPEC7F3AUSERTEXT"
NEAR_CHARS = 64
SAMPLES_SUFFIX = ".samples"  # not a data suffix: a directory of outputs still loads as data


@dataclass
class PromptsConfig(TargetOptions):
    """What to write. Options of ``scripts/make_prompts.py`` (see the module docstring); the target's
    are `TargetOptions`."""

    out: str = option(help="output JSONL of prompt rows (then: regenerate_data.py --data OUT)")
    # What changes the sampled turns (`settings`, with target and dtype: checked on resume): the prefix
    # they are sampled after, and how.
    system: str | None = option(None, help="system prompt (default: the template's own)")
    seed: int = option(0, help="sampling and shuffling seed")
    temperature: float = option(1.0, help="user-turn sampling temperature")
    top_p: float = option(1.0, help="nucleus sampling: 1.0 = off")
    max_tokens: int = option(256, help="longest user turn; longer ones are dropped")
    batch_size: int = option(32, help="user turns sampled per generate call")
    # What only selects from the samples, so it may change between runs.
    n: int = option(2000, help="prompts in all")
    code_fraction: float = option(0.3, help="share of code prompts from installed sources")
    min_tokens: int = option(8, help="shortest user turn kept, in tokens")
    max_samples: int | None = option(
        None, help="give up after this many sampled turns (default: 20 x chat prompts)"
    )

    def __post_init__(self) -> None:
        if not self.out:
            raise ValueError("out must be a file path for the prompts JSONL")
        for name in ("n", "batch_size", "min_tokens", "max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens {self.min_tokens} exceeds max_tokens {self.max_tokens}")
        if not 0.0 <= self.code_fraction <= 1.0:
            raise ValueError(f"code_fraction must be in [0, 1], got {self.code_fraction!r}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 (user turns are sampled), got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def n_code(self) -> int:
        return round(self.n * self.code_fraction)

    @property
    def n_chat(self) -> int:
        return self.n - self.n_code

    def settings(self) -> dict[str, Any]:
        """The settings that change the sampled turns (recorded in ``OUT.meta``, checked on resume)."""
        keep = ("target", "seed", "temperature", "top_p", "max_tokens", "system", "batch_size", "dtype")
        return {k: getattr(self, k) for k in keep}


# Why a sampled turn is dropped, in the order the filters are tried (see the module docstring).
DROP_REASONS = ("unfinished", "too_short", "duplicate", "near_duplicate")


@dataclass(kw_only=True)
class PromptsReport(RunReport):
    """What a prompt-writing run did. ``sampled``: user turns sampled in all (``sampled_before`` of them
    by earlier runs); ``dropped``: sampled turns the filters dropped, by reason (`DROP_REASONS`, every
    reason present)."""

    chat: int = 0
    code: int = 0
    sampled: int = 0
    sampled_before: int = 0
    dropped: Counter[str] = field(default_factory=lambda: Counter(dict.fromkeys(DROP_REASONS, 0)))

    def summary(self) -> str:
        d = self.dropped
        return (
            f"{self.out}: {self.chat} chat + {self.code} code prompts; {self.sampled} user turns sampled "
            f"({self.sampled_before} before this run), dropped {d['unfinished']} unfinished, "
            f"{d['too_short']} too short, {d['duplicate']} duplicates, {d['near_duplicate']} near-duplicates; "
            f"{self.new_tokens} new tokens in {self.seconds:.0f} s"
        )


# ----------------------------------------------------------------------------- the template


def user_prefix(tokenizer, system: str | None = None) -> tuple[str, str]:
    """``(prefix, suffix)``: the chat template's text before and after the user's text of a conversation
    whose first user message is the sentinel (after ``system``, if given). ValueError if the template is
    missing or does not copy the user's text verbatim."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template: prompts can only be sampled from a chat model")
    messages = [{"role": "user", "content": SENTINEL}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    if text.count(SENTINEL) != 1:
        raise ValueError(
            "the chat template does not copy the user's text verbatim; cannot find its user prefix"
        )
    prefix, suffix = text.split(SENTINEL)
    return prefix, suffix


def stop_ids(model, tokenizer, suffix: str) -> tuple[list[int], str | None]:
    """Token ids that end a user turn, and a text marker to cut at when the end of turn is not one token.

    The first token of ``suffix`` ends the turn when it is a special token; otherwise (a template whose
    turn ends in plain text, e.g. ``[/INST]``) only the eos ids stop generation and the decoded text is cut
    at the suffix's first line."""
    ids = eos_ids(model, tokenizer)
    suffix_ids = tokenizer(suffix, add_special_tokens=False)["input_ids"]
    if suffix_ids and suffix_ids[0] in set(tokenizer.all_special_ids):
        if suffix_ids[0] not in ids:
            ids = [suffix_ids[0], *ids]
        return ids, None
    marker = suffix.strip().split("\n")[0] or None
    return ids, marker


# ----------------------------------------------------------------------------- filtering


def near_key(text: str) -> str:
    """Lowercased, non-word runs collapsed to one space, the first `NEAR_CHARS` characters."""
    return re.sub(r"\W+", " ", text.lower()).strip()[:NEAR_CHARS]


class _Filter:
    """Keeps sampled turns in order (see the module docstring), counting each reason to drop one."""

    def __init__(self, cfg: PromptsConfig, report: PromptsReport):
        self.cfg, self.report = cfg, report
        self.kept: list[tuple[str, str]] = []  # (text, origin)
        self.exact: set[str] = set()
        self.near: set[str] = set()

    def drop_reason(self, sample: dict) -> str | None:
        """The first of `DROP_REASONS` that ``sample`` fails, or None to keep it."""
        text = sample["text"]
        if not sample["finished"]:
            return "unfinished"
        if sample["tokens"] < self.cfg.min_tokens or not text:
            return "too_short"
        if text in self.exact:
            return "duplicate"
        if near_key(text) in self.near:
            return "near_duplicate"
        return None

    def add(self, sample: dict, origin: str) -> None:
        if reason := self.drop_reason(sample):
            self.report.dropped[reason] += 1
        else:
            text = sample["text"]
            self.exact.add(text)
            self.near.add(near_key(text))
            self.kept.append((text, origin))


# ----------------------------------------------------------------------------- files


def read_samples(path: str) -> list[dict]:
    """The batches in ``path`` (``{"batch": k, "samples": [...]}`` lines, k = 0, 1, ...), after cutting off
    a torn last line; a ValueError for a file this tool did not write."""
    if not os.path.exists(path):
        return []
    with open(path, "rb+") as f:
        data = f.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            logger.warning("%s: dropping a truncated last line from an interrupted write", path)
            f.truncate(end)
    batches = []
    for n, line in enumerate(data[:end].splitlines(), 1):
        try:
            batch = json.loads(line)
            ok = batch["batch"] == len(batches) and isinstance(batch["samples"], list)
        except (json.JSONDecodeError, TypeError, KeyError):
            ok = False
        if not ok:
            raise ValueError(f"{path} line {n}: not a batch written by make_prompts; use a new output path")
        batches.append(batch)
    return batches


def _origin(path: str) -> str:
    """A source file's path below its root (stdlib or site-packages), machine-independent."""
    for name, root in [("stdlib", sysconfig.get_paths()["stdlib"])] + [
        ("site-packages", r) for r in source_roots()
    ]:
        root = os.path.realpath(root)
        if os.path.realpath(path).startswith(root + os.sep):
            return f"{name}/{os.path.relpath(os.path.realpath(path), root)}"
    return os.path.basename(path)


# ----------------------------------------------------------------------------- sampling


def _sample_batch(model, tokenizer, prefix_ids, stop, marker, cfg: PromptsConfig, k: int) -> list[dict]:
    """Batch ``k``: ``batch_size`` user turns sampled after the prefix, seeded by ``(seed, k)``.

    Generation runs one token past ``max_tokens``, so a turn with ``tokens > max_tokens`` had not ended."""
    new = generate_batch(
        model,
        [prefix_ids] * cfg.batch_size,
        max_new_tokens=cfg.max_tokens + 1,
        eos=stop,
        pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop[-1],
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        seed=(cfg.seed * 1_000_003 + k) % 2**63,
    )
    out = []
    for ids in new:
        text = tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        finished = len(ids) <= cfg.max_tokens
        if marker is not None:
            finished = finished and marker in text
            text = text.split(marker)[0]
        out.append({"text": text.strip(), "tokens": len(ids), "finished": finished})
    return out


def sample_user_turns(
    model, tokenizer, cfg: PromptsConfig, report: PromptsReport, progress=True, on_batch=None
):
    """The kept user turns ``[(text, origin)]`` (``cfg.n_chat`` of them), sampling the batches not yet in
    ``OUT.samples``. ValueError if ``max_samples`` turns leave fewer than ``n_chat`` after filtering."""
    path = cfg.out + SAMPLES_SUFFIX
    batches = read_samples(path)
    check_settings(cfg.out, cfg.settings(), fresh=not batches, made="sampled")
    keep = _Filter(cfg, report)
    for b in batches:
        for j, s in enumerate(b["samples"]):
            keep.add(s, f"magpie/{b['batch']}/{j}")
    report.sampled = report.sampled_before = sum(len(b["samples"]) for b in batches)
    limit = cfg.max_samples or 20 * cfg.n_chat
    bar = tqdm(total=cfg.n_chat, desc="sampling user turns", unit="prompt", disable=not progress)
    bar.update(min(len(keep.kept), cfg.n_chat))
    prefix, suffix = user_prefix(tokenizer, cfg.system)
    prefix_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    stop, marker = stop_ids(model, tokenizer, suffix)
    k = len(batches)
    with open(path, "a", encoding="utf-8") as f:
        while len(keep.kept) < cfg.n_chat:
            if report.sampled >= limit:
                raise ValueError(
                    f"only {len(keep.kept)} of {cfg.n_chat} user turns passed the filters after {report.sampled} "
                    "samples; lower --n, raise --max-samples, or loosen --min-tokens / --max-tokens"
                )
            samples = _sample_batch(model, tokenizer, prefix_ids, stop, marker, cfg, k)
            f.write(json.dumps({"batch": k, "samples": samples}, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
            before = len(keep.kept)
            for j, s in enumerate(samples):
                keep.add(s, f"magpie/{k}/{j}")
            report.sampled += len(samples)
            report.new_tokens += sum(s["tokens"] for s in samples)
            bar.update(min(len(keep.kept), cfg.n_chat) - min(before, cfg.n_chat))
            if on_batch is not None:
                on_batch(k)
            k += 1
    bar.close()
    return keep.kept[: cfg.n_chat]


def _row(text: str, source: str, origin: str, system: str | None) -> dict:
    messages = [{"role": "user", "content": text}, {"role": "assistant", "content": ""}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return {"messages": messages, "source": source, "origin": origin}


def make_prompts(
    model, tokenizer, cfg: PromptsConfig, *, progress=True, on_batch=None, files=None
) -> PromptsReport:
    """Sample the chat prompts with ``model``, collect the code prompts (from ``files``: default
    `train.code_prompts.source_files`), and write ``cfg.out`` (see the module docstring)."""
    t0 = time.perf_counter()
    os.makedirs(os.path.dirname(os.path.abspath(cfg.out)), exist_ok=True)
    report = PromptsReport(out=cfg.out)
    chat = sample_user_turns(model, tokenizer, cfg, report, progress, on_batch) if cfg.n_chat else []
    bar = tqdm(total=cfg.n_code, desc="collecting code prompts", unit="prompt", disable=not progress)
    code = code_prompts(cfg.n_code, cfg.seed, files, progress=bar)
    bar.close()
    if len(code) < cfg.n_code:
        raise ValueError(
            f"only {len(code)} code prompts found in the installed sources; lower --code-fraction"
        )
    rows = [_row(t, "magpie", o, cfg.system) for t, o in chat]
    rows += [_row(code_request(c), "code", _origin(p), cfg.system) for p, c in code]
    random.Random(f"selfspec-prompt-mix:{cfg.seed}").shuffle(rows)
    atomic_text(cfg.out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    report.chat, report.code = len(chat), len(code)
    report.seconds = time.perf_counter() - t0
    return report


def cli(cfg: PromptsConfig) -> PromptsReport:
    """``scripts/make_prompts.py``: load the target, write the prompts, print the summary and the report as
    JSON; an input problem ends in one ``error: ...`` line."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        model, tokenizer = load_target_and_tokenizer(cfg)
        if cfg.n_chat:
            user_prefix(tokenizer, cfg.system)  # a template problem fails before any sampling
        report = make_prompts(model, tokenizer, cfg)
    except (ValueError, OSError) as e:
        raise SystemExit(f"error: {e}") from None
    print(report.summary())
    print(json.dumps(report.as_dict()))
    return report
