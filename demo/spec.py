"""What defines one demo size (model shape, corpus slice, optimisation) and the recipe constants.

The sizes and why they are what they are: see the package docstring (`demo`) and docs/design.md §10.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Size = Literal["full", "tiny"]
Split = Literal["train", "heldout"]

# Bump when the recipe changes in a way that changes the built artefacts; it is recorded in
# demo_info.json, and a cached build of another version is rebuilt (`demo.target.stale_reason`).
# 2: the precision follows the hardware (fp32 where bf16 is emulated, `demo.precision`); full: 400 steps.
RECIPE_VERSION = 2
HELDOUT_PERCENT = 5  # of stdlib files, by a stable hash of their relative path
CHAT_PERCENT = 10  # of train files rendered as chat conversations in the target's corpus
SPLIT_SALT = "selfspec-demo-split"


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
    # Calibrated on 2 CPU cores (bf16 autocast, AMX: 750 steps, ~0.8 s/step): see the module docstring and
    # demo_info.json. Trimmed to 400 steps in recipe 2 so the README's first command fits ~25 minutes on
    # 2 cores without native bf16 too (fp32 there: measured s/step in demo_info.json, README).
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
        steps=400,
        lr=3e-3,
        warmup_steps=40,
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
