"""Train draft heads on a frozen target LM: setup -> fit -> validate -> save.

    python train/train_heads.py --config configs/demo-medusa.yaml [key=value ...] [--resume]
    accelerate launch --config_file configs/accelerate/deepspeed_zero2.yaml train/train_heads.py \
        --config configs/demo-medusa.yaml
    # on CPU add: DS_ACCELERATOR=cpu ... accelerate launch ... --num_processes 2

The target is frozen and stays outside accelerate/DeepSpeed: it is moved to the device and run under
``torch.no_grad()`` to get its last post-norm hidden state; only the heads, their optimizer and the
dataloaders are prepared. One optimizer step = ``train.grad_accum`` micro-batches of
``train.batch_size`` sequences on each process.

Output layout (``output_dir``):
    config.json, model.safetensors   the trained heads (`heads.base.load_heads` reads them)
    train_config.yaml                the full resolved run config
    eval_results.json                the final held-out metrics
    metrics.jsonl                    every logged train/eval record
    checkpoints/step-N/              `accelerator.save_state` + trainer_state.json, written atomically
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import json
import math
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Any

if __package__ in (None, ""):  # run as a script: import from the repo root, not from train/
    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path[0] = _root
    else:
        sys.path.insert(0, _root)

import torch
from torch import Tensor, nn

from train.config import RunConfig, load_config, resolve_demo, to_dict, to_yaml
from train.losses import medusa_loss, medusa_stats

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.json"
METRICS_FILE = "metrics.jsonl"


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

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    def print(self, *args) -> None:
        if self.is_main:
            from tqdm.auto import tqdm

            tqdm.write(" ".join(str(a) for a in args))


# ---------------------------------------------------------------------------------------------- setup


def make_accelerator(cfg: RunConfig):
    """An Accelerator with gloo on CPU (DESIGN §3), seeded data order and the configured precision."""
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration, InitProcessGroupKwargs

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


def _deepspeed_plugin(accelerator):
    from accelerate.utils import DistributedType

    return (
        accelerator.state.deepspeed_plugin
        if accelerator.distributed_type == DistributedType.DEEPSPEED
        else None
    )


INPUT_ERRORS = (ValueError, FileNotFoundError, OSError)  # DataError is a ValueError


def main_process_first(accelerator, fn):
    """``fn()`` on the main process, then on the others. If it fails on the main process with an input
    error, every process raises it (instead of the others dying at a barrier with a gloo traceback)."""
    from accelerate.utils import broadcast_object_list

    if accelerator.num_processes == 1:
        return fn()
    failure: list[str | None] = [None]
    if accelerator.is_main_process:
        try:
            result = fn()
        except INPUT_ERRORS as e:
            failure = [str(e)]
            broadcast_object_list(failure)
            raise
    broadcast_object_list(failure)  # doubles as the barrier
    if failure[0] is not None:
        raise ValueError(failure[0])
    return result if accelerator.is_main_process else fn()


@contextlib.contextmanager
def outside_zero3_init(plugin):
    """Build modules normally even under ZeRO-3. transformers partitions every model it loads (zero.Init)
    while accelerate's stage-3 config is registered with it, whatever ``zero3_init_flag`` says; the
    frozen target must stay whole, so unregister the config for the duration and restore it after."""
    if plugin is None or plugin.zero_stage != 3:
        yield
        return
    from transformers.integrations import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        plugin.set_deepspeed_weakref()


def setup(cfg: RunConfig) -> Run:
    """Build and check everything before the first step: target, tokenizer, data, heads, optimizer."""
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader
    from transformers import AutoTokenizer, get_cosine_schedule_with_warmup

    from heads.base import REGISTRY
    from heads.graft import load_target, looks_local, num_layers
    from train.data import build_datasets, collate

    accelerator = make_accelerator(cfg)
    set_seed(cfg.train.seed)
    plugin = _deepspeed_plugin(accelerator)
    tcfg = cfg.train

    # Demo assets and the datasets cache are built by the main process first; the others then load them.
    def load_inputs():
        resolved = resolve_demo(cfg)
        name = resolved.target.name_or_path
        if looks_local(name) and not os.path.isdir(os.path.expanduser(name)):
            raise FileNotFoundError(f"target model directory not found: {name!r}")
        try:
            tok = AutoTokenizer.from_pretrained(os.path.expanduser(name), revision=resolved.target.revision)
        except OSError as e:
            raise OSError(f"could not load the tokenizer of {name!r}: {e}") from e
        return resolved, tok, *build_datasets(resolved.data, tok, seed=tcfg.seed)

    cfg, tokenizer, train_ds, eval_ds = main_process_first(accelerator, load_inputs)
    name = cfg.target.name_or_path
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    if len(train_ds) == 0:
        raise ValueError(f"no training examples in {cfg.data.path!r}")

    # The target stays frozen, whole and outside DeepSpeed: never build it (or the heads) under zero.Init.
    with outside_zero3_init(plugin):
        target = load_target(
            name,
            revision=cfg.target.revision,
            dtype=cfg.target.dtype,
            device=accelerator.device,
            attn_implementation=cfg.target.attn_implementation,
        )
        text_cfg = target.config.get_text_config()
        max_pos = getattr(text_cfg, "max_position_embeddings", None)
        if max_pos is not None and cfg.data.max_length > max_pos:
            raise ValueError(
                f"data.max_length={cfg.data.max_length} exceeds the target's max_position_embeddings={max_pos}"
            )
        if len(tokenizer) > target.get_output_embeddings().weight.shape[0]:
            raise ValueError(
                f"the tokenizer has {len(tokenizer)} tokens but the target's lm_head only {target.get_output_embeddings().weight.shape[0]}"
            )
        module_cls = REGISTRY[cfg.heads.type][1]
        heads = module_cls.for_target(target, **cfg.heads.head_kwargs()).float()
    trainable = [p for p in heads.parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("these heads have no trainable parameter (num_layers=0 with lm_head=target?)")
    heads.train()

    train_dl = DataLoader(
        train_ds,
        batch_size=tcfg.batch_size,
        shuffle=True,
        collate_fn=functools.partial(collate, pad_token_id=pad_id),
        num_workers=tcfg.num_workers,
    )
    eval_dl = DataLoader(
        eval_ds,
        batch_size=tcfg.eval_batch_size or tcfg.batch_size,
        shuffle=False,
        collate_fn=functools.partial(collate, pad_token_id=pad_id),
        num_workers=tcfg.num_workers,
    )
    adamw = torch.optim.AdamW(trainable, lr=tcfg.lr, betas=tuple(tcfg.betas), weight_decay=tcfg.weight_decay)
    if plugin is not None:  # DeepSpeed clips itself, from its config
        ds = plugin.deepspeed_config
        if ds.get("gradient_clipping", "auto") == "auto":
            ds["gradient_clipping"] = tcfg.grad_clip
        elif float(ds["gradient_clipping"]) != tcfg.grad_clip:
            accelerator.print(
                f"note: DeepSpeed config sets gradient_clipping={ds['gradient_clipping']} (train.grad_clip ignored)"
            )
    heads, optimizer, train_dl, eval_dl = accelerator.prepare(heads, adamw, train_dl, eval_dl)

    # Steps come from the per-process dataloader length (after sharding across processes).
    steps_per_epoch = math.ceil(len(train_dl) / tcfg.grad_accum)
    total_steps = tcfg.max_steps if tcfg.max_steps > 0 else tcfg.num_epochs * steps_per_epoch
    # The scheduler drives the AdamW created above (DeepSpeed's ZeRO optimizer wraps that same object and
    # reads its param_groups' lr). It is stepped by hand once per optimizer step (not prepared: accelerate
    # would step it num_processes times) and saved with each checkpoint via register_for_checkpointing.
    scheduler = get_cosine_schedule_with_warmup(adamw, round(tcfg.warmup_ratio * total_steps), total_steps)
    accelerator.register_for_checkpointing(scheduler)

    run = Run(
        cfg=cfg,
        accelerator=accelerator,
        target=target,
        lm_head=target.get_output_embeddings(),
        heads=heads,
        head_config=accelerator.unwrap_model(heads).config,
        optimizer=optimizer,
        scheduler=scheduler,
        train_dl=train_dl,
        eval_dl=eval_dl,
        steps_per_epoch=steps_per_epoch,
        total_steps=total_steps,
    )
    n_target = sum(p.numel() for p in target.parameters())
    n_heads = sum(p.numel() for p in trainable)
    run.print(
        f"target {name} ({n_target / 1e6:.1f}M params, {num_layers(target)} layers, {next(target.parameters()).dtype}) | "
        f"{cfg.heads.type} heads {n_heads / 1e6:.2f}M trainable params | "
        f"data {len(train_ds)} train / {len(eval_ds)} eval sequences | "
        f"{accelerator.num_processes} process(es) x batch {tcfg.batch_size} x accum {tcfg.grad_accum} | "
        f"{total_steps} steps ({steps_per_epoch}/epoch) | precision {accelerator.mixed_precision}"
        + (f" | DeepSpeed ZeRO-{plugin.zero_stage}" if plugin is not None else "")
    )
    return run


# ---------------------------------------------------------------------------------------------- model step


def _target_kwargs(target: nn.Module) -> dict:
    """Skip computing the target's full logits when its forward allows (we only need the hidden states)."""
    params = inspect.signature(target.forward).parameters
    kwargs = {"use_cache": False}
    if "logits_to_keep" in params:
        kwargs["logits_to_keep"] = 1
    return kwargs


