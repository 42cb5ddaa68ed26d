"""What a heads checkpoint is never trusted with: paths, sizes, and the target it claims to fit.

A checkpoint (a local directory or a Hub snapshot) is data. `heads.base.load_heads` and ``infer.load``
read it through the checks here, each failing with one line that names the file, the key and the
allowed range, before anything expensive is built:

- **paths** (`inside`): every file or directory named by a checkpoint, or read from it under a fixed
  name, must resolve (symlinks included) to a place inside it. Absolute paths, ``~`` and ``..`` escapes
  are refused. A Hub snapshot's files are symlinks into the same repo's ``blobs/``, so for a directory
  ``.../models--org--name/snapshots/<commit>`` the repo's cache folder is the boundary.
- **sizes** (`check_sizes`, `check_weights_header`): every size in ``config.json`` is an int within
  `LIMITS` (and, given a target, equal to the target's: `HeadConfig.check_target`), and the tensor
  names and shapes the config implies (the module built on the ``meta`` device: no memory) must be
  exactly those in the ``model.safetensors`` header (read without loading any tensor). Only then is
  the module built; its memory is then that of the weights file.
- (draft-tree settings saved with the heads, ``inference.json``, are `infer`'s and are
  bounded there: `infer.settings`.)
- **the target** (`target_fingerprint`, `identity_problems`): heads record the target's architecture
  and a fingerprint of its embedding and lm_head; a different target of the same sizes is refused.

And the other way round, what leaves the machine: `scrub` cuts every absolute local path in a JSON/YAML
document to its last component before a push uploads it (`heads.hub.upload_payloads`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from heads.graft import unwrap_peft

# Bounds on the sizes a heads config may state. Generous against today's models (vocabularies up to
# ~262k, hidden sizes up to ~16k, Medusa 4-5 heads of 1 layer, EAGLE-3 7 TTT steps), small enough that
# nothing absurd is ever allocated or looped over.
LIMITS: dict[str, tuple[int, int]] = {
    "vocab_size": (1, 1 << 22),
    "hidden_size": (1, 1 << 16),
    "num_heads": (1, 64),
    "num_layers": (0, 64),
    "draft_vocab_size": (1, 1 << 22),
    "ttt_steps": (1, 64),
}
# The same for the target's config stored with EAGLE heads (``target_config``), from which the draft
# layer is rebuilt.
TARGET_CONFIG_LIMITS: dict[str, tuple[int, int]] = {
    "vocab_size": (1, 1 << 22),
    "hidden_size": (1, 1 << 16),
    "intermediate_size": (1, 1 << 20),
    "num_attention_heads": (1, 1024),
    "num_key_value_heads": (1, 1024),
    "head_dim": (1, 4096),
    "num_hidden_layers": (1, 4096),
}
FINGERPRINT_POSITIONS = 32  # values sampled from each of the embedding and the lm_head


def short_list(items: Sequence[Any], n: int = 4) -> str:
    """``[a, b, c, d, ...]`` with the total count: error messages stay one short line."""
    items = list(items)
    head = ", ".join(map(str, items[:n]))
    return f"[{head}]" if len(items) <= n else f"[{head}, ... ({len(items)} in all)]"


# ---------------------------------------------------------------------------------------------- paths


def boundary(directory: str) -> str:
    """The real path a checkpoint's files must stay inside: the directory itself, or for a Hub snapshot
    (``models--org--name/snapshots/<commit>``) the repo's cache folder, whose ``blobs/`` the
    snapshot's symlinks point into."""
    real = os.path.realpath(directory)
    parent = os.path.dirname(real)
    if os.path.basename(parent) == "snapshots" and os.path.basename(os.path.dirname(parent)).count("--") >= 1:
        return os.path.dirname(parent)
    return real


def inside(directory: str, relative: str, what: str = "path") -> str:
    """``directory/relative`` after checking that it stays inside the checkpoint (symlinks resolved).

    ``relative`` comes from the checkpoint (a key of its config) or is a fixed file name. Raises
    ``ValueError`` for an absolute path, a ``~`` path, a ``..`` that leaves the directory, or a symlink
    whose target is outside `boundary`. Returns the joined (unresolved) path; it need not exist.
    """
    if not isinstance(relative, str) or not relative:
        raise ValueError(f"{directory}: {what} must be a non-empty relative path, got {relative!r}")
    if os.path.isabs(relative) or relative.startswith(("~", "/", "\\")):
        raise ValueError(
            f"{directory}: {what} {relative!r} is an absolute path; a checkpoint may only name files inside it"
        )
    joined = os.path.join(directory, relative)
    if ".." in relative.replace("\\", "/").split("/"):
        raise ValueError(f"{directory}: {what} {relative!r} leaves the checkpoint directory ('..')")
    root = boundary(directory)
    real = os.path.realpath(joined)
    if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
        raise ValueError(
            f"{directory}: {what} {relative!r} resolves to {real}, outside the checkpoint (a symlink out of it)"
        )
    return joined


