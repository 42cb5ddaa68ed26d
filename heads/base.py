"""What every head type shares: a validated config, the registry, and heads-only save/load.

A head checkpoint is a directory with ``config.json`` (head type, head hyper-parameters, the target's
``base_model_name_or_path``, vocab and hidden size, and the selfspec version) and ``model.safetensors``
holding only the heads' own tensors, never the target's. Loading goes through safetensors, so no
pickled code is ever executed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any, ClassVar

from torch import nn

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"

# head_type -> (config class, module class); filled by each head file via `register`.
REGISTRY: dict[str, tuple[type[HeadConfig], type[nn.Module]]] = {}


def library_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("selfspec")
    except PackageNotFoundError:
        return "0+unknown"


@dataclass
class HeadConfig:
    """Fields common to all head types. ``hidden_size``/``vocab_size`` are the target's (0 = not set yet)."""

    head_type: ClassVar[str] = ""
    hidden_size: int = 0
    vocab_size: int = 0
    base_model_name_or_path: str | None = None

    def __post_init__(self) -> None:
        if self.hidden_size < 0 or self.vocab_size < 0:
            raise ValueError(
                f"hidden_size and vocab_size must be >= 0, got {self.hidden_size}, {self.vocab_size}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "head_type": self.head_type,
            **dataclasses.asdict(self),
            "selfspec_version": library_version(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HeadConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names - {"head_type", "selfspec_version"}
        if unknown:
            raise ValueError(f"unknown keys for {cls.head_type} head config: {sorted(unknown)}")
        return cls(**{k: v for k, v in d.items() if k in names})

    def check_target(self, target: nn.Module) -> None:
        """Raise ``ValueError`` if these heads were trained for a target of another shape."""
        from heads.graft import target_dims

        vocab, hidden = target_dims(target)
        problems = []
        if self.vocab_size != vocab:
            problems.append(f"vocab size {self.vocab_size} != target's {vocab}")
        if self.hidden_size != hidden:
            problems.append(f"hidden size {self.hidden_size} != target's {hidden}")
        if problems:
            name = getattr(target.config, "_name_or_path", "") or type(target).__name__
            raise ValueError(
                f"{self.head_type} heads were trained for {self.base_model_name_or_path!r} and do not fit target "
                f"{name!r}: " + "; ".join(problems)
            )


def register(config_cls: type[HeadConfig], module_cls: type[nn.Module]) -> None:
    REGISTRY[config_cls.head_type] = (config_cls, module_cls)


def _atomic_write(path: str, write) -> None:
    """Write through a temp file in the same directory, then rename: a crash never leaves half a file."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=os.path.basename(path))
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def save_heads(heads: nn.Module, output_dir: str, extra_files: dict[str, str] | None = None) -> None:
    """Write ``config.json`` + ``model.safetensors`` (heads' own tensors only) to ``output_dir``."""
    from safetensors.torch import save_file

    os.makedirs(output_dir, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in heads.state_dict().items()}
    _atomic_write(
        os.path.join(output_dir, WEIGHTS_NAME), lambda p: save_file(state, p, metadata={"format": "pt"})
    )
    cfg = json.dumps(heads.config.to_dict(), indent=2, sort_keys=True) + "\n"
    _atomic_write(os.path.join(output_dir, CONFIG_NAME), lambda p: open(p, "w").write(cfg))
    for name, text in (extra_files or {}).items():
        _atomic_write(os.path.join(output_dir, name), lambda p, t=text: open(p, "w").write(t))


def resolve_dir(path_or_id: str, revision: str | None = None) -> str:
    """A local directory as is, or a Hub id downloaded into the standard HF cache."""
    from heads.graft import looks_local

    expanded = os.path.expanduser(path_or_id)
    if os.path.isdir(expanded):
        return expanded
    if looks_local(path_or_id):
        raise FileNotFoundError(f"heads directory not found: {path_or_id!r}")
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(
            path_or_id, revision=revision, allow_patterns=["*.json", "*.safetensors", "*.md"]
        )
    except Exception as e:  # the hub raises many types; the user needs the id and the reason
        raise OSError(f"could not fetch heads {path_or_id!r} from the Hugging Face Hub: {e}") from e


def read_config(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, CONFIG_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing: not a selfspec heads checkpoint")
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON (corrupt checkpoint?): {e}") from e


def load_heads(
    path_or_id: str,
    target: nn.Module | None = None,
    *,
    revision: str | None = None,
    device=None,
    dtype=None,
) -> nn.Module:
    """Load heads saved by `save_heads` from a local dir or Hub id; check them against ``target`` if given."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = resolve_dir(path_or_id, revision)
    raw = read_config(directory)
    head_type = raw.get("head_type")
    if head_type not in REGISTRY:
        raise ValueError(f"{directory}: unknown head_type {head_type!r}; known: {sorted(REGISTRY)}")
    config_cls, module_cls = REGISTRY[head_type]
    config = config_cls.from_dict(raw)
    if target is not None:
        config.check_target(target)
    heads = module_cls(config)
    wpath = os.path.join(directory, WEIGHTS_NAME)
    if not os.path.isfile(wpath):
        raise FileNotFoundError(f"{wpath} is missing: not a selfspec heads checkpoint")
    try:
        state = load_file(wpath)
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"{wpath} could not be read (corrupt or truncated checkpoint?): {e}") from e
    missing, unexpected = heads.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{wpath} does not match {head_type} heads with this config: missing {missing}, unexpected {unexpected}"
        )
    if target is not None and device is None:
        device = next(target.parameters()).device
    return heads.to(device=device, dtype=dtype).eval()
