"""The demo target itself: a standard ``LlamaForCausalLM`` pre-trained here on the demo corpus.

`ensure_demo_target` builds it once per ``(size, seed)`` into the cache (`demo.cache.build_cached`), in a
fresh interpreter (`_spawn_build`, ``python -m demo``); `_build_target` is what that process runs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from demo.cache import build_cached, cache_dir
from demo.corpus import documents, read_source, stdlib_files
from demo.precision import FAST, Precision, fast_precision
from demo.spec import RECIPE_VERSION, SPECS, DemoSpec, Size
from demo.tokenizer import train_tokenizer


def lr_at(step: int, spec: DemoSpec) -> float:
    """Linear warmup to ``spec.lr`` over ``warmup_steps``, then cosine down to ``min_lr_ratio * lr``."""
    if step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    t = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
    floor = spec.min_lr_ratio * spec.lr
    return floor + 0.5 * (spec.lr - floor) * (1.0 + math.cos(math.pi * min(1.0, t)))


def windows(docs: list[list[int]], seq_len: int):
    """Concatenate documents and cut the stream into windows of ``seq_len + 1`` tokens, stride ``seq_len``.

    Returns a [N, seq_len + 1] int64 tensor: inputs ``w[:, :-1]``, labels ``w[:, 1:]``; every stream
    token but the first is a label exactly once.
    """
    stream = torch.from_numpy(np.concatenate([np.asarray(d, dtype=np.int64) for d in docs]))
    n = (len(stream) - 1) // seq_len
    if n < 1:
        raise RuntimeError(f"corpus too small: {len(stream)} tokens for windows of {seq_len + 1}")
    idx = torch.arange(n)[:, None] * seq_len + torch.arange(seq_len + 1)[None, :]
    return stream[idx]


def llama_config(spec: DemoSpec, tokenizer):
    """The demo target's ``LlamaConfig`` for ``spec`` and its trained tokenizer (ids of the special tokens)."""
    from transformers import LlamaConfig  # heavy (the model code); only building a target needs it

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


def _loss_fn(model, bf16: bool):
    """Next-token cross-entropy over a [B, T+1] window batch; the forward under bf16 autocast if ``bf16``
    (only where bf16 is native: emulated, it is 15-50x slower than fp32, `demo.precision`)."""

    def loss(windows: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=windows[:, :-1]).logits  # [B, T, V]
        return F.cross_entropy(logits.float().flatten(0, 1), windows[:, 1:].flatten())

    return loss


def _eval_loss(model, heldout, batch_size: int, bf16: bool) -> float:
    """Mean next-token loss over the ``heldout`` windows [N, T+1] (the held-out files)."""
    loss_fn = _loss_fn(model, bf16)
    model.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(heldout), batch_size):
            batch = heldout[i : i + batch_size]
            total += loss_fn(batch).item() * len(batch)
    model.train()
    return total / len(heldout)


def _train(model, train_windows, spec: DemoSpec, seed: int, desc: str, bf16: bool) -> tuple[float, bool]:
    """AdamW + warmup/cosine over ``spec.steps`` batches of seeded-shuffled windows.

    Returns (train seconds, whether torch.compile was used). Weight decay applies to matrices only
    (not norms), as in GPT-style recipes. Deterministic given the seed on a given machine and thread
    count: the data order comes from a seeded generator and CPU kernels are deterministic.
    """
    g = torch.Generator().manual_seed(seed)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": spec.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=spec.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    eager = _loss_fn(model, bf16)
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


def _corpus(spec: DemoSpec):
    """The tokenizer trained on the train files, and the train / held-out windows ([N, seq_len + 1])."""
    train_files = stdlib_files("train")[:: spec.file_stride]
    heldout_files = stdlib_files("heldout")
    tokenizer = train_tokenizer(
        [read_source(p) for p in train_files], spec.vocab_size, spec.max_position_embeddings
    )
    train_windows = windows(documents(train_files, tokenizer), spec.seq_len)
    encoded = tokenizer.backend_tokenizer.encode_batch(
        [read_source(p) for p in heldout_files], add_special_tokens=False
    )
    heldout_docs = [[tokenizer.bos_token_id, *e.ids, tokenizer.eos_token_id] for e in encoded]
    heldout_windows = windows(heldout_docs, spec.seq_len)[: spec.eval_windows]
    counts = {"train_files": len(train_files), "heldout_files": len(heldout_files)}
    return tokenizer, train_windows, heldout_windows, counts


