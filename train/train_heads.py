"""Train draft heads on a frozen target LM: setup -> fit -> validate -> save.

    python train/train_heads.py --config configs/demo-medusa.yaml [key=value ...] [--resume]
    python train/train_heads.py --config configs/demo-eagle3.yaml --features DIR   # offline features
    accelerate launch --config_file configs/accelerate/deepspeed_zero2.yaml train/train_heads.py \
        --config configs/demo-medusa.yaml
    # on CPU add: DS_ACCELERATOR=cpu ... accelerate launch ... --num_processes 2

The target is frozen and stays outside accelerate/DeepSpeed: it is moved to the device and run under
``torch.no_grad()`` to get its last post-norm hidden state (EAGLE-3: three layer inputs and all logits);
only the heads, their optimizer and the dataloaders are prepared. The config's ``heads.type`` (medusa,
eagle, eagle3) picks the loss (`batch_loss`); everything else is shared. With ``--features DIR``
(written by ``scripts/dump_features.py``) the training batches carry those target outputs and the
target only runs for the held-out eval (it still provides the embedding and lm_head). One optimizer
step = ``train.grad_accum`` micro-batches of ``train.batch_size`` sequences on each process.

Medusa-2 (``joint.enabled``, configs/demo-medusa2.yaml) instead trains a LoRA adapter on the target (peft)
with the heads: both are prepared as one `JointModel` (ZeRO-2 at most), the base weights stay frozen,
and checkpoints hold only the trainable tensors (LoRA + heads). See `joint_batch_loss`.

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
import contextlib
import functools
import inspect
import json
import math
import os
import pickle
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

from heads import registry
from heads.base import ADAPTER_DIR  # the LoRA's subdirectory next to Medusa-2 heads (output_dir, best/)
from heads.medusa import medusa_loss
from heads.registry import LossInputs
from train import checkpoint as ckpt
from train.checkpoint import CHECKPOINTS, SCHEDULER_FILE, STATE_FILE, latest_checkpoint  # noqa: F401 (API)
from train.config import RunConfig, load_config, resolve_demo, to_dict, to_yaml
from train.evaluate import accuracy_table, eval_metrics, evaluate, measure_tau  # noqa: F401 (API)
from train.losses import simulated_accept_length

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
    # The best τ seen in eval (measured, else simulated: `run_eval`) and its step: `save_final` keeps those.
    best_accept_length: float = -math.inf
    best_step: int | None = None
    last_eval: dict[str, Any] | None = None  # the latest eval and its step (cards of pushed checkpoints)
    # The run's identity: the config as given (demo names unresolved) less the keys a resume may change
    # (`train.checkpoint.flat_config`); every checkpoint carries it. None = computed from ``cfg``.
    config_flat: dict[str, Any] | None = None

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    def print(self, *args) -> None:
        if self.is_main:
            from tqdm.auto import tqdm

            tqdm.write(" ".join(str(a) for a in args))


# ---------------------------------------------------------------------------------------------- setup


def make_accelerator(cfg: RunConfig):
    """An Accelerator with gloo on CPU (docs/design.md §3), seeded data order and the configured precision."""
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


def main_process_first(accelerator, fn, main_only: bool = False):
    """``fn()`` on the main process, then on the others (``main_only``: the others get its result, which
    must be picklable). If it fails on the main process with an input error, every process raises it
    (instead of the others dying at a barrier with a gloo traceback)."""
    from accelerate.utils import broadcast_object_list

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
    from transformers.integrations import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        plugin.set_deepspeed_weakref()


def check_context_length(cfg: RunConfig) -> None:
    """``data.max_length`` against the target's context, from its config.json alone (before any row is
    tokenized or a weight loaded)."""
    from transformers import AutoConfig

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


def setup(cfg: RunConfig, features: str | None = None, accelerator=None) -> Run:
    """Build and check everything before the first step: target, tokenizer, data, heads, optimizer.
    ``accelerator``: the one `start` made (None = make one)."""
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader
    from transformers import AutoTokenizer, get_cosine_schedule_with_warmup

    from heads.graft import load_target, looks_local, num_layers
    from heads.registry import REGISTRY
    from train.data import build_datasets, collate

    accelerator = accelerator or make_accelerator(cfg)
    set_seed(cfg.train.seed)
    plugin = _deepspeed_plugin(accelerator)
    tcfg = cfg.train
    if cfg.joint.enabled:
        check_joint(cfg, plugin)

    # Demo assets and the datasets cache are built by the main process first; the others then load them.
    def load_inputs():
        if cfg.push_to_hub and accelerator.is_main_process:
            from heads.hub import resolve_token

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
        return resolved, tok, *build_datasets(resolved.data, tok, seed=tcfg.seed)

    feature_ds = (
        FeatureShards(features, cfg.heads.type) if features is not None else None
    )  # cheap checks first
    cfg, tokenizer, train_ds, eval_ds = main_process_first(accelerator, load_inputs)
    token_ds = train_ds  # tokenized rows (EAGLE-3 counts its draft vocab on them)
    if feature_ds is not None:
        train_ds = feature_ds
        if len(train_ds) != len(token_ds):
            raise ValueError(
                f"{features} holds {len(train_ds)} rows but the config's training set has {len(token_ds)}: "
                "dump the features with the same data settings"
            )
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
            adapter=cfg.target.adapter,
            adapter_revision=cfg.target.adapter_revision,
            merge=cfg.target.merge,
        )
        if len(tokenizer) > target.get_output_embeddings().weight.shape[0]:
            raise ValueError(
                f"the tokenizer has {len(tokenizer)} tokens but the target's lm_head only {target.get_output_embeddings().weight.shape[0]}"
            )
        module_cls = REGISTRY[cfg.heads.type].module
        heads = module_cls.for_target(target, **cfg.heads.head_kwargs()).float()
        heads.config.record_target(target)  # its adapter, architecture and fingerprint: heads fit only it
    if cfg.heads.type == "eagle3" and heads.config.draft_vocab_size is not None:
        # Every process counts the same dataset (cheap and deterministic), so all get the same map.
        install_vocab_map(heads, token_ds, accelerator.print)
    if cfg.joint.enabled:  # Medusa-2: LoRA on the backbone, trained with the heads as one module
        target = add_lora(target, cfg.joint, name)
        heads.config.target_adapter = ADAPTER_DIR  # saved beside the heads (`save_adapter`)
        heads = JointModel(target, heads)
        if plugin is None:
            accelerator.register_save_state_pre_hook(_drop_frozen_weights)
    trainable = [p for p in heads.parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("these heads have no trainable parameter (num_layers=0 with lm_head=target?)")
    heads.train()

    train_dl = DataLoader(
        train_ds,
        batch_size=tcfg.batch_size,
        shuffle=True,
        collate_fn=functools.partial(collate if features is None else collate_features, pad_token_id=pad_id),
        num_workers=tcfg.num_workers,
    )
    eval_dl = DataLoader(
        eval_ds,
        batch_size=tcfg.eval_batch_size or tcfg.batch_size,
        shuffle=False,
        collate_fn=functools.partial(collate, pad_token_id=pad_id),
        num_workers=tcfg.num_workers,
    )
    groups: list[dict[str, Any]] = [{"params": trainable}]
    if cfg.joint.enabled:  # the heads learn joint.head_lr_multiplier x faster than the LoRA weights
        mine = {id(p) for p in heads.heads.parameters()}
        groups = [
            {"params": [p for p in trainable if id(p) not in mine], "lr": tcfg.lr},
            {"params": [p for p in trainable if id(p) in mine], "lr": tcfg.lr * cfg.joint.head_lr_multiplier},
        ]
    adamw = torch.optim.AdamW(groups, lr=tcfg.lr, betas=tuple(tcfg.betas), weight_decay=tcfg.weight_decay)
    if plugin is not None:  # DeepSpeed clips itself, from its config
        ds = plugin.deepspeed_config
        if ds.get("gradient_clipping", "auto") == "auto":
            ds["gradient_clipping"] = tcfg.grad_clip
        elif float(ds["gradient_clipping"]) != tcfg.grad_clip:
            accelerator.print(
                f"note: DeepSpeed config sets gradient_clipping={ds['gradient_clipping']} (train.grad_clip ignored)"
            )
    heads, optimizer, train_dl, eval_dl = accelerator.prepare(heads, adamw, train_dl, eval_dl)
    if (
        plugin is not None
    ):  # DeepSpeed reads its checkpoint shards with an unrestricted unpickler (weights_only off)
        ckpt.safe_deepspeed_loads(heads)

    # Steps come from the per-process dataloader length (after sharding across processes).
    steps_per_epoch = math.ceil(len(train_dl) / tcfg.grad_accum)
    total_steps = tcfg.max_steps if tcfg.max_steps > 0 else tcfg.num_epochs * steps_per_epoch
    # The scheduler drives the AdamW created above (DeepSpeed's ZeRO optimizer wraps that same object and
    # reads its param_groups' lr). It is stepped by hand once per optimizer step (not prepared: accelerate
    # would step it num_processes times) and saved by `save_checkpoint` as JSON (not registered with
    # accelerate, which would pickle it and unpickle it with code on resume).
    scheduler = get_cosine_schedule_with_warmup(adamw, round(tcfg.warmup_ratio * total_steps), total_steps)

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
        f"{cfg.heads.type} heads {n_heads / 1e6:.2f}M trainable params"
        + (f" (+ LoRA r={cfg.joint.lora_r}, Medusa-2) | " if cfg.joint.enabled else " | ")
        + f"data {len(train_ds)} train / {len(eval_ds)} eval sequences | "
        f"{accelerator.num_processes} process(es) x batch {tcfg.batch_size} x accum {tcfg.grad_accum} | "
        f"{total_steps} steps ({steps_per_epoch}/epoch) | precision {accelerator.mixed_precision}"
        + (f" | DeepSpeed ZeRO-{plugin.zero_stage}" if plugin is not None else "")
    )
    return run


# ---------------------------------------------------------------------------------------------- model step
#
# Everything that depends on the head type is here: how many draft positions K it scores (Medusa head k,
# EAGLE-3 TTT step k; EAGLE-1/2 has one), their loss weights, the target forward it needs, and
# `batch_loss`. The loop, evaluation, checkpoints and logging only see ``(loss, metrics)``.


def install_vocab_map(heads: nn.Module, train_ds, print_fn=print) -> None:
    """EAGLE-3: the draft vocab = the ``draft_vocab_size`` most frequent training labels (loss_mask == 1)."""
    from heads.eagle3 import build_vocab_map

    V = heads.config.vocab_size
    counts = torch.zeros(V, dtype=torch.long)
    for i in range(len(train_ds)):
        row = train_ds[i]
        ids = torch.as_tensor(row["input_ids"], dtype=torch.long)
        counts += torch.bincount(ids[torch.as_tensor(row["loss_mask"]).bool()], minlength=V)[:V]
    d2t, t2d = build_vocab_map(counts, heads.config.draft_vocab_size)
    heads.set_vocab_map(d2t.to(heads.d2t.device), t2d.to(heads.t2d.device))
    covered = counts[t2d].sum().item() / max(counts.sum().item(), 1)
    print_fn(
        f"draft vocab: {d2t.numel()} of {V} target tokens, covering {100 * covered:.1f}% of training labels"
    )


def num_positions(cfg: Any) -> int:
    """K, the draft positions scored per pair (the head type's `heads.registry.Objective.positions`)."""
    return registry.get(cfg.head_type).objective.positions(cfg)


def position_weights(run: Run) -> list[float]:
    """Weight of each position's loss in the total (what `batch_loss` sums)."""
    cfg = run.head_config
    return registry.get(cfg.head_type).objective.weights(cfg, run.cfg.train.decay)


def position_name(run: Run) -> str:
    return registry.get(run.head_config.head_type).objective.position_name


def target_forward(run: Run, batch: dict[str, Tensor]):
    """The frozen target over the batch (no grad): `heads.graft.TargetOutput`. EAGLE-3 reads its aux layers
    and all its logits; the others only the last hidden state, so the target skips the full logits.
    A batch of offline features (`collate_features`) already carries them."""
    from heads.graft import TargetOutput, run_target, unwrap_peft

    if "hidden" in batch or "aux" in batch:
        aux = tuple(batch["aux"].chunk(3, dim=-1)) if "aux" in batch else ()
        return TargetOutput(logits=batch.get("logits"), hidden=batch.get("hidden"), aux=aux)

    kwargs: dict[str, Any] = {"use_cache": False}
    kwargs |= registry.get(run.head_config.head_type).objective.target_kwargs(run.head_config)
    all_logits = kwargs.pop("all_logits", False)
    if not all_logits and "logits_to_keep" in inspect.signature(unwrap_peft(run.target).forward).parameters:
        kwargs["logits_to_keep"] = 1  # a PeftModel's forward is (*args, **kwargs): ask the model inside
    with torch.no_grad():
        return run_target(run.target, batch["input_ids"], batch["attention_mask"], **kwargs)


def batch_loss(run: Run, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
    """Target forward + heads + loss for one batch.

    Returns ``(loss, metrics)``: ``loss`` a scalar with gradient; ``metrics`` detached [K] tensors, one
    entry per draft position: ``count`` (scored positions) and averages over them: ``loss`` (that
    position's loss, unweighted), ``top1`` (+ ``top5`` for Medusa, ``loss_reg``/``loss_cls`` for EAGLE).
    """
    if run.cfg.joint.enabled:
        return joint_batch_loss(run, batch)
    out = target_forward(run, batch)
    inputs = LossInputs(
        lm_head=run.lm_head, embed=run.target.get_input_embeddings(), decay=run.cfg.train.decay
    )
    return registry.get(run.head_config.head_type).objective.loss(run.heads, out, batch, inputs)


# ---------------------------------------------------------------------------------------------- Medusa-2
#
# Joint training (``joint.enabled``): LoRA on the backbone through peft plus the Medusa heads, prepared as
# one module (`JointModel`) so accelerate/DeepSpeed clip, step and checkpoint both; the base weights stay
# frozen. The outputs are the heads (with ``target_adapter: adapter``) and ``adapter/`` (PEFT files).


class JointModel(nn.Module):
    """The LoRA-adapted backbone (a peft ``PeftModel``) and the Medusa heads as one trainable module.

    ``config`` is the heads' config, so code that reads ``unwrap_model(run.heads).config`` works as for
    heads alone.
    """

    def __init__(self, backbone: nn.Module, heads: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.heads = heads

    @property
    def config(self):
        return self.heads.config

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, *, teacher: bool = False, backbone_grad: bool = True
    ) -> dict[str, Tensor | None]:
        """input_ids, attention_mask: [B, T] -> ``logits`` [B, T, V] of the adapted backbone (only the last
        position's without ``backbone_grad``, the heads-only stage), ``head_logits`` [K, B, T, V] read off its
        last post-norm state, and with ``teacher`` the original model's ``teacher_logits`` [B, T, V]
        (the same backbone under ``disable_adapter()``, no grad), else None."""
        from heads.graft import run_target

        teacher_logits = None
        if teacher:
            with torch.no_grad(), self.backbone.disable_adapter():
                teacher_logits = run_target(self.backbone, input_ids, attention_mask, use_cache=False).logits
        kwargs = {} if backbone_grad else {"logits_to_keep": 1}
        with torch.set_grad_enabled(backbone_grad and torch.is_grad_enabled()):
            out = run_target(self.backbone, input_ids, attention_mask, use_cache=False, **kwargs)
        dtype = next(self.heads.parameters()).dtype
        head_logits = self.heads(out.hidden.to(dtype), self.backbone.get_output_embeddings())
        return {"logits": out.logits, "head_logits": head_logits, "teacher_logits": teacher_logits}


def add_lora(target: nn.Module, cfg: Any, name: str = "target") -> nn.Module:
    """``peft.get_peft_model(target, LoraConfig(...))`` from the ``joint`` config, after checking that every
    ``target_modules`` entry names a module of ``target`` (peft skips missing ones when others match).
    LoRA weights are kept in fp32 on a bf16/fp16 backbone (peft's ``autocast_adapter_dtype``); only they
    are trainable, B = 0 at init so the adapted model starts equal to the original."""
    from peft import LoraConfig, get_peft_model

    names = [n for n, _ in target.named_modules() if n]
    missing = [t for t in cfg.target_modules if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in target.named_modules() if isinstance(m, nn.Linear)})
        raise ValueError(
            f"joint.target_modules {missing} match no module of {name!r}; its linear layers are named "
            f"{linear[:12]}"
        )
    lora = LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(target, lora)


def check_joint(cfg: RunConfig, plugin) -> None:
    """Refuse the joint setups this trainer does not support, before anything is loaded."""
    if plugin is not None and plugin.zero_stage == 3:
        raise ValueError(
            "joint training (joint.enabled) is not supported under DeepSpeed ZeRO-3 (untested: the LoRA "
            "backbone would be partitioned and its adapter would have to be gathered to save); use ZeRO-2"
        )
    if getattr(cfg.target, "adapter", None):
        raise ValueError(
            f"joint training adds its own LoRA adapter, but target.adapter is {cfg.target.adapter!r}: "
            "merge that adapter into a model directory first (peft merge_and_unload), or train heads for "
            "it with joint.enabled: false"
        )


def joint_batch_loss(run: Run, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
    """`batch_loss` for Medusa-2: L_backbone + heads_coef(step) · Σ_k decay**k · L_k (`medusa2_loss`).

    The first ``joint.heads_only_steps`` steps train the heads alone. Under ``torch.no_grad()`` (eval) the
    original model always runs too, and the metrics carry the backbone's sums (``backbone_count``,
    ``backbone_ce_sum``, ``backbone_kl_sum``) for the held-out KL(p_original ‖ p_adapted) per token.
    """
    from train.losses import backbone_stats, medusa2_loss

    jc = run.cfg.joint
    ids, am, lm = batch["input_ids"], batch["attention_mask"], batch["loss_mask"]
    training = torch.is_grad_enabled()
    heads_only = training and run.step < jc.heads_only_steps
    teacher = not training or (jc.self_distill and not heads_only)
    out = run.heads(ids, am, teacher=teacher, backbone_grad=not heads_only)
    heads_loss, m = medusa_loss(out["head_logits"], ids, lm, run.cfg.train.decay)
    if heads_only:
        return medusa2_loss(None, heads_loss, 1.0), m
    bb = backbone_stats(out["logits"], ids, lm, out["teacher_logits"])
    term = bb["kl_sum"] if jc.self_distill else bb["ce_sum"]
    loss = medusa2_loss(term / bb["count"].clamp(min=1), heads_loss, jc.heads_coef_at(run.step))
    if not training:
        m = m | {f"backbone_{k}": v.detach() for k, v in bb.items()}
    return loss, m


def save_adapter(run: Run, directory: str) -> None:
    """Main process: the LoRA adapter's standard PEFT files (``adapter_config.json`` +
    ``adapter_model.safetensors``, no base weights) into ``directory``, written beside it and renamed."""
    backbone = run.accelerator.unwrap_model(run.heads).backbone
    tmp = os.path.join(os.path.dirname(os.path.abspath(directory)), f".tmp-{os.path.basename(directory)}")
    shutil.rmtree(tmp, ignore_errors=True)
    backbone.save_pretrained(tmp)
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(tmp, directory)


def _drop_frozen_weights(models, weights, output_dir) -> None:
    """accelerate save_state pre-hook (no DeepSpeed): checkpoint only the trainable tensors (LoRA +
    heads), never the frozen backbone; `load_checkpoint` loads them with strict=False."""
    for i, model in enumerate(models):
        keep = {n for n, p in model.named_parameters() if p.requires_grad}
        weights[i] = {k: v for k, v in weights[i].items() if k in keep}


def _state_kwargs(run: Run, load: bool) -> dict[str, Any]:
    """Extra save_state/load_state arguments: joint checkpoints hold the trainable weights only."""
    if not run.cfg.joint.enabled:
        return {}
    if _deepspeed_plugin(run.accelerator) is not None:
        return {"load_module_strict": False} if load else {"exclude_frozen_parameters": True}
    return {"strict": False} if load else {}


class FeatureShards(torch.utils.data.Dataset):
    """The rows of a ``scripts/dump_features.py`` directory: dicts of ``input_ids``/``loss_mask`` [n] and the
    stored target outputs ``hidden`` [n, H] / ``aux`` [n, 3H] / ``logits`` [n, V], read lazily per row."""

    def __init__(self, directory: str, head_type: str) -> None:
        path = os.path.join(directory, "meta.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path} is missing: write the features with scripts/dump_features.py")
        with open(path) as f:
            self.meta = json.load(f)
        if self.meta["head_type"] != head_type:
            raise ValueError(
                f"{directory} holds features for {self.meta['head_type']!r} heads, not {head_type!r}"
            )
        n_shards = math.ceil(self.meta["rows"] / self.meta["shard_size"])
        self.shards = [os.path.join(directory, f"shard-{s:05d}.safetensors") for s in range(n_shards)]
        missing = [p for p in self.shards if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(
                f"{len(missing)} feature shards missing (first {missing[0]}): rerun the dump"
            )

    def __len__(self) -> int:
        return self.meta["rows"]

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        from safetensors import safe_open

        if not 0 <= i < len(self):
            raise IndexError(f"row {i} of {len(self)}")
        s, r = divmod(i, self.meta["shard_size"])
        with safe_open(self.shards[s], framework="pt") as f:
            a, b = f.get_slice("offsets")[r : r + 2].tolist()
            return {k: f.get_slice(k)[a:b] for k in f.keys() if k != "offsets"}


def collate_features(rows: list[dict[str, Tensor]], pad_token_id: int) -> dict[str, Tensor]:
    """`train.data.collate` for `FeatureShards` rows: the same ids and masks, plus the features right-padded
    with zeros to [B, T, ...] (padded positions are never scored nor attended)."""
    from train.data import collate

    batch = collate(rows, pad_token_id=pad_token_id)
    for key in ("hidden", "aux", "logits"):
        if key in rows[0]:
            batch[key] = torch.nn.utils.rnn.pad_sequence([r[key] for r in rows], batch_first=True)
    return batch


# ---------------------------------------------------------------------------------------------- checkpoints


def _state(run: Run) -> dict[str, Any]:
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


def save_checkpoint(run: Run) -> str:
    """``accelerator.save_state`` into ``checkpoints/.tmp-step-N``, add the scheduler (JSON) and
    trainer_state.json, rename to step-N.

    Every process takes part (DeepSpeed writes its shards, each process its RNG state). A crash leaves at
    most a ``.tmp-*`` directory, which is never resumed from. A failed write (disk full, quota) on any
    process removes that directory and raises `train.checkpoint.CheckpointWriteError` on every process;
    the previous checkpoints are untouched. Keeps the newest ``save_total_limit``.
    """
    acc = run.accelerator
    root = os.path.join(run.cfg.output_dir, CHECKPOINTS)
    final = os.path.join(root, f"step-{run.step}")
    tmp = os.path.join(root, f".tmp-step-{run.step}")
    if acc.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(root, exist_ok=True)
    acc.wait_for_everyone()
    error: BaseException | None = None
    try:
        acc.save_state(tmp, **_state_kwargs(run, load=False))
        if acc.is_main_process:
            for name, obj in ((SCHEDULER_FILE, run.scheduler.state_dict()), (STATE_FILE, _state(run))):
                with open(os.path.join(tmp, name), "w") as f:
                    json.dump(obj, f, indent=2)
    except Exception as e:  # OSError, torch's zip writer's RuntimeError, safetensors' SafetensorError, ...
        error = e
    if ckpt.any_process(acc, error is not None):
        full = error is not None and ckpt.is_disk_full(error, root)
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        kept = ckpt.checkpoint_steps(run.cfg.output_dir)
        why = (
            "No space left on device"
            if full
            else (" ".join(str(error).split())[:300] or "failed on another process")
        )
        raise ckpt.CheckpointWriteError(
            f"writing checkpoint {final} failed: {why}; the partial {tmp} was removed"
            + (f", the previous checkpoint {kept[-1][1]} is kept" if kept else "")
            + (": free some space, then resume with --resume" if full else "")
        ) from error
    if acc.is_main_process:
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
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
    ckpt.check_same_run(path, state, _state(run))
    acc = run.accelerator
    main_process_first(acc, lambda: ckpt.verify_checkpoint(path, acc.num_processes), main_only=True)
    try:
        acc.load_state(path, **_state_kwargs(run, load=True))
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


# ---------------------------------------------------------------------------------------------- fit


def log(run: Run, metrics: dict[str, float]) -> None:
    """Send to the trackers (main process only, accelerate handles that) and append to metrics.jsonl."""
    run.accelerator.log(metrics, step=run.step)
    if run.is_main:
        with open(os.path.join(run.cfg.output_dir, METRICS_FILE), "a") as f:
            f.write(json.dumps({"step": run.step, **metrics}) + "\n")


BEST = "best"  # output_dir/best: heads-only copy of the best-τ eval so far (removed when the run ends)


def run_eval(run: Run, final: bool = False) -> dict[str, Any]:
    """Evaluate (`train.evaluate`), log, and keep the heads if their τ is the best so far (ties go to the
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


def fit(run: Run) -> None:
    """The training loop: accumulate micro-batches, clip, step, log, evaluate and checkpoint on schedule."""
    from tqdm.auto import tqdm

    acc, tcfg = run.accelerator, run.cfg.train
    K = num_positions(run.head_config)
    pos = position_name(run)
    has_eval = len(run.eval_dl) > 0
    bar = tqdm(
        total=run.total_steps,
        initial=run.step,
        desc="train",
        disable=not acc.is_main_process,
        dynamic_ncols=True,
    )
    window = torch.zeros(1 + K, device=acc.device)  # loss, top1 [K] summed over micro-batches
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
        for batch in rng_neutral(batches):
            with acc.accumulate(run.heads):
                loss, m = batch_loss(run, batch)
                acc.backward(loss)
                if acc.sync_gradients and tcfg.grad_clip > 0:
                    grad_norm = acc.clip_grad_norm_(run.heads.parameters(), tcfg.grad_clip)
                run.optimizer.step()
                run.optimizer.zero_grad(set_to_none=True)
            run.batches_in_epoch += 1
            window += torch.cat([loss.detach().float().view(1), m["top1"].float()]).to(window.device)
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
                metrics |= {f"train/{pos}{k}_top1": avg[1 + k].item() for k in range(K)}
                metrics["train/sim_accept_length"] = float(simulated_accept_length(avg[1:]))
                if grad_norm is not None:
                    metrics["train/grad_norm"] = float(grad_norm)
                metrics["train/steps_per_s"] = (run.step - last_logged) / max(time.time() - t0, 1e-9)
                t0, last_logged = time.time(), run.step
                log(run, metrics)
                bar.set_postfix(
                    loss=f"{metrics['train/loss']:.3f}",
                    tau=f"{metrics['train/sim_accept_length']:.2f}",
                    lr=f"{metrics['train/lr']:.2e}",
                )
                window.zero_()
                window_n = 0
            if (
                tcfg.eval_every
                and run.step % tcfg.eval_every == 0
                and run.step < run.total_steps
                and has_eval
            ):
                run_eval(run)
            if tcfg.save_every and run.step % tcfg.save_every == 0:
                save_checkpoint(run)
                if run.cfg.push_to_hub and run.cfg.hub_strategy == "every_save":
                    push_checkpoint_heads(run)
            if run.step >= run.total_steps:
                break
        else:  # the epoch ran out
            run.epoch += 1
            run.batches_in_epoch = 0
    bar.close()


# ---------------------------------------------------------------------------------------------- save


def model_card(run: Run, ev: dict[str, Any] | None) -> str:
    """The README.md saved with the heads (`heads.hub.model_card_text`); its usage snippet loads them from
    ``hub_model_id`` when set, else from ``output_dir``."""
    from heads.hub import model_card_text

    return model_card_text(
        run.head_config.to_dict(),
        eval_results=ev,
        train_config=to_dict(run.cfg),
        repo_id=run.cfg.hub_model_id or run.cfg.output_dir,
    )


def push_heads(run: Run, directory: str, message: str, fatal: bool = True) -> None:
    """Upload a saved heads directory to ``hub_model_id`` from the main process; the others wait. A failed
    intermediate push (``fatal=False``) is reported and training goes on; the final one raises."""
    if run.is_main:
        from heads.hub import push_heads_dir

        repo = run.cfg.hub_model_id
        run.print(f"pushing {directory} to the Hugging Face Hub: {repo}")
        try:
            push_heads_dir(
                directory, repo, private=run.cfg.hub_private, commit_message=message, write_card=False
            )
        except Exception as e:
            if not fatal:
                run.print(
                    f"warning: pushing the step-{run.step} heads to {repo!r} failed ({e}); training goes on"
                )
            else:
                raise RuntimeError(
                    f"pushing the heads to {repo!r} failed: {e}. They are saved in {directory}; push them "
                    f"later with `python heads/hub.py push {directory} {repo}`"
                ) from e
    run.accelerator.wait_for_everyone()


HUB_STAGING = ".hub-staging"  # output_dir/.hub-staging: the current heads while they are pushed


def push_checkpoint_heads(run: Run) -> None:
    """``hub_strategy: every_save``: push the current heads (not the optimizer state) at a checkpoint."""
    staging = os.path.join(run.cfg.output_dir, HUB_STAGING)
    ev = run.last_eval if run.last_eval is not None and run.last_eval["step"] == run.step else None
    save_heads_copy(run, staging, ev)  # every process (ZeRO-3 gathers)
    push_heads(run, staging, f"{run.head_config.head_type} heads at step {run.step} (training)", fatal=False)
    if run.is_main:
        shutil.rmtree(staging, ignore_errors=True)


def save_heads_copy(run: Run, directory: str, ev: dict[str, Any] | None) -> None:
    """Heads-only save of the current weights (gathered under ZeRO-3; every process calls this) into
    ``directory``, written to a temporary sibling and renamed, with the run config and ``ev``."""
    from heads.base import save_heads
    from heads.registry import REGISTRY

    acc = run.accelerator
    acc.wait_for_everyone()
    state = acc.get_state_dict(run.heads)  # every process (ZeRO-3 gathers the shards)
    joint = run.cfg.joint.enabled  # Medusa-2: the heads are `JointModel.heads`; the LoRA goes to adapter/
    if joint:
        state = {k.removeprefix("heads."): v for k, v in state.items() if k.startswith("heads.")}
    if acc.is_main_process:
        heads = REGISTRY[run.head_config.head_type].module(run.head_config)
        heads.load_state_dict(state)
        extra = {"train_config.yaml": to_yaml(run.cfg)}
        if ev is not None:
            extra["eval_results.json"] = json.dumps(ev, indent=2) + "\n"
        extra["README.md"] = model_card(run, ev)
        if os.path.abspath(directory) == os.path.abspath(run.cfg.output_dir):
            save_heads(heads, directory, extra_files=extra)  # files are replaced one by one, atomically
            if joint:
                save_adapter(run, os.path.join(directory, ADAPTER_DIR))
        else:
            tmp = os.path.join(os.path.dirname(directory), f".tmp-{os.path.basename(directory)}")
            shutil.rmtree(tmp, ignore_errors=True)
            save_heads(heads, tmp, extra_files=extra)
            if joint:
                save_adapter(run, os.path.join(tmp, ADAPTER_DIR))
            shutil.rmtree(directory, ignore_errors=True)
            os.replace(tmp, directory)
    acc.wait_for_everyone()


def save_final(run: Run, ev: dict[str, Any] | None) -> dict[str, Any] | None:
    """Write the *best* heads by acceptance length τ (`run_eval`) to ``output_dir``, and return their eval.

    Without eval data these are the last heads. If the final eval is the best (ties go to the later
    step), the heads in memory are saved; otherwise the copy that `run_eval` kept in ``output_dir/best``
    is. ``eval_results.json`` holds the chosen step's eval plus ``last`` (the final step's eval); the
    last step's weights stay in the newest ``checkpoints/step-N`` when checkpoints are on.
    ``output_dir/best`` is removed once the heads are in place.
    """
    from heads.base import save_heads
    from heads.registry import REGISTRY

    acc = run.accelerator
    best_dir = os.path.join(run.cfg.output_dir, BEST)
    if ev is None or run.best_step == run.step:
        best_ev = None if ev is None else {"step": run.step, **ev}
        save_heads_copy(run, run.cfg.output_dir, None if ev is None else best_ev | {"last": best_ev})
    else:
        with open(os.path.join(best_dir, "eval_results.json")) as f:
            best_ev = json.load(f)
        if best_ev["step"] != run.best_step:
            raise RuntimeError(
                f"{best_dir} holds step {best_ev['step']}, but the best step is {run.best_step}"
            )
        if acc.is_main_process:
            from safetensors.torch import load_file

            heads = REGISTRY[run.head_config.head_type].module(run.head_config)
            heads.load_state_dict(load_file(os.path.join(best_dir, "model.safetensors")))
            extra = {
                "train_config.yaml": to_yaml(run.cfg),
                "eval_results.json": json.dumps(best_ev | {"last": {"step": run.step, **ev}}, indent=2)
                + "\n",
            }
            extra["README.md"] = model_card(run, json.loads(extra["eval_results.json"]))
            save_heads(heads, run.cfg.output_dir, extra_files=extra)
            if run.cfg.joint.enabled:  # Medusa-2: the LoRA adapter of that same step, copied then renamed
                final, tmp = (
                    os.path.join(run.cfg.output_dir, n) for n in (ADAPTER_DIR, f".tmp-{ADAPTER_DIR}")
                )
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.copytree(os.path.join(best_dir, ADAPTER_DIR), tmp)
                shutil.rmtree(final, ignore_errors=True)
                os.replace(tmp, final)
    acc.wait_for_everyone()
    if acc.is_main_process:  # finished before best/ goes: a resume after a kill here is a no-op, not a crash
        ckpt.mark_finished(run.cfg.output_dir, run.step)
        shutil.rmtree(best_dir, ignore_errors=True)
    acc.wait_for_everyone()
    return best_ev


def start(cfg: RunConfig, features: str | None = None) -> Run | None:
    """Everything that can fail because of the user's input: output_dir ownership, setup, trackers, resume.
    ``features``: a ``scripts/dump_features.py`` directory to train from (None = run the target online).
    Returns None (after saying so) when the run in output_dir is finished and this is a resume."""
    accelerator = make_accelerator(cfg)
    # Before any data is read: output_dir is this run's (`train.checkpoint.claim_output_dir`), and writable.
    done = main_process_first(accelerator, lambda: ckpt.claim_output_dir(cfg), main_only=True)
    if done is not None:
        accelerator.print(done)
        accelerator.end_training()
        return None
    run = setup(cfg, features, accelerator)
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
    from train.data import DataError

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
