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
import warnings
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, ClassVar

from huggingface_hub import constants, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from heads import gguf, registry
from heads.graft import adapter_fingerprint, adapter_info, looks_local, target_dims, unwrap_peft
from heads.guard import (
    check_sizes,
    check_weights_header,
    identity_problems,
    inside,
    short_list,
    target_architecture,
    target_fingerprint,
)
from heads.io import atomic_write

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
ADAPTER_DIR = "adapter"  # a PEFT adapter of the target stored with the heads (Medusa-2's LoRA)
LIBRARY_NAME = "selfspec"
LOGIN_HINT = "run `hf auth login`, set the HF_TOKEN environment variable, or pass token="
# What a Hub download of heads fetches: configs, weights, the card, a stored adapter, and the two pickle
# names of original Medusa / EAGLE checkpoints, which `heads.convert.import_heads` reads only with
# torch.load(weights_only=True).
HUB_PATTERNS = [
    "*.json",
    "*.safetensors",
    "*.md",
    "medusa_lm_head.pt",
    "pytorch_model.bin",
    f"{ADAPTER_DIR}/*",
]
# Inference settings tuned for these heads (`infer.settings`; heads only upload them, `infer` reads them)
INFERENCE_NAME = "inference.json"  # written by `infer.tune_tree`


def library_version() -> str:
    try:
        return version("selfspec")
    except PackageNotFoundError:
        return "0+unknown"


