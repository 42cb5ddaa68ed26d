"""What a run hands to its user: heads-only copies (``best/``, the final heads), the model card, the push.

Output layout in ``output_dir`` (the module docstring of `train.train_heads` lists every file):
``config.json`` + ``model.safetensors`` (the heads of the eval with the best acceptance length τ),
``train_config.yaml``, ``README.md`` (the model card, `heads.hub.model_card_text`), ``eval_results.json``,
``adapter/`` (Medusa-2 only), and during the run ``best/`` (the best intermediate heads) and
``.hub-staging/`` (the heads being pushed at a checkpoint). Directories are written through
`heads.io.atomic_dir`, files through `heads.base.save_heads` (`heads.io.atomic_write`).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from safetensors.torch import load_file

from heads import registry
from heads.base import ADAPTER_DIR, save_heads  # ADAPTER_DIR: the LoRA's subdirectory next to Medusa-2 heads
from heads.hub import model_card_text, push_heads_dir
from heads.io import atomic_dir
from train import checkpoint as ckpt
from train.config import to_dict, to_yaml
from train.medusa2 import save_adapter
from train.run import DIR_MODE, Run, deepspeed_plugin, outside_zero3_init

BEST = "best"  # output_dir/best: heads-only copy of the best-τ eval so far (removed when the run ends)
HUB_STAGING = ".hub-staging"  # output_dir/.hub-staging: the current heads while they are pushed


def model_card(run: Run, ev: dict[str, Any] | None) -> str:
    """The README.md saved with the heads (`heads.hub.model_card_text`); its usage snippet loads them from
    ``hub_model_id`` when set, else from ``output_dir``."""
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
                    f"later with `python scripts/push_heads.py push {directory} {repo}`"
                ) from e
    run.accelerator.wait_for_everyone()


def push_checkpoint_heads(run: Run) -> None:
    """``hub_strategy: every_save``: push the current heads (not the optimizer state) at a checkpoint."""
    staging = os.path.join(run.cfg.output_dir, HUB_STAGING)
    ev = run.last_eval if run.last_eval is not None and run.last_eval["step"] == run.step else None
    save_heads_copy(run, staging, ev)  # every process (ZeRO-3 gathers)
    push_heads(run, staging, f"{run.head_config.head_type} heads at step {run.step} (training)", fatal=False)
    if run.is_main:
        shutil.rmtree(staging, ignore_errors=True)


def _heads_files(run: Run, ev: dict[str, Any] | None) -> dict[str, str]:
    """The files saved next to the heads: the run config, ``ev`` (eval_results.json) and the model card."""
    extra = {"train_config.yaml": to_yaml(run.cfg)}
    if ev is not None:
        extra["eval_results.json"] = json.dumps(ev, indent=2) + "\n"
    extra["README.md"] = model_card(run, ev)
    return extra


def _fresh_heads(run: Run):
    """A new module of the run's heads, built on one process: outside zero.Init, where a draft layer built
    by transformers would be partitioned by a collective the other processes never join (a hang)."""
    with outside_zero3_init(deepspeed_plugin(run.accelerator)):
        return registry.get(run.head_config.head_type).module(run.head_config)


def save_heads_copy(run: Run, directory: str, ev: dict[str, Any] | None) -> None:
    """Heads-only save of the current weights (gathered under ZeRO-3; every process calls this) into
    ``directory`` with the run config and ``ev``. ``output_dir`` itself is updated file by file (each
    file atomically); any other directory is written whole beside it and renamed (`heads.io.atomic_dir`)."""
    acc = run.accelerator
    acc.wait_for_everyone()
    state = acc.get_state_dict(run.heads)  # every process (ZeRO-3 gathers the shards)
    joint = run.cfg.joint.enabled  # Medusa-2: the heads are `JointModel.heads`; the LoRA goes to adapter/
    if joint:
        state = {k.removeprefix("heads."): v for k, v in state.items() if k.startswith("heads.")}
    if acc.is_main_process:
        heads = _fresh_heads(run)
        heads.load_state_dict(state)
        if os.path.abspath(directory) == os.path.abspath(run.cfg.output_dir):
            save_heads(heads, directory, extra_files=_heads_files(run, ev))
            if joint:
                save_adapter(run, os.path.join(directory, ADAPTER_DIR))
        else:
            with atomic_dir(directory, mode=DIR_MODE) as tmp:
                save_heads(heads, tmp, extra_files=_heads_files(run, ev))
                if joint:
                    save_adapter(run, os.path.join(tmp, ADAPTER_DIR))
    acc.wait_for_everyone()


def _save_best_copy(run: Run, best_dir: str, best_ev: dict[str, Any], ev: dict[str, Any]) -> None:
    """Main process: the heads (and Medusa-2 adapter) kept in ``best_dir`` become the output_dir's heads,
    with ``best_ev`` plus ``last`` (the final step's eval ``ev``) as their eval_results.json."""
    heads = _fresh_heads(run)
    heads.load_state_dict(load_file(os.path.join(best_dir, "model.safetensors")))
    save_heads(
        heads, run.cfg.output_dir, extra_files=_heads_files(run, best_ev | {"last": {"step": run.step, **ev}})
    )
    if run.cfg.joint.enabled:  # Medusa-2: the LoRA adapter of that same step, copied then renamed
        with atomic_dir(os.path.join(run.cfg.output_dir, ADAPTER_DIR), mode=DIR_MODE) as tmp:
            shutil.copytree(os.path.join(best_dir, ADAPTER_DIR), tmp, dirs_exist_ok=True)


def save_final(run: Run, ev: dict[str, Any] | None) -> dict[str, Any] | None:
    """Write the *best* heads by acceptance length τ (`run_eval`) to ``output_dir``, and return their eval.

    Without eval data these are the last heads. If the final eval is the best (ties go to the later
    step), the heads in memory are saved; otherwise the copy that `run_eval` kept in ``output_dir/best``
    is. ``eval_results.json`` holds the chosen step's eval plus ``last`` (the final step's eval); the
    last step's weights stay in the newest ``checkpoints/step-N`` when checkpoints are on.
    ``output_dir/best`` is removed once the heads are in place.
    """
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
            _save_best_copy(run, best_dir, best_ev, ev)
    acc.wait_for_everyone()
    if acc.is_main_process:  # finished before best/ goes: a resume after a kill here is a no-op, not a crash
        ckpt.mark_finished(run.cfg.output_dir, run.step)
        shutil.rmtree(best_dir, ignore_errors=True)
    acc.wait_for_everyone()
    return best_ev
