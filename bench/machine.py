"""What machine a benchmark ran on (written into every results.json and results.md)."""

from __future__ import annotations

import contextlib
import os
import platform
import re

import torch
import transformers


def machine_info(device: torch.device) -> dict:
    """CPU model, cores, torch threads, GPU name, library versions; ``summary`` is one line of them."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.+)", f.read())
            cpu = m.group(1).strip() if m else cpu
    info = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
    }
    where = info["gpu"] or f"{cpu}, {info['cores']} cores, {info['torch_threads']} torch threads"
    info["summary"] = f"{where}; torch {torch.__version__}, transformers {transformers.__version__}"
    return info