def _build_target(out: str, size: Size, seed: int, precision: str = FAST) -> None:
    """Train the tokenizer and the model and save them (plus demo_info.json) into ``out``.

    ``precision``: fast (bf16 autocast where the hardware has native bf16, else fp32: `demo.precision`),
    bf16 or fp32. The weights are saved in fp32 either way."""
    # heavy (the model code), and only the build subprocess needs it
    import transformers
    from transformers import GenerationConfig, LlamaForCausalLM

    spec = SPECS[size]
    chosen: Precision = fast_precision(precision, "cpu")
    bf16 = chosen.name == "bf16"
    print(f"demo target {size}: {chosen.line}", flush=True)
    t_start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(spec.threads or os.cpu_count() or 1)
    try:
        tokenizer, train_windows, heldout_windows, counts = _corpus(spec)
        torch.manual_seed(seed)
        config = llama_config(spec, tokenizer)
        model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)
        n_params = sum(p.numel() for p in model.parameters())
        tokens = spec.steps * spec.batch_size * spec.seq_len
        print(
            f"demo target {size} (seed {seed}): {spec.num_layers} layers, hidden {spec.hidden_size}, "
            f"{n_params / 1e6:.1f}M params, vocab {len(tokenizer)}; {len(train_windows)} train windows of "
            f"{spec.seq_len} tokens, training on {tokens:,} tokens",
            flush=True,
        )
        train_seconds, compiled = _train(
            model, train_windows, spec, seed, desc=f"demo-target-{size}", bf16=bf16
        )
        heldout_loss = _eval_loss(model, heldout_windows, spec.batch_size, bf16)
        heldout_tokens = heldout_windows.numel() - len(heldout_windows)
        print(
            f"demo target {size}: held-out loss {heldout_loss:.4f} ({heldout_tokens:,} "
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
            "heldout_tokens": heldout_tokens,
            "precision": chosen.name,
            "precision_reason": chosen.reason,
            "train_seconds": round(train_seconds, 1),
            "seconds_per_step": round(train_seconds / spec.steps, 3),
            "build_seconds": round(time.perf_counter() - t_start, 1),
            "compiled": compiled,
            "threads": torch.get_num_threads(),
            **counts,
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
    size: Size = "full", seed: int = 0, cache: str | None = None, force: bool = False, precision: str = FAST
) -> str:
    """The demo target's directory, ``<cache>/demo-target-<size>-s<seed>``, built on first call.

    The directory holds a standard HF ``LlamaForCausalLM`` (config.json, generation_config.json,
    model.safetensors in float32), its tokenizer (with chat template) and demo_info.json. Building
    ``full`` takes about 10 minutes on 2 CPU cores with native bf16 or in fp32; ``tiny`` a few seconds.
    ``force`` rebuilds; so does a cached build of another recipe version, or (for an explicit
    ``precision``) one trained in the other precision (`stale_reason`). ``precision``: fast | bf16 | fp32.
    """
    if size not in SPECS:
        raise ValueError(f"size must be one of {', '.join(SPECS)}, got {size!r}")
    fast_precision(precision)  # a bad value fails here, before any work
    final = os.path.join(cache or cache_dir(), f"demo-target-{size}-s{seed}")
    stale = stale_reason(final, precision)
    if stale and not force:
        print(f"rebuilding the demo target {final}: {stale}", file=sys.stderr, flush=True)
    return build_cached(final, lambda tmp: _spawn_build(tmp, size, seed, precision), force or bool(stale))


def stale_reason(final: str, precision: str = FAST) -> str | None:
    """Why a cached demo target in ``final`` must not be reused (None: reuse it, or nothing is there)."""
    try:
        with open(os.path.join(final, "demo_info.json")) as f:
            info = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return f"its demo_info.json is unreadable ({e})"
    version = info.get("recipe_version") if isinstance(info, dict) else None
    if version != RECIPE_VERSION:
        return f"built by recipe version {version}, this is version {RECIPE_VERSION}"
    if precision != FAST and info.get("precision") != fast_precision(precision).name:
        return f"trained in {info.get('precision')}, {precision} was asked for"
    return None


def _spawn_build(out: str, size: Size, seed: int, precision: str = FAST) -> None:
    """Run `_build_target` in a fresh interpreter (``python -m demo OUT SIZE SEED PRECISION``).

    Why a subprocess: torch's OpenMP runtime (libgomp) reads ``OMP_WAIT_POLICY`` once, when torch is
    imported, and by default its threads spin after every parallel region. On 2 cores shared with
    any other busy process that makes training 10-20x slower (measured: 1.1 s/step alone, 17-26 s/step
    next to one busy process; 1.4-1.7 s/step with PASSIVE). A fresh process also keeps the build
    independent of the caller's torch state (threads, default dtype, compile caches, RNG), which the
    determinism promise needs. An explicit ``OMP_WAIT_POLICY`` in the environment is respected.
    """
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.setdefault("HF_HUB_OFFLINE", "1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # importable without an install
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "demo", out, size, str(seed), precision]
    rc = subprocess.run(cmd, env=env).returncode
    if rc != 0:
        raise RuntimeError(
            f"building the demo target ({size}, seed {seed}) failed with exit code {rc}; see its output above"
        )