@dataclass
class HeadConfig:
    """Fields common to all head types. ``hidden_size``/``vocab_size`` are the target's (0 = not set yet).

    ``target_adapter``: the PEFT adapter the target carried in training (a Hub id or path, or a path
    relative to the heads directory, e.g. ``"adapter"`` for Medusa-2's own LoRA); None = the plain
    target. ``target_adapter_sha256`` is its weight file's hash (`heads.graft.adapter_fingerprint`), so
    the same adapter is recognised under another path. Heads only fit the target they were trained on.

    ``target_architecture`` / ``target_model_type`` / ``target_fingerprint`` identify that target (its
    model class, model_type, and `heads.guard.target_fingerprint` of its embedding and lm_head; set by
    `record_target`); loading onto another target is refused (`check_identity`). None: not recorded
    (heads saved before these fields existed), and then not checked.

    ``target_gguf``: for a target dequantised from a GGUF file, that file (`heads.gguf.describe`: name,
    size, sha256, quantisation, Hub model, built-in name); ``base_model_name_or_path`` is then the Hub
    model it is a release of, where known. None for any other target.
    """

    head_type: ClassVar[str] = ""
    hidden_size: int = 0
    vocab_size: int = 0
    base_model_name_or_path: str | None = None
    target_adapter: str | None = None
    target_adapter_sha256: str | None = None
    target_architecture: str | None = None
    target_model_type: str | None = None
    target_fingerprint: dict[str, Any] | None = None
    target_gguf: dict[str, Any] | None = None

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
            raise ValueError(f"unknown keys for {cls.head_type} head config: {short_list(sorted(unknown))}")
        for f in dataclasses.fields(cls):  # a wrong type from a file is one line, not a TypeError later
            if f.name not in d or f.default is dataclasses.MISSING or f.default is None:
                continue
            v, kind = d[f.name], type(f.default)
            if kind is float:
                ok = isinstance(v, (int, float)) and not isinstance(v, bool)
            elif kind is bool:
                ok = isinstance(v, bool)
            elif kind in (int, str):
                ok = isinstance(v, kind) and not isinstance(v, bool)
            else:
                continue
            if not ok:
                raise ValueError(
                    f"{cls.head_type} head config: {f.name} must be {kind.__name__}, got {str(v)[:60]!r}"
                )
        return cls(**{k: v for k, v in d.items() if k in names})

    def check_target(self, target: nn.Module) -> None:
        """Raise ``ValueError`` if these heads were trained for a target of another shape."""
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
        self.check_adapter(target)

    def record_adapter(self, target: nn.Module) -> None:
        """Note the PEFT adapter ``target`` carries (see `heads.graft.adapter_info`) in this config.

        A local adapter's path is kept for the record (and scrubbed from uploads: `heads.hub.scrub`), but
        loading never follows it: only an adapter inside the heads directory or a Hub id is applied from
        the config (`adapter_location`); for any other, pass ``adapter=``."""
        info = adapter_info(target) or {}
        self.target_adapter = info.get("name_or_path")
        self.target_adapter_sha256 = info.get("sha256")

    def record_target(self, target: nn.Module) -> None:
        """Note which target these heads are made for: its adapter (`record_adapter`), its model class and
        model_type, the fingerprint of its embedding and lm_head (`heads.guard.target_fingerprint`), and the
        GGUF file it was dequantised from with the Hub model that file is a release of (`heads.gguf`)."""
        self.record_adapter(target)
        self.target_gguf = gguf.source_of(unwrap_peft(target))
        if self.target_gguf and self.target_gguf.get("hub_model"):
            self.base_model_name_or_path = self.target_gguf["hub_model"]
        self.target_architecture, self.target_model_type = target_architecture(target)
        self.target_fingerprint = target_fingerprint(target)

    def check_identity(self, target: nn.Module, allow_other_target: bool = False) -> None:
        """Raise ``ValueError`` if ``target`` is not the model these heads recorded (`record_target`): a
        different architecture, or other embedding / lm_head weights, even with the same sizes. Outputs
        would still be the target's own, but the heads would draft for another model: acceptance, and so
        the speedup, would be lost. ``allow_other_target=True`` turns the error into a warning."""
        problems = identity_problems(self, target)
        if not problems:
            return
        name = getattr(target.config, "_name_or_path", "") or type(target).__name__
        text = (
            f"{self.head_type} heads were trained on another target than {name!r} ({'; '.join(problems)}): "
            "they fit its sizes, so outputs stay the target's own, but their drafts would rarely be accepted"
        )
        if not allow_other_target:
            raise ValueError(text + "; pass allow_other_target=True to use them anyway")

        warnings.warn(text, stacklevel=3)

    def check_adapter(self, target: nn.Module) -> None:
        """Raise ``ValueError`` unless ``target`` carries the PEFT adapter these heads were trained with.

        An adapter changes the target's hidden states and logits, so heads trained on the plain model
        and heads trained on an adapted one are not interchangeable. Two adapters are told apart by
        the hash of their weights when both are known, else by their Hub ids; an adapter of unknown
        origin (a ``PeftModel`` built by the caller) is accepted for heads that recorded one.
        """
        info = adapter_info(target)
        base = self.base_model_name_or_path
        if self.target_adapter is None and info is None:
            return
        if info is None:
            raise ValueError(
                f"{self.head_type} heads were trained on {base!r} with the PEFT adapter {self.target_adapter!r}, "
                "but the target has no adapter: load the target with it (infer.load(target, heads) does, or "
                "heads.load_target(..., adapter=...))"
            )
        theirs = info["name_or_path"] or "a PeftModel"
        if self.target_adapter is None:
            raise ValueError(
                f"the target carries the PEFT adapter {theirs!r} but these {self.head_type} heads were trained "
                f"on the plain {base!r}: load the target without the adapter, or train heads on the adapted "
                "target (target.adapter in the training config)"
            )
        mine, sha = self.target_adapter, info["sha256"]
        if self.target_adapter_sha256 and sha:
            differ = self.target_adapter_sha256 != sha
        else:  # without both hashes, only two Hub ids ("org/name") can be compared by name
            ids = [
                n for n in (mine, info["name_or_path"]) if n and n.count("/") == 1 and not os.path.exists(n)
            ]
            differ = len(ids) == 2 and ids[0] != ids[1]
        if differ:
            raise ValueError(
                f"{self.head_type} heads were trained on {base!r} with the PEFT adapter {mine!r} "
                f"(sha256 {str(self.target_adapter_sha256)[:12]}), but the target carries another adapter, "
                f"{theirs!r} (sha256 {str(sha)[:12]}): load the target with the heads' adapter"
            )