def head_logits(run: Run, batch: dict[str, Tensor]) -> Tensor:
    """Frozen target forward (no grad) -> hidden [B, T, H] -> heads -> logits [K, B, T, V]."""
    from heads.graft import run_target

    with torch.no_grad():
        hidden = run_target(
            run.target, batch["input_ids"], batch["attention_mask"], **_target_kwargs(run.target)
        ).hidden
    dtype = next(run.accelerator.unwrap_model(run.heads).parameters()).dtype
    return run.heads(hidden.to(dtype), run.lm_head)


@torch.no_grad()
def evaluate(run: Run) -> dict[str, Any]:
    """Held-out loss and per-head top-1/top-5 accuracy, exact across processes (duplicates from padding
    the last batch are dropped by `gather_for_metrics`)."""
    run.heads.eval()
    K = run.head_config.num_heads
    totals = torch.zeros(K, 4, dtype=torch.float64)  # per head: loss_sum, top1, top5, count
    for batch in run.eval_dl:
        stats = medusa_stats(head_logits(run, batch), batch["input_ids"], batch["loss_mask"])  # [K, B] each
        per_seq = torch.stack(
            [stats["loss_sum"], stats["top1"], stats["topk"], stats["count"]], -1
        )  # [K, B, 4]
        per_seq = run.accelerator.gather_for_metrics(per_seq.transpose(0, 1).contiguous())  # [B_all, K, 4]
        totals += per_seq.sum(0).double().cpu()
    run.heads.train()
    n = totals[:, 3].clamp(min=1)
    per_head_loss = totals[:, 0] / n
    weights = torch.tensor([run.cfg.train.decay**k for k in range(K)], dtype=torch.float64)
    return {
        "loss": float((weights * per_head_loss).sum()),
        "head_loss": per_head_loss.tolist(),
        "top1": (totals[:, 1] / n).tolist(),
        "top5": (totals[:, 2] / n).tolist(),
        "count": totals[:, 3].long().tolist(),
    }