# What an uploaded file may say about a path of this machine (`heads.hub.upload_payloads`, model cards).

_WINDOWS_ABS = re.compile(r"^[A-Za-z]:[\\/]")


def is_local_path(value: Any) -> bool:
    """True for a string that is an absolute or home-relative local path, or climbs out with ``..``."""
    if not isinstance(value, str) or not value:
        return False
    return (
        value.startswith(("/", "~", "\\"))
        or bool(_WINDOWS_ABS.match(value))
        or ".." in value.replace("\\", "/").split("/")
    )


def public_name(value: Any) -> Any:
    """What an uploaded file may say for ``value``: a local absolute path becomes its last component
    (``/home/me/models/llama-8b`` -> ``llama-8b``); Hub ids, relative paths and non-strings are kept."""
    if not is_local_path(value):
        return value
    return os.path.basename(os.path.normpath(os.path.expanduser(value))) or None


def scrub(obj: Any, found: set[str] | None = None) -> Any:
    """``obj`` (parsed JSON/YAML) with every local path string replaced by `public_name`; the paths
    replaced are added to ``found``."""
    if isinstance(obj, dict):
        return {k: scrub(v, found) for k, v in obj.items()}
    if isinstance(obj, list):
        return [scrub(v, found) for v in obj]
    if is_local_path(obj):
        if found is not None:
            found.add(obj)
        return public_name(obj)
    return obj


# ---------------------------------------------------------------------------------------------- sizes


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_range(where: str, key: str, v: Any, lo: int, hi: int, nullable: bool = False) -> None:
    if v is None and nullable:
        return
    if not _is_int(v) or not lo <= v <= hi:
        raise ValueError(f"{where}: {key!r} must be an int in [{lo}, {hi}], got {_short(v)}")


def _short(v: Any, n: int = 60) -> str:
    text = repr(v)
    return text if len(text) <= n else text[:n] + "..."


def check_sizes(raw: dict[str, Any], where: str) -> None:
    """Raise ``ValueError`` unless every size in a heads ``config.json`` dict is an int within `LIMITS`
    (``draft_vocab_size`` may be null), and those of its ``target_config`` and ``draft_layer_config``
    within `TARGET_CONFIG_LIMITS`."""
    for key, (lo, hi) in LIMITS.items():
        if key in raw:
            _check_range(where, key, raw[key], lo, hi, nullable=key == "draft_vocab_size")
    # EAGLE heads rebuild their layer from one of these two dicts (draft_layer: target | llama)
    for name in ("target_config", "draft_layer_config"):
        tc = raw.get(name)
        if not isinstance(tc, dict):
            continue
        if "auto_map" in tc:  # the draft layer is rebuilt from this config: never from remote code
            raise ValueError(f"{where}: {name}.auto_map names remote model code; it is refused")
        for key, (lo, hi) in TARGET_CONFIG_LIMITS.items():
            if key in tc:
                _check_range(where, f"{name}.{key}", tc[key], lo, hi, nullable=key == "head_dim")


def header_shapes(path: str) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} from a safetensors file's header; no tensor is read."""
    try:
        with safe_open(path, "pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(
            f"{path} could not be read (corrupt or truncated checkpoint?): {str(e)[:200]}"
        ) from e


def expected_shapes(module_cls: type[nn.Module], config: Any) -> dict[str, tuple[int, ...]]:
    """{name: shape} of the state dict ``module_cls(config)`` would have, built on the meta device (no
    memory, no initialisation)."""
    with torch.device("meta"):
        skeleton = module_cls(config)
    return {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}


