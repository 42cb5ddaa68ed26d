"""`Eagle3Head`: ``fc`` + one widened decoder layer + own norm and lm_head (see `heads.eagle3`)."""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from heads.draft_layer import DraftLayerMixin, causal_mask
from heads.eagle3.attention import ATTN_IMPLEMENTATION, register_attention
from heads.eagle3.config import Eagle3Config
from heads.hub import HubMixin
from heads.vocab import DraftVocabMixin

_QKV_NAMES = ("q_proj", "k_proj", "v_proj", "qkv_proj")


class _FusedInput(nn.Module):
    """Stands in for the layer's ``input_layernorm``: g -> cat(input_norm(emb), hidden_norm(g)) [.., 2H].

    The decoder layer calls its input norm with the residual stream only, so `Eagle3Head` hands the
    embedding over through ``self.emb`` for the duration of one layer call. The norms are the head's
    (kept out of this module's parameters so each is saved once, under ``input_norm``/``hidden_norm``).
    """

    def __init__(self, head: Eagle3Head) -> None:
        super().__init__()
        self.__dict__["head"] = head
        self.emb: Tensor | None = None

    def forward(self, g: Tensor) -> Tensor:
        assert self.emb is not None, "the fused input norm runs inside Eagle3Head.forward only"
        return torch.cat([self.head.input_norm(self.emb), self.head.hidden_norm(g)], dim=-1)


