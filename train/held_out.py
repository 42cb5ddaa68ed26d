"""Held-out rows for the scripts that score trained heads (`scripts/eval_heads.py`, `scripts/tune_tree.py`).

They pass `eval_batches` to `infer.head_accuracy` and `infer.tune_tree` as their loader, so that `infer`
never imports `train`: training-format data is train's business.
"""

from __future__ import annotations

import functools
import os

import datasets
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from heads.card import is_run_config
from train.data import DataConfig, _runs, _tokenize_runs, build_datasets, collate


def held_out(config_path: str, tokenizer) -> datasets.Dataset:
    """The tokenized held-out rows of the training run that wrote ``config_path`` (its ``train_config.yaml``):
    what `build_datasets` gave that run for eval, from the same data options and ``train.seed``, so the
    seeded split of ``data.path`` (no ``eval_path``) comes out the same rows as long as the data is unchanged.
    A file that is not such a config is a one-line ``ValueError``. Tokenized once per config file (as it is
    on disk) and tokenizer: tree tuning reads the rows three times."""
    path = os.path.realpath(config_path)
    return _held_out(path, os.stat(path).st_mtime_ns, tokenizer)


@functools.lru_cache(maxsize=2)
def _held_out(config_path: str, mtime_ns: int, tokenizer) -> datasets.Dataset:
    try:
        raw = OmegaConf.load(config_path)
        data = OmegaConf.to_container(raw.data, resolve=True)
        cfg = DataConfig(**data)
        seed = int(OmegaConf.select(raw, "train.seed", default=0))
    except (OSError, yaml.YAMLError, OmegaConfBaseException, TypeError, ValueError) as e:
        raise ValueError(
            f"{config_path}: not a selfspec training run config ({type(e).__name__}: {e})"
        ) from None
    return build_datasets(cfg, tokenizer, seed=seed)[1]


def eval_batches(data: str, tokenizer, max_examples: int, max_length: int, batch_size: int) -> list[dict]:
    """Tokenized, collated batches (`collate`) of the first ``max_examples`` rows of ``data``: a local file
    or Hub id in any training format, or a run's ``train_config.yaml`` for that run's held-out rows
    (`held_out`), each cut to ``max_length`` tokens. The held-out data `infer.head_accuracy` and
    `infer.tune_tree` score the heads on (the scripts pass this loader in, so `infer` never imports
    `train`)."""
    if is_run_config(data):
        ds = held_out(data, tokenizer)
        ds = ds.select(range(min(max_examples, len(ds))))
        rows = [{k: ds[i][k][:max_length] for k in ("input_ids", "loss_mask")} for i in range(len(ds))]
    else:
        cfg = DataConfig(path=data, max_length=max_length)
        label, runs = _runs(data, "train", cfg, first=max_examples)
        ds = _tokenize_runs(runs, tokenizer, cfg, label)
        rows = [ds[i] for i in range(len(ds))]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    return [collate(rows[i : i + batch_size], pad_token_id=pad) for i in range(0, len(rows), batch_size)]
