"""Hugging Face Hub round trip for head checkpoints: save, load by Hub id, push, and the model card.

Every head module (`heads.medusa.MedusaHeads`, `heads.eagle.EagleHead`, `heads.eagle3.Eagle3Head`) mixes
in `HubMixin`:

    heads.save_pretrained("out/my-heads")                    # config.json + model.safetensors + README.md
    heads = MedusaHeads.from_pretrained("org/my-heads", revision="v1", target=target)
    heads.push_to_hub("org/my-heads", private=True)          # token: `hf auth login`, HF_TOKEN or token=

The checkpoint format is `heads.base.save_heads`' (it is not `PyTorchModelHubMixin`'s, whose config.json
holds constructor kwargs): the head type, its hyper-parameters and the target's sizes, so one loader
(`heads.base.load_heads`, used by ``infer.load``) reads every head type. Loading a Hub id goes through
``snapshot_download`` into the standard HF cache, so ``HF_HUB_OFFLINE=1`` works from that cache, and
pushing goes through ``HfApi.create_repo`` + ``HfApi.create_commit`` with an explicit allow-list of the
files selfspec writes (`upload_files`: heads, config, card, eval results, run config, ``inference.json``,
a PEFT ``adapter/``); nothing else in the directory is ever uploaded, the list is printed first, a new
repo is private unless ``private=False``, and no absolute local path goes into an uploaded file
(`upload_payloads`).

`push_heads_dir` uploads a directory written by training (``train/train_heads.py`` calls it when
``push_to_hub: true``); from the shell: ``python scripts/push_heads.py push out/demo-medusa
your-name/demo-medusa`` (`PushOptions`, `push_command`). The model card is `heads.card`'s.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Any

import huggingface_hub
import yaml
from huggingface_hub import CommitOperationAdd, HfApi
from huggingface_hub.utils import validate_repo_id
from torch import nn

from heads.base import (
    ADAPTER_DIR,
    CONFIG_NAME,
    INFERENCE_NAME,
    LIBRARY_NAME,
    LOGIN_HINT,
    WEIGHTS_NAME,
    load_heads,
    read_config,
    resolve_dir,
    save_heads,
)
from heads.card import CARD_NAME, EVAL_NAME, TRAIN_CONFIG_NAME, is_hub_id, model_card_text, write_model_card
from heads.guard import inside, scrub
from heads.registry import REGISTRY

__all__ = [
    "CARD_NAME",
    "EVAL_NAME",
    "TRAIN_CONFIG_NAME",
    "HubMixin",
    "MissingTokenError",
    "PushOptions",
    "model_card_text",
    "push_command",
    "push_heads_dir",
    "resolve_token",
    "upload_files",
    "upload_payloads",
    "write_model_card",
]
# The only files a push uploads: what `save_heads`, `HubMixin.save_pretrained`, training
# (`train.train_heads.save_heads_copy` / `save_final` / `save_adapter`) and `scripts/tune_tree.py` write into
# a heads directory. Anything else there (training checkpoints, data, keys, the user's own files) stays.
UPLOAD_FILES = (CONFIG_NAME, WEIGHTS_NAME, CARD_NAME, EVAL_NAME, TRAIN_CONFIG_NAME, INFERENCE_NAME)
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")  # PEFT's own files, no README


class MissingTokenError(ValueError):
    """No Hugging Face token to push with (raised before any upload or training starts)."""


# ---------------------------------------------------------------------------------------------- auth


def resolve_token(token: str | None = None, repo_id: str | None = None) -> str:
    """``token`` or the one huggingface_hub finds (HF_TOKEN, then the `hf auth login` token file).

    Raises `MissingTokenError` naming the ways to provide one: pushing is checked at the start of a
    training run with this, not hours later at the end.
    """
    found = token or huggingface_hub.get_token()
    if not found:
        where = f" ({repo_id!r})" if repo_id else ""
        raise MissingTokenError(f"pushing heads to the Hugging Face Hub{where} needs a token: {LOGIN_HINT}")
    return found


# ---------------------------------------------------------------------------------------------- load


def _head_type_of(module_cls: type) -> str | None:
    for head_type, entry in REGISTRY.items():
        if issubclass(entry.module, module_cls):
            return head_type
    return None


class HubMixin:
    """``save_pretrained`` / ``from_pretrained`` / ``push_to_hub`` for a head module with a ``config``."""

    config: Any

    def save_pretrained(
        self,
        save_directory: str,
        *,
        eval_results: dict[str, Any] | None = None,
        repo_id: str | None = None,
        model_card: bool = True,
    ) -> str:
        """Write ``config.json`` + ``model.safetensors`` (heads' own tensors only, atomically) and, with
        ``model_card``, a ``README.md`` (`model_card`; ``eval_results`` adds the accuracy table and τ,
        ``repo_id`` goes into the usage snippet). Returns ``save_directory``."""
        extra = {}
        if eval_results is not None:
            extra[EVAL_NAME] = json.dumps(eval_results, indent=2) + "\n"
        if model_card:
            extra[CARD_NAME] = model_card_text(
                self.config.to_dict(),
                eval_results=eval_results,
                repo_id=repo_id or save_directory,
                has_adapter=os.path.isdir(os.path.join(save_directory, ADAPTER_DIR)),
            )
        save_heads(self, save_directory, extra_files=extra)  # type: ignore[arg-type]
        return save_directory

    @classmethod
    def from_pretrained(
        cls,
        path_or_id: str,
        *,
        revision: str | None = None,
        target: nn.Module | None = None,
        device=None,
        dtype=None,
        cache_dir: str | None = None,
        token: str | None = None,
        local_files_only: bool | None = None,
        allow_other_target: bool = False,
    ):
        """Heads from a local directory or a Hub id (``revision``: branch, tag or commit), checked to be of
        this class's head type and, given ``target``, to fit it (vocab and hidden size, architecture, and
        the recorded target fingerprint unless ``allow_other_target``: `heads.base.load_heads`)."""
        directory = resolve_dir(
            path_or_id, revision=revision, cache_dir=cache_dir, token=token, local_files_only=local_files_only
        )
        raw = read_config(directory)
        found, want = raw.get("head_type"), _head_type_of(cls)
        if found not in REGISTRY:
            raise ValueError(
                f"{path_or_id!r} ({directory}): unknown head_type {found!r}; known: {sorted(REGISTRY)}"
            )
        if want is not None and found != want:
            right = REGISTRY[found].module.__name__
            raise ValueError(
                f"{path_or_id!r} holds {found!r} heads, not {want!r}: load it with {right}.from_pretrained "
                f"or heads.load_heads (which reads any head type)"
            )
        heads = load_heads(
            directory, target, device=device, dtype=dtype, allow_other_target=allow_other_target
        )
        if target is not None:
            _warn_other_base(raw.get("base_model_name_or_path"), target, path_or_id)
        return heads

    def push_to_hub(
        self,
        repo_id: str,
        *,
        token: str | None = None,
        eval_results: dict[str, Any] | None = None,
        **options: Any,
    ):
        """Save to a temporary directory (heads, config, model card) and upload it with `push_heads_dir`,
        which takes the ``options`` (``private``, ``revision``, ``commit_message``, ``create_pr``).
        Returns the ``CommitInfo``."""
        token = resolve_token(token, repo_id)  # before any work
        with tempfile.TemporaryDirectory(prefix="selfspec-push-") as tmp:
            self.save_pretrained(tmp, eval_results=eval_results, repo_id=repo_id)
            return push_heads_dir(tmp, repo_id, token=token, write_card=False, **options)


def _warn_other_base(recorded: str | None, target: nn.Module, path_or_id: str) -> None:
    """Heads of the right shape for a differently named base model load (the sizes are what must match),
    but the user should know: acceptance rates come from the model the heads were trained on."""
    name = getattr(getattr(target, "config", None), "_name_or_path", "") or ""
    if is_hub_id(recorded) and is_hub_id(name) and recorded != name:
        warnings.warn(
            f"heads {path_or_id!r} were trained for {recorded!r} but the target is {name!r}: they fit its "
            "shapes, so outputs stay the target's own, but acceptance (and so speed) may be much lower",
            stacklevel=3,
        )


# ---------------------------------------------------------------------------------------------- push


def upload_files(directory: str) -> list[str]:
    """The files of ``directory`` a push uploads (paths relative to it, sorted): those of `UPLOAD_FILES`
    and ``adapter/`` + `ADAPTER_FILES` that exist, and nothing else. Each must be a regular file inside
    the directory (a symlink out of it is refused: `heads.guard.inside`). Raises ``FileNotFoundError``
    unless it is a heads checkpoint."""
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        if not os.path.isfile(os.path.join(directory, name)):
            raise FileNotFoundError(
                f"{os.path.join(directory, name)} is missing: {directory!r} is not a selfspec heads checkpoint"
            )
    names = list(UPLOAD_FILES) + [f"{ADAPTER_DIR}/{n}" for n in ADAPTER_FILES]
    return sorted(n for n in names if os.path.isfile(inside(directory, n, "uploaded file")))


def upload_payloads(directory: str) -> list[tuple[str, str | bytes]]:
    """(path in the repo, what to upload) for each of `upload_files`: weights as the local file, JSON
    and YAML rewritten through `scrub` (no absolute local path leaves the machine; the local files are
    untouched). ``README.md`` is uploaded as written, and refused (``ValueError``) if it names one of
    those local paths or the directory's own absolute path: selfspec's cards never do (`model_card_text`)."""
    found: set[str] = set()
    out: list[tuple[str, str | bytes]] = []
    files = upload_files(directory)
    for rel in files:
        path = os.path.join(directory, rel)
        if rel.endswith(".json"):
            with open(path, "rb") as f:
                try:
                    data = json.loads(f.read())
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise ValueError(f"{path} is not valid JSON, not uploaded: {str(e)[:120]}") from e
            out.append((rel, (json.dumps(scrub(data, found), indent=2, sort_keys=True) + "\n").encode()))
        elif rel.endswith(".yaml"):
            with open(path) as f:
                data = yaml.safe_load(f)
            out.append((rel, yaml.safe_dump(scrub(data, found), sort_keys=False).encode()))
        else:
            out.append((rel, path))
    if CARD_NAME in files:
        with open(os.path.join(directory, CARD_NAME), encoding="utf-8", errors="replace") as f:
            card = f.read()
        here = {os.path.abspath(directory), os.path.realpath(directory)}
        leaks = sorted(p for p in found | here if len(p) > 1 and p in card)
        if leaks:
            raise ValueError(
                f"{os.path.join(directory, CARD_NAME)} names the local path {leaks[0]!r}; remove it (or delete "
                "README.md: a push then writes a card without local paths), then push again"
            )
    return out


def push_heads_dir(
    directory: str,
    repo_id: str,
    *,
    private: bool | None = None,
    token: str | None = None,
    revision: str | None = None,
    commit_message: str | None = None,
    create_pr: bool = False,
    write_card: bool = True,
):
    """Upload a saved heads directory to the Hub repo ``repo_id`` in one commit; returns the ``CommitInfo``.

    Creates the repo if needed, **private** unless ``private=False`` (None means private too; an existing
    repo keeps its visibility). Uploads exactly `upload_files` (an allow-list: heads, config, README.md,
    eval results, run config, inference.json, ``adapter/``), printing the list first; everything else in the
    directory is left out. JSON/YAML files are uploaded without absolute local paths (`upload_payloads`).
    ``write_card``: first write a model card into ``directory`` if it has none. ``revision``: a branch to
    commit to (created from main if missing).
    """
    validate_repo_id(repo_id)
    token = resolve_token(token, repo_id)
    upload_files(directory)  # a heads checkpoint? (before writing anything into it)
    if write_card and not os.path.isfile(os.path.join(directory, CARD_NAME)):
        write_model_card(directory, repo_id=repo_id)
    payloads = upload_payloads(directory)
    private = private is not False
    config = read_config(directory)
    files = [rel for rel, _ in payloads]
    left = _left_out(directory, set(files))
    print(
        f"uploading to {repo_id} ({'private' if private else 'public'} if created): {', '.join(files)}"
        + (f"; not uploaded: {len(left)} other file(s) in {directory}" if left else ""),
        flush=True,
    )
    api = HfApi(token=token, library_name=LIBRARY_NAME)
    repo = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    repo_id = getattr(repo, "repo_id", None) or repo_id  # a bare name gets the user's namespace
    if revision is not None and not create_pr:
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    operations = [CommitOperationAdd(path_in_repo=rel, path_or_fileobj=data) for rel, data in payloads]
    message = commit_message or f"Upload {config.get('head_type', '')} heads with {LIBRARY_NAME}"
    return api.create_commit(
        repo_id,
        operations=operations,
        commit_message=message,
        revision=revision,
        create_pr=create_pr,
        repo_type="model",
    )


def _left_out(directory: str, uploaded: set[str]) -> list[str]:
    """Files under ``directory`` that a push does not upload (relative paths)."""
    out = []
    for root, _, names in os.walk(directory):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/")
            if rel not in uploaded:
                out.append(rel)
    return sorted(out)


# ---------------------------------------------------------------------------------------------- CLI


@dataclass
class PushOptions:
    """Push a saved heads directory to the Hub: ``push DIR REPO_ID`` (scripts/push_heads.py)."""

    command: str = field(default="", metadata={"positional": True, "help": "push"})
    directory: str = field(default="", metadata={"positional": True, "help": "the saved heads directory"})
    repo_id: str = field(default="", metadata={"positional": True, "help": "the Hub repo (org/name)"})
    private: bool = field(
        default=True,
        metadata={"false_flag": "--public", "help": "create the repo private (default); --public: public"},
    )
    revision: str | None = field(default=None, metadata={"help": "branch to push to (default: main)"})
    commit_message: str | None = field(default=None, metadata={"help": "the commit message"})

    def __post_init__(self) -> None:
        if self.command != "push":
            raise ValueError(f"the command is 'push' (push DIR REPO_ID), got {self.command!r}")
        if not self.directory or not self.repo_id:
            raise ValueError("push needs a heads directory and a Hub repo id: push DIR REPO_ID")


def push_command(options: PushOptions) -> str:
    """Upload ``options.directory`` (`push_heads_dir`, an allow-list of files, private unless ``--public``);
    returns the commit URL. Bad input (no token, not a heads dir, a bad repo id) is a one-line
    ``SystemExit``."""
    try:
        info = push_heads_dir(
            options.directory,
            options.repo_id,
            private=options.private,
            revision=options.revision,
            commit_message=options.commit_message,
        )
    except (ValueError, OSError) as e:
        raise SystemExit(f"error: {e}") from None
    return str(getattr(info, "commit_url", info))
