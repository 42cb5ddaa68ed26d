"""The model card (``README.md``) of a heads checkpoint, written for the Hub.

What differs per head type (its name, Hub tags, what draft position k predicts, what a position is
called) comes from its registry entry (`heads.registry.HeadType` ``title``, ``tags``, ``predicts``,
``objective.position_name``). No absolute local path is ever written (`heads.guard.public_name` /
`scrub`): the card is meant to be uploaded, and `heads.hub.upload_payloads` refuses one that names one.
"""

from __future__ import annotations

import json
import os
from typing import Any

import yaml
from huggingface_hub import ModelCard, ModelCardData

from heads import gguf
from heads.base import ADAPTER_DIR, LIBRARY_NAME, read_config
from heads.graft import looks_local
from heads.guard import public_name, scrub
from heads.io import atomic_text
from heads.registry import REGISTRY

CARD_NAME = "README.md"
EVAL_NAME = "eval_results.json"
TRAIN_CONFIG_NAME = "train_config.yaml"


def is_run_config(path: str) -> bool:
    """Whether ``path`` names a training run's ``train_config.yaml`` (the scripts that score heads read it
    as that run's held-out rows) rather than a data file."""
    return os.path.basename(path) == TRAIN_CONFIG_NAME and os.path.isfile(path)


_ACCURACY_COLUMNS = {  # eval_results.json key -> column title (`train.evaluation`)
    "top1_vs_target": "top-1 vs target",
    "top1_vs_data": "top-1 vs data",
    "top5_vs_data": "top-5 vs data",
}
_INTRO = (
    "The heads draft a tree of candidate tokens from the target's hidden states, and the target verifies the "
    "whole tree in one forward. Outputs are the target's own (greedy: token-identical to its `generate`; "
    "sampling: exactly the target's distribution); only the speed changes. This repository holds the heads' "
    "weights (`model.safetensors`), never the target's."
)
_SIMULATED_TAU = (
    "τ = 1 + Σ_k Π_(j≤k) top1_j. τ counts the bonus token (the one token the target itself adds at every "
    "verification step), as the Medusa and EAGLE papers do; τ = 1 means no speedup. It assumes a chain of "
    "top-1 guesses; tree drafting in `infer.generate` usually accepts more, and "
    "`out.stats.mean_accepted_length` reports what it measures on your prompts."
)


def is_hub_id(name: str | None) -> bool:
    return bool(name) and not looks_local(name)


def _fmt(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (list, dict, bool)) or value is None else str(value)
    return text.replace("|", "\\|")


def _describe(head_type: str) -> tuple[str, list[str], str, Any]:
    """(title, tags, position name, predicts(k)) of a head type; plain defaults for an unregistered one."""
    entry = REGISTRY.get(head_type)
    if entry is None:
        return head_type, [head_type], "position", lambda k: f"draft token {k + 1}"
    predicts = entry.predicts or (lambda k: f"draft token {k + 1}")
    return entry.title or head_type, list(entry.tags or (head_type,)), entry.objective.position_name, predicts


