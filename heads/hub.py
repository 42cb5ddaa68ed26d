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
files selfspec writes (`upload_files`: heads, config, card, eval results, run config, ``tree.json``, a
PEFT ``adapter/``); nothing else in the directory is ever uploaded, the list is printed first, a new
repo is private unless ``private=False``, and no absolute local path goes into an uploaded file
(`upload_payloads`).

`push_heads_dir` uploads a directory written by training (``train/train_heads.py`` calls it when
``push_to_hub: true``); from the shell: ``python heads/hub.py push out/demo-medusa your-name/demo-medusa``.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from typing import Any

if __package__ in (None, ""):  # run as a script: import from the repo root, not from heads/
    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path[0] = _root
    else:
        sys.path.insert(0, _root)

from torch import nn

from heads.base import (
    ADAPTER_DIR,
    CONFIG_NAME,
    LIBRARY_NAME,
    LOGIN_HINT,
    TREE_NAME,
    WEIGHTS_NAME,
    load_heads,
    read_config,
    resolve_dir,
    save_heads,
)
from heads.guard import public_name, scrub
from heads.io import atomic_text
from heads.registry import REGISTRY

CARD_NAME = "README.md"
EVAL_NAME = "eval_results.json"
TRAIN_CONFIG_NAME = "train_config.yaml"
# The only files a push uploads: what `save_heads`, `HubMixin.save_pretrained`, training
# (`train.train_heads.save_heads_copy` / `save_final` / `save_adapter`) and `scripts/tune_tree.py` write into
# a heads directory. Anything else there (training checkpoints, data, keys, the user's own files) stays.
UPLOAD_FILES = (CONFIG_NAME, WEIGHTS_NAME, CARD_NAME, EVAL_NAME, TRAIN_CONFIG_NAME, TREE_NAME)
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")  # PEFT's own files, no README


class MissingTokenError(ValueError):
    """No Hugging Face token to push with (raised before any upload or training starts)."""


# ---------------------------------------------------------------------------------------------- auth


def resolve_token(token: str | None = None, repo_id: str | None = None) -> str:
    """``token`` or the one huggingface_hub finds (HF_TOKEN, then the `hf auth login` token file).

    Raises `MissingTokenError` naming the ways to provide one: pushing is checked at the start of a
    training run with this, not hours later at the end.
    """
    import huggingface_hub

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


def _is_hub_id(name: str | None) -> bool:
    from heads.graft import looks_local

    return bool(name) and not looks_local(name)


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
        private: bool | None = None,
        token: str | None = None,
        revision: str | None = None,
        commit_message: str | None = None,
        create_pr: bool = False,
        eval_results: dict[str, Any] | None = None,
    ):
        """Save to a temporary directory (heads, config, model card) and upload it with `push_heads_dir`.
        Returns the ``CommitInfo``."""
        import tempfile

        token = resolve_token(token, repo_id)  # before any work
        with tempfile.TemporaryDirectory(prefix="selfspec-push-") as tmp:
            self.save_pretrained(tmp, eval_results=eval_results, repo_id=repo_id)
            return push_heads_dir(
                tmp,
                repo_id,
                private=private,
                token=token,
                revision=revision,
                commit_message=commit_message,
                create_pr=create_pr,
                write_card=False,
            )