# ---------------------------------------------------------------------------------------------- checkpoints


def _checkpoint_steps(output_dir: str) -> list[tuple[int, str]]:
    """Complete checkpoints (step-N with a trainer_state.json), oldest first."""
    root = os.path.join(output_dir, CHECKPOINTS)
    found = []
    if os.path.isdir(root):
        for name in os.listdir(root):
            m = re.fullmatch(r"step-(\d+)", name)
            path = os.path.join(root, name)
            if m and os.path.isfile(os.path.join(path, STATE_FILE)):
                found.append((int(m.group(1)), path))
    return sorted(found)


def latest_checkpoint(output_dir: str) -> str | None:
    found = _checkpoint_steps(output_dir)
    return found[-1][1] if found else None


def _state(run: Run) -> dict[str, Any]:
    return {
        "step": run.step,
        "epoch": run.epoch,
        "batches_in_epoch": run.batches_in_epoch,
        "best_eval_loss": run.best_eval_loss if math.isfinite(run.best_eval_loss) else None,
        "total_steps": run.total_steps,
        "num_processes": run.accelerator.num_processes,
        "batch_size": run.cfg.train.batch_size,
        "grad_accum": run.cfg.train.grad_accum,
    }


def save_checkpoint(run: Run) -> str:
    """``accelerator.save_state`` into ``checkpoints/.tmp-step-N``, add trainer_state.json, rename to step-N.

    Every process takes part (DeepSpeed writes its shards, each process its RNG state). A crash leaves at
    most a ``.tmp-*`` directory, which is never resumed from. Keeps the newest ``save_total_limit``.
    """
    acc = run.accelerator
    root = os.path.join(run.cfg.output_dir, CHECKPOINTS)
    final = os.path.join(root, f"step-{run.step}")
    tmp = os.path.join(root, f".tmp-step-{run.step}")
    if acc.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(root, exist_ok=True)
    acc.wait_for_everyone()
    acc.save_state(tmp)
    acc.wait_for_everyone()
    if acc.is_main_process:
        with open(os.path.join(tmp, STATE_FILE), "w") as f:
            json.dump(_state(run), f, indent=2)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
        limit = run.cfg.train.save_total_limit
        if limit > 0:
            for _, old in _checkpoint_steps(run.cfg.output_dir)[:-limit]:
                shutil.rmtree(old, ignore_errors=True)
    acc.wait_for_everyone()
    return final


