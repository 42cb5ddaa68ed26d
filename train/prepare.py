"""Setup of a training run: everything that is built and checked before the first step.

The target is frozen and stays outside accelerate/DeepSpeed: it is moved to the device and run under
``torch.no_grad()`` (`train.objective.target_forward`); only the heads, their optimizer and the
dataloaders are prepared. `setup` reads the inputs (main process first: demo assets and the datasets
cache are built once), loads the target, builds the heads from the head type's registry entry, and
makes the dataloaders, the optimizer and the LR schedule.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any

import torch
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader
from transformers import AutoConfig, AutoTokenizer, get_cosine_schedule_with_warmup

from heads import registry
from heads.base import ADAPTER_DIR
from heads.eagle3 import build_vocab_map
from heads.graft import load_target, looks_local, num_layers
from heads.hub import resolve_token
from heads.vocab import label_counts
from infer.prompts import load_prompts
from train import checkpoint as ckpt
from train import data as train_data  # called through the module: tests replace build_datasets
from train.config import RunConfig, resolve_demo
from train.features import FeatureShards, collate_features
from train.medusa2 import JointModel, add_lora, check_joint, drop_frozen_weights
from train.run import Run, deepspeed_plugin, main_process_first, make_accelerator, outside_zero3_init


def check_context_length(cfg: RunConfig) -> None:
    """``data.max_length`` against the target's context, from its config.json alone (before any row is
    tokenized or a weight loaded)."""
    name = os.path.expanduser(cfg.target.name_or_path)
    try:
        text_cfg = AutoConfig.from_pretrained(name, revision=cfg.target.revision).get_text_config()
    except (OSError, ValueError) as e:
        raise OSError(f"could not read the config of {cfg.target.name_or_path!r}: {e}") from e
    max_pos = getattr(text_cfg, "max_position_embeddings", None)
    if max_pos is not None and cfg.data.max_length > max_pos:
        raise ValueError(
            f"data.max_length={cfg.data.max_length} exceeds the target's max_position_embeddings={max_pos}"
        )


def load_inputs(cfg: RunConfig, is_main: bool):
    """``(resolved cfg, tokenizer, train_ds, eval_ds)``: demo names resolved (built on first use), the target
    directory, context and tokenizer checked, every data row tokenized (`train.data.build_datasets`)."""
    if cfg.push_to_hub and is_main:
        resolve_token(None, cfg.hub_model_id)  # no token: fail now, not after hours of training
    resolved = resolve_demo(cfg)
    name = resolved.target.name_or_path
    if looks_local(name) and not os.path.isdir(os.path.expanduser(name)):
        raise FileNotFoundError(f"target model directory not found: {name!r}")
    check_context_length(resolved)
    try:
        tok = AutoTokenizer.from_pretrained(os.path.expanduser(name), revision=resolved.target.revision)
    except OSError as e:
        raise OSError(f"could not load the tokenizer of {name!r}: {e}") from e
    return resolved, tok, *train_data.build_datasets(resolved.data, tok, seed=cfg.train.seed)


def install_vocab_map(heads: nn.Module, train_ds, print_fn=print) -> None:
    """Heads with their own draft vocabulary (a ``set_vocab_map`` method and a ``draft_vocab_size``, as
    EAGLE-3's): the draft vocab = the ``draft_vocab_size`` most frequent training labels (loss_mask == 1)."""
    V = heads.config.vocab_size
    counts = label_counts(train_ds, V)
    d2t, t2d = build_vocab_map(counts, heads.config.draft_vocab_size)
    heads.set_vocab_map(d2t.to(heads.d2t.device), t2d.to(heads.t2d.device))
    covered = counts[t2d].sum().item() / max(counts.sum().item(), 1)
    print_fn(
        f"draft vocab: {d2t.numel()} of {V} target tokens, covering {100 * covered:.1f}% of training labels"
    )


def build_heads(cfg: RunConfig, target: nn.Module, token_ds, accelerator, plugin) -> nn.Module:
    """Fresh heads of ``cfg.heads.type`` for ``target`` (float32), fitted to the data's vocabulary where they
    draft from their own; with ``joint.enabled`` the LoRA-adapted target and the heads as one `JointModel`."""
    heads = registry.get(cfg.heads.type).module.for_target(target, **cfg.heads.head_kwargs()).float()
    heads.config.record_target(target)  # its adapter, architecture and fingerprint: heads fit only it
    if hasattr(heads, "set_vocab_map") and getattr(heads.config, "draft_vocab_size", None) is not None:
        # Every process counts the same dataset (cheap and deterministic), so all get the same map.
        install_vocab_map(heads, token_ds, accelerator.print)
    if getattr(heads.config, "lm_head_init", "random") == "target":
        heads.init_lm_head_from(target)  # after the vocabulary map: row i is draft token i's target row
    if cfg.joint.enabled:  # Medusa-2: LoRA on the backbone, trained with the heads as one module
        backbone = add_lora(target, cfg.joint, cfg.target.name_or_path)
        heads.config.target_adapter = ADAPTER_DIR  # saved beside the heads (`train.medusa2.save_adapter`)
        heads = JointModel(backbone, heads)
        if plugin is None:
            accelerator.register_save_state_pre_hook(drop_frozen_weights)
    return heads


def check_feature_vocab(feature_ds: FeatureShards, heads: nn.Module, directory: str) -> None:
    """Offline logits kept for a draft vocabulary (``logit_columns``) must be the columns these heads read."""
    kept = feature_ds.meta.get("logit_columns")
    if kept is None:
        return
    t2d = getattr(heads, "t2d", None)
    if t2d is None or t2d.nonzero().view(-1).tolist() != kept:
        raise ValueError(
            f"{directory} keeps the target's logits for another draft vocabulary than these heads' "
            "(data or heads settings differ): dump the features again with this config"
        )


def make_dataloaders(cfg: RunConfig, train_ds, eval_ds, pad_id: int, features: bool):
    tcfg = cfg.train
    train_dl = DataLoader(
        train_ds,
        batch_size=tcfg.batch_size,
        shuffle=True,
        collate_fn=functools.partial(
            collate_features if features else train_data.collate, pad_token_id=pad_id
        ),
        num_workers=tcfg.num_workers,
    )
    eval_dl = DataLoader(
        eval_ds,
        batch_size=tcfg.eval_batch_size or tcfg.batch_size,
        shuffle=False,
        collate_fn=functools.partial(train_data.collate, pad_token_id=pad_id),
        num_workers=tcfg.num_workers,
    )
    return train_dl, eval_dl


def make_optimizer(cfg: RunConfig, heads: nn.Module, trainable: list, accelerator, plugin):
    """AdamW over the trainable parameters (Medusa-2: the heads at ``joint.head_lr_multiplier`` x the LoRA's
    lr); under DeepSpeed, ``train.grad_clip`` goes into its config (it clips itself)."""
    tcfg = cfg.train
    groups: list[dict[str, Any]] = [{"params": trainable}]
    if cfg.joint.enabled:
        mine = {id(p) for p in heads.heads.parameters()}
        groups = [
            {"params": [p for p in trainable if id(p) not in mine], "lr": tcfg.lr},
            {"params": [p for p in trainable if id(p) in mine], "lr": tcfg.lr * cfg.joint.head_lr_multiplier},
        ]
    adamw = torch.optim.AdamW(groups, lr=tcfg.lr, betas=tuple(tcfg.betas), weight_decay=tcfg.weight_decay)
    if plugin is not None:
        ds = plugin.deepspeed_config
        if ds.get("gradient_clipping", "auto") == "auto":
            ds["gradient_clipping"] = tcfg.grad_clip
        elif float(ds["gradient_clipping"]) != tcfg.grad_clip:
            accelerator.print(
                f"note: DeepSpeed config sets gradient_clipping={ds['gradient_clipping']} (train.grad_clip ignored)"
            )
    return adamw


def _load_frozen_target(cfg: RunConfig, tokenizer, accelerator) -> nn.Module:
    target = load_target(
        cfg.target.name_or_path,
        revision=cfg.target.revision,
        dtype=cfg.target.dtype,
        device=accelerator.device,
        attn_implementation=cfg.target.attn_implementation,
        adapter=cfg.target.adapter,
        adapter_revision=cfg.target.adapter_revision,
        merge=cfg.target.merge,
    )
    rows = target.get_output_embeddings().weight.shape[0]
    if len(tokenizer) > rows:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the target's lm_head only {rows}")
    return target


def _describe(run: Run, n_heads: int, n_train: int, n_eval: int, plugin) -> str:
    """One line: target, heads, data, processes and batch layout, steps, precision."""
    cfg, tcfg, acc = run.cfg, run.cfg.train, run.accelerator
    n_target = sum(p.numel() for p in run.target.parameters())
    return (
        f"target {cfg.target.name_or_path} ({n_target / 1e6:.1f}M params, {num_layers(run.target)} layers, "
        f"{next(run.target.parameters()).dtype}) | {cfg.heads.type} heads {n_heads / 1e6:.2f}M trainable params"
        + (f" (+ LoRA r={cfg.joint.lora_r}, Medusa-2) | " if cfg.joint.enabled else " | ")
        + f"data {n_train} train / {n_eval} eval sequences | "
        f"{acc.num_processes} process(es) x batch {tcfg.batch_size} x accum {tcfg.grad_accum} | "
        f"{run.total_steps} steps ({run.steps_per_epoch}/epoch) | precision {acc.mixed_precision}"
        + (f" | DeepSpeed ZeRO-{plugin.zero_stage}" if plugin is not None else "")
    )


def _tau_prompts(cfg: RunConfig, tokenizer) -> list | None:
    """`eval.measured_tau_prompts_file` (demo names already resolved) read as the benchmark reads a prompt
    file: rows ``skip .. skip + measured_tau_prompts - 1``, whole text rows, chat rows up to the generation
    prompt. None when the eval rows give the prompts (no file, or measured τ off)."""
    ev = cfg.eval
    if ev.measured_tau_prompts_file is None or ev.measured_tau_prompts == 0:
        return None
    return load_prompts(
        os.path.expanduser(ev.measured_tau_prompts_file), tokenizer, ev.measured_tau_prompts,
        max_tokens=None, skip=ev.measured_tau_prompts_skip, need_answer=False,
    )  # fmt: skip


def setup(cfg: RunConfig, features: str | None = None, accelerator=None) -> Run:
    """Build and check everything before the first step: target, tokenizer, data, heads, optimizer.
    ``features``: a `train.features.dump` directory to train from. ``accelerator``: the one
    `train.train_heads.start` made (None = make one)."""
    accelerator = accelerator or make_accelerator(cfg)
    set_seed(cfg.train.seed)
    plugin = deepspeed_plugin(accelerator)
    if cfg.joint.enabled:
        check_joint(cfg, plugin)
    feature_ds = (
        FeatureShards(features, cfg.heads.type) if features is not None else None
    )  # cheap checks first
    cfg, tokenizer, token_ds, eval_ds = main_process_first(
        accelerator, lambda: load_inputs(cfg, accelerator.is_main_process)
    )
    tau_prompts = _tau_prompts(cfg, tokenizer)  # a bad prompt file fails here, before the target loads
    train_ds = token_ds if feature_ds is None else feature_ds  # token_ds: EAGLE-3 counts its vocab on it
    if len(train_ds) != len(token_ds):
        raise ValueError(
            f"{features} holds {len(train_ds)} rows but the config's training set has {len(token_ds)}: "
            "dump the features with the same data settings"
        )
    if len(train_ds) == 0:
        raise ValueError(f"no training examples in {cfg.data.path!r}")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)

    # The target stays frozen, whole and outside DeepSpeed: never build it (or the heads) under zero.Init.
    with outside_zero3_init(plugin):
        target = _load_frozen_target(cfg, tokenizer, accelerator)
        heads = build_heads(cfg, target, token_ds, accelerator, plugin)
    if feature_ds is not None:
        check_feature_vocab(feature_ds, heads, features)
    if cfg.joint.enabled:
        target = heads.backbone
    trainable = [p for p in heads.parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("these heads have no trainable parameter (num_layers=0 with lm_head=target?)")
    heads.train()
    train_dl, eval_dl = make_dataloaders(cfg, train_ds, eval_ds, pad_id, features is not None)
    adamw = make_optimizer(cfg, heads, trainable, accelerator, plugin)
    heads, optimizer, train_dl, eval_dl = accelerator.prepare(heads, adamw, train_dl, eval_dl)
    if plugin is not None:  # DeepSpeed reads its checkpoint shards with an unrestricted unpickler
        ckpt.safe_deepspeed_loads(heads)

    # Steps come from the per-process dataloader length (after sharding across processes).
    steps_per_epoch = math.ceil(len(train_dl) / cfg.train.grad_accum)
    total_steps = cfg.train.max_steps if cfg.train.max_steps > 0 else cfg.train.num_epochs * steps_per_epoch
    # The scheduler drives the AdamW above (DeepSpeed's ZeRO optimizer wraps that same object and reads its
    # param_groups' lr). It is stepped by hand once per optimizer step (not prepared: accelerate would step it
    # num_processes times) and saved by `train.state.save_checkpoint` as JSON (not registered with
    # accelerate, which would pickle it and unpickle it with code on resume).
    warmup = round(cfg.train.warmup_ratio * total_steps)
    run = Run(
        cfg=cfg, accelerator=accelerator, target=target, lm_head=target.get_output_embeddings(), heads=heads,
        head_config=accelerator.unwrap_model(heads).config, optimizer=optimizer,
        scheduler=get_cosine_schedule_with_warmup(adamw, warmup, total_steps), train_dl=train_dl,
        eval_dl=eval_dl, steps_per_epoch=steps_per_epoch, total_steps=total_steps,
        tau_prompts=tau_prompts,
    )  # fmt: skip
    run.print(_describe(run, sum(p.numel() for p in trainable), len(train_ds), len(eval_ds), plugin))
    return run
