"""A reduced draft vocabulary (EAGLE-3's ``d2t`` / ``t2d``; FR-Spec's frequency-ranked vocabulary), shared by
the head types that draft over one (`heads.eagle3` always, `heads.eagle` with ``draft_vocab_size``).

The draft scores only Vd of the target's V tokens: the Vd most frequent training labels. Draft id i is
target id ``i + d2t[i]`` (``d2t`` [Vd] int64, non-decreasing, >= 0: the chosen ids in increasing order, as
offsets, the layout vLLM and SGLang read); ``t2d`` [V] bool marks the chosen target ids. Drafting ranks,
samples and takes top-k over the Vd draft logits only, and maps the chosen ids back through ``d2t``. The
verifier still scores every target token, so a reduced vocabulary changes how often drafts are accepted,
never what is generated (a token outside the draft vocabulary is simply never proposed).
"""

from __future__ import annotations

import torch
from torch import Tensor


def count_tokens(input_ids: Tensor, loss_mask: Tensor, vocab_size: int) -> Tensor:
    """[V] int64 counts of the token ids at positions with ``loss_mask == 1`` (sum these over a dataset)."""
    ids = input_ids[loss_mask.bool()].reshape(-1).to(torch.long)
    return torch.bincount(ids.cpu(), minlength=vocab_size)[:vocab_size]


def label_counts(ds, vocab_size: int) -> torch.Tensor:
    """[V] int64 counts of the training labels (``loss_mask == 1``) over every row of ``ds`` (what a
    draft vocabulary is chosen from: `build_vocab_map`)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for i in range(len(ds)):
        row = ds[i]
        counts += count_tokens(
            torch.as_tensor(row["input_ids"]), torch.as_tensor(row["loss_mask"]), vocab_size
        )
    return counts


def build_vocab_map(token_counts: Tensor, draft_vocab_size: int | None) -> tuple[Tensor, Tensor]:
    """(d2t [Vd] int64, t2d [V] bool) for the ``draft_vocab_size`` most frequent target tokens.

    token_counts: [V] counts (e.g. `count_tokens` over the training data). Ties go to the lower id;
    unseen tokens fill the vocabulary last, by id. Draft ids follow target-id order, so
    ``target_id = i + d2t[i]`` with ``d2t`` non-decreasing and >= 0. None or V gives the identity.
    """
    V = token_counts.numel()
    Vd = V if draft_vocab_size is None else int(draft_vocab_size)
    if not 1 <= Vd <= V:
        raise ValueError(f"draft_vocab_size must be in [1, {V}], got {draft_vocab_size}")
    order = torch.sort(token_counts.reshape(-1).cpu(), descending=True, stable=True).indices
    chosen = order[:Vd].sort().values
    d2t = chosen - torch.arange(Vd)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[chosen] = True
    return d2t, t2d


def check_draft_vocab_size(draft_vocab_size: int | None, vocab_size: int) -> None:
    """Raise ``ValueError`` (one line) unless ``draft_vocab_size`` is None or an int in [1, vocab_size]
    (vocab_size 0: not known yet, only >= 1 is checked)."""
    if draft_vocab_size is None:
        return
    if isinstance(draft_vocab_size, bool) or not isinstance(draft_vocab_size, int) or draft_vocab_size < 1:
        raise ValueError(f"draft_vocab_size must be an int >= 1 or None, got {draft_vocab_size!r}")
    if vocab_size and draft_vocab_size > vocab_size:
        raise ValueError(f"draft_vocab_size {draft_vocab_size} > the target's vocab size {vocab_size}")


def check_vocab_map(d2t: Tensor, t2d: Tensor, Vd: int, V: int) -> None:
    """Raise ``ValueError`` (one line) unless d2t [Vd] / t2d [V] are a consistent map: t2d marks exactly the
    ids ``arange(Vd) + d2t``, in increasing order (so every mapped id lies in [0, V))."""
    if d2t.shape != (Vd,) or t2d.shape != (V,):
        raise ValueError(f"vocab map shapes {tuple(d2t.shape)}, {tuple(t2d.shape)} != ({Vd},), ({V},)")
    if d2t.dtype.is_floating_point or t2d.dtype != torch.bool:
        raise ValueError(f"vocab map dtypes {d2t.dtype}, {t2d.dtype}: d2t must be integer and t2d bool")
    ids = torch.arange(Vd) + d2t.detach().cpu().long()
    if not torch.equal(ids, t2d.detach().cpu().nonzero().view(-1)):
        raise ValueError("d2t and t2d disagree: t2d must mark exactly the ids arange(Vd) + d2t, sorted")


class DraftVocabMixin:
    """The ``d2t`` / ``t2d`` buffers of a head with its own draft vocabulary, checked whenever they are
    installed or loaded (a ``load_state_dict`` of an inconsistent map raises, so no out-of-range id is ever
    looked up)."""

    d2t: Tensor
    t2d: Tensor

    def _init_vocab_map(self, V: int, Vd: int) -> None:
        """Register ``d2t`` [Vd] / ``t2d`` [V] as the first Vd target ids, until `set_vocab_map`."""
        self.register_buffer("d2t", torch.zeros(Vd, dtype=torch.long))
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[:Vd] = True
        self.register_buffer("t2d", t2d)
        self.register_load_state_dict_post_hook(_check_loaded_map)

    def set_vocab_map(self, d2t: Tensor, t2d: Tensor) -> None:
        """Install a `build_vocab_map` result (checked for consistency) into the ``d2t``/``t2d`` buffers."""
        check_vocab_map(d2t, t2d, self.d2t.shape[0], self.t2d.shape[0])
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def to_target_ids(self, draft_ids: Tensor) -> Tensor:
        """Draft-vocab ids -> target ids (``i + d2t[i]``)."""
        return draft_ids + self.d2t[draft_ids]


def _check_loaded_map(module, incompatible_keys) -> None:
    check_vocab_map(module.d2t, module.t2d, module.d2t.shape[0], module.t2d.shape[0])