def _warn_other_base(recorded: str | None, target: nn.Module, path_or_id: str) -> None:
    """Heads of the right shape for a differently named base model load (the sizes are what must match),
    but the user should know: acceptance rates come from the model the heads were trained on."""
    name = getattr(getattr(target, "config", None), "_name_or_path", "") or ""
    if _is_hub_id(recorded) and _is_hub_id(name) and recorded != name:
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
    from heads.guard import inside

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
    import yaml

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
    eval results, run config, tree.json, ``adapter/``), printing the list first; everything else in the
    directory is left out. JSON/YAML files are uploaded without absolute local paths (`upload_payloads`).
    ``write_card``: first write a model card into ``directory`` if it has none. ``revision``: a branch to
    commit to (created from main if missing).
    """
    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.utils import validate_repo_id

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


# ---------------------------------------------------------------------------------------------- model card

_TAGS = {"medusa": ["medusa"], "eagle": ["eagle", "eagle-2"], "eagle3": ["eagle", "eagle-3"]}
_POSITION = {"medusa": "head", "eagle": "step", "eagle3": "step"}


def _fmt(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (list, dict, bool)) or value is None else str(value)
    return text.replace("|", "\\|")


_ACCURACY_COLUMNS = {  # eval_results.json key -> column title (`train.evaluate`)
    "top1_vs_target": "top-1 vs target",
    "top1_vs_data": "top-1 vs data",
    "top5_vs_data": "top-5 vs data",
}


def _accuracy_section(head_type: str, ev: dict[str, Any]) -> list[str]:
    top1 = ev.get("top1") or []
    cols = {k: t for k, t in _ACCURACY_COLUMNS.items() if ev.get(k)}
    if not cols:  # results written before the accuracies were named
        cols = {"top1": "top-1"} | ({"top5": "top-5"} if ev.get("top5") else {})
    loss = ev.get("head_loss") or [None] * len(top1)
    count = ev.get("count") or [None] * len(top1)
    pos = _POSITION.get(head_type, "position")
    # Draft token k+1 follows the target's own next token; Medusa head k reads h_t and predicts t+2+k.
    if head_type == "medusa":
        predicts = [f"t+{k + 2} (draft token {k + 1})" for k in range(len(top1))]
    else:
        predicts = [f"draft token {k + 1}" for k in range(len(top1))]
    header = f"| {pos} | predicts | " + "".join(f"{t} | " for t in cols.values()) + "loss | positions |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for k in range(len(top1)):
        accs = "".join(f"{100 * ev[c][k]:.1f}% | " for c in cols)
        lo = f"{loss[k]:.3f}" if loss[k] is not None else ""
        lines.append(f"| {k} | {predicts[k]} | {accs}{lo} | {count[k] or ''} |")
    tau = ev.get("sim_accept_length")
    basis = (
        "the target's argmax (what greedy verification accepts)" if ev.get("top1_vs_target") else "the data"
    )
    if tau is not None:
        lines += [
            "",
            f"**Simulated acceptance length τ = {tau:.3f}** tokens per target forward, computed from the "
            f"top-1 accuracies against {basis} as τ = 1 + Σ_k Π_(j≤k) top1_j. τ counts the bonus token (the "
            "one token the target itself adds at every verification step), as the Medusa and EAGLE papers "
            "do; τ = 1 means no speedup. It assumes a chain of top-1 guesses; tree drafting in "
            "`infer.generate` usually accepts more, and `out.stats.mean_accepted_length` reports what it "
            "measures on your prompts.",
        ]
    measured, how = ev.get("measured_accept_length"), ev.get("measured_tau") or {}
    if measured is not None:
        lines += [
            "",
            f"**Measured acceptance length τ = {measured:.3f}**: greedy `infer.generate` at this step on "
            f"{how.get('prompts')} held-out prompts ({how.get('prompt_source', 'from the eval data')}), "
            f"{how.get('max_new_tokens')} new tokens each, drafting with {how.get('tree')}; Σ accepted tokens "
            "/ Σ verification steps over all prompts, bonus token included.",
        ]
    return lines


def model_card_text(
    config: dict[str, Any],
    *,
    eval_results: dict[str, Any] | None = None,
    train_config: dict[str, Any] | None = None,
    repo_id: str | None = None,
    has_adapter: bool = False,
) -> str:
    """The ``README.md`` of a heads checkpoint: Hub metadata (``base_model``, ``library_name``, ``tags``,
    ``datasets``) as YAML front matter via ``ModelCardData``, then the base model, head type and config,
    training data and steps, per-position held-out accuracy and simulated τ, and a usage snippet.

    config: the heads' ``config.json`` dict; eval_results: ``eval_results.json`` (training's held-out eval);
    train_config: the run config (``train_config.yaml``); repo_id: the Hub id or directory users load.
    No absolute local path is written: each becomes its last component (`public_name`), since the card
    is meant to be uploaded.
    """
    from huggingface_hub import ModelCard, ModelCardData

    raw_data = ((train_config or {}).get("data") or {}).get("path")
    hub_base = _is_hub_id(config.get("base_model_name_or_path"))  # decided on the real value, not its name
    hub_data = _is_hub_id(raw_data) and not os.path.exists(str(raw_data))
    config, train_config, repo_id = scrub(config), scrub(train_config), public_name(repo_id)
    head_type = str(config.get("head_type", ""))
    base = config.get("base_model_name_or_path")
    adapter = config.get("target_adapter")  # set for heads trained on a PEFT-adapted target
    data = (train_config or {}).get("data") or {}
    data_path = data.get("path")
    datasets = [data_path] if hub_data else None
    card_data = ModelCardData(
        # Only a Hub id is valid metadata (the Hub rejects local paths); a local base is named in the text.
        base_model=base if hub_base else None,
        library_name=LIBRARY_NAME,
        tags=["speculative-decoding", "draft-heads", *_TAGS.get(head_type, [head_type])],
        datasets=datasets,
    )
    name = repo_id or "path/to/these-heads"
    title = {"medusa": "Medusa", "eagle": "EAGLE-1/2", "eagle3": "EAGLE-3"}.get(head_type, head_type)
    lines = [
        f"# {title} draft heads for `{base}`" if base else f"# {title} draft heads",
        "",
        f"Draft heads for speculative decoding of **`{base}`**, trained with {LIBRARY_NAME}. The heads "
        "draft a tree of candidate tokens from the target's hidden states, and the target verifies the "
        "whole tree in one forward. Outputs are the target's own (greedy: token-identical to its "
        "`generate`; sampling: exactly the target's distribution); only the speed changes. This repository "
        "holds the heads' weights (`model.safetensors`), never the target's.",
        "",
    ]
    if adapter:
        # A relative name (Medusa-2 saves its LoRA as "adapter") is the adapter stored next to the heads.
        inside = has_adapter or ("/" not in adapter and not os.path.isabs(adapter))
        where = (
            f"the PEFT adapter stored with them (`{adapter}/`)" if inside else f"the PEFT adapter `{adapter}`"
        )
        lines += [
            f"> **These heads require {where} on `{base}`.** They were trained on the adapted model, and "
            "the adapter changes the target's outputs: the speedup, and outputs identical to the model you "
            "serve, hold only for the base model *with this adapter applied*; that adapted model, not the "
            "plain base, is the one whose outputs `infer.generate` reproduces. `infer.load` applies the "
            "adapter recorded in `config.json` and rejects a target with another adapter or none.",
            "",
        ]
    elif has_adapter:
        lines += [
            "> This repository also holds a PEFT adapter of the target under `adapter/`; the heads are meant "
            "for the target with that adapter applied.",
            "",
        ]
    lines += ["## Usage", "", "```python", "import infer  # selfspec", ""]
    lines += [
        f'model = infer.load("{base or "<the base model>"}", heads="{name}")',
        'input_ids = model.tokenizer("def fibonacci(n):", return_tensors="pt").input_ids',
        "out = infer.generate(model, input_ids, max_new_tokens=128)  # greedy: identical to target.generate",
        "print(model.tokenizer.decode(out.sequences[0]))",
        "print(out.stats.mean_accepted_length)  # τ: tokens per target forward, bonus token included",
        "```",
        "",
    ]
    if base and not hub_base:
        lines += [
            f"`{base}` names the local target model the heads were trained on; replace it with where that "
            "model is on your machine (or its Hub id).",
            "",
        ]
    skip = {"head_type", "target_config", "draft_layer_config", "selfspec_version"}  # dicts stay in the json
    lines += ["## Heads", "", f"- head type: `{head_type}`", f"- base model: `{base}`"]
    tcfg = config.get("target_config") or {}
    if tcfg:
        lines.append(
            f"- target architecture: `{tcfg.get('model_type')}`, {tcfg.get('num_hidden_layers')} layers "
            "(the draft layer is rebuilt from the target's config, stored in `config.json`)"
        )
    if config.get("selfspec_version"):
        lines.append(f"- written by {LIBRARY_NAME} {config['selfspec_version']}")
    lines += ["", "| config | value |", "|---|---|"]
    lines += [
        f"| `{k}` | `{_fmt(v)}` |"
        for k, v in sorted(config.items())
        if k not in skip and not (k.startswith("target_adapter") and v is None)
    ]
    lines.append("")
    if train_config or eval_results:
        lines += ["## Training", ""]
        if data:
            lines.append(
                f"- data: `{data_path}` (format `{data.get('format')}`, up to {data.get('max_length')} "
                "tokens per example"
                + (f", held-out set `{data['eval_path']}`" if data.get("eval_path") else "")
                + ")"
            )
        tr = (train_config or {}).get("train") or {}
        if tr:
            lines.append(
                f"- optimisation: AdamW, peak lr {tr.get('lr')}, {tr.get('batch_size')} sequences per process per "
                f"micro-batch, {tr.get('grad_accum')} micro-batch(es) per optimizer step, "
                + (
                    f"max_steps {tr['max_steps']}"
                    if (tr.get("max_steps") or -1) > 0
                    else f"{tr.get('num_epochs')} epoch(s)"
                )
            )
        if eval_results and eval_results.get("step") is not None:
            last = (eval_results.get("last") or {}).get("step", eval_results["step"])
            lines.append(
                f"- trained for {last} optimizer steps; these heads are from step {eval_results['step']}, "
                "the held-out eval with the best "
                + ("measured" if eval_results.get("measured_accept_length") is not None else "simulated")
                + " τ"
            )
        lines.append("")
    if eval_results and eval_results.get("top1"):
        lines += ["## Held-out accuracy", ""] + _accuracy_section(head_type, eval_results) + [""]
    body = "\n".join(lines)
    return str(ModelCard(f"---\n{card_data.to_yaml()}\n---\n\n{body}"))


def write_model_card(directory: str, *, repo_id: str | None = None) -> str:
    """Write ``README.md`` into a saved heads directory from its ``config.json`` (+ ``eval_results.json``
    and ``train_config.yaml`` when present), atomically. Returns the card's path."""
    config = read_config(directory)
    ev = tc = None
    if os.path.isfile(os.path.join(directory, EVAL_NAME)):
        with open(os.path.join(directory, EVAL_NAME)) as f:
            ev = json.load(f)
    if os.path.isfile(os.path.join(directory, TRAIN_CONFIG_NAME)):
        import yaml

        with open(os.path.join(directory, TRAIN_CONFIG_NAME)) as f:
            tc = yaml.safe_load(f)
    text = model_card_text(
        config,
        eval_results=ev,
        train_config=tc,
        repo_id=repo_id or directory,
        has_adapter=os.path.isdir(os.path.join(directory, ADAPTER_DIR)),
    )
    path = os.path.join(directory, CARD_NAME)
    atomic_text(path, text)
    return path


# ---------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(
        prog="python heads/hub.py", description="Push a saved heads directory to the Hub."
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    push = sub.add_parser(
        "push", help="upload DIR's heads files (an allow-list, printed first) to REPO_ID, private by default"
    )
    push.add_argument("directory")
    push.add_argument("repo_id")
    vis = push.add_mutually_exclusive_group()
    vis.add_argument(
        "--private",
        dest="private",
        action="store_true",
        default=True,
        help="create the repo private (default)",
    )
    vis.add_argument("--public", dest="private", action="store_false", help="create the repo public")
    push.add_argument("--revision", help="branch to push to (default: main)")
    push.add_argument("--commit-message")
    args = p.parse_args(argv)
    try:
        info = push_heads_dir(
            args.directory,
            args.repo_id,
            private=args.private,
            revision=args.revision,
            commit_message=args.commit_message,
        )
    except (ValueError, OSError) as e:  # bad input (no token, not a heads dir, bad repo id): one line
        raise SystemExit(f"error: {e}") from None
    print(getattr(info, "commit_url", info))


if __name__ == "__main__":
    main()
