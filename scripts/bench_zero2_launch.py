"""Wall time of a 2-process DeepSpeed ZeRO-2 training run on CPU: ``accelerate launch`` with
configs/accelerate/deepspeed_zero2.yaml and configs/demo-medusa-tiny.yaml (the tiny demo target and data,
built into $SELFSPEC_CACHE on first use), into a temporary output_dir.

    python scripts/bench_zero2_launch.py [--steps 6] [--repeats 1]

Prints one line per run: the launch's wall time (process start-up, DeepSpeed's CPU set-up, training,
checkpoints and the final save together) and its exit status. tests/test_train.py checks what such a run
writes; how long it takes is measured here only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch(steps: int, out: str, port: int) -> subprocess.CompletedProcess:
    cache = os.environ.get("SELFSPEC_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "selfspec")
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONPATH=ROOT,
               TORCH_EXTENSIONS_DIR=os.environ.get("TORCH_EXTENSIONS_DIR", os.path.join(cache, "torch_extensions")))  # fmt: skip
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--quiet",
        "--config_file", os.path.join(ROOT, "configs/accelerate/deepspeed_zero2.yaml"),
        "--num_processes", "2", "--main_process_port", str(port),
        os.path.join(ROOT, "train/train_heads.py"), "--config", os.path.join(ROOT, "configs/demo-medusa-tiny.yaml"),
        f"train.max_steps={steps}", f"train.save_every={max(steps // 2, 1)}", f"output_dir={out}",
    ]  # fmt: skip
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=6, help="optimizer steps per run")
    p.add_argument("--repeats", type=int, default=1, help="runs, each into a fresh output_dir")
    p.add_argument("--port", type=int, default=29561, help="the launcher's main process port")
    args = p.parse_args(argv)
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            proc = launch(args.steps, os.path.join(tmp, "run"), args.port)
            wall = time.perf_counter() - t0
        print(
            f"run {i + 1}: {args.steps} steps, 2 processes, ZeRO-2 on CPU: {wall:.1f} s (exit {proc.returncode})"
        )
        if proc.returncode:
            print(proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(proc.returncode)


if __name__ == "__main__":
    main()
