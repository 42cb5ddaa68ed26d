"""Train draft heads on a frozen target LM: setup -> fit -> validate -> save.

    python train/train_heads.py --config configs/demo-medusa.yaml [key=value ...] [--resume]
    python -m train.train_heads --config configs/demo-medusa.yaml
    python train/train_heads.py --config configs/demo-eagle3.yaml --features DIR   # offline features
    accelerate launch --config_file configs/accelerate/deepspeed_zero2.yaml train/train_heads.py \
        --config configs/demo-medusa.yaml
    # on CPU add: DS_ACCELERATOR=cpu ... accelerate launch ... --num_processes 2

This file is the run from start to end, as one reads it: `start` (output_dir, `train.prepare.setup`,
trackers, resume), `fit` (the loop), `run_eval` (held-out eval, best-heads copy), `finish` (final eval,
save, push). The parts live in their own modules:

    train/run.py        the `Run` state, the Accelerator, main-process-first helpers, metrics logging
    train/prepare.py    `setup`: target, tokenizer, data, heads (from the registry), optimizer, schedule
    train/objective.py  one model step: the frozen target's forward and the head type's loss (registry)
    train/medusa2.py    Medusa-2: the LoRA backbone + heads as one module, its loss, adapter saving
    train/features.py   offline target features (``--features DIR``, scripts/dump_features.py)
    train/evaluation.py held-out loss, accuracies, simulated and measured τ
    train/state.py      checkpoints of a run (save, load, resume); train/checkpoint.py: their safety
    train/publish.py    heads copies (best/, final), model card, Hub push

The target is frozen and stays outside accelerate/DeepSpeed; only the heads, their optimizer and the
dataloaders are prepared. The config's ``heads.type`` picks the head type's registry entry
(`heads.registry`), which gives the loss; everything else is shared. With ``--features DIR`` the
training batches carry the target outputs and the target only runs for the held-out eval (it still
provides the embedding and lm_head). One optimizer step = ``train.grad_accum`` micro-batches of
``train.batch_size`` sequences on each process. Medusa-2 (``joint.enabled``, configs/demo-medusa2.yaml)
trains a LoRA adapter on the target with the heads (`train.medusa2`).

Output layout (``output_dir``):
    config.json, model.safetensors   the heads of the eval with the best acceptance length τ (measured)
                                     (`heads.base.load_heads` reads them; the last eval's if no eval data)
    train_config.yaml                the full resolved run config
    README.md                        model card: base model, config, data, accuracy, τ (`heads.hub`)
    eval_results.json                that eval's held-out metrics (+ ``last``: the final step's)
    adapter/                         Medusa-2 (``joint.enabled``) only: the LoRA adapter of the same step
                                     (PEFT files; the heads' config says ``target_adapter: adapter``)
    best/                            during the run only: a copy of the best intermediate heads
    metrics.jsonl                    every logged train/eval record
    checkpoints/step-N/              `accelerator.save_state` + trainer_state.json, written atomically
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any

import torch
from tqdm.auto import tqdm

from train import checkpoint as ckpt
from train.checkpoint import CHECKPOINTS, SCHEDULER_FILE, STATE_FILE, latest_checkpoint
from train.config import RunConfig, load_config, to_dict
from train.data import DataError
from train.evaluation import accuracy_table, eval_metrics, evaluate, measure_tau
from train.features import FeatureShards, collate_features
from train.losses import simulated_accept_length
from train.medusa2 import JointModel, add_lora, joint_batch_loss
from train.objective import batch_loss, num_positions, position_name, position_weights, target_forward
from train.prepare import install_vocab_map, setup
from train.publish import BEST, HUB_STAGING, push_checkpoint_heads, push_heads, save_final, save_heads_copy
from train.run import INPUT_ERRORS, METRICS_FILE, Run, log, main_process_first, make_accelerator
from train.state import load_checkpoint, maybe_resume, save_checkpoint

# With a CUDA build of torch and a CUDA toolkit but no GPU, torch warns "No CUDA runtime is found" each
# time DeepSpeed looks up its compiler: noise on a CPU run that breaks the one-line error promise.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)

# The names other code (tests, scripts, train/launch.py) imports from here; the parts live in the modules above.
__all__ = [
    "BEST", "CHECKPOINTS", "HUB_STAGING", "INPUT_ERRORS", "METRICS_FILE", "SCHEDULER_FILE", "STATE_FILE",
    "FeatureShards", "JointModel", "Run", "accuracy_table", "add_lora", "batch_loss", "collate_features",
    "eval_metrics", "evaluate", "finish", "fit", "install_vocab_map", "joint_batch_loss", "latest_checkpoint",
    "load_checkpoint", "load_config", "main", "measure_tau", "num_positions", "parse_args", "position_name",
    "position_weights", "push_heads", "run_eval", "save_checkpoint", "save_final", "save_heads_copy", "setup",
    "start", "target_forward", "train",
]  # fmt: skip

# `fit`, `run_eval` and `finish` call `save_checkpoint`, `evaluate`, `measure_tau` and `fit` through this
# module's names, so a test can replace one of them here (a kill right after a checkpoint, a patched eval).

# ---------------------------------------------------------------------------------------------- eval


def run_eval(run: Run, final: bool = False) -> dict[str, Any]:
    """Evaluate (`train.evaluation`), log, and keep the heads if their τ is the best so far (ties go to the
    later step): the measured τ when ``eval.measured_tau_prompts`` > 0, else the simulated one. An
    intermediate best is copied to ``output_dir/best``; the final eval's heads are still in memory, so
    `save_final` needs no copy of them."""
    ev = evaluate(run)
    measured = measure_tau(run)
    seconds = measured.pop("_seconds") if measured else None
    ev |= measured or {}
    run.best_eval_loss = min(run.best_eval_loss, ev["loss"])
    log(run, eval_metrics(run, ev))
    run.last_eval = {"step": run.step, **ev}
    tau = ev.get("measured_accept_length", ev["sim_accept_length"])
    is_best = tau >= run.best_accept_length
    if is_best:
        run.best_accept_length, run.best_step = tau, run.step
        if not final:
            save_heads_copy(run, os.path.join(run.cfg.output_dir, BEST), {"step": run.step, **ev})
    best = " (best)" if is_best else ""
    run.print(
        f"step {run.step}: eval loss {ev['loss']:.4f} | τ(sim) {ev['sim_accept_length']:.3f}"
        + (best if measured is None else f" | τ(measured) {tau:.3f}{best} in {seconds:.1f} s")
        + f" | top-1 {'vs target' if 'top1_vs_target' in ev else 'vs data'} "
        + " ".join(f"{a:.3f}" for a in ev["top1"])
        + (f" | backbone KL(orig‖adapted) {ev['backbone_kl']:.5f} nats/token" if "backbone_kl" in ev else "")
    )
    return ev


# ---------------------------------------------------------------------------------------------- fit


def rng_neutral(batches):
    """Iterate ``batches`` without letting the data loader touch the global CPU RNG.

    Starting a DataLoader iterator draws a seed from it. Keeping that draw out of the training RNG
    stream (EAGLE's feature noise) makes a resumed run, whose iterator starts after the checkpoint's
    RNG state is restored, draw the same noise as an uninterrupted one. (Shuffling has its own seeded
    generator; worker processes, if any, get the same base seed every epoch.)
    """
    it = iter(batches)
    while True:
        rng = torch.get_rng_state()
        try:
            batch = next(it)
        except StopIteration:
            return
        finally:
            torch.set_rng_state(rng)
        yield batch


class TrainLog:
    """The training metrics between two log lines: loss and per-position top-1 [1 + K], summed over
    micro-batches (on the device: no host sync per step), averaged over processes when logged."""

    def __init__(self, run: Run) -> None:
        self.K, self.pos = num_positions(run.head_config), position_name(run)
        self.sums = torch.zeros(1 + self.K, device=run.accelerator.device)
        self.n = 0
        self.t0, self.last_step = time.time(), run.step

    def add(self, loss: torch.Tensor, metrics: dict[str, torch.Tensor]) -> None:
        self.sums += torch.cat([loss.detach().float().view(1), metrics["top1"].float()]).to(self.sums.device)
        self.n += 1

    def flush(self, run: Run, grad_norm, bar) -> None:
        """Log the window's averages (every process calls this: it reduces), then start a new window."""
        avg = run.accelerator.reduce(self.sums / self.n, reduction="mean").cpu()
        metrics = {
            "train/loss": avg[0].item(),
            "train/lr": run.scheduler.get_last_lr()[0],
            "train/epoch": run.epoch,
        }
        metrics |= {f"train/{self.pos}{k}_top1": avg[1 + k].item() for k in range(self.K)}
        metrics["train/sim_accept_length"] = float(simulated_accept_length(avg[1:]))
        if grad_norm is not None:
            metrics["train/grad_norm"] = float(grad_norm)
        metrics["train/steps_per_s"] = (run.step - self.last_step) / max(time.time() - self.t0, 1e-9)
        self.t0, self.last_step = time.time(), run.step
        log(run, metrics)
        bar.set_postfix(
            loss=f"{metrics['train/loss']:.3f}",
            tau=f"{metrics['train/sim_accept_length']:.2f}",
            lr=f"{metrics['train/lr']:.2e}",
        )
        self.sums.zero_()
        self.n = 0


def after_step(run: Run, has_eval: bool) -> None:
    """What the schedule asks for after optimizer step ``run.step``: an eval, a checkpoint (and its push)."""
    tcfg = run.cfg.train
    if tcfg.eval_every and run.step % tcfg.eval_every == 0 and run.step < run.total_steps and has_eval:
        run_eval(run)
    if tcfg.save_every and run.step % tcfg.save_every == 0:
        save_checkpoint(run)
        if run.cfg.push_to_hub and run.cfg.hub_strategy == "every_save":
            push_checkpoint_heads(run)


def fit(run: Run) -> None:
    """The training loop: accumulate micro-batches, clip, step, log, evaluate and checkpoint on schedule."""
    acc, tcfg = run.accelerator, run.cfg.train
    has_eval = len(run.eval_dl) > 0
    bar = tqdm(
        total=run.total_steps,
        initial=run.step,
        desc="train",
        disable=not acc.is_main_process,
        dynamic_ncols=True,
    )
    window = TrainLog(run)
    grad_norm = None
    while run.step < run.total_steps:
        run.train_dl.set_epoch(run.epoch)
        # A resumed epoch skips the micro-batches it already consumed (same order: the sampler is seeded).
        batches = (
            acc.skip_first_batches(run.train_dl, run.batches_in_epoch)
            if run.batches_in_epoch
            else run.train_dl
        )
        for batch in rng_neutral(batches):
            with acc.accumulate(run.heads):
                loss, m = batch_loss(run, batch)
                acc.backward(loss)
                if acc.sync_gradients and tcfg.grad_clip > 0:
                    grad_norm = acc.clip_grad_norm_(run.heads.parameters(), tcfg.grad_clip)
                run.optimizer.step()
                run.optimizer.zero_grad(set_to_none=True)
            run.batches_in_epoch += 1
            window.add(loss, m)
            if not acc.sync_gradients:
                continue
            run.scheduler.step()
            run.step += 1
            bar.update(1)
            if run.step % tcfg.log_every == 0 or run.step == run.total_steps:
                window.flush(run, grad_norm, bar)
            after_step(run, has_eval)
            if run.step >= run.total_steps:
                break
        else:  # the epoch ran out
            run.epoch += 1
            run.batches_in_epoch = 0
    bar.close()


# ---------------------------------------------------------------------------------------------- the run


def start(cfg: RunConfig, features: str | None = None) -> Run | None:
    """Everything that can fail because of the user's input: output_dir ownership, setup, trackers, resume.
    ``features``: a ``scripts/dump_features.py`` directory to train from (None = run the target online).
    Returns None (after saying so) when the run in output_dir is finished and this is a resume."""
    accelerator = make_accelerator(cfg)
    # Before any data is read: output_dir can be this run's (`train.checkpoint.claim_output_dir`), and writable.
    done = main_process_first(accelerator, lambda: ckpt.claim_output_dir(cfg), main_only=True)
    if done is not None:
        accelerator.print(done)
        accelerator.end_training()
        return None
    run = setup(cfg, features, accelerator)
    # Only now, with every input checked, is anything written into output_dir.
    main_process_first(accelerator, lambda: ckpt.take_output_dir(cfg), main_only=True)
    run.config_flat = ckpt.flat_config(cfg)
    if run.cfg.report_to == "wandb":
        run.accelerator.init_trackers(
            run.cfg.wandb_project, config=to_dict(run.cfg), init_kwargs={"wandb": {"name": run.cfg.run_name}}
        )
    maybe_resume(run)
    return run


def _tau_words(ev: dict[str, Any]) -> str:
    measured = ev.get("measured_accept_length")
    return (
        f"{measured:.3f} measured, " if measured is not None else ""
    ) + f"{ev['sim_accept_length']:.3f} simulated"


def finish(run: Run) -> dict[str, Any] | None:
    """fit -> validate -> save. Returns the final held-out metrics (None without eval data)."""
    fit(run)
    ev = run_eval(run, final=True) if len(run.eval_dl) else None
    best = save_final(run, ev)
    if run.cfg.push_to_hub:
        tau = f", τ {_tau_words(best)}" if best else ""
        push_heads(run, run.cfg.output_dir, f"{run.head_config.head_type} heads after {run.step} steps{tau}")
    if ev is not None:
        run.print(f"\nheld-out accuracy after {run.step} steps:\n{accuracy_table(ev, position_name(run))}")
        run.print(
            f"best τ {_tau_words(best)} at step {best['step']}: those heads are saved to {run.cfg.output_dir}"
        )
    run.accelerator.end_training()
    return ev


def train(cfg: RunConfig, features: str | None = None) -> dict[str, Any] | None:
    """setup -> (resume) -> fit -> validate -> save (nothing when resuming a finished run)."""
    run = start(cfg, features)
    return None if run is None else finish(run)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", help="YAML recipe (see configs/); defaults are used for keys it does not set")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest complete checkpoint in output_dir (same as resume=auto; "
        "resume=PATH picks a checkpoint directory)",
    )
    p.add_argument(
        "--features",
        metavar="DIR",
        help="train on target features written by scripts/dump_features.py (same config) instead of "
        "running the target on every training batch; the held-out eval still runs it",
    )
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.lr=1e-3 output_dir=out/x")
    return p.parse_args(argv)


