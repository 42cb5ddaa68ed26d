"""What the benchmark measures per call: wall time (CUDA-synchronised), peak memory, the target's forward
calls (τ of HF methods), and the latency of a k-token verify forward; plus the greedy-mismatch probes."""

from __future__ import annotations

import re
import statistics
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from heads.graft import run_target_lean
from infer.cache import new_cache


def random_llama(
    config: dict, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0
) -> LlamaForCausalLM:
    """A frozen ``LlamaForCausalLM`` (sdpa) with random weights from ``config`` (LlamaConfig keyword
    arguments), initialised directly on ``device``: timing does not depend on the weights."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM._from_config(LlamaConfig(**config), attn_implementation="sdpa")
    return model.to(dtype).eval().requires_grad_(False)


def sync(device: torch.device) -> None:
    """Wait for the device's queued kernels (CUDA); a no-op on CPU, where calls are synchronous."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PeakMemory:
    """Per-call peak memory in MiB; ``kind`` says what is measured (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cuda":
            self.kind = "cuda.max_memory_allocated, reset before each call"
        elif self._can_reset_rss():
            self.kind = "peak RSS of the process (VmHWM), reset before each call via /proc/self/clear_refs"
        else:
            self.kind = "peak RSS of the whole process so far (resource.getrusage; not per call)"

    @staticmethod
    def _can_reset_rss() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return PeakMemory._vmhwm_kib() is not None
        except OSError:
            return False

    @staticmethod
    def _vmhwm_kib() -> int | None:
        with open("/proc/self/status") as f:
            m = re.search(r"VmHWM:\s+(\d+)\s*kB", f.read())
        return int(m.group(1)) if m else None

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.kind.startswith("peak RSS of the process"):
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")

    def read_mib(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        if self.kind.startswith("peak RSS of the process"):
            return (self._vmhwm_kib() or 0) / 1024
        import resource  # POSIX only: imported where the other two ways are unavailable

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        return rss / (2**20 if sys.platform == "darwin" else 1024)


class ForwardRecorder:
    """Counts the target's forward calls and the cache length before each, to get τ for HF methods.

    Step lengths: consecutive decode forwards start ``s_i`` and ``s_{i+1}`` apart, which is what step i
    emitted (accepted candidates + the bonus token); the last step emitted ``final_len - 1 - s_last``.
    """

    def __init__(self, model) -> None:
        self.model, self.starts, self.handle = model, [], None

    def _hook(self, module, args, kwargs) -> None:
        # The cache length before the call: the first position id, else the cache's own count (the
        # kwarg is `cache` in transformers >= 5.2x, `past_key_values` before).
        start = None
        for key in ("position_ids", "cache_position"):
            if kwargs.get(key) is not None:
                start = int(kwargs[key].reshape(-1)[0])
                break
        if start is None:
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            if cache is not None and hasattr(cache, "get_seq_length"):
                start = int(cache.get_seq_length())
        self.starts.append(start)

    def __enter__(self) -> ForwardRecorder:
        self.starts = []
        self.handle = self.model.register_forward_pre_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()

    def step_lengths(self, final_len: int) -> list[int] | None:
        s = self.starts[1:]  # [0] is the prefill
        if not s or any(x is None for x in s):
            return None
        return [b - a for a, b in zip(s, s[1:], strict=False)] + [final_len - 1 - s[-1]]


# ----------------------------------------------------------------------------- methods


@torch.inference_mode()
def tie_margin(target, seq: torch.Tensor, prompt_len: int, pos: int, a: int, b: int) -> float:
    """|logit[a] - logit[b]| of the target (one full forward over the common prefix) at new-token ``pos``."""
    logits = target(input_ids=seq[:, : prompt_len + pos]).logits[0, -1].float()
    return abs(float(logits[a] - logits[b]))


def first_difference(ref: torch.Tensor, out: torch.Tensor) -> int | None:
    """Index of the first differing position of two [1, L] sequences (a length difference counts)."""
    n = min(ref.shape[1], out.shape[1])
    diff = (ref[0, :n] != out[0, :n].to(ref.device)).nonzero()
    if len(diff):
        return int(diff[0, 0])
    return n if ref.shape[1] != out.shape[1] else None


@torch.inference_mode()
def verify_cost(target, ks: list[int], prefix: int = 256, reps: int = 30) -> dict:
    """Latency of one target forward over k new tokens after a ``prefix``-token cache, ratio to k=1.

    The k values are interleaved within each repetition (so load changes hit all alike); median over
    repetitions after 5 warm-up rounds. Random token ids: the cost does not depend on the values.
    """
    device = next(target.parameters()).device
    V = target.config.get_text_config().vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (1, prefix), generator=g).to(device)
    cache = new_cache()
    run_target_lean(target, ids, cache=cache, use_cache=True)
    times = {k: [] for k in ks}
    for r in range(reps + 5):
        for k in ks:
            x = torch.randint(0, V, (1, k), generator=g).to(device)
            sync(device)
            t = time.perf_counter()
            run_target_lean(
                target, x, logits_to_keep=0, cache=cache, use_cache=True
            )  # all k logits, as a verify
            sync(device)
            if r >= 5:
                times[k].append(time.perf_counter() - t)
            cache.crop(-k)
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med[min(ks)]
    return {
        "prefix_tokens": prefix,
        "repetitions": reps,
        "ms": {str(k): round(v * 1e3, 3) for k, v in med.items()},
        "ratio_to_k1": {str(k): round(v / base, 3) for k, v in med.items()},
    }
