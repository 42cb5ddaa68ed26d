"""`EagleHead`: ``fc`` + one decoder layer, run at the feature level (see `heads.eagle`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from heads.draft_layer import DraftLayerMixin, causal_mask, soft_cap, target_logit_transform
from heads.eagle.config import EagleConfig
from heads.hub import HubMixin
from heads.unroll import cached_unroll
from heads.vocab import DraftVocabMixin


class EagleHead(DraftVocabMixin, DraftLayerMixin, HubMixin, nn.Module):
    """``fc`` + one decoder layer (Llama, or the target's own); see `heads.eagle`. With
    ``config.draft_vocab_size`` it also holds the ``d2t``/``t2d`` buffers of its draft vocabulary
    (`heads.vocab`) and scores only those rows of the target's lm_head."""

    def __init__(self, config: EagleConfig) -> None:
        super().__init__()
        layer, rotary, layer_config = self._new_layer(config)
        H = config.hidden_size
        self.layer_config = layer_config
        self.fc = nn.Linear(2 * H, H, bias=config.bias)
        self.layers = nn.ModuleList([layer])  # keys `layers.0.*`, as EAGLE-1 checkpoints name them
        self._attach_layer(layer, rotary)
        self.logit_scale, self.logit_softcap = target_logit_transform(config.target_config)
        if config.draft_vocab_size is not None:
            self._init_vocab_map(config.vocab_size, config.draft_vocab_size)
        self.__dict__["_rows"] = None  # `draft_rows`' cache: (key, weight [Vd, H], bias [Vd] | None)

    @classmethod
    def for_target(cls, target: nn.Module, **kwargs) -> EagleHead:
        """A fresh head for ``target``: its architecture and sizes, on its device and in its dtype."""
        return cls._new_for_target(EagleConfig, target, **kwargs)

    def causal_mask(self, attention_mask: Tensor | None, T: int, past_len: int, dtype: torch.dtype) -> Tensor:
        """[B or 1, 1, T, past_len + T] additive causal mask; ``attention_mask`` [B, past_len + T] hides padding."""
        return causal_mask(attention_mask, T, past_len, dtype, self.fc.weight.device)

    def forward(
        self,
        input_ids: Tensor,
        features: Tensor,
        embed: nn.Module,
        position_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        cache=None,
    ) -> Tensor:
        """Predict the next features.

        input_ids: [B, T] tokens x_{k+1}; features: [B, T, H] target (or draft) features f_k — pair k
        combines the token *after* the position whose feature it carries.
        embed: the target's input embedding module (``target.get_input_embeddings()``).
        position_ids: [B or 1, T]; default ``past_len + arange(T)`` (pair k at position k).
        attention_mask: None (causal), a [B, past_len + T] 0/1 padding mask (causal + padding), or a
            4D additive mask [B, 1, T, past_len + T] used as given (tree drafting).
        cache: a transformers ``DynamicCache`` for the draft layer (extended in place) or None.
        Returns f̂: [B, T, H], the prediction of f_{k+1} at pair k.
        """
        B, T = input_ids.shape
        assert features.shape[:2] == (B, T), (input_ids.shape, features.shape)
        dtype = self.fc.weight.dtype
        emb = embed(input_ids).to(dtype)
        h = self.fc(torch.cat([emb, features.to(dtype)], dim=-1))  # [B, T, H]
        position_ids, attention_mask = self._step_inputs(
            T, cache, position_ids, attention_mask, dtype, h.device
        )
        return self._call_layer(self.layers[0], h, position_ids, attention_mask, cache)

    def ttt_unroll(
        self, input_ids: Tensor, features: Tensor, embed: nn.Module, pair_mask: Tensor | None, steps: int
    ) -> Tensor:
        """The draft unrolled on its own features, as `heads.eagle3.Eagle3Head.ttt_unroll`: [K, B, N, H]
        outputs f̂ (`heads.unroll.cached_unroll`; ``logits(out[j])`` scores token k+2+j at pair k).

        input_ids: [B, N + K - 1] (x_{k+1} at column k); features: [B, N, H] the target's f_k;
        pair_mask: [B, N] or None; steps: K."""
        return cached_unroll(self, input_ids, features, embed, pair_mask, steps)

    @property
    def reduced_vocab(self) -> bool:
        """Whether the head drafts over its own draft vocabulary (``config.draft_vocab_size``)."""
        return self.config.draft_vocab_size is not None

    def draft_rows(self, lm_head: nn.Module) -> tuple[Tensor, Tensor | None]:
        """(weight [Vd, H], bias [Vd] or None): the target lm_head's rows of the draft vocabulary (target ids
        ``arange(Vd) + d2t``), gathered once and kept while the lm_head's weight and the map are unchanged
        (the lm_head is frozen, so in training and at inference alike this is one gather per run)."""
        w, b = lm_head.weight, getattr(lm_head, "bias", None)
        key = (w.data_ptr(), w._version, w.dtype, w.device, self.d2t.data_ptr(), self.d2t._version)
        if self._rows is None or self._rows[0] != key:
            ids = torch.arange(self.d2t.shape[0], device=w.device) + self.d2t.to(w.device)
            rows = w.detach().index_select(0, ids)
            self.__dict__["_rows"] = (key, rows, None if b is None else b.detach().index_select(0, ids))
        return self._rows[1], self._rows[2]

    def logits(self, feats: Tensor, lm_head: nn.Module) -> Tensor:
        """feats: [..., H] -> float32 logits [..., Vd] through the target's lm_head (and its scale, soft-cap):
        all V rows, or with a draft vocabulary only its Vd rows (`draft_rows`; draft id i = target id
        ``i + d2t[i]``)."""
        x = feats.to(lm_head.weight.dtype)
        z = F.linear(x, *self.draft_rows(lm_head)) if self.reduced_vocab else lm_head(x)
        return soft_cap(z.float() * self.logit_scale, self.logit_softcap)
