"""Run directories and checkpoints: who owns ``output_dir``, what a resume reads, and how it is read.

A run owns its ``output_dir``. When it starts, the main process writes ``.selfspec_run.json`` there: the
run's identity (a SHA-256 of its configuration, less the keys that may change on resume, `MUTABLE_KEYS`),
that configuration, and its status (``running``, then ``finished`` once the final heads are in place).

    fresh run, missing or empty dir            -> claim it (also a dir whose run stopped before its first
                                                  checkpoint: nothing there is worth keeping)
    fresh run, dir holding a selfspec run      -> refused: resume it (``--resume``), ``overwrite=true``
                                                  (deletes selfspec's own files, `SELFSPEC_FILES`), or a new dir
    any run, non-empty dir that is no run      -> refused, nothing in it touched (``overwrite`` does not apply)
    resume, dir holding another config's run   -> refused, naming the keys that differ
    resume, finished run                       -> nothing to do (exit 0, one line)

Every checkpoint's ``trainer_state.json`` carries the identity too, so ``resume=PATH`` refuses another
run's checkpoint. Nothing a resume reads can run code: the scheduler state is JSON (`SCHEDULER_FILE`),
the heads safetensors, and every pickle-format file accelerate or DeepSpeed reads (optimizer, RNG states,
gradient scaler, DeepSpeed's model/optimizer shards) is checked with ``torch.load(weights_only=True)``
(`verify_checkpoint`, `safe_deepspeed_loads`) — a file that needs anything else is refused, not skipped.
"""

from __future__ import annotations

import enum
import errno
import hashlib
import json
import os
import pickle
import re
import shutil
import sys
from typing import Any

import torch
from accelerate.utils.other import TORCH_SAFE_GLOBALS

from heads.io import TMP_PREFIX, atomic_text
from train.config import to_dict

RUN_FILE = ".selfspec_run.json"  # hidden: never uploaded with the heads (heads.hub ignores dot files)
STATE_FILE = "trainer_state.json"
SCHEDULER_FILE = "scheduler.json"
CHECKPOINTS = "checkpoints"
# Config keys that may differ between a run and its resume: where and how often it logs, saves and pushes.
# Everything else (model, data, heads, optimisation, eval schedule, which draws from the RNG) is the run.
MUTABLE_KEYS = (
    "output_dir", "resume", "overwrite", "report_to", "wandb_project", "run_name", "push_to_hub",
    "hub_model_id", "hub_private", "hub_strategy", "train.log_every", "train.save_every",
    "train.save_total_limit", "train.num_workers", "data.num_proc",
)  # fmt: skip
# What a selfspec run writes into output_dir (`overwrite=true` deletes exactly these, plus `.tmp-*`).
SELFSPEC_FILES = (
    RUN_FILE, "config.json", "model.safetensors", "train_config.yaml", "README.md", "eval_results.json",
    "metrics.jsonl", "adapter", "best", CHECKPOINTS, ".hub-staging",
)  # fmt: skip


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, quota, I/O error); the partial write is removed."""


# ---------------------------------------------------------------------------------------------- identity


def flat_config(cfg) -> dict[str, Any]:
    """The run config as ``{"train.lr": 0.01, ...}`` without `MUTABLE_KEYS`."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        elif prefix not in MUTABLE_KEYS:
            flat[prefix] = value

    walk("", to_dict(cfg))
    return flat


def run_identity(flat: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:16]


def config_diff(old: dict[str, Any], new: dict[str, Any], limit: int = 6) -> str:
    """``"heads.medusa.num_heads: 3 -> 4, train.lr: 0.001 -> 0.01"`` (at most ``limit`` keys)."""
    keys = sorted(k for k in old.keys() | new.keys() if old.get(k, "<unset>") != new.get(k, "<unset>"))
    parts = [f"{k}: {old.get(k, '<unset>')!r} -> {new.get(k, '<unset>')!r}" for k in keys[:limit]]
    return ", ".join(parts) + (f" (+{len(keys) - limit} more)" if len(keys) > limit else "")