def compare_shapes(want: dict[str, tuple[int, ...]], have: dict[str, tuple[int, ...]]) -> list[str]:
    """What differs between two {name: shape} maps, as short phrases (empty: they agree)."""
    missing, unexpected = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    shapes = [f"{k} {have[k]} != {want[k]}" for k in sorted(set(want) & set(have)) if have[k] != want[k]]
    problems = []
    if missing:
        problems.append(f"missing {short_list(missing)}")
    if unexpected:
        problems.append(f"unexpected {short_list(unexpected)}")
    if shapes:
        problems.append(f"shapes differ: {short_list(shapes, 3)}")
    return problems


def check_weights_header(module_cls: type[nn.Module], config: Any, path: str) -> None:
    """Raise ``ValueError`` (one line) unless the safetensors file at ``path`` holds exactly the tensors,
    of exactly the shapes, that heads of ``config`` have. Runs before the real module is built."""
    problems = compare_shapes(expected_shapes(module_cls, config), header_shapes(path))
    if problems:
        raise ValueError(
            f"{path} does not match {config.head_type} heads of the config.json beside it: "
            + "; ".join(problems)
        )


# ---------------------------------------------------------------------------------------------- target


def _sample(weight: torch.Tensor) -> list[float] | None:
    """``FINGERPRINT_POSITIONS`` values of a [V, H] matrix at fixed positions spread over its rows (row
    ``(2i+1)·V/(2n)``, column ``(37i + 11) mod H``), as float32 rounded to 6 significant digits; None
    when the weights are not readable here (meta/offloaded or not floating point)."""
    if weight.dim() != 2 or weight.device.type == "meta" or not weight.dtype.is_floating_point:
        return None
    V, H = weight.shape
    n = FINGERPRINT_POSITIONS
    rows = torch.tensor([((2 * i + 1) * V) // (2 * n) for i in range(n)], device=weight.device)
    cols = torch.tensor([(37 * i + 11) % H for i in range(n)], device=weight.device)
    values = weight.detach()[rows, cols].float().cpu().tolist()
    return [float(f"{v:.6g}") for v in values]


def target_fingerprint(target: nn.Module) -> dict[str, Any] | None:
    """A cheap, dtype-tolerant fingerprint of the target's embedding and lm_head.

    Not a hash of the whole matrices (that would read GBs for an 8B model) and not a sha256 of sampled
    rows (the same model loaded in bf16 and fp32 hashes differently): 32 values of each matrix at fixed
    positions (`_sample`), compared with a relative tolerance of 2% (`identity_problems`), which bf16
    rounding (0.4%) passes and an independently trained model of the same sizes does not.
    """
    emb, lm = target.get_input_embeddings(), target.get_output_embeddings()
    e = _sample(emb.weight) if emb is not None else None
    o = _sample(lm.weight) if lm is not None else None
    if e is None or o is None:
        return None
    return {"version": 1, "embed": e, "lm_head": o}


def target_architecture(target: nn.Module) -> tuple[str, str]:
    """(model class name, model_type) of the target, a PEFT wrapper looked through."""
    inner = unwrap_peft(target)
    return type(inner).__name__, str(getattr(target.config.get_text_config(), "model_type", ""))


def _close(a: Sequence[float], b: Any) -> bool:
    numbers = isinstance(b, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in b)
    if not numbers or len(a) != len(b):  # a malformed record never matches
        return False
    scale = max((abs(x) for x in (*a, *b)), default=0.0)
    return all(
        math.isfinite(x) and math.isfinite(y) and abs(x - y) <= 0.02 * max(abs(x), abs(y)) + 1e-6 * scale
        for x, y in zip(a, b, strict=True)
    )


def identity_problems(config: Any, target: nn.Module) -> list[str]:
    """How ``target`` differs from the one the heads recorded (architecture, model_type, fingerprint of
    embedding and lm_head); empty when it is the same or the heads recorded nothing (older heads)."""
    problems = []
    arch, model_type = target_architecture(target)
    want_arch = getattr(config, "target_architecture", None)
    want_type = getattr(config, "target_model_type", None)
    if want_arch and want_arch != arch:
        problems.append(f"architecture {arch} != {want_arch}")
    if want_type and want_type != model_type:
        problems.append(f"model_type {model_type!r} != {want_type!r}")
    want = getattr(config, "target_fingerprint", None)
    if isinstance(want, dict):
        have = target_fingerprint(target)
        if have is not None:
            for part in ("embed", "lm_head"):
                if not _close(have[part], want.get(part) or []):
                    problems.append(f"its {part} weights differ (fingerprint)")
    return problems