def load_checkpoint(run: Run, path: str) -> None:
    """Restore heads, optimizer, scheduler, RNG states and the loop position from a step-N directory."""
    with open(os.path.join(path, STATE_FILE)) as f:
        state = json.load(f)
    now = _state(run)
    for key in ("num_processes", "batch_size", "grad_accum"):
        if state.get(key) != now[key]:
            raise ValueError(
                f"checkpoint {path} was written with {key}={state.get(key)} but this run has {key}={now[key]}; "
                "resume with the same settings, or use a new output_dir"
            )
    run.accelerator.load_state(path)
    run.step, run.epoch, run.batches_in_epoch = state["step"], state["epoch"], state["batches_in_epoch"]
    run.best_eval_loss = state["best_eval_loss"] if state["best_eval_loss"] is not None else math.inf
    if run.batches_in_epoch >= len(run.train_dl):  # saved on the last step of an epoch
        run.epoch, run.batches_in_epoch = run.epoch + 1, 0
    run.print(f"resumed from {path} at step {run.step} (epoch {run.epoch}, batch {run.batches_in_epoch})")


def maybe_resume(run: Run) -> None:
    resume = run.cfg.resume
    if resume is None:
        return
    path = latest_checkpoint(run.cfg.output_dir) if resume == "auto" else os.path.expanduser(resume)
    if path is None:
        run.print(
            f"resume=auto: no checkpoint in {os.path.join(run.cfg.output_dir, CHECKPOINTS)}, starting fresh"
        )
        return
    if not os.path.isfile(os.path.join(path, STATE_FILE)):
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {STATE_FILE})")
    load_checkpoint(run, path)


