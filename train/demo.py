"""The built-in demo target: a small Llama trained here, on the Python standard library (docs/design.md §10).

The Hub is unreachable on the machines this project runs on and there is no pretrained LM on disk, so
the project makes its own target: a standard ``LlamaForCausalLM`` (config.json, model.safetensors,
tokenizer files) that any HF code loads like a Hub model. Everything downstream (demo head training,
benchmarks, end-to-end tests) uses it, so it is

- **deterministic** given ``(size, seed)`` and the interpreter's stdlib: sorted files, a seeded
  shuffle of fixed-length windows, a fixed step count (not a wall-clock budget);
- **cached**: built once into ``<cache>/demo-target-<size>-s<seed>`` and reused afterwards;
- **atomic**: built in a temp directory next to the final one and renamed into place, under a file
  lock, so an interrupted build never leaves a directory that later runs would trust, and two
  processes (e.g. two ranks of ``accelerate launch``) never train it twice.

Corpus: the stdlib's own ``.py`` files minus tests and generated files, split by a stable hash of the
relative path into ~95% train and ~5% held out. Held-out files are never seen by the target or by
head training; benchmark prompts come from them (`ensure_demo_data`).

Sizes: ``full`` is a 12-layer model that trains in about 10 minutes on 2 CPU cores (depth >= 12 so a
one-layer EAGLE draft costs about 1/12 of a target forward, as on real 32-layer targets); ``tiny`` is
the same code path at 2 layers / hidden 64, built in seconds for tests and CI.

Why ``full`` is narrow (hidden 128) and trains on 256-token windows: in a fixed 10-minute CPU budget
the model sees only ~2.5M tokens (about one pass over the corpus), and in that regime a narrow model
learns more per second. Measured with the same data and recipe (held-out loss, 512-token windows):
hidden 256 with 512-token windows 5.05 (1.8M tokens), hidden 256 with 256-token windows 4.38-4.55
(2.5M), hidden 128 with 256-token windows 4.30 (3.0M), while a step costs about the same on this CPU.
256-token training still extrapolates to 512 positions (loss on positions 256-511 within 0.1 of
0-255). Learning rates above ~4e-3 diverged at this depth. Two heads of 64 (one KV head, so
``repeat_kv`` is exercised) rather than four of 32: CPU flash-attention backward is ~2x cheaper at
head_dim 64, which made a step 1.27x faster at equal loss.

Tokenizer: byte-level BPE with special tokens ``<unk> <pad> <s> <|end|> <|system|> <|user|>
<|assistant|>``. ``<|end|>`` is the eos: it ends every training document *and* every chat message, so
plain completion and chat generation both stop on the one ``eos_token_id``. The chat template is
ChatML-like (``<s><|user|>...<|end|>\\n<|assistant|>...<|end|>``) with a ``{% generation %}``
block, so ``return_assistant_tokens_mask`` works; ~10% of the training files are rendered as chat so
the target knows the format.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import random
import shutil
import sys
import sysconfig
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

Size = Literal["full", "tiny"]
Split = Literal["train", "heldout"]

# Bump when the recipe changes in a way that changes the built artefacts; it is recorded in
# demo_info.json (an old cache is still reused: pass force=True to rebuild).
RECIPE_VERSION = 1
HELDOUT_PERCENT = 5  # of stdlib files, by a stable hash of their relative path
CHAT_PERCENT = 10  # of train files rendered as chat conversations in the target's corpus
SPLIT_SALT = "selfspec-demo-split"

UNK, PAD, BOS, EOS = "<unk>", "<pad>", "<s>", "<|end|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
SPECIAL_TOKENS = [UNK, PAD, BOS, EOS, *ROLE_TOKENS.values()]  # ids 0..6, in this order

# ChatML-like: <s><|system|>...<|end|>\n<|user|>...<|end|>\n<|assistant|>...<|end|>\n. No newline
# follows a role tag: byte-level BPE would merge it with the content's indentation ("\n    "), so the
# generation prompt (ending in the bare tag) would tokenize unlike training text. BOS is written by
# the template (tokenize chat text with add_special_tokens=False); `generation` marks what
# `return_assistant_tokens_mask=True` reports as assistant tokens.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{- raise_exception('unsupported role ' + message['role'] + '; use system, user or assistant') -}}"
    "{%- endif -%}"
    "{{- '<|' + message['role'] + '|>' -}}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- generation -%}{{- message['content'] + '<|end|>' -}}{%- endgeneration -%}{{- '\\n' -}}"
    "{%- else -%}"
    "{{- message['content'] + '<|end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>' -}}{%- endif -%}"
)
SYSTEM_PROMPT = "You are a Python programmer. Continue the code."


@dataclass(frozen=True)
class DemoSpec:
    """Everything that defines one demo size: model shape, corpus, tokenizer and optimisation.

    ``steps * batch_size * seq_len`` is the number of tokens trained on. ``file_stride`` keeps every
    n-th train file (tiny trains on a small slice so it builds in seconds). ``compile`` uses
    ``torch.compile`` for the loss (about 1.5x faster per step on CPU after a ~1 minute compile; it
    falls back to eager if compiling fails). ``threads``: torch threads while building (None: every
    core). Tiny uses 1: its kernels are too small to gain from a second thread, and on a busy machine
    OpenMP threads that wait for each other make it ~10x slower.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position_embeddings: int
    seq_len: int
    batch_size: int
    steps: int
    lr: float
    warmup_steps: int
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    file_stride: int = 1
    eval_windows: int = 128
    compile: bool = False
    threads: int | None = None


