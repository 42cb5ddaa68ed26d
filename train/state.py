"""A run's checkpoints: write one (`save_checkpoint`), restore one (`load_checkpoint`), pick one (`maybe_resume`).

``checkpoints/step-N/`` holds ``accelerator.save_state`` (heads, optimizer, RNG states; DeepSpeed's shards
under DeepSpeed), the LR scheduler as JSON (``scheduler.json``) and ``trainer_state.json`` (the loop
position, the best eval so far, the run's identity). What may be read back, and how safely, is
`train.checkpoint`'s business; this module moves a `Run` in and out of those files.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pickle
import shutil
from typing import Any

from accelerate.utils import broadcast_object_list

from heads.io import TMP_PREFIX, atomic_dir
from train import checkpoint as ckpt
from train.checkpoint import CHECKPOINTS, SCHEDULER_FILE, STATE_FILE
from train.medusa2 import checkpoint_kwargs
from train.run import DIR_MODE, METRICS_FILE, Run, main_process_first


def trainer_state(run: Run) -> dict[str, Any]:
    """What ``trainer_state.json`` holds: the loop position, the best eval, the batch layout, the identity."""
    flat = run.config_flat if run.config_flat is not None else ckpt.flat_config(run.cfg)
    return {
        "step": run.step,
        "epoch": run.epoch,
        "batches_in_epoch": run.batches_in_epoch,
        "best_eval_loss": run.best_eval_loss if math.isfinite(run.best_eval_loss) else None,
        "best_accept_length": run.best_accept_length if math.isfinite(run.best_accept_length) else None,
        "best_step": run.best_step,
        "total_steps": run.total_steps,
        "num_processes": run.accelerator.num_processes,
        "batch_size": run.cfg.train.batch_size,
        "grad_accum": run.cfg.train.grad_accum,
        "run_id": ckpt.run_identity(flat),  # `load_checkpoint` refuses another run's checkpoint
        "config": flat,
    }


def _write_error(run: Run, final: str, root: str, error: BaseException | None) -> ckpt.CheckpointWriteError:
    full = error is not None and ckpt.is_disk_full(error, root)
    kept = ckpt.checkpoint_steps(run.cfg.output_dir)
    why = (
        "No space left on device"
        if full
        else (" ".join(str(error).split())[:300] or "failed on another process")
    )
    return ckpt.CheckpointWriteError(
        f"writing checkpoint {final} failed: {why}; the partial write was removed"
        + (f", the previous checkpoint {kept[-1][1]} is kept" if kept else "")
        + (": free some space, then resume with --resume" if full else "")
    )


def save_checkpoint(run: Run) -> str:
    """``accelerator.save_state`` into a temporary sibling of ``checkpoints/step-N`` (`heads.io.atomic_dir`),
    add the scheduler (JSON) and trainer_state.json, rename it to step-N.

    Every process takes part (DeepSpeed writes its shards, each process its RNG state) in the directory the
    main process made. A crash leaves at most a ``.tmp-*`` directory, which is never resumed from and is
    removed by the next save. A failed write (disk full, quota) on any process removes that directory and
    raises `train.checkpoint.CheckpointWriteError` on every process; the previous checkpoints are untouched.
    Keeps the newest ``save_total_limit``.
    """
    acc = run.accelerator
    root = os.path.join(run.cfg.output_dir, CHECKPOINTS)
    final = os.path.join(root, f"step-{run.step}")
    with contextlib.ExitStack() as stack:
        box: list[str | None] = [None]
        if acc.is_main_process:
            os.makedirs(root, exist_ok=True)
            for name in os.listdir(root):  # what a killed save left behind
                if name.startswith(TMP_PREFIX):
                    shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            box[0] = stack.enter_context(atomic_dir(final, mode=DIR_MODE))
        if acc.num_processes > 1:
            broadcast_object_list(box)  # every process writes into the main process's directory
        tmp = box[0]
        error: BaseException | None = None
        try:
            acc.save_state(tmp, **checkpoint_kwargs(run, load=False))
            if acc.is_main_process:
                for name, obj in (
                    (SCHEDULER_FILE, run.scheduler.state_dict()),
                    (STATE_FILE, trainer_state(run)),
                ):
                    with open(os.path.join(tmp, name), "w") as f:
                        json.dump(obj, f, indent=2)
        except (
            Exception
        ) as e:  # OSError, torch's zip writer's RuntimeError, safetensors' SafetensorError, ...
            error = e
        if ckpt.any_process(acc, error is not None):
            raise _write_error(
                run, final, root, error
            ) from error  # atomic_dir removes tmp on the main process
    if acc.is_main_process:
        limit = run.cfg.train.save_total_limit
        if limit > 0:
            for _, old in ckpt.checkpoint_steps(run.cfg.output_dir)[:-limit]:
                shutil.rmtree(old, ignore_errors=True)
    acc.wait_for_everyone()
    return final


def load_checkpoint(run: Run, path: str) -> None:
    """Restore heads, optimizer, scheduler, RNG states and the loop position from a step-N directory, after
    checking it is this run's and that none of its files needs more than a weights-only load."""
    try:
        with open(os.path.join(path, STATE_FILE)) as f:
            state = json.load(f)
    except ValueError as e:
        raise ValueError(f"{os.path.join(path, STATE_FILE)} is not valid JSON: {e}") from None
    ckpt.check_same_run(path, state, trainer_state(run))
    acc = run.accelerator
    main_process_first(acc, lambda: ckpt.verify_checkpoint(path, acc.num_processes), main_only=True)
    try:
        acc.load_state(path, **checkpoint_kwargs(run, load=True))
    except pickle.UnpicklingError as e:  # a weights-only load refused a file (accelerate / DeepSpeed)
        raise ValueError(f"refusing to resume from {path}: {str(e).splitlines()[0][:300]}") from None
    run.scheduler.load_state_dict(ckpt.read_scheduler(path))
    run.step, run.epoch, run.batches_in_epoch = state["step"], state["epoch"], state["batches_in_epoch"]
    run.best_eval_loss = state["best_eval_loss"] if state["best_eval_loss"] is not None else math.inf
    best = state.get("best_accept_length")
    run.best_accept_length, run.best_step = (
        (best, state["best_step"]) if best is not None else (-math.inf, None)
    )
    if run.batches_in_epoch >= len(run.train_dl):  # saved on the last step of an epoch
        run.epoch, run.batches_in_epoch = run.epoch + 1, 0
    if acc.is_main_process:
        ckpt.trim_metrics(os.path.join(run.cfg.output_dir, METRICS_FILE), run.step)
    acc.wait_for_everyone()
    run.print(f"resumed from {path} at step {run.step} (epoch {run.epoch}, batch {run.batches_in_epoch})")


def maybe_resume(run: Run) -> None:
    """``resume=auto``: the latest complete checkpoint in output_dir (none: start fresh); ``resume=PATH``: that one."""
    resume = run.cfg.resume
    if resume is None:
        return
    path = ckpt.latest_checkpoint(run.cfg.output_dir) if resume == "auto" else os.path.expanduser(resume)
    if path is None:
        run.print(
            f"resume=auto: no checkpoint in {os.path.join(run.cfg.output_dir, CHECKPOINTS)}, starting fresh"
        )
        if run.is_main:
            ckpt.trim_metrics(os.path.join(run.cfg.output_dir, METRICS_FILE), 0)
        run.accelerator.wait_for_everyone()
        return
    if not os.path.isfile(os.path.join(path, STATE_FILE)):
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {STATE_FILE})")
    load_checkpoint(run, path)
