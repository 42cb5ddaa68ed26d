"""Which floating-point format is fast on this machine: bf16 only where the hardware computes it natively.

Why it matters: on a CPU without bf16 matrix instructions PyTorch emulates bf16 (converts to fp32 and
back around every kernel), so bf16 autocast is far *slower* than fp32. Measured on a 2-core AMD EPYC
(avx2, no avx512_bf16 / amx_bf16): one demo-target training step took 65-80 s in bf16 autocast against
1.5-5 s in fp32; on an Intel AMX machine the same step took 0.8 s in bf16.

The rule (`fast_precision`):
- CUDA: bf16 where ``torch.cuda.is_bf16_supported()`` (Ampere and newer), else fp32.
- Linux x86: bf16 where ``/proc/cpuinfo`` lists ``avx512_bf16`` or ``amx_bf16``; Linux arm64: where it
  lists the ``bf16`` feature (ARMv8.6 BFMMLA/BFDOT); else fp32.
- Anywhere else (macOS, Windows, no readable cpuinfo): fp32, because native bf16 cannot be confirmed and
  emulated bf16 is the slow case.

An explicit ``bf16`` / ``fp32`` wherever a precision is taken overrides the rule.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

import torch

FAST = "fast"  # the precision value that means "pick with `fast_precision`"
X86_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
ARM_BF16_FEATURE = "bf16"
PRECISIONS = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class Precision:
    """A chosen precision: ``name`` ("bf16" or "fp32") and ``reason`` (why, for the one printed line)."""

    name: str
    reason: str

    @property
    def dtype(self) -> torch.dtype:
        return PRECISIONS[self.name]

    @property
    def line(self) -> str:
        return f"precision: {self.name} ({self.reason})"


def cpu_bf16_flags(cpuinfo: str) -> list[str]:
    """The native-bf16 flags in ``/proc/cpuinfo`` text (x86 ``flags`` lines, arm64 ``Features`` lines)."""
    found: set[str] = set()
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, words = key.strip().lower(), set(value.split())
        if key == "flags":
            found.update(f for f in X86_BF16_FLAGS if f in words)
        elif key == "features" and ARM_BF16_FEATURE in words:
            found.add(ARM_BF16_FEATURE)
    return sorted(found)


def _read_cpuinfo() -> str | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def cpu_precision(cpuinfo: str | None) -> Precision:
    """The CPU rule of the module docstring, for ``cpuinfo`` text (None: not readable / not Linux)."""
    if cpuinfo is None:
        return Precision("fp32", "cannot read /proc/cpuinfo to confirm native bf16; emulated bf16 is slow")
    flags = cpu_bf16_flags(cpuinfo)
    if flags:
        return Precision("bf16", f"CPU has native bf16: {', '.join(flags)}")
    return Precision(
        "fp32",
        "CPU lacks native bf16 (no avx512_bf16 / amx_bf16 / bf16 in /proc/cpuinfo); emulated bf16 is slow",
    )


@functools.cache
def _machine_precision(device_type: str) -> Precision:
    if device_type == "cuda":
        if torch.cuda.is_bf16_supported():
            return Precision("bf16", f"CUDA {torch.cuda.get_device_name()} supports bf16")
        return Precision("fp32", f"CUDA {torch.cuda.get_device_name()} lacks bf16")
    return cpu_precision(_read_cpuinfo())


def fast_precision(requested: str = FAST, device: str | torch.device | None = None) -> Precision:
    """``requested`` = "fast": the rule of the module docstring for ``device`` (default: CUDA if available,
    else CPU); "bf16" / "fp32" (or bfloat16 / float32): that, as asked."""
    aliases = {"bf16": "bf16", "bfloat16": "bf16", "fp32": "fp32", "float32": "fp32"}
    if requested in aliases:
        return Precision(aliases[requested], "asked for explicitly")
    if requested != FAST:
        raise ValueError(f"precision must be fast, bf16 or fp32; got {requested!r}")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return _machine_precision(torch.device(device).type)