SPECS: dict[str, DemoSpec] = {
    # Calibrated on 2 CPU cores (bf16 autocast, AMX): see the module docstring and demo_info.json.
    "full": DemoSpec(
        vocab_size=8192,
        hidden_size=128,
        num_layers=12,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=384,
        max_position_embeddings=1024,
        seq_len=256,
        batch_size=16,
        steps=750,
        lr=3e-3,
        warmup_steps=60,
        eval_windows=512,
        compile=True,
    ),
    "tiny": DemoSpec(
        vocab_size=512,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=192,
        max_position_embeddings=512,
        seq_len=128,
        batch_size=8,
        steps=100,
        lr=5e-3,
        warmup_steps=10,
        file_stride=20,
        eval_windows=8,
        threads=1,
    ),
}

# Rows of head-training data (`ensure_demo_data`): (train, eval, prompts).
DATA_ROWS: dict[str, tuple[int, int, int]] = {"full": (4000, 200, 200), "tiny": (100, 20, 10)}
DATA_MAX_TOKENS = 512  # chunk cap when a tokenizer is given to ensure_demo_data


# ----------------------------------------------------------------------------- corpus


def cache_dir() -> str:
    """Where demo artefacts live: ``$SELFSPEC_CACHE`` if set, else ``~/.cache/selfspec``."""
    return os.environ.get("SELFSPEC_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "selfspec")


def stdlib_root() -> str:
    """The interpreter's pure-Python standard library (the base install's, also inside a venv)."""
    return sysconfig.get_paths()["stdlib"]


# Path components that mark test code, installed packages or caches.
_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


def _wanted(rel: str) -> bool:
    """Whether a stdlib file (path relative to the stdlib root, '/'-separated) belongs in the corpus.

    Besides tests and site-packages this drops files that are not representative code or that differ
    between machines: ``pydoc_data`` (750 KB of generated prose), the build-config scripts
    (``config-*/``, ``_sysconfigdata_*``, which hold this machine's paths) and the codec tables
    generated by ``gencodec.py`` (1.2 MB of hex literals, checked by content in `stdlib_files`).
    """
    parts = rel.split("/")
    if any(p in _SKIP_DIRS for p in parts[:-1]):
        return False
    if parts[0] == "pydoc_data" or parts[0].startswith("config-"):
        return False
    return not parts[-1].startswith("_sysconfigdata_")


def _is_generated_codec(path: str) -> bool:
    with open(path, encoding="utf-8", errors="replace") as f:
        return "gencodec.py" in f.read(400)


def _bucket(key: str, salt: str) -> int:
    """A stable 0..99 bucket for ``key`` (``hash()`` is salted per process, so use sha1)."""
    return int.from_bytes(hashlib.sha1(f"{salt}:{key}".encode()).digest()[:8], "big") % 100


def _relpath(path: str) -> str:
    return os.path.relpath(path, stdlib_root()).replace(os.sep, "/")


def stdlib_files(split: Split) -> list[str]:
    """Absolute paths of the stdlib's ``.py`` sources in ``split``, sorted by relative path.

    The split is by a stable hash of the relative path (~95% train, ~5% held out), so it does not
    depend on which other files exist. Held-out files are never trained on, by the target or the heads.
    """
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    root = stdlib_root()
    rels = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in filenames:
            if name.endswith(".py"):
                rels.append(os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/"))
    out = []
    for rel in sorted(rels):
        if not _wanted(rel):
            continue
        path = os.path.join(root, *rel.split("/"))
        if rel.startswith("encodings/") and _is_generated_codec(path):
            continue
        heldout = _bucket(rel, SPLIT_SALT) < HELDOUT_PERCENT
        if heldout == (split == "heldout"):
            out.append(path)
    if not out:
        raise RuntimeError(f"no stdlib .py files found under {root} for split {split!r}")
    return out


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read().replace("\r\n", "\n")


# ----------------------------------------------------------------------------- code chunks


_DEF_PREFIXES = ("def ", "async def ", "class ")


def _header_start(lines: list[str], i: int) -> int:
    """Index of the first decorator line directly above the def/class at line ``i``."""
    indent = len(lines[i]) - len(lines[i].lstrip())
    while (
        i > 0
        and lines[i - 1].strip().startswith("@")
        and len(lines[i - 1]) - len(lines[i - 1].lstrip()) == indent
    ):
        i -= 1
    return i


def _def_lines(lines: list[str]) -> list[int]:
    return [i for i, line in enumerate(lines) if line.lstrip().startswith(_DEF_PREFIXES)]


def _code_chunks(text: str, rng: random.Random) -> Iterator[str]:
    """Non-overlapping chunks of 20-60 lines, each starting at a def/class (with its decorators).

    Chunks are dedented (a method reads as a top-level function) and need >= 10 non-blank lines.
    """
    lines = text.split("\n")
    next_free = 0
    for i in _def_lines(lines):
        start = _header_start(lines, i)
        if start < next_free:
            continue
        n = rng.randint(20, 60)
        chunk = lines[start : start + n]
        while chunk and not chunk[-1].strip():
            chunk.pop()
        if sum(1 for line in chunk if line.strip()) < 10:
            continue
        next_free = start + n
        yield textwrap.dedent("\n".join(chunk)) + "\n"


def _prompts(text: str, rng: random.Random) -> Iterator[str]:
    """Generation prompts: a function's decorators and signature plus its first 2-5 body lines.

    Only functions with at least 8 more body lines are used, so there is code left to generate. No
    trailing newline: byte-level BPE merges a newline with the next line's indentation, so in training
    text a bare "\n" token mostly comes right before end-of-file, and a prompt ending in one makes the
    target stop at once (measured: half of the prompts generated just ``<|end|>``).
    """
    lines = text.split("\n")
    for i in _def_lines(lines):
        if not lines[i].lstrip().startswith(("def ", "async def ")):
            continue
        start = _header_start(lines, i)
        end = i  # the signature may span lines; it ends at the first line ending in ':'
        while end < len(lines) and end < i + 8 and not lines[end].rstrip().endswith(":"):
            end += 1
        if end >= len(lines) or not lines[end].rstrip().endswith(":"):
            continue
        indent = len(lines[i]) - len(lines[i].lstrip())
        body_end = end + 1  # the body is every following line that is blank or indented deeper
        while body_end < len(lines) and (
            not lines[body_end].strip() or len(lines[body_end]) - len(lines[body_end].lstrip()) > indent
        ):
            body_end += 1
        n_body = rng.randint(2, 5)
        if body_end - (end + 1) < n_body + 8:
            continue
        yield textwrap.dedent("\n".join(lines[start : end + 1 + n_body])).rstrip()


# ----------------------------------------------------------------------------- atomic cached builds


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (POSIX ``flock``; a no-op where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _build_cached(final: str, build: Callable[[str], None], force: bool) -> str:
    """Return ``final``, calling ``build(tmp_dir)`` first if it does not exist (or ``force``).

    ``build`` writes into a fresh temp directory next to ``final`` that is then renamed into place, so
    ``final`` either does not exist or is complete. The lock serialises concurrent builders: the
    second one finds the directory built and returns it. Temp directories left by killed builds are
    removed here (under the lock nobody else is writing them).
    """
    parent, name = os.path.split(os.path.abspath(final))
    os.makedirs(parent, exist_ok=True)
    with _locked(os.path.join(parent, f".{name}.lock")):
        if os.path.isdir(final) and not force:
            return final
        for stale in os.listdir(parent):
            if stale.startswith(f".{name}.tmp-"):
                shutil.rmtree(os.path.join(parent, stale), ignore_errors=True)
        tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; the cache is shared like any dir
        try:
            build(tmp)
            if os.path.isdir(final):  # force: move the old one aside, then swap
                old = tempfile.mkdtemp(prefix=f".{name}.tmp-old-", dir=parent)
                os.rename(final, os.path.join(old, name))
                os.rename(tmp, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def _write_jsonl(path: str, rows: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for text in rows:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")


# ----------------------------------------------------------------------------- tokenizer


def train_tokenizer(texts: list[str], vocab_size: int, max_length: int):
    """A byte-level BPE trained on ``texts``, wrapped as a `PreTrainedTokenizerFast` with the chat template.

    Plain ``tokenizer(text)`` prepends ``<s>`` (as the training documents start); the chat template
    writes ``<s>`` itself, so chat text is tokenized with ``add_special_tokens=False``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
            ),
        ]
    )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        extra_special_tokens=list(ROLE_TOKENS.values()),
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def _conversation(lines: list[str], rng: random.Random) -> list[dict[str, str]]:
    """Code lines as a chat: the user gives the first 2-6 lines (and a newline), the assistant the rest; a
    quarter of the conversations start with `SYSTEM_PROMPT`."""
    k = rng.randint(2, 6)
    messages = [
        {"role": "user", "content": "\n".join(lines[:k]) + "\n"},
        {"role": "assistant", "content": "\n".join(lines[k:])},
    ]
    if rng.random() < 0.25:
        messages.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
    return messages


def _documents(files: list[str], tokenizer) -> list[list[int]]:
    """Token ids of the target's training documents, one per file (chat files: one per conversation).

    A plain document is ``<s> source <|end|>``. A chat file (CHAT_PERCENT of them, by hash) becomes one
    conversation per code chunk: the user gives the chunk's first lines, the assistant continues, and
    a quarter of them carry a system prompt (more often, and the model parrots it into comments).
    """
    texts, is_chat = [], []
    for path in files:
        rel = _relpath(path)
        text = _read(path)
        if _bucket(rel, "selfspec-demo-chat") >= CHAT_PERCENT:
            texts.append(text)
            is_chat.append(False)
            continue
        rng = random.Random(f"chat:{rel}")
        for chunk in _code_chunks(text, rng):
            messages = _conversation(chunk.split("\n"), rng)
            texts.append(tokenizer.apply_chat_template(messages, tokenize=False))
            is_chat.append(True)
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    encoded = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    docs = []
    for enc, chat in zip(encoded, is_chat, strict=True):
        # Rendered chat already starts with <s> and ends with <|end|>\n; drop that newline so the
        # document ends on eos, as plain ones do and as chat generation should.
        ids = list(enc.ids)
        if chat:
            while ids and ids[-1] != eos:
                ids.pop()
            docs.append(ids)
        else:
            docs.append([bos, *ids, eos])
    return docs


# ----------------------------------------------------------------------------- training


def lr_at(step: int, spec: DemoSpec) -> float:
    """Linear warmup to ``spec.lr`` over ``warmup_steps``, then cosine down to ``min_lr_ratio * lr``."""
    import math

    if step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    t = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
    floor = spec.min_lr_ratio * spec.lr
    return floor + 0.5 * (spec.lr - floor) * (1.0 + math.cos(math.pi * min(1.0, t)))


def _windows(docs: list[list[int]], seq_len: int):
    """Concatenate documents and cut the stream into windows of ``seq_len + 1`` tokens, stride ``seq_len``.

    Returns a [N, seq_len + 1] int64 tensor: inputs ``w[:, :-1]``, labels ``w[:, 1:]``; every stream
    token but the first is a label exactly once.
    """
    import numpy as np
    import torch

    stream = torch.from_numpy(np.concatenate([np.asarray(d, dtype=np.int64) for d in docs]))
    n = (len(stream) - 1) // seq_len
    if n < 1:
        raise RuntimeError(f"corpus too small: {len(stream)} tokens for windows of {seq_len + 1}")
    idx = torch.arange(n)[:, None] * seq_len + torch.arange(seq_len + 1)[None, :]
    return stream[idx]


def _llama_config(spec: DemoSpec, tokenizer):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _loss_fn(model):
    """Next-token cross-entropy over a [B, T+1] window batch, the forward under bf16 autocast."""
    import torch
    import torch.nn.functional as F

    def loss(windows: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(input_ids=windows[:, :-1]).logits  # [B, T, V]
        return F.cross_entropy(logits.float().flatten(0, 1), windows[:, 1:].flatten())

    return loss


def _eval_loss(model, windows, batch_size: int) -> float:
    """Mean next-token loss over ``windows`` (the held-out files)."""
    import torch

    loss_fn = _loss_fn(model)
    model.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(windows), batch_size):
            batch = windows[i : i + batch_size]
            total += loss_fn(batch).item() * len(batch)
    model.train()
    return total / len(windows)


def _train(model, train_windows, spec: DemoSpec, seed: int, desc: str) -> tuple[float, bool]:
    """AdamW + warmup/cosine over ``spec.steps`` batches of seeded-shuffled windows.

    Returns (train seconds, whether torch.compile was used). Weight decay applies to matrices only
    (not norms), as in GPT-style recipes. Deterministic given the seed on a given machine and thread
    count: the data order comes from a seeded generator and CPU kernels are deterministic.
    """
    import torch
    from tqdm.auto import tqdm

    g = torch.Generator().manual_seed(seed)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": spec.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=spec.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    eager = _loss_fn(model)
    loss_fn = torch.compile(eager) if spec.compile else eager
    compiled = spec.compile
    order = torch.empty(0, dtype=torch.long)
    model.train()
    t0 = time.perf_counter()
    smooth = None
    bar = tqdm(range(spec.steps), desc=desc, unit="step", dynamic_ncols=True, mininterval=1.0)
    for step in bar:
        if len(order) < spec.batch_size:  # a new epoch over the windows (the full size sees < 1)
            order = torch.cat([order, torch.randperm(len(train_windows), generator=g)])
        batch, order = train_windows[order[: spec.batch_size]], order[spec.batch_size :]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, spec)
        try:
            loss = loss_fn(batch)
            loss.backward()
        except Exception as e:  # a missing C++ compiler and the like: train eagerly instead
            if not compiled:
                raise
            print(f"torch.compile failed ({type(e).__name__}: {e}); training eagerly", file=sys.stderr)
            opt.zero_grad(set_to_none=True)
            loss_fn, compiled = eager, False
            loss = loss_fn(batch)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.item()
        smooth = value if smooth is None else 0.9 * smooth + 0.1 * value
        bar.set_postfix(loss=f"{smooth:.3f}", lr=f"{lr_at(step, spec):.1e}", refresh=False)
    bar.close()
    return time.perf_counter() - t0, compiled


def _build_target(out: str, size: Size, seed: int) -> None:
    """Train the tokenizer and the model and save them (plus demo_info.json) into ``out``."""
    import torch
    import transformers
    from transformers import GenerationConfig, LlamaForCausalLM

    spec = SPECS[size]
    t_start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(spec.threads or os.cpu_count() or 1)
    try:
        train_files = stdlib_files("train")[:: spec.file_stride]
        heldout_files = stdlib_files("heldout")
        tokenizer = train_tokenizer(
            [_read(p) for p in train_files], spec.vocab_size, spec.max_position_embeddings
        )
        train_windows = _windows(_documents(train_files, tokenizer), spec.seq_len)
        encoded = tokenizer.backend_tokenizer.encode_batch(
            [_read(p) for p in heldout_files], add_special_tokens=False
        )
        heldout_docs = [[tokenizer.bos_token_id, *e.ids, tokenizer.eos_token_id] for e in encoded]
        heldout_windows = _windows(heldout_docs, spec.seq_len)[: spec.eval_windows]

        torch.manual_seed(seed)
        config = _llama_config(spec, tokenizer)
        model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)
        n_params = sum(p.numel() for p in model.parameters())
        tokens = spec.steps * spec.batch_size * spec.seq_len
        print(
            f"demo target {size} (seed {seed}): {spec.num_layers} layers, hidden {spec.hidden_size}, "
            f"{n_params / 1e6:.1f}M params, vocab {len(tokenizer)}; {len(train_windows)} train windows of "
            f"{spec.seq_len} tokens, training on {tokens:,} tokens",
            flush=True,
        )
        train_seconds, compiled = _train(model, train_windows, spec, seed, desc=f"demo-target-{size}")
        heldout_loss = _eval_loss(model, heldout_windows, spec.batch_size)
        print(
            f"demo target {size}: held-out loss {heldout_loss:.4f} ({heldout_windows.numel() - len(heldout_windows):,} "
            f"tokens), trained on {tokens:,} tokens in {train_seconds:.0f} s",
            flush=True,
        )

        model.generation_config = GenerationConfig(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        model.config._name_or_path = f"selfspec-demo-target-{size}-s{seed}"
        model.eval().save_pretrained(out)
        tokenizer.save_pretrained(out)
        info = {
            "recipe_version": RECIPE_VERSION,
            "size": size,
            "seed": seed,
            "layers": spec.num_layers,
            "hidden_size": spec.hidden_size,
            "params": n_params,
            "vocab_size": len(tokenizer),
            "seq_len": spec.seq_len,
            "batch_size": spec.batch_size,
            "steps": spec.steps,
            "tokens_trained": tokens,
            "train_windows": len(train_windows),
            "heldout_loss": round(heldout_loss, 4),
            "heldout_tokens": heldout_windows.numel() - len(heldout_windows),
            "train_seconds": round(train_seconds, 1),
            "build_seconds": round(time.perf_counter() - t_start, 1),
            "compiled": compiled,
            "threads": torch.get_num_threads(),
            "train_files": len(train_files),
            "heldout_files": len(heldout_files),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "spec": dataclasses.asdict(spec),
        }
        with open(os.path.join(out, "demo_info.json"), "w") as f:
            json.dump(info, f, indent=2)
    finally:
        torch.set_num_threads(threads)


def ensure_demo_target(
    size: Size = "full", seed: int = 0, cache: str | None = None, force: bool = False
) -> str:
    """The demo target's directory, ``<cache>/demo-target-<size>-s<seed>``, built on first call.

    The directory holds a standard HF ``LlamaForCausalLM`` (config.json, generation_config.json,
    model.safetensors in float32), its tokenizer (with chat template) and demo_info.json. Building
    ``full`` takes about 10 minutes on 2 CPU cores; ``tiny`` a few seconds. ``force`` rebuilds.
    """
    if size not in SPECS:
        raise ValueError(f"size must be one of {', '.join(SPECS)}, got {size!r}")
    final = os.path.join(cache or cache_dir(), f"demo-target-{size}-s{seed}")
    return _build_cached(final, lambda tmp: _spawn_build(tmp, size, seed), force)


def _spawn_build(out: str, size: Size, seed: int) -> None:
    """Run `_build_target` in a fresh interpreter (``python -m train.demo OUT SIZE SEED``).

    Why a subprocess: torch's OpenMP runtime (libgomp) reads ``OMP_WAIT_POLICY`` once, when torch is
    imported, and by default its threads spin after every parallel region. On 2 cores shared with
    any other busy process that makes training 10-20x slower (measured: 1.1 s/step alone, 17-26 s/step
    next to one busy process; 1.4-1.7 s/step with PASSIVE). A fresh process also keeps the build
    independent of the caller's torch state (threads, default dtype, compile caches, RNG), which the
    determinism promise needs. An explicit ``OMP_WAIT_POLICY`` in the environment is respected.
    """
    import subprocess

    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.setdefault("HF_HUB_OFFLINE", "1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # importable without an install
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "train.demo", out, size, str(seed)]
    rc = subprocess.run(cmd, env=env).returncode
    if rc != 0:
        raise RuntimeError(
            f"building the demo target ({size}, seed {seed}) failed with exit code {rc}; see its output above"
        )


# ----------------------------------------------------------------------------- head-training data


def _tokenizer_fingerprint(tokenizer_dir: str) -> str:
    with open(os.path.join(tokenizer_dir, "tokenizer.json"), "rb") as f:
        return hashlib.sha1(f.read()).hexdigest()[:10]


def _build_data(out: str, size: Size, seed: int, tokenizer_dir: str | None) -> None:
    n_train, n_eval, n_prompts = DATA_ROWS[size]
    chunks = []
    for path in stdlib_files("train"):
        chunks.extend(_code_chunks(_read(path), random.Random(f"{seed}:chunks:{_relpath(path)}")))
    prompts = []
    for path in stdlib_files("heldout"):
        prompts.extend(_prompts(_read(path), random.Random(f"{seed}:prompts:{_relpath(path)}")))
    if tokenizer_dir is not None:  # cap each chunk at DATA_MAX_TOKENS by dropping trailing lines
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer_dir)

        def fit(text: str) -> str:
            lines = text.rstrip("\n").split("\n")
            while len(lines) > 1 and len(tok("\n".join(lines) + "\n")["input_ids"]) > DATA_MAX_TOKENS:
                lines = lines[: max(1, len(lines) * 3 // 4)]
            return "\n".join(lines) + "\n"

        chunks = [fit(c) for c in chunks]
    random.Random(f"{seed}:shuffle").shuffle(chunks)
    random.Random(f"{seed}:prompts").shuffle(prompts)
    if len(chunks) < n_eval + 1 or not prompts:
        raise RuntimeError(
            f"too little stdlib code for demo data: {len(chunks)} chunks, {len(prompts)} prompts"
        )
    _write_jsonl(os.path.join(out, "eval.jsonl"), chunks[:n_eval])
    _write_jsonl(os.path.join(out, "train.jsonl"), chunks[n_eval : n_eval + n_train])
    _write_jsonl(os.path.join(out, "prompts.jsonl"), prompts[:n_prompts])


def ensure_demo_data(
    size: Size = "full",
    seed: int = 0,
    cache: str | None = None,
    *,
    tokenizer_dir: str | None = None,
    force: bool = False,
) -> dict[str, str]:
    """JSONL files of ``{"text": ...}`` rows for head training and benchmarks, built on first call.

    Returns ``{"train": path, "eval": path, "prompts": path}``:
    - train / eval: disjoint code chunks (20-60 lines, starting at a def or class, dedented) from
      *train-split* files; 4000 / 200 rows for ``full``, 100 / 20 for ``tiny``.
    - prompts: a function's signature plus its first few body lines, without a trailing newline (see
      `_prompts`), from *held-out* files only (never trained on by the target or the heads); 200 rows
      for ``full``, 10 for ``tiny``.
    With ``tokenizer_dir``, chunks are cut to at most 512 tokens of that tokenizer (the cache entry is
    then specific to the tokenizer). Deterministic given ``(size, seed)``; written atomically.
    """
    if size not in DATA_ROWS:
        raise ValueError(f"size must be one of {', '.join(DATA_ROWS)}, got {size!r}")
    name = f"demo-data-{size}-s{seed}"
    if tokenizer_dir is not None:
        name += f"-tok{_tokenizer_fingerprint(tokenizer_dir)}"
    final = _build_cached(
        os.path.join(cache or cache_dir(), name),
        lambda tmp: _build_data(tmp, size, seed, tokenizer_dir),
        force,
    )
    return {split: os.path.join(final, f"{split}.jsonl") for split in ("train", "eval", "prompts")}


def chat_rows(texts: list[str], seed: int = 0) -> list[dict]:
    """Code chunks as conversations (`_conversation`), in the form the demo target saw its chat files
    (`_documents`). Deterministic given ``(texts, seed)``."""
    return [
        {"messages": _conversation(text.rstrip("\n").split("\n"), random.Random(f"{seed}:chat-rows:{i}"))}
        for i, text in enumerate(texts)
    ]


def ensure_demo_chat_data(size: Size = "full", seed: int = 0, cache: str | None = None) -> dict[str, str]:
    """The demo's train / eval code chunks as chat conversations (`chat_rows`), built on first call.

    Returns ``{"train-chat": path, "eval-chat": path}``: JSONL files of ``{"messages": [...]}`` rows,
    one per row of `ensure_demo_data`'s train / eval files, in the same order. They are the input of
    ``scripts/regenerate_data.py --data demo --split train-chat``: heads for a chat-served model train on
    the target's own answers in the chat format it is served in.
    """
    files = ensure_demo_data(size, seed=seed, cache=cache)

    def build(tmp: str) -> None:
        for split in ("train", "eval"):
            with open(files[split], encoding="utf-8") as f:
                texts = [json.loads(line)["text"] for line in f if line.strip()]
            with open(os.path.join(tmp, f"{split}-chat.jsonl"), "w", encoding="utf-8") as f:
                for row in chat_rows(texts, seed):
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")

    final = _build_cached(os.path.dirname(files["train"]) + "-chat", build, force=False)
    return {f"{split}-chat": os.path.join(final, f"{split}-chat.jsonl") for split in ("train", "eval")}


if __name__ == "__main__":  # the build subprocess of `_spawn_build`; use ensure_demo_target instead
    _out, _size, _seed = sys.argv[1:]
    _build_target(_out, _size, int(_seed))  # type: ignore[arg-type]