def read_record(output_dir: str) -> dict[str, Any] | None:
    path = os.path.join(output_dir, RUN_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            record = json.load(f)
        if not isinstance(record.get("run_id"), str) or not isinstance(record.get("config"), dict):
            raise ValueError("no run_id/config")
    except (ValueError, OSError) as e:
        raise ValueError(f"{path} is unreadable ({e}): delete {output_dir} or use a new output_dir") from None
    return record


def write_record(output_dir: str, record: dict[str, Any]) -> None:
    text = json.dumps(record, indent=2, sort_keys=True, default=str) + "\n"
    atomic_text(os.path.join(output_dir, RUN_FILE), text)


def mark_finished(output_dir: str, step: int) -> None:
    """Record that the final heads of this run are in ``output_dir`` (a later ``--resume`` is a no-op)."""
    record = read_record(output_dir) or {}
    write_record(output_dir, record | {"status": "finished", "step": step})


# ---------------------------------------------------------------------------------------------- ownership


def check_writable(directory: str) -> None:
    """Create and delete a probe file: permissions and read-only mounts (also for root) fail here."""
    probe = os.path.join(directory, f"{TMP_PREFIX}write-probe-{os.getpid()}")
    try:
        with open(probe, "w") as f:
            f.write("x")
        os.remove(probe)
    except OSError as e:
        raise OSError(f"output_dir {directory!r} is not writable: {e.strerror or e}") from None


def _holds_results(output_dir: str) -> bool:
    """A complete checkpoint, heads, or a best-so-far copy: what a refusal protects."""
    if checkpoint_steps(output_dir):
        return True
    return any(os.path.exists(os.path.join(output_dir, n)) for n in ("model.safetensors", "best"))


def _wipe(output_dir: str) -> None:
    for name in os.listdir(output_dir):
        if name in SELFSPEC_FILES or name.startswith(TMP_PREFIX):
            path = os.path.join(output_dir, name)
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)


def claim_output_dir(cfg) -> str | None:
    """Main process, before any data is read: check that ``cfg.output_dir`` can be this run's, or raise
    ``ValueError`` (one line) if it belongs to another run or to nobody, ``OSError`` if it is not writable.
    Returns a message when there is nothing to do (the run finished already and this is a resume), else
    None. Writes nothing: `take_output_dir` does, once the run's setup has passed its checks too."""
    out = cfg.output_dir
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"output_dir {out!r} is a file, not a directory")
    flat = flat_config(cfg)
    entries = sorted(os.listdir(out)) if os.path.isdir(out) else []
    record = read_record(out) if entries else None
    if record is None and entries:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise ValueError(
            f"output_dir {out!r} is not empty ({shown}) and is not a selfspec run: use a new or empty "
            "directory (nothing in it was changed)"
        )
    if record is not None and _holds_results(out) and not cfg.overwrite:
        same = record["run_id"] == run_identity(flat)
        diff = "" if same else f" with a different config ({config_diff(record['config'], flat)})"
        finished = record.get("status") == "finished"
        what = f"a {'finished' if finished else 'selfspec'} run{diff}"
        if cfg.resume is None:
            how = "pass --resume (resume=auto) to continue it, " if same and not finished else ""
            raise ValueError(
                f"output_dir {out!r} already holds {what}: {how}overwrite=true to delete its selfspec files and "
                "start again, or use a new output_dir"
            )
        if not same:
            raise ValueError(
                f"resume: output_dir {out!r} holds a run{diff}: resume with that config, overwrite=true to "
                "start again, or use a new output_dir"
            )
        if finished:
            return (
                f"output_dir {out} holds the finished run (step {record.get('step')}): nothing to resume; "
                "its heads are in place (overwrite=true trains again)"
            )
    existing = out
    while not os.path.isdir(existing):  # the nearest directory that exists: where makedirs will write
        existing = os.path.dirname(os.path.abspath(existing))
    check_writable(existing)
    return None


def take_output_dir(cfg) -> None:
    """Main process, after `claim_output_dir` and the run's setup passed: make ``cfg.output_dir`` this
    run's. A new run (or ``overwrite``, or a run that stopped before its first checkpoint, which left
    nothing worth keeping) clears the selfspec files and writes the run record; a resume keeps its record."""
    out = cfg.output_dir
    record = read_record(out) if os.path.isdir(out) else None
    if record is not None and (cfg.overwrite or not _holds_results(out)):
        _wipe(out)
        record = None
    os.makedirs(out, exist_ok=True)
    check_writable(out)
    if record is None:
        flat = flat_config(cfg)
        write_record(out, {"format": 1, "run_id": run_identity(flat), "config": flat, "status": "running"})