def adapter_location(directory: str | None, recorded: str) -> str:
    """Where to load a heads config's ``target_adapter`` from: inside the heads ``directory`` (a relative
    path, as Medusa-2 saves its LoRA in ``adapter/``), or a Hub id (``org/name``).

    Nothing else: the config is data from a checkpoint, so an absolute path, a ``..`` escape or a symlink
    out of the directory is a ``ValueError`` (`heads.guard.inside`), and a name that is neither inside
    the directory nor a Hub id is a ``FileNotFoundError`` asking for ``adapter=``."""
    if not isinstance(recorded, str) or not recorded:
        raise ValueError(f"the heads' target_adapter must be a relative path or a Hub id, got {recorded!r}")
    where = f"in {directory!r}" if directory is not None else "(heads given as a module: pass adapter=)"
    if directory is not None:
        try:
            path = inside(directory, recorded, "target_adapter")
        except ValueError as e:
            raise ValueError(
                f"{e}: it is not applied; pass adapter= (the adapter's directory or Hub id)"
            ) from None
        if os.path.isdir(path):
            return path
    if recorded.count("/") != 1 or recorded.startswith((".", "/", "~")):
        raise FileNotFoundError(
            f"the heads' PEFT adapter {recorded!r} is not found {where}: pass adapter= (that adapter's "
            "directory or Hub id)"
        )
    if os.path.exists(recorded):  # a Hub id that is also a path under the cwd: peft would read the path
        raise ValueError(
            f"the heads' PEFT adapter {recorded!r} is a Hub id but also a local path here; pass adapter= "
            "explicitly"
        )
    return recorded


def save_heads(heads: nn.Module, output_dir: str, extra_files: dict[str, str] | None = None) -> None:
    """Write ``config.json`` + ``model.safetensors`` (heads' own tensors only) to ``output_dir``."""
    os.makedirs(output_dir, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in heads.state_dict().items()}
    atomic_write(
        os.path.join(output_dir, WEIGHTS_NAME), lambda p: save_file(state, p, metadata={"format": "pt"})
    )
    cfg = json.dumps(heads.config.to_dict(), indent=2, sort_keys=True) + "\n"
    atomic_write(os.path.join(output_dir, CONFIG_NAME), lambda p: open(p, "w").write(cfg))
    for name, text in (extra_files or {}).items():
        atomic_write(os.path.join(output_dir, name), lambda p, t=text: open(p, "w").write(t))


def resolve_dir(
    path_or_id: str,
    revision: str | None = None,
    *,
    cache_dir: str | None = None,
    token: str | None = None,
    local_files_only: bool | None = None,
) -> str:
    """A local heads directory as is, or a Hub id's snapshot in the HF cache (downloaded if needed).

    Offline (``HF_HUB_OFFLINE=1`` or ``local_files_only=True``) the cached snapshot of ``revision``
    (a branch, tag or commit; None = main) is used. Errors name the id, the revision and what to do.
    """
    expanded = os.path.expanduser(path_or_id)
    if os.path.isdir(expanded):
        if revision is not None:
            raise ValueError(
                f"revision={revision!r} only applies to Hub ids, not to the directory {path_or_id!r}"
            )
        return expanded
    if looks_local(path_or_id):
        raise FileNotFoundError(f"heads directory not found: {path_or_id!r}")

    what = f"heads {path_or_id!r}" + (f" at revision {revision!r}" if revision else "")
    try:
        return snapshot_download(
            path_or_id,
            revision=revision,
            cache_dir=cache_dir,
            token=token,
            local_files_only=bool(local_files_only),
            allow_patterns=HUB_PATTERNS,
            library_name=LIBRARY_NAME,
        )
    except HFValidationError as e:
        raise ValueError(f"{path_or_id!r} is neither a local directory nor a valid Hub id: {e}") from e
    except LocalEntryNotFoundError as e:
        cache = cache_dir or constants.HF_HUB_CACHE
        raise FileNotFoundError(
            f"{what} are not in the Hugging Face cache ({cache}) and the Hub was not asked "
            f"(HF_HUB_OFFLINE=1, local_files_only, or no network): download them once online, or pass a "
            f"local directory"
        ) from e
    except GatedRepoError as e:
        raise PermissionError(
            f"{what}: the repo is gated; accept its terms on the Hub, then {LOGIN_HINT}"
        ) from e
    except RepositoryNotFoundError as e:
        raise FileNotFoundError(
            f"{what}: no such repo on the Hub (or it is private: {LOGIN_HINT} with access to it)"
        ) from e
    except RevisionNotFoundError as e:
        raise FileNotFoundError(f"{what}: the repo has no such branch, tag or commit") from e
    except Exception as e:  # network and server errors come in many types; keep the id and the reason
        raise OSError(f"could not fetch {what} from the Hugging Face Hub: {e}") from e


