"""Run configuration: validated dataclasses, YAML recipes and dotted command-line overrides.

A run is described by one `RunConfig`:

    target:  which frozen causal LM the heads graft onto        (`TargetConfig`)
    heads:   the head type and its block of options              (`HeadsConfig`)
    data:    where the training text comes from                  (`train.data.DataConfig`)
    train:   optimisation, evaluation, logging and checkpoints   (`TrainConfig`)
    joint:   Medusa-2: LoRA on the target trained with the heads (`JointConfig`, off by default)
    eval:    the measured τ of each held-out eval                (`EvalConfig`)
    + output_dir, resume, overwrite, report_to, wandb_project, run_name
    + push_to_hub, hub_model_id, hub_private, hub_strategy (upload the heads, `heads.hub`)

`load_config(path, overrides)` layers, in order: the dataclass defaults, the YAML file, then the
``key=value`` overrides (``train.lr=1e-3 output_dir=out/x``), all through OmegaConf structured
configs, so an unknown key or a value of the wrong type is an error that names the key. Every
dataclass checks its values in ``__post_init__`` and raises ``ValueError`` with a helpful message.
``target.name_or_path`` and ``data.path`` have no default: every recipe names its target and its data.

The names ``demo`` and ``demo-tiny`` (target and data path) stand for the project's own small
target and corpus, built locally and cached on first use (the `demo` package); `resolve_demo` turns them
into real paths. Loading a config never builds anything.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from dataclasses import dataclass, field
from typing import Any

from huggingface_hub.utils import validate_repo_id
from omegaconf import MISSING

import heads  # noqa: F401  (importing the package registers every head type)
from heads import config, registry, targets
from heads.eagle.config import EagleRecipe
from heads.eagle3.config import Eagle3Recipe
from heads.medusa.config import MedusaRecipe
from train.data import DataConfig

DTYPES = ("auto", "fast", "bf16", "bfloat16", "fp16", "float16", "fp32", "float32")
MIXED_PRECISION = ("auto", "no", "bf16", "fp16")
REPORT_TO = ("none", "wandb")
HUB_STRATEGIES = ("end", "every_save")


@dataclass
class TargetConfig:
    """The frozen target LM. ``name_or_path`` (required): a Hub id, a local directory, ``demo`` or
    ``demo-tiny``."""

    name_or_path: str = MISSING
    revision: str | None = None
    dtype: str = "auto"  # auto = as stored; fast = bf16 where native, else fp32; or bf16 / fp16 / fp32
    attn_implementation: str | None = None  # None = transformers' default (sdpa); or "eager", ...
    adapter: str | None = None  # PEFT adapter dir or Hub id: heads train on the adapted target
    adapter_revision: str | None = None  # Hub revision of the adapter
    merge: bool = False  # fold the adapter into the weights (faster forward); False keeps the PeftModel

    def __post_init__(self) -> None:
        if not self.name_or_path:
            raise ValueError("target.name_or_path is empty: give a Hub id, a local model directory or 'demo'")
        if self.dtype not in DTYPES:
            raise ValueError(f"target.dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}")
        if self.adapter is None and (self.merge or self.adapter_revision is not None):
            raise ValueError("target.merge and target.adapter_revision need target.adapter (a PEFT adapter)")
        if self.adapter is not None and not self.adapter:
            raise ValueError("target.adapter is empty: give a PEFT adapter directory or Hub id, or null")


@dataclass
class HeadsConfig:
    """Which draft heads to train: ``type`` picks the head type (`heads.registry`), and the block of the same
    name holds that type's options; the other blocks stay unset (null).

        medusa   `heads.medusa.config.MedusaRecipe`: num_heads, num_layers, lm_head, decay
        eagle    `heads.eagle.config.EagleRecipe` (EAGLE-1/2): draft_layer, bias, w_reg, w_cls, noise,
                 draft_vocab_size
        eagle3   `heads.eagle3.config.Eagle3Recipe`: variant (eagle3 | eagle3.1), p_eagle (P-EAGLE's
                 ``depths``), draft_layer, draft_vocab_size, aux_layer_ids, ttt_steps, step_weight, noise,
                 lm_head_init

    An unset block of the chosen type means that block's defaults (`block`). Every trainable head type
    of the registry has a block (tests/test_config.py checks it). The target's sizes and config are filled
    in from the target itself.
    """

    type: str = "medusa"
    medusa: MedusaRecipe | None = None
    eagle: EagleRecipe | None = None
    eagle3: Eagle3Recipe | None = None

    def __post_init__(self) -> None:
        self.head_config_cls()
        blocks = head_blocks()
        if self.type not in blocks:
            raise ValueError(f"heads.type {self.type!r} has no options block in HeadsConfig")
        others = [name for name in blocks if name != self.type and getattr(self, name) is not None]
        if others:
            raise ValueError(
                f"heads.{others[0]} is set but heads.type is {self.type!r}: a recipe holds only the block of "
                f"its head type (heads.{self.type}); drop heads.{others[0]} (heads.{others[0]}=null)"
            )
        self.head_kwargs()  # validates every value by building a config of that head type

    @property
    def block(self) -> Any:
        """The options block of ``type`` (``heads.<type>``; its defaults where it is unset)."""
        return getattr(self, self.type) or head_blocks()[self.type]()

    def head_config_cls(self) -> type:
        """The head type's config class; a head type is trainable when its registry entry has an objective."""
        if self.type not in registry.REGISTRY:
            raise ValueError(
                f"heads.type {self.type!r} is unknown; known head types: {sorted(registry.REGISTRY)}"
            )
        entry = registry.REGISTRY[self.type]
        if getattr(entry, "objective", None) is None:
            trainable = sorted(
                n for n, e in registry.REGISTRY.items() if getattr(e, "objective", None) is not None
            )
            raise ValueError(
                f"training {self.type!r} heads is not implemented yet (its registry entry has no training "
                f"objective); trainable: {trainable}"
            )
        return entry.config

    def head_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the head type's config class (the target's sizes are added later)."""
        kwargs = self.block.head_kwargs()
        try:
            self.head_config_cls()(**kwargs)
        except ValueError as e:
            raise ValueError(f"heads.{self.type}: {e}") from None
        return kwargs


def head_blocks() -> dict[str, type]:
    """``{head type: its options block class}``: the `HeadsConfig` fields besides ``type``."""
    hints = typing.get_type_hints(HeadsConfig)
    return {
        f.name: next(a for a in typing.get_args(hints[f.name]) if a is not type(None))
        for f in dataclasses.fields(HeadsConfig)
        if f.name != "type"
    }


@dataclass
class TrainConfig:
    """Optimisation, evaluation, logging and checkpointing. Steps are optimizer steps."""

    lr: float = 1e-3  # peak learning rate (AdamW)
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    warmup_ratio: float = 0.1  # linear warm-up over this fraction of the steps, then cosine to 0
    num_epochs: int = 1
    max_steps: int = -1  # > 0: stop after this many optimizer steps (overrides num_epochs)
    batch_size: int = 8  # sequences per process per micro-batch
    eval_batch_size: int | None = None  # None = batch_size
    grad_accum: int = 1  # micro-batches per optimizer step
    grad_clip: float = 1.0  # max gradient norm; 0 = no clipping
    seed: int = 0  # seeds the heads' init and the data order
    mixed_precision: str = (
        "auto"  # "auto" (bf16 on a bf16 GPU, else what the launcher says, else fp32) | no | bf16 | fp16
    )
    eval_every: int = 100  # evaluate every N steps (0 = only at the end)
    save_every: int = 100  # checkpoint every N steps (0 = no intermediate checkpoints)
    log_every: int = 10  # log the training loss every N steps
    save_total_limit: int = 2  # keep the newest N checkpoints (0 = keep all)
    num_workers: int = 0  # dataloader worker processes

    def __post_init__(self) -> None:
        problems = []
        if not self.lr > 0:
            problems.append(f"train.lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            problems.append(f"train.weight_decay must be >= 0, got {self.weight_decay}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            problems.append(f"train.betas must be two numbers in [0, 1), got {list(self.betas)}")
        if not 0 <= self.warmup_ratio < 1:
            problems.append(f"train.warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.num_epochs < 1:
            problems.append(f"train.num_epochs must be >= 1, got {self.num_epochs}")
        if self.max_steps == 0 or self.max_steps < -1:
            problems.append(
                f"train.max_steps must be > 0, or -1 to train for num_epochs; got {self.max_steps}"
            )
        for name in ("batch_size", "grad_accum", "log_every"):
            if getattr(self, name) < 1:
                problems.append(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if self.eval_batch_size is not None and self.eval_batch_size < 1:
            problems.append(f"train.eval_batch_size must be >= 1 or null, got {self.eval_batch_size}")
        for name in ("grad_clip", "eval_every", "save_every", "save_total_limit", "num_workers"):
            if getattr(self, name) < 0:
                problems.append(f"train.{name} must be >= 0, got {getattr(self, name)}")
        if self.mixed_precision not in MIXED_PRECISION:
            problems.append(
                f"train.mixed_precision must be one of {', '.join(MIXED_PRECISION)}; got {self.mixed_precision!r}"
            )
        if problems:
            raise ValueError("; ".join(problems))


@dataclass
class EvalConfig:
    """The measured acceptance length τ of each held-out eval (`train.evaluation.measure_tau`): greedy
    `infer.generate` with the heads' default tree (EAGLE: the dynamic-tree defaults) on the first
    ``measured_tau_prompts`` held-out rows. A chat row's prompt is its conversation up to the first
    assistant answer (the tokens before its first training label); a text row's is its first
    ``measured_tau_prompt_tokens`` tokens. Not run for Medusa-2 joint training (its target is trained).

    ``measured_tau_prompts_file`` measures on a prompt file instead, read as ``scripts/benchmark.py
    --prompts`` reads one (whole text rows; chat rows up to the generation prompt), so the logged τ is the
    one the benchmark will see on prompts of that kind. The benchmark reads a file's first rows: skip them
    (``measured_tau_prompts_skip``) and checkpoint selection never sees the benchmark's own prompts."""

    measured_tau_prompts: int = 4  # 0 = off (the best heads are then chosen by the simulated τ)
    measured_tau_new_tokens: int = 32  # tokens generated per prompt (short prompts give a low τ: see above)
    measured_tau_prompt_tokens: int = 32  # prompt length taken from a text row (chat rows: see above)
    # JSONL prompts (text / chat rows); demo / demo-tiny = the demo's held-out prompts; null = the eval rows
    measured_tau_prompts_file: str | None = None
    measured_tau_prompts_skip: int = 0  # rows of measured_tau_prompts_file skipped at its start

    def __post_init__(self) -> None:
        for name, low in (("measured_tau_prompts", 0), ("measured_tau_new_tokens", 1),
                          ("measured_tau_prompt_tokens", 1), ("measured_tau_prompts_skip", 0)):  # fmt: skip
            if getattr(self, name) < low:
                raise ValueError(f"eval.{name} must be >= {low}, got {getattr(self, name)}")


