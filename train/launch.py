"""``accelerate launch`` for train/train_heads.py with one-line errors: the same arguments, the same launchers.

    python -m train.launch --config_file configs/accelerate/deepspeed_zero2.yaml --num_processes 8 \
        train/train_heads.py --config configs/llama-3.1-8b-eagle3.yaml [key=value ...]

``accelerate launch`` answers any failed training process with a traceback of its own (its single-process
launcher raises ``CalledProcessError``; the multi-process one, torch elastic, raises ``ChildFailedError``
with a report box), after the one-line ``error: ...`` the training script printed. This wrapper runs
accelerate's own launcher in-process and, when a training process fails, exits with that failure's status
and nothing more: the training script's own line (or its traceback, for a bug) is what the user reads.
The run config (file + ``key=value`` overrides) is also checked here first, before any process starts.
"""

from __future__ import annotations

import logging
import subprocess
import sys

from accelerate.commands.launch import launch_command, launch_command_parser
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from train.config import load_config
from train.train_heads import parse_args


def _check_run_config(script_args: list[str]) -> None:
    """Load the training script's config as train_heads would: a bad key or value is one line, now."""
    args = parse_args(script_args)
    try:
        load_config(args.config, list(args.overrides) + (["resume=auto"] if args.resume else []))
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit("error: " + " ".join(str(e).split())) from None


def main(argv: list[str] | None = None) -> None:
    args = launch_command_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.training_script.endswith("train_heads.py"):
        _check_run_config(list(args.training_script_args))
    # torch elastic logs one "failed (exitcode: N)" line per failed process before raising: the process's
    # own output already says what failed.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        launch_command(args)
    except subprocess.CalledProcessError as e:  # the single-process launcher
        raise SystemExit(e.returncode or 1) from None
    except Exception as e:
        if not isinstance(e, ChildFailedError):
            raise
        codes = [f.exitcode for f in e.failures.values()]
        raise SystemExit(next((c for c in codes if c and c > 0), 1)) from None


if __name__ == "__main__":
    main()