# ---------------------------------------------------------------------------------------------- fit


def log(run: Run, metrics: dict[str, float]) -> None:
    """Send to the trackers (main process only, accelerate handles that) and append to metrics.jsonl."""
    run.accelerator.log(metrics, step=run.step)
    if run.is_main:
        with open(os.path.join(run.cfg.output_dir, METRICS_FILE), "a") as f:
            f.write(json.dumps({"step": run.step, **metrics}) + "\n")


def eval_metrics(ev: dict[str, Any]) -> dict[str, float]:
    out = {"eval/loss": ev["loss"]}
    for k, (loss, t1, t5) in enumerate(zip(ev["head_loss"], ev["top1"], ev["top5"], strict=True)):
        out |= {f"eval/head{k}_loss": loss, f"eval/head{k}_top1": t1, f"eval/head{k}_top5": t5}
    return out


def run_eval(run: Run) -> dict[str, Any]:
    ev = evaluate(run)
    run.best_eval_loss = min(run.best_eval_loss, ev["loss"])
    log(run, eval_metrics(ev))
    run.print(
        f"step {run.step}: eval loss {ev['loss']:.4f} | top-1 " + " ".join(f"{a:.3f}" for a in ev["top1"])
    )
    return ev


def fit(run: Run) -> None:
    """The training loop: accumulate micro-batches, clip, step, log, evaluate and checkpoint on schedule."""
    from tqdm.auto import tqdm

    acc, tcfg = run.accelerator, run.cfg.train
    K = run.head_config.num_heads
    bar = tqdm(
        total=run.total_steps,
        initial=run.step,
        desc="train",
        disable=not acc.is_main_process,
        dynamic_ncols=True,
    )
    window = torch.zeros(1 + 2 * K, device=acc.device)  # loss, top1 [K], top5 [K] summed over micro-batches
    window_n = 0
    grad_norm = None
    t0, last_logged = time.time(), run.step
    while run.step < run.total_steps:
        run.train_dl.set_epoch(run.epoch)
        batches = (
            acc.skip_first_batches(run.train_dl, run.batches_in_epoch)
            if run.batches_in_epoch
            else run.train_dl
        )
        for batch in batches:
            with acc.accumulate(run.heads):
                loss, m = medusa_loss(
                    head_logits(run, batch), batch["input_ids"], batch["loss_mask"], tcfg.decay
                )
                acc.backward(loss)
                if acc.sync_gradients and tcfg.grad_clip > 0:
                    grad_norm = acc.clip_grad_norm_(run.heads.parameters(), tcfg.grad_clip)
                run.optimizer.step()
                run.optimizer.zero_grad(set_to_none=True)
            run.batches_in_epoch += 1
            window += torch.cat([loss.detach().float().view(1), m["top1"], m["top5"]]).to(window.device)
            window_n += 1
            if not acc.sync_gradients:
                continue
            run.scheduler.step()
            run.step += 1
            bar.update(1)

            if run.step % tcfg.log_every == 0 or run.step == run.total_steps:
                avg = acc.reduce(window / window_n, reduction="mean").cpu()  # every process calls reduce
                metrics = {
                    "train/loss": avg[0].item(),
                    "train/lr": run.scheduler.get_last_lr()[0],
                    "train/epoch": run.epoch,
                }
                metrics |= {f"train/head{k}_top1": avg[1 + k].item() for k in range(K)}
                if grad_norm is not None:
                    metrics["train/grad_norm"] = float(grad_norm)
                metrics["train/steps_per_s"] = (run.step - last_logged) / max(time.time() - t0, 1e-9)
                t0, last_logged = time.time(), run.step
                log(run, metrics)
                bar.set_postfix(loss=f"{metrics['train/loss']:.3f}", lr=f"{metrics['train/lr']:.2e}")
                window.zero_()
                window_n = 0
            if tcfg.eval_every and run.step % tcfg.eval_every == 0 and run.step < run.total_steps:
                run_eval(run)
            if tcfg.save_every and run.step % tcfg.save_every == 0:
                save_checkpoint(run)
            if run.step >= run.total_steps:
                break
        else:  # the epoch ran out
            run.epoch += 1
            run.batches_in_epoch = 0
    bar.close()


