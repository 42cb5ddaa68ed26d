"""A training run's state and its processes: `Run`, the Accelerator, and the main-process-first helpers.

`train.prepare.setup` builds a `Run`; the loop (`train.train_heads.fit`), the eval, the checkpoints and
the publishing steps all read and update it. Everything here is independent of the head type.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import (
    DataLoaderConfiguration,
    DistributedType,
    InitProcessGroupKwargs,
    broadcast_object_list,
)
from torch import nn
from tqdm.auto import tqdm

from train.config import RunConfig

METRICS_FILE = "metrics.jsonl"
INPUT_ERRORS = (ValueError, FileNotFoundError, OSError)  # DataError is a ValueError


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o777 & ~mask


# Permissions of the directories a run writes through `heads.io.atomic_dir` (which makes them private):
# those a plain ``os.makedirs`` would give, so a shared output_dir stays readable as before.
DIR_MODE = _umask_mode()


@dataclass
class Run:
    """Everything `fit` needs; built by `setup`. ``heads``/``optimizer``/dataloaders are accelerate-prepared."""

    cfg: RunConfig
    accelerator: Any
    target: nn.Module
    lm_head: nn.Module
    heads: nn.Module
    head_config: Any
    optimizer: Any
    scheduler: Any
    train_dl: Any
    eval_dl: Any
    steps_per_epoch: int
    total_steps: int
    step: int = 0  # optimizer steps done
    epoch: int = 0
    batches_in_epoch: int = 0  # micro-batches of the current epoch already consumed
    best_eval_loss: float = math.inf
    # The best τ seen in eval (measured, else simulated: `run_eval`) and its step: `save_final` keeps those.
    best_accept_length: float = -math.inf
    best_step: int | None = None
    # `eval.measured_tau_prompts_file`'s prompts [1, T] each, read at setup (None: the eval rows' prompts)
    tau_prompts: list | None = None
    last_eval: dict[str, Any] | None = None  # the latest eval and its step (cards of pushed checkpoints)
    # The run's identity: the config as given (demo names unresolved) less the keys a resume may change
    # (`train.checkpoint.flat_config`); every checkpoint carries it. None = computed from ``cfg``.
    config_flat: dict[str, Any] | None = None

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    def print(self, *args) -> None:
        if self.is_main:
            tqdm.write(" ".join(str(a) for a in args))


def make_accelerator(cfg: RunConfig) -> Accelerator:
    """An Accelerator with gloo on CPU (docs/design.md §3), seeded data order and the configured precision."""
    # Only under a distributed launcher: a plain single process must not get a backend.
    launched = int(os.environ.get("LOCAL_RANK", -1)) != -1 or int(os.environ.get("WORLD_SIZE", 1)) > 1
    handlers = [InitProcessGroupKwargs(backend="gloo")] if launched and not torch.cuda.is_available() else []
    mp = cfg.train.mixed_precision
    if mp == "auto":
        # bf16 on a GPU that has it; otherwise what the launcher says (ACCELERATE_MIXED_PRECISION, "no" by default).
        mp = "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else None
    return Accelerator(
        gradient_accumulation_steps=cfg.train.grad_accum,
        mixed_precision=mp,
        log_with="wandb" if cfg.report_to == "wandb" else None,
        kwargs_handlers=handlers,
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=cfg.train.seed),
    )


def deepspeed_plugin(accelerator):
    """The DeepSpeed plugin of a DeepSpeed launch, else None."""
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        return accelerator.state.deepspeed_plugin
    return None


def main_process_first(accelerator, fn, main_only: bool = False):
    """``fn()`` on the main process, then on the others (``main_only``: the others get its result, which
    must be picklable). If it fails on the main process with an input error, every process raises it
    (instead of the others dying at a barrier with a gloo traceback)."""
    if accelerator.num_processes == 1:
        return fn()
    box: list[Any] = [None, None]  # [failure, result]
    if accelerator.is_main_process:
        try:
            box[1] = fn()
        except INPUT_ERRORS as e:
            box[0] = str(e)
            broadcast_object_list(box)
            raise
    broadcast_object_list(box)  # doubles as the barrier
    if box[0] is not None:
        raise ValueError(box[0])
    return box[1] if accelerator.is_main_process or main_only else fn()


@contextlib.contextmanager
def outside_zero3_init(plugin):
    """Build modules normally even under ZeRO-3. transformers partitions every model it loads (zero.Init)
    while accelerate's stage-3 config is registered with it, whatever ``zero3_init_flag`` says; the
    frozen target must stay whole, so unregister the config for the duration and restore it after."""
    if plugin is None or plugin.zero_stage != 3:
        yield
        return
    # Only a ZeRO-3 run gets here; transformers.integrations pulls in its DeepSpeed glue.
    from transformers.integrations import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        plugin.set_deepspeed_weakref()


def log(run: Run, metrics: dict[str, float]) -> None:
    """Send to the trackers (main process only, accelerate handles that) and append to metrics.jsonl."""
    run.accelerator.log(metrics, step=run.step)
    if run.is_main:
        with open(os.path.join(run.cfg.output_dir, METRICS_FILE), "a") as f:
            f.write(json.dumps({"step": run.step, **metrics}) + "\n")