HEADS_COEF_SCHEDULES = ("constant", "linear", "sine")


@dataclass
class JointConfig:
    """Medusa-2 joint training (Cai et al. 2024, §2.3): LoRA on the backbone (``peft``) + the heads.

    loss = L_backbone + heads_coef(s) · Σ_k decay**k · L_k (decay: ``heads.medusa.decay``), where L_backbone is KL(p_original ‖ p_adapted)
    with ``self_distill`` (the original = the same model with its adapter disabled) and next-token CE
    without. heads_coef(s) warms up over ``heads_coef_warmup_steps`` joint steps: constant = heads_coef;
    linear = heads_coef · min(1, s/W); sine = heads_coef · sin(π/2 · min(1, s/W)). The first
    ``heads_only_steps`` optimizer steps (stage 1) train only the heads, on the frozen backbone.
    """

    enabled: bool = False  # False: Medusa-1 (frozen target, heads only)
    lora_r: int = 8  # LoRA rank
    lora_alpha: float = 16.0  # LoRA scaling numerator (scale = alpha / r)
    lora_dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    heads_coef: float = 0.2  # weight of the heads' loss next to the backbone's
    heads_coef_schedule: str = "constant"  # constant | linear | sine warm-up of heads_coef
    heads_coef_warmup_steps: int = 0  # joint steps to reach heads_coef (linear / sine)
    head_lr_multiplier: float = 4.0  # the heads' lr = train.lr x this (the LoRA weights get train.lr)
    heads_only_steps: int = 0  # stage 1: this many steps of heads only, then joint (0 = joint from the start)
    self_distill: bool = False  # backbone term = KL to the un-adapted model (True) or next-token CE (False)

    def __post_init__(self) -> None:
        problems = []
        if self.heads_coef < 0:
            problems.append(f"joint.heads_coef must be >= 0, got {self.heads_coef}")
        if self.heads_coef_schedule not in HEADS_COEF_SCHEDULES:
            problems.append(
                f"joint.heads_coef_schedule must be one of {', '.join(HEADS_COEF_SCHEDULES)}; "
                f"got {self.heads_coef_schedule!r}"
            )
        for name in ("heads_coef_warmup_steps", "heads_only_steps"):
            if getattr(self, name) < 0:
                problems.append(f"joint.{name} must be >= 0, got {getattr(self, name)}")
        if not self.head_lr_multiplier > 0:
            problems.append(f"joint.head_lr_multiplier must be > 0, got {self.head_lr_multiplier}")
        if self.lora_r < 1:
            problems.append(f"joint.lora_r must be >= 1, got {self.lora_r}")
        if not self.lora_alpha > 0:
            problems.append(f"joint.lora_alpha must be > 0, got {self.lora_alpha}")
        if not 0 <= self.lora_dropout < 1:
            problems.append(f"joint.lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if self.enabled and not self.target_modules:
            problems.append("joint.target_modules is empty: name the backbone modules that get LoRA")
        if self.self_distill and not self.enabled:
            problems.append(
                "joint.self_distill needs LoRA on the backbone (joint.enabled: true): without an adapter "
                "there is nothing to distil into"
            )
        if problems:
            raise ValueError("; ".join(problems))

    def heads_coef_at(self, step: int) -> float:
        """heads_coef at optimizer step ``step`` (0-based, counted over the whole run). Stage 1 steps
        (``step < heads_only_steps``) train the heads alone and return 1.0 (their loss is the whole loss)."""
        s = step - self.heads_only_steps
        if s < 0:
            return 1.0
        W = self.heads_coef_warmup_steps
        frac = 1.0 if self.heads_coef_schedule == "constant" or W == 0 else min(1.0, s / W)
        if self.heads_coef_schedule == "sine":
            frac = math.sin(math.pi / 2 * frac)
        return self.heads_coef * frac


@dataclass
class RunConfig:
    """Everything one training run needs; `load_config` builds it from YAML + overrides."""

    target: TargetConfig = field(default_factory=TargetConfig)
    heads: HeadsConfig = field(default_factory=HeadsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    joint: JointConfig = field(default_factory=JointConfig)  # Medusa-2 (off by default)
    eval: EvalConfig = field(default_factory=EvalConfig)  # measured τ at each held-out eval
    output_dir: str = "out/medusa"  # final heads here; checkpoints under output_dir/checkpoints/step-N
    resume: str | None = None  # None: start fresh; "auto": latest checkpoint in output_dir if any; or a path
    # A fresh run refuses an output_dir that holds another run (`train.checkpoint`); overwrite=true deletes
    # that run's selfspec files first (never other files; a directory that is no selfspec run is refused).
    overwrite: bool = False
    report_to: str = "none"  # "none" | "wandb"
    wandb_project: str = "selfspec"
    run_name: str | None = None  # wandb run name (None = wandb picks one)
    # Hub upload of the heads (+ model card), as transformers' Trainer names it. The token is never a config
    # key: `hf auth login` or HF_TOKEN, checked when the run starts.
    push_to_hub: bool = False
    hub_model_id: str | None = None  # "your-name/heads-name" (required with push_to_hub)
    hub_private: bool | None = None  # a new repo is private unless false (None: private too)
    hub_strategy: str = "end"  # "end": push the final heads | "every_save": also the heads at each checkpoint

    def __post_init__(self) -> None:
        if not self.output_dir:
            raise ValueError("output_dir is empty")
        if self.report_to not in REPORT_TO:
            raise ValueError(f"report_to must be one of {', '.join(REPORT_TO)}; got {self.report_to!r}")
        self._check_hub()
        joint = sorted(n for n, e in registry.REGISTRY.items() if getattr(e, "joint_training", False))
        if self.joint.enabled and self.heads.type not in joint:
            raise ValueError(
                f"joint training (Medusa-2, joint.enabled: true) needs heads.type: {' or '.join(joint)}, got "
                f"{self.heads.type!r}; train {self.heads.type} heads on the frozen target (joint.enabled: false)"
            )
        if self.overwrite and self.resume is not None:
            raise ValueError(
                f"overwrite=true deletes the run in output_dir, resume={self.resume!r} continues it: pick one"
            )
        if (
            self.resume is not None
            and self.resume != "auto"
            and not os.path.isdir(os.path.expanduser(self.resume))
        ):
            raise FileNotFoundError(
                f"resume: checkpoint directory not found: {self.resume!r} (use 'auto' or null)"
            )

    def _check_hub(self) -> None:
        if self.hub_strategy not in HUB_STRATEGIES:
            raise ValueError(
                f"hub_strategy must be one of {', '.join(HUB_STRATEGIES)}; got {self.hub_strategy!r}"
            )
        if self.push_to_hub and not self.hub_model_id:
            raise ValueError(
                "push_to_hub is true but hub_model_id is not set: name the Hub repo, e.g. "
                "hub_model_id=your-name/my-heads"
            )
        if self.hub_model_id:
            try:
                validate_repo_id(self.hub_model_id)
            except ValueError as e:
                raise ValueError(
                    f"hub_model_id {self.hub_model_id!r} is not a valid Hub repo id: {e}"
                ) from None


def load_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Defaults <- YAML file at ``path`` (optional) <- ``key=value`` overrides; returns a validated `RunConfig`
    (`heads.config.load`: a missing file is ``FileNotFoundError``, a bad key or value one ``ValueError``)."""
    return config.load(RunConfig, path, overrides)


def to_dict(cfg: RunConfig) -> dict[str, Any]:
    """Plain nested dict of the config (for logging and for the copy saved next to the heads)."""
    return dataclasses.asdict(cfg)


def to_yaml(cfg: RunConfig) -> str:
    return config.to_yaml(cfg)


def resolve_demo(cfg: RunConfig, cache: str | None = None) -> RunConfig:
    """Replace built-in target names (``demo``, ``demo-tiny``, ``smollm2-135m-instruct``, a ``.gguf`` file) and
    the demo data names by local paths, building them on first use (`heads.targets`).

    Returns a new `RunConfig`; ``cfg`` is not modified. Call it on the main process first (building the
    demo target takes a while and writes to a shared cache).
    """
    target, data, ev = cfg.target, cfg.data, cfg.eval
    path = targets.resolve(target.name_or_path, cache=cache)
    if path != target.name_or_path:
        target = dataclasses.replace(target, name_or_path=path)
    files = targets.resolve_data(data.path, cache=cache)
    if files is not None:
        data = dataclasses.replace(data, path=files["train"], eval_path=data.eval_path or files["eval"])
    prompts = targets.resolve_data(ev.measured_tau_prompts_file or "", cache=cache)
    if prompts is not None:
        ev = dataclasses.replace(ev, measured_tau_prompts_file=prompts["prompts"])
    return dataclasses.replace(cfg, target=target, data=data, eval=ev)
