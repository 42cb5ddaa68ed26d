"""GGUF targets: a ``.gguf`` file dequantised once into an ordinary transformers checkpoint.

transformers reads GGUF itself (``AutoModelForCausalLM.from_pretrained(dir, gguf_file=name)``, with the
``gguf`` package): the quantised tensors are dequantised to fp32 and the tokenizer, with its chat
template, is rebuilt from the file's metadata. That takes tens of seconds, and ``save_pretrained``
refuses such a model, so `dequantise` copies its state dict (``strict=True``) into a model built with
``from_config`` and saves that: later loads are a plain ``from_pretrained`` of safetensors.

Each checkpoint holds ``selfspec_gguf.json`` (`SOURCE_NAME`), which says which file it came from: name,
size, sha256, quantisation type, and the Hub model it is a release of where known (`KNOWN`, or the
file's ``general.source`` / ``general.base_model`` metadata). Heads trained on it record that
(`heads.base.HeadConfig.record_target`), so their config, model card and exports name the Hub model
a vLLM or SGLang user serves and say the heads were trained on the quantised release, dequantised.
Where the checkpoints live and how they are cached is `heads.targets`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from torch import nn

SOURCE_NAME = "selfspec_gguf.json"
# Releases whose Hub model is known (sha256 of the .gguf -> its Hub id and built-in name).
KNOWN: dict[str, dict[str, str]] = {
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53": {
        "hub_model": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "builtin": "smollm2-135m-instruct",
    },
}
_HF = "https://huggingface.co/"


def _metadata_hub_model(fields: dict[str, Any]) -> str | None:
    """The Hub id a GGUF's metadata names as its source or base model (a huggingface.co URL or an
    ``org/name`` repository field), else None."""
    for key in (
        "general.source.huggingface.repository",
        "general.source.url",
        "general.base_model.0.repo_url",
    ):
        value = fields.get(key)
        if isinstance(value, str) and value:
            value = value.removeprefix(_HF).strip("/") if value.startswith(_HF) else value
            if value.count("/") == 1 and "://" not in value:
                return value
    return None


def describe(path: str, sha256: str) -> dict[str, Any]:
    """What a GGUF file is: ``file`` (its name), ``size``, ``sha256``, ``quantization`` (e.g. ``Q4_1``,
    from ``general.file_type``), ``hub_model`` (None when unknown) and ``builtin`` (a built-in target
    name, or None). Reads only the metadata."""
    import gguf  # heavy, and only GGUF targets need it

    reader = gguf.GGUFReader(path)
    fields: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("general."):
            try:
                fields[key] = field.contents()
            except (ValueError, IndexError, TypeError):  # a field this gguf version cannot decode
                continue
    try:
        quant = gguf.LlamaFileType(int(fields["general.file_type"])).name.removeprefix("MOSTLY_")
    except (KeyError, ValueError, TypeError):
        quant = None
    known = KNOWN.get(sha256, {})
    return {
        "file": os.path.basename(path),
        "size": os.path.getsize(path),
        "sha256": sha256,
        "quantization": quant,
        "hub_model": known.get("hub_model") or _metadata_hub_model(fields),
        "builtin": known.get("builtin"),
    }


def dequantise(path: str, out_dir: str, sha256: str) -> None:
    """Write the fp32 checkpoint of the GGUF file ``path`` (model, generation config, tokenizer with its
    chat template, `SOURCE_NAME`) into ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = describe(path, sha256)
    where, name = os.path.split(os.path.abspath(path))
    loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
    config = loaded.config
    for key in ("quantization_config", "_model_name_or_path"):  # GGUF-load bookkeeping, not architecture
        if hasattr(config, key):
            delattr(config, key)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    plain.generation_config = loaded.generation_config
    del loaded
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    with open(os.path.join(out_dir, SOURCE_NAME), "w", encoding="utf-8") as f:
        json.dump(source, f, indent=2, sort_keys=True)
        f.write("\n")


def read_source(directory: str) -> dict[str, Any] | None:
    """The `SOURCE_NAME` record of a dequantised checkpoint directory, or None for any other directory."""
    path = os.path.join(os.path.expanduser(directory), SOURCE_NAME)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def source_of(target: nn.Module) -> dict[str, Any] | None:
    """The GGUF file ``target`` was dequantised from (`read_source` of the directory it was loaded
    from), or None for a target that was not."""
    config = getattr(target, "config", None)
    name = getattr(config, "_name_or_path", "") or ""
    return read_source(name) if name and os.path.isdir(os.path.expanduser(name)) else None


def note(source: dict[str, Any]) -> str:
    """One sentence for model cards and exports: which release the heads were trained on."""
    quant = source.get("quantization") or "quantised"
    sha = str(source.get("sha256") or "")[:12]
    hub = source.get("hub_model")
    of = f" of `{hub}`" if hub else ""
    text = (
        f"Trained on the {quant} GGUF release{of} (`{source.get('file')}`, sha256 {sha}...), dequantised to "
        "fp32 by transformers."
    )
    if hub:
        text += (
            f" Serve them with `{hub}`: its unquantised weights differ slightly from the dequantised "
            "ones, so acceptance there may differ a little from what was measured here."
        )
    return text


def target_name(config: dict[str, Any]) -> str | None:
    """The name that loads the target heads with this ``config.json`` dict were trained on: the built-in
    name of the GGUF release they recorded (``target_gguf``; its Hub model in ``base_model_name_or_path``
    has other, unquantised weights), else ``base_model_name_or_path``."""
    source = config.get("target_gguf")
    if isinstance(source, dict) and isinstance(source.get("builtin"), str):
        return source["builtin"]
    return config.get("base_model_name_or_path")