def _exit_one_line(e: BaseException) -> SystemExit:
    """``error: ...`` as one line (Python prints a SystemExit's message to stderr, exit status 1), from the
    main process only.

    Under a launcher (``WORLD_SIZE`` > 1) the other processes wait a moment before exiting, because the
    launcher stops every process once one fails and must not stop the main process before it has printed;
    and every process leaves with ``os._exit`` once the line is out, because an interpreter shutdown with
    the process group's threads still running aborts with a C++ ``terminate called ...`` line."""
    line = "error: " + " ".join(str(e).split())  # one line, whatever the library wrote
    rank = int(os.environ.get("RANK", 0))
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        if rank == 0:
            print(line, file=sys.stderr, flush=True)
        else:
            time.sleep(5)
        sys.stdout.flush()
        os._exit(1)
    return SystemExit(1) if rank != 0 else SystemExit(line)


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv)
    overrides = list(args.overrides) + (["resume=auto"] if args.resume else [])

    # Input problems (config, target path, data, output_dir, checkpoint) and a full disk end in one line;
    # set SELFSPEC_DEBUG=1 for the traceback. Other errors during training itself are bugs and keep theirs.
    run = None
    try:
        run = start(load_config(args.config, overrides), args.features)
        return None if run is None else finish(run)
    except (DataError, *INPUT_ERRORS) as e:
        if os.environ.get("SELFSPEC_DEBUG"):
            raise
        if run is not None:  # training had started: only a failed write (disk full) is the user's to fix
            if isinstance(e, OSError) and not isinstance(e, ckpt.CheckpointWriteError):
                if not ckpt.is_disk_full(e, run.cfg.output_dir):
                    raise
                e = OSError(f"No space left on device writing to {run.cfg.output_dir} ({e})")
            elif not isinstance(e, ckpt.CheckpointWriteError):
                raise
        raise _exit_one_line(e) from None


if __name__ == "__main__":
    main()