def _tau_lines(ev: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    tau = ev.get("sim_accept_length")
    basis = (
        "the target's argmax (what greedy verification accepts)" if ev.get("top1_vs_target") else "the data"
    )
    if tau is not None:
        lines += [
            "",
            f"**Simulated acceptance length τ = {tau:.3f}** tokens per target forward, computed from the "
            f"top-1 accuracies against {basis} as {_SIMULATED_TAU}",
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


def _accuracy_section(head_type: str, ev: dict[str, Any]) -> list[str]:
    top1 = ev.get("top1") or []
    cols = {k: t for k, t in _ACCURACY_COLUMNS.items() if ev.get(k)}
    if not cols:  # results written before the accuracies were named
        cols = {"top1": "top-1"} | ({"top5": "top-5"} if ev.get("top5") else {})
    loss = ev.get("head_loss") or [None] * len(top1)
    count = ev.get("count") or [None] * len(top1)
    _, _, pos, predicts = _describe(head_type)
    header = f"| {pos} | predicts | " + "".join(f"{t} | " for t in cols.values()) + "loss | positions |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for k in range(len(top1)):
        accs = "".join(f"{100 * ev[c][k]:.1f}% | " for c in cols)
        lo = f"{loss[k]:.3f}" if loss[k] is not None else ""
        lines.append(f"| {k} | {predicts(k)} | {accs}{lo} | {count[k] or ''} |")
    return lines + _tau_lines(ev)


def _adapter_lines(base: Any, adapter: str | None, has_adapter: bool) -> list[str]:
    if adapter:
        # A relative name (Medusa-2 saves its LoRA as "adapter") is the adapter stored next to the heads.
        inside = has_adapter or ("/" not in adapter and not os.path.isabs(adapter))
        where = (
            f"the PEFT adapter stored with them (`{adapter}/`)" if inside else f"the PEFT adapter `{adapter}`"
        )
        return [
            f"> **These heads require {where} on `{base}`.** They were trained on the adapted model, and "
            "the adapter changes the target's outputs: the speedup, and outputs identical to the model you "
            "serve, hold only for the base model *with this adapter applied*; that adapted model, not the "
            "plain base, is the one whose outputs `infer.generate` reproduces. `infer.load` applies the "
            "adapter recorded in `config.json` and rejects a target with another adapter or none.",
            "",
        ]
    if has_adapter:
        return [
            "> This repository also holds a PEFT adapter of the target under `adapter/`; the heads are meant "
            "for the target with that adapter applied.",
            "",
        ]
    return []


def _usage_lines(base: Any, name: str, hub_base: bool) -> list[str]:
    """``base``: the name that loads the target (`heads.gguf.target_name`)."""
    lines = ["## Usage", "", "```python", "import infer  # selfspec", ""]
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
    return lines


def _heads_lines(config: dict[str, Any], head_type: str, base: Any) -> list[str]:
    skip = {"head_type", "target_config", "draft_layer_config", "selfspec_version"}  # dicts stay in the json
    lines = ["## Heads", "", f"- head type: `{head_type}`", f"- base model: `{base}`"]
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
    return lines + [""]


def _training_lines(train_config: dict[str, Any] | None, eval_results: dict[str, Any] | None) -> list[str]:
    if not (train_config or eval_results):
        return []
    lines = ["## Training", ""]
    data = (train_config or {}).get("data") or {}
    if data:
        lines.append(
            f"- data: `{data.get('path')}` (format `{data.get('format')}`, up to {data.get('max_length')} "
            "tokens per example"
            + (f", held-out set `{data['eval_path']}`" if data.get("eval_path") else "")
            + ")"
        )
    tr = (train_config or {}).get("train") or {}
    if tr:
        steps = (
            f"max_steps {tr['max_steps']}"
            if (tr.get("max_steps") or -1) > 0
            else f"{tr.get('num_epochs')} epoch(s)"
        )
        lines.append(
            f"- optimisation: AdamW, peak lr {tr.get('lr')}, {tr.get('batch_size')} sequences per process per "
            f"micro-batch, {tr.get('grad_accum')} micro-batch(es) per optimizer step, {steps}"
        )
    if eval_results and eval_results.get("step") is not None:
        last = (eval_results.get("last") or {}).get("step", eval_results["step"])
        kind = "measured" if eval_results.get("measured_accept_length") is not None else "simulated"
        lines.append(
            f"- trained for {last} optimizer steps; these heads are from step {eval_results['step']}, "
            f"the held-out eval with the best {kind} τ"
        )
    return lines + [""]


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
    raw_data = ((train_config or {}).get("data") or {}).get("path")
    hub_base = is_hub_id(config.get("base_model_name_or_path"))  # decided on the real value, not its name
    hub_data = is_hub_id(raw_data) and not os.path.exists(str(raw_data))
    config, train_config, repo_id = scrub(config), scrub(train_config), public_name(repo_id)
    head_type = str(config.get("head_type", ""))
    base = config.get("base_model_name_or_path")
    title, tags, _, _ = _describe(head_type)
    card_data = ModelCardData(
        # Only a Hub id is valid metadata (the Hub rejects local paths); a local base is named in the text.
        base_model=base if hub_base else None,
        library_name=LIBRARY_NAME,
        tags=["speculative-decoding", "draft-heads", *tags],
        datasets=[((train_config or {}).get("data") or {}).get("path")] if hub_data else None,
    )
    lines = [
        f"# {title} draft heads for `{base}`" if base else f"# {title} draft heads",
        "",
        f"Draft heads for speculative decoding of **`{base}`**, trained with {LIBRARY_NAME}. {_INTRO}",
        "",
    ]
    if config.get("target_gguf"):  # trained on a quantised release: say which, and what to serve
        lines += [f"> {gguf.note(config['target_gguf'])}", ""]
    lines += _adapter_lines(base, config.get("target_adapter"), has_adapter)
    load = gguf.target_name(config)
    lines += _usage_lines(load, repo_id or "path/to/these-heads", hub_base or load != base)
    lines += _heads_lines(config, head_type, base)
    lines += _training_lines(train_config, eval_results)
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