class Eagle3Head(DraftVocabMixin, DraftLayerMixin, HubMixin, nn.Module):
    """``fc`` + one widened decoder layer (Llama, or the target's own) + own norm and lm_head; see the
    module docstring."""

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        layer, rotary, layer_config = self._new_layer(config)
        H, V, Vd = config.hidden_size, config.vocab_size, config.draft_vocab
        norm = getattr(layer, "post_attention_layernorm", None)  # the layer's norm class, eps and init
        if not isinstance(norm, nn.Module):
            raise NotImplementedError(
                f"EAGLE-3 with the target's own {type(layer).__name__} (draft_layer: target) needs a "
                "post_attention_layernorm, which its parallel attention/MLP block lacks; use "
                "heads.eagle3.draft_layer: llama"
            )
        register_attention()
        layer_config._attn_implementation = ATTN_IMPLEMENTATION  # the layer's attention reads it per call
        self.layer_config = layer_config
        std = getattr(layer_config, "initializer_range", 0.02)
        attn = layer.self_attn
        widened = 0
        for name in _QKV_NAMES:
            old = getattr(attn, name, None)
            if isinstance(old, nn.Linear):
                new = nn.Linear(2 * H, old.out_features, bias=old.bias is not None)
                nn.init.normal_(new.weight, std=std)
                if new.bias is not None:
                    nn.init.zeros_(new.bias)
                setattr(attn, name, new)
                widened += 1
        if not widened:
            raise NotImplementedError(
                f"EAGLE-3: {type(attn).__name__} has none of {_QKV_NAMES} to widen to 2H inputs"
            )
        self.fc = nn.Linear(3 * H, H, bias=False)
        # EAGLE-3.1: one norm per target layer before fc (keys fc_norm.{0,1,2}, as speculators/SpecForge)
        self.fc_norm = nn.ModuleList([copy.deepcopy(norm) for _ in range(3)]) if config.fc_norm else None
        self.input_norm = copy.deepcopy(norm)
        self.hidden_norm = copy.deepcopy(norm)
        layer.input_layernorm = _FusedInput(self)
        self.midlayer = layer  # keys `midlayer.*`, as EAGLE-3 checkpoints name the layer
        self.norm = copy.deepcopy(norm)
        self.lm_head = nn.Linear(H, Vd, bias=False)
        nn.init.normal_(self.lm_head.weight, std=std)
        self._init_vocab_map(V, Vd)  # until `set_vocab_map`: the first Vd target ids
        if config.parallel_draft:  # P-EAGLE's placeholders: the token embedding and feature of an undrafted slot
            self.mask_embed = nn.Parameter(torch.randn(H) * std)
            self.mask_hidden = nn.Parameter(torch.randn(H) * std)
        self._attach_layer(layer, rotary)

    @classmethod
    def for_target(cls, target: nn.Module, **kwargs) -> Eagle3Head:
        """A fresh head for ``target``: its architecture and sizes, on its device and in its dtype."""
        return cls._new_for_target(Eagle3Config, target, **kwargs)

    @torch.no_grad()
    def init_lm_head_from(self, target: nn.Module) -> None:
        """``lm_head_init: target``: row i of the draft lm_head [Vd, H] := the target lm_head's row of
        draft token i's target id (i + d2t[i]); call it after `set_vocab_map`."""
        weight = target.get_output_embeddings().weight
        if weight.shape[1] != self.lm_head.weight.shape[1]:
            raise ValueError(
                f"lm_head_init: target: the target's lm_head has {weight.shape[1]} inputs, the draft's "
                f"{self.lm_head.weight.shape[1]}"
            )
        ids = torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t
        self.lm_head.weight.copy_(weight[ids.to(weight.device)].to(self.lm_head.weight))

    @property
    def aux_layer_ids(self) -> tuple[int, ...]:
        return tuple(self.config.aux_layer_ids)

    def fuse(self, aux: Tensor | tuple[Tensor, ...]) -> Tensor:
        """Target features -> g: ``fc(cat(low, mid, high))``, EAGLE-3.1 (``fc_norm``):
        ``fc(cat(n_0(low), n_1(mid), n_2(high)))``; aux is the 3 [.., H] tensors or one [.., 3H]."""
        if isinstance(aux, (tuple, list)):
            aux = torch.cat(list(aux), dim=-1)
        aux = aux.to(self.fc.weight.dtype)
        if self.fc_norm is not None:
            aux = torch.cat([n(a) for n, a in zip(self.fc_norm, aux.chunk(3, dim=-1), strict=True)], dim=-1)
        return self.fc(aux)

    def _output(self, o: Tensor) -> Tensor:
        """The layer's output o -> the head's output, the feature fed to the next draft step: o itself
        (EAGLE-3), or h = norm(o) (EAGLE-3.1, ``norm_output``)."""
        return self.norm(o) if self.config.norm_output else o

    def _head_in(self, out: Tensor) -> Tensor:
        """The head's output -> the lm_head's input: norm(o) either way (EAGLE-3.1's output is normed once)."""
        return out if self.config.norm_output else self.norm(out)

    def forward(
        self,
        input_ids: Tensor,
        features: Tensor,
        embed: nn.Module,
        position_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        cache=None,
        *,
        ttt_steps: int | None = None,
        rows: list[Tensor] | None = None,
        placeholders: int = 0,
    ) -> Tensor:
        """One draft step over T pairs, or (``ttt_steps=K``) a whole training-time-test unroll.

        features: [B, T, 3H] target aux features ``cat(low, mid, high)`` (fused through ``fc`` here) or
            [B, T, H] the draft's own outputs (used as the fused g as is), told apart by width.
        input_ids: [B, T] tokens x_{k+1} of the pairs; embed: the target's input embedding module.
        position_ids, attention_mask, cache: as `heads.eagle.EagleHead.forward`.
        Returns o: [B, T, H], the pre-norm draft outputs (EAGLE-3.1, ``norm_output``: h = norm(o)), the
        feature the next draft step is fed; ``logits(o)`` scores x_{k+2}.

        TTT (training): input_ids [B, N + K - 1] with input_ids[:, k] = x_{k+1} (step j reads
        input_ids[:, j : j + N]), features [B, N, 3H], attention_mask None or the [B, N] pair mask,
        no cache. Returns logits [K, B, N, draft_vocab] in the head's dtype (`eagle3_loss` upcasts the
        scored rows): step j at pair k predicts x_{k+2+j}. They are computed inside this call so that a
        DDP/DeepSpeed wrapper sees one forward. ``rows`` (training): K bool masks [B, n_j] (n_j <= N, the
        scored pairs of step j, `ttt_scored`); then only those rows go through the final norm and the
        lm_head, and the result is the packed [M, draft_vocab], step 0's rows first, each step's in
        (b, k) order (as `_target_rows` reads them): the norm is per row, so this is the same function
        on fewer rows.

        placeholders = n (P-EAGLE inference, ``parallel_draft``): n placeholder slots follow the T pairs in
        the same forward (token embedding ``mask_embed``, feature ``mask_hidden``); position_ids and
        attention_mask then cover T + n queries, and the result is [B, T + n, H]: the output at the last
        pair scores depth 1, the one at placeholder i depth i + 1.
        """
        if ttt_steps is not None:
            outs = self._ttt_outputs(input_ids, features, embed, attention_mask, ttt_steps)
            if rows is None:
                return self.lm_head(self._head_in(torch.stack(outs)))
            if len(rows) != ttt_steps:
                raise ValueError(f"rows needs one mask per TTT step ({ttt_steps}), got {len(rows)}")
            picked = torch.cat([o[:, : r.shape[1]][r] for o, r in zip(outs, rows, strict=True)])
            return self.lm_head(self._head_in(picked))
        B, T = input_ids.shape
        assert features.shape[:2] == (B, T), (input_ids.shape, features.shape)
        g = self._features(features)
        emb = embed(input_ids).to(g.dtype)
        if placeholders:
            slot_g, slot_emb = self._placeholders(B, placeholders, g.dtype)
            g, emb = torch.cat([g, slot_g], 1), torch.cat([emb, slot_emb], 1)
        position_ids, attention_mask = self._step_inputs(
            T + placeholders, cache, position_ids, attention_mask, self.fc.weight.dtype, g.device
        )
        return self._output(self._layer(emb, g, position_ids, attention_mask, cache=cache))

    def _placeholders(self, B: int, n: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """P-EAGLE's n undrafted slots: (feature, token embedding), each [B, n, H] (the learned vectors)."""
        if not self.config.parallel_draft:
            raise ValueError("placeholder slots need heads trained with parallel_draft > 0 (P-EAGLE: heads.eagle3.p_eagle)")
        H = self.config.hidden_size
        return self.mask_hidden.to(dtype).expand(B, n, H), self.mask_embed.to(dtype).expand(B, n, H)

    def ttt_unroll(
        self,
        input_ids: Tensor,
        features: Tensor,
        embed: nn.Module,
        pair_mask: Tensor | None,
        steps: int,
    ) -> Tensor:
        """The TTT rollout (see `forward`): [K, B, N, H] outputs o^j_k (EAGLE-3.1: h^j_k = norm(o^j_k)).

        Step 0 is the ordinary causal forward over the N pairs (token x_{k+1}, g_k) at positions k. Step
        j >= 1 runs the pairs (x_{k+1+j}, o^{j-1}_k) (EAGLE-3.1: h^{j-1}_k) at positions k + j;
        `eagle3_attention` lets each attend to the step-0 keys of pairs <= k and to its own keys at steps
        1..j. Memory O(K·N²).
        """
        return torch.stack(self._ttt_outputs(input_ids, features, embed, pair_mask, steps))

    def _ttt_outputs(
        self, input_ids: Tensor, features: Tensor, embed: nn.Module, pair_mask: Tensor | None, steps: int
    ) -> list[Tensor]:
        """`ttt_unroll` as a list of K [B, N, H] (no stacked copy)."""
        B, N = features.shape[:2]
        if input_ids.shape != (B, N + steps - 1):
            raise ValueError(
                f"TTT input_ids must be [B, N + K - 1] = {(B, N + steps - 1)}, got {input_ids.shape}"
            )
        dtype = self.fc.weight.dtype
        g = self._features(features)
        mask = causal_mask(pair_mask, N, 0, dtype, g.device)  # step-0 keys, for every step
        pos = torch.arange(N, device=g.device)[None]
        store: dict[int, tuple[Tensor, Tensor]] = {}
        outs = []
        for j in range(steps):
            emb = embed(input_ids[:, j : j + N]).to(g.dtype)
            if j and self.config.parallel_draft:  # P-EAGLE: slot j is a placeholder, not the step j-1 output
                g, emb = self._placeholders(B, N, g.dtype)
            outs.append(self._output(self._layer(emb, g, pos + j, mask, ttt=(store, j))))
            g = outs[-1]
        return outs

    def _features(self, features: Tensor) -> Tensor:
        H = self.config.hidden_size
        if features.shape[-1] == 3 * H:
            return self.fuse(features)
        if features.shape[-1] != H:
            raise ValueError(
                f"features must be [.., 3H] (target aux) or [.., H] (draft), got {features.shape}"
            )
        return features.to(self.fc.weight.dtype)

    def _layer(self, emb, g, position_ids, attention_mask, cache=None, ttt=None) -> Tensor:
        """emb, g: [B, T, H] the token embeddings and the fused features -> the layer's output o [B, T, H]."""
        extra = {} if ttt is None else {"eagle3_ttt": ttt}
        fused = self.midlayer.input_layernorm
        fused.emb = emb
        try:
            return self._call_layer(self.midlayer, g, position_ids, attention_mask, cache, **extra)
        finally:
            fused.emb = None

    def logits(self, feats: Tensor, lm_head: nn.Module | None = None) -> Tensor:
        """feats: [..., H] the head's outputs (pre-norm o; EAGLE-3.1: post-norm h) -> float32 draft-vocab
        logits [..., Vd] = lm_head(norm(o)) (own norm and lm_head; ``lm_head`` is accepted for the
        proposer's EAGLE-1/2 call signature and ignored)."""
        return self.lm_head(self._head_in(feats)).float()
