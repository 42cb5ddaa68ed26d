"""The built-in demo target: a small Llama trained here, on the Python standard library (docs/design.md §10).

Its own package, below heads/train/infer (it imports none of them; any of them may import it): it builds
a model, it does not train heads. Modules: `demo.spec` (sizes), `demo.corpus` (stdlib files, chunks,
prompts, chat), `demo.tokenizer`, `demo.target` (the LM pre-training), `demo.data` (head-training data),
`demo.cache` (the locked, atomic cache).

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

from demo.cache import cache_dir
from demo.corpus import (
    SYSTEM_PROMPT,
    conversation,
    documents,
    read_source,
    relpath,
    stdlib_files,
    stdlib_root,
)
from demo.data import DATA_MAX_TOKENS, chat_rows, ensure_demo_chat_data, ensure_demo_data
from demo.spec import DATA_ROWS, RECIPE_VERSION, SPECS, DemoSpec, Size
from demo.target import ensure_demo_target, llama_config, lr_at
from demo.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS, train_tokenizer

__all__ = [
    "CHAT_TEMPLATE",
    "DATA_MAX_TOKENS",
    "DATA_ROWS",
    "NAMES",
    "RECIPE_VERSION",
    "SPECIAL_TOKENS",
    "SPECS",
    "SYSTEM_PROMPT",
    "DemoSpec",
    "Size",
    "cache_dir",
    "chat_rows",
    "conversation",
    "documents",
    "ensure_demo_chat_data",
    "ensure_demo_data",
    "ensure_demo_target",
    "llama_config",
    "lr_at",
    "read_source",
    "relpath",
    "resolve",
    "resolve_data",
    "stdlib_files",
    "stdlib_root",
    "train_tokenizer",
]

# The names that stand for the demo target (and its data) wherever a model name or data path is taken.
NAMES: dict[str, Size] = {"demo": "full", "demo-tiny": "tiny"}


def resolve(name_or_path: str, cache: str | None = None) -> str:
    """``demo`` / ``demo-tiny`` -> the demo target's directory (`ensure_demo_target`, built and cached on
    first use); any other name or path is returned as is."""
    if name_or_path not in NAMES:
        return name_or_path
    return ensure_demo_target(NAMES[name_or_path], cache=cache)


def resolve_data(name_or_path: str, cache: str | None = None) -> dict[str, str] | None:
    """``demo`` / ``demo-tiny`` -> the demo data files (`ensure_demo_data`: ``train``, ``eval``,
    ``prompts`` paths); None for any other name (a real data path or Hub dataset)."""
    if name_or_path not in NAMES:
        return None
    return ensure_demo_data(NAMES[name_or_path], cache=cache)
