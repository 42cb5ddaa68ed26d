"""Serve exported heads in vLLM or SGLang and compare their acceptance length with selfspec's τ.

    python scripts/gpu_engine_check.py --engine vllm --target DIR --heads DIR --prompts P.jsonl --out R.json
    python scripts/gpu_engine_check.py --engine sglang ...   # in an environment with SGLang installed

A thin command line over `bench.engine_accept` (what it measures is in its docstring). Needs a CUDA GPU
and the engine installed; without a GPU it stops with one line (exit 2). Exit 1 when the engine's τ falls
short of selfspec's by more than --tolerance.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # bench/ sits beside the packages

from bench.engine_accept import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