# ---------------------------------------------------------------------------------------------- save


def accuracy_table(ev: dict[str, Any]) -> str:
    lines = ["head  predicts   loss    top-1   top-5   positions"]
    for k, (loss, t1, t5, n) in enumerate(
        zip(ev["head_loss"], ev["top1"], ev["top5"], ev["count"], strict=True)
    ):
        lines.append(f"{k:>4}  t+{k + 2:<7}  {loss:6.3f}  {100 * t1:5.1f}%  {100 * t5:5.1f}%  {n:>9}")
    return "\n".join(lines)


def save_final(run: Run, ev: dict[str, Any] | None) -> None:
    """Write the heads (full weights, gathered under ZeRO-3) with the run config and final metrics."""
    from heads.base import REGISTRY, save_heads

    acc = run.accelerator
    acc.wait_for_everyone()
    state = acc.get_state_dict(run.heads)  # every process (ZeRO-3 gathers the shards)
    if acc.is_main_process:
        heads = REGISTRY[run.head_config.head_type][1](run.head_config)
        heads.load_state_dict(state)
        extra = {"train_config.yaml": to_yaml(run.cfg)}
        if ev is not None:
            extra["eval_results.json"] = json.dumps({"step": run.step, **ev}, indent=2) + "\n"
        save_heads(heads, run.cfg.output_dir, extra_files=extra)
    acc.wait_for_everyone()


def start(cfg: RunConfig) -> Run:
    """Everything that can fail because of the user's input: setup, trackers, resume."""
    run = setup(cfg)
    os.makedirs(run.cfg.output_dir, exist_ok=True)
    if run.cfg.report_to == "wandb":
        run.accelerator.init_trackers(
            run.cfg.wandb_project, config=to_dict(run.cfg), init_kwargs={"wandb": {"name": run.cfg.run_name}}
        )
    maybe_resume(run)
    return run


def finish(run: Run) -> dict[str, Any] | None:
    """fit -> validate -> save. Returns the final held-out metrics (None without eval data)."""
    fit(run)
    ev = run_eval(run) if len(run.eval_dl) else None
    save_final(run, ev)
    if ev is not None:
        run.print(
            f"\nheld-out accuracy after {run.step} steps (saved to {run.cfg.output_dir}):\n{accuracy_table(ev)}"
        )
    run.accelerator.end_training()
    return ev


def train(cfg: RunConfig) -> dict[str, Any] | None:
    """setup -> (resume) -> fit -> validate -> save."""
    return finish(start(cfg))


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
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.lr=1e-3 output_dir=out/x")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv)
    overrides = list(args.overrides) + (["resume=auto"] if args.resume else [])
    from train.data import DataError

    # Input problems (config, target path, data, checkpoint) end in one line; set SELFSPEC_DEBUG=1 for the
    # traceback. Errors during training itself are bugs and keep theirs.
    try:
        run = start(load_config(args.config, overrides))
    except (DataError, *INPUT_ERRORS) as e:
        if os.environ.get("SELFSPEC_DEBUG"):
            raise
        if int(os.environ.get("RANK", 0)) != 0:
            raise SystemExit(1) from None  # the main process reports it
        raise SystemExit(
            "error: " + " ".join(str(e).split())
        ) from None  # one line, whatever the library wrote
    return finish(run)


if __name__ == "__main__":
    main()