# ---------------------------------------------------------------------------------------------- checkpoints


def checkpoint_steps(output_dir: str) -> list[tuple[int, str]]:
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
    found = checkpoint_steps(output_dir)
    return found[-1][1] if found else None


def check_same_run(path: str, state: dict[str, Any], now: dict[str, Any]) -> None:
    """Refuse checkpoint ``path`` (its trainer_state ``state``) unless it is of the run whose state is ``now``:
    same identity (else the differing keys are named: heads, data, optimisation, ...) and the same
    process count and batch layout (the data position depends on them)."""
    if "run_id" not in state or not isinstance(state.get("config"), dict):
        raise ValueError(
            f"checkpoint {path} carries no run identity (written by an older selfspec): it cannot be checked "
            "to belong to this run; start in a new output_dir"
        )
    if state["run_id"] != now["run_id"]:
        raise ValueError(
            f"checkpoint {path} belongs to a run with a different config "
            f"({config_diff(state['config'], now['config'])}): resume with that config, or start "
            "a new run (overwrite=true or a new output_dir)"
        )
    for key in ("num_processes", "batch_size", "grad_accum"):
        if state.get(key) != now[key]:
            raise ValueError(
                f"checkpoint {path} was written with {key}={state.get(key)} but this run has {key}={now[key]}; "
                "resume with the same settings, or use a new output_dir"
            )


def trim_metrics(path: str, step: int) -> None:
    """Drop the records of steps after ``step`` from the metrics.jsonl at ``path`` (logged before a kill,
    they are about to be logged again), and any line the kill cut short."""
    if not os.path.isfile(path):
        return
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    keep = []
    for line in lines:
        try:
            if json.loads(line).get("step", 0) <= step:
                keep.append(line)
        except ValueError:  # a line cut by the kill
            continue
    if len(keep) != len(lines):
        atomic_text(path, "".join(keep))


def any_process(acc, failed: bool) -> bool:
    """True on every process if any process passed ``failed=True`` (a collective: all must call it)."""
    if acc.num_processes == 1:
        return failed
    return bool(acc.reduce(torch.tensor([float(failed)], device=acc.device), reduction="sum").item() > 0)


# ---------------------------------------------------------------------------------------------- reading


def _safe_globals() -> list:
    """What a weights-only load may rebuild besides tensors: numpy's RNG state (accelerate's own list)."""
    return list(TORCH_SAFE_GLOBALS)


def safe_torch_load(path: str, map_location: Any = "cpu") -> Any:
    """``torch.load(weights_only=True)``: tensors, containers, numbers and the allow-listed numpy RNG types;
    anything else (a pickled callable) raises ``ValueError`` naming the file, and nothing is executed."""
    try:
        with torch.serialization.safe_globals(_safe_globals() + _deepspeed_globals()):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:
        try:
            found = ", ".join(torch.serialization.get_unsafe_globals_in_checkpoint(path)[:4])
        except Exception:
            found = "not a torch.save file"
        raise ValueError(
            f"refusing to load {path}: it needs more than tensors and plain data to unpickle ({found}), "
            "which could run code; a checkpoint file is only ever read with torch.load(weights_only=True)"
        ) from None
    except (RuntimeError, EOFError, OSError) as e:
        raise ValueError(
            f"{path} is not a readable checkpoint file: {str(e).splitlines()[0][:200]}"
        ) from None


PICKLE_SUFFIXES = (".bin", ".pt", ".pkl", ".pth")