def read_config(directory: str) -> dict[str, Any]:
    """The ``config.json`` of a heads directory as a dict (a file inside it: `heads.guard.inside`)."""
    path = inside(directory, CONFIG_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing: not a selfspec heads checkpoint")
    try:
        with open(path) as f:
            raw = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON (corrupt checkpoint?): {str(e)[:200]}") from e
    if not isinstance(raw, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(raw).__name__}")
    return raw


def load_heads(
    path_or_id: str,
    target: nn.Module | None = None,
    *,
    revision: str | None = None,
    device=None,
    dtype=None,
    allow_other_target: bool = False,
) -> nn.Module:
    """Load heads saved by `save_heads` from a local dir or Hub id; check them against ``target`` if given.

    A directory whose ``config.json`` has no selfspec ``head_type`` (an original Medusa / EAGLE / EAGLE-3
    checkpoint, or one exported for vLLM/SGLang) is imported by `heads.convert.import_heads`; EAGLE and
    EAGLE-3 imports need ``target``.

    Nothing in the directory is trusted (`heads.guard`): sizes are bounded and checked against the
    target's, the safetensors header must hold exactly the tensors the config implies before the module
    is built, files must be inside the directory, and heads that recorded their target
    (`HeadConfig.record_target`) refuse another one unless ``allow_other_target=True``.
    """
    directory = resolve_dir(path_or_id, revision)
    raw = read_config(directory)
    if "head_type" not in raw:  # Medusa / EAGLE / EAGLE-3 in the original or an engine's layout
        from heads.convert import import_heads  # a cycle: heads.convert imports this module

        heads = import_heads(directory, raw, target)
        if target is not None:
            heads.config.check_target(target)
            device = next(target.parameters()).device if device is None else device
        return heads.to(device=device, dtype=dtype).eval()
    head_type = raw.get("head_type")
    try:
        entry = registry.get(head_type)
    except ValueError as e:
        raise ValueError(f"{directory}: {e}") from None
    config_cls, module_cls = entry.config, entry.module
    check_sizes(raw, os.path.join(directory, CONFIG_NAME))
    config = config_cls.from_dict(raw)
    adapter_dir = _stored_adapter(directory, config.target_adapter)
    if config.target_adapter_sha256 is None and adapter_dir is not None:
        config.target_adapter_sha256 = adapter_fingerprint(adapter_dir)  # the adapter saved with the heads
    if target is not None:
        config.check_target(target)
        config.check_identity(target, allow_other_target)
    wpath = inside(directory, WEIGHTS_NAME)
    if not os.path.isfile(wpath):
        raise FileNotFoundError(f"{wpath} is missing: not a selfspec heads checkpoint")
    check_weights_header(module_cls, config, wpath)  # before building anything of the config's size
    heads = module_cls(config)
    try:
        state = load_file(wpath)
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(
            f"{wpath} could not be read (corrupt or truncated checkpoint?): {str(e)[:200]}"
        ) from e
    heads.load_state_dict(state)  # names and shapes were checked against the header
    if target is not None and device is None:
        device = next(target.parameters()).device
    return heads.to(device=device, dtype=dtype).eval()


def _stored_adapter(directory: str, recorded: str | None) -> str | None:
    """The adapter directory saved inside the heads directory that ``target_adapter`` names, or None
    (not recorded, a Hub id, or not there). A recorded path that leaves the directory is never used."""
    if not recorded:
        return None
    try:
        path = inside(directory, recorded, "target_adapter")
    except ValueError:
        return None  # `adapter_location` refuses it with the reason when the adapter is to be applied
    return path if os.path.isdir(path) else None