def verify_checkpoint(path: str, num_processes: int) -> None:
    """Before ``accelerator.load_state``: refuse a checkpoint with a pickled custom state (accelerate would
    unpickle it with code), a missing or unsafe RNG state (accelerate would skip it silently), or any other
    pickle-format file that needs more than a weights-only load. Reads every such file once, mmapped."""
    names = sorted(os.listdir(path))
    custom = [n for n in names if n.startswith("custom_checkpoint_")]
    if custom:
        raise ValueError(
            f"checkpoint {path} holds {custom[0]} (a pickled state that accelerate would unpickle with code): "
            "refusing to resume from it; such checkpoints come from an older selfspec or from elsewhere"
        )
    for rank in range(num_processes):
        rng = os.path.join(path, f"random_states_{rank}.pkl")
        if not os.path.isfile(rng):
            raise ValueError(
                f"checkpoint {path} has no RNG state for process {rank} ({os.path.basename(rng)})"
            )
        state = safe_torch_load(rng)
        if not isinstance(state, dict) or not {"random_state", "torch_manual_seed"} <= state.keys():
            raise ValueError(
                f"{rng} is not an RNG state (keys: {sorted(state)[:5] if isinstance(state, dict) else type(state).__name__})"
            )
    read_scheduler(path)
    # optimizer.bin, pytorch_model.bin (if no safetensors), scaler.pt, sampler.bin, DeepSpeed's shards, ...
    for root, _, files in os.walk(path):
        for name in sorted(files):
            if name.endswith(PICKLE_SUFFIXES) and not name.startswith("random_states_"):
                safe_torch_load(os.path.join(root, name))


def read_scheduler(path: str) -> dict[str, Any]:
    """The LR scheduler's state from ``scheduler.json`` in checkpoint ``path`` (numbers and lists only)."""
    file = os.path.join(path, SCHEDULER_FILE)
    try:
        with open(file) as f:
            state = json.load(f)
    except (ValueError, OSError) as e:
        raise ValueError(f"{file} is not a scheduler state: {e}") from None
    if not isinstance(state, dict) or not isinstance(state.get("last_epoch"), int):
        raise ValueError(f"{file} is not a scheduler state (no last_epoch)")
    return state


def _deepspeed_globals() -> list:
    """DeepSpeed's checkpoints hold a few plain-data objects of its own besides tensors (found by loading
    ZeRO-2 (fp32, bf16) and ZeRO-3 checkpoints with weights_only=True): an int enum, the loss-scaler's
    attributes and a (start, numel) pair. Allow exactly those, nothing callable."""
    if "deepspeed" not in sys.modules:  # not a DeepSpeed run: its files are refused (and not imported here)
        return []
    try:  # heavy and optional: imported only when a DeepSpeed run already loaded it
        from deepspeed.runtime.fp16.loss_scaler import LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address
    except Exception:  # DeepSpeed not installed (or moved them): nothing to allow
        return []
    return [LossScaler, ZeroStageEnum, fragment_address, (_enum_member, "builtins.getattr")]


def _enum_member(cls: Any, name: Any) -> Any:
    """What a checkpoint's ``getattr(cls, name)`` may do: some pickles store an enum member by name
    (DeepSpeed's ``ZeroStageEnum.gradients``). Only a member of an allow-listed enum is returned; real
    ``getattr`` would hand the unpickler any attribute (a function's ``__globals__``, ...)."""
    if (
        isinstance(cls, type)
        and issubclass(cls, enum.Enum)
        and cls in _deepspeed_globals()
        and isinstance(name, str)
        and name in cls.__members__
    ):
        return cls[name]
    raise pickle.UnpicklingError(f"getattr({getattr(cls, '__name__', cls)!r}, {name!r}) is not allowed")


def safe_deepspeed_loads(engine) -> None:
    """Make a DeepSpeed engine read its checkpoint files with `safe_torch_load` instead of
    ``torch.load(weights_only=False)`` (its TorchCheckpointEngine): every model/optimizer shard it reads
    on resume goes through here."""
    ckpt = getattr(engine, "checkpoint_engine", None)
    if ckpt is None:
        raise RuntimeError("this DeepSpeed engine has no checkpoint_engine: cannot make its loads safe")
    ckpt.load = lambda path, map_location=None: safe_torch_load(path, map_location=map_location or "cpu")


# ---------------------------------------------------------------------------------------------- writing


def is_disk_full(e: BaseException, directory: str) -> bool:
    """ENOSPC / EDQUOT anywhere in the exception chain or its text (safetensors says ``os error 28``), or
    a write failure that names no cause (torch's zip writer: ``unexpected pos``, ``file write failed``)
    while the filesystem has less than 1 MiB left."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(seen)
        if "No space left on device" in text or "os error 28" in text or "StorageFull" in text:
            return True
        seen = seen.__cause__ or seen.__context__
    if "unexpected pos" in str(e) or "write" in str(e).lower():
        try:
            st = os.statvfs(directory)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize < 1 << 20
    return False
