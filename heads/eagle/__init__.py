"""EAGLE-1/2 draft head (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty"; EAGLE-2: "Faster Inference of Language Models with Dynamic Draft Trees").

The draft is one decoder layer that runs autoregressively at the *feature* level. Its input at pair k
fuses the embedding of token x_{k+1} with the target's last post-norm hidden state f_k:

    z_k = fc(cat(embed(x_{k+1}), f_k))           fc: Linear(2H -> H, bias)
    f̂_{k+1} = layer(z_k | z_0..z_{k-1})          one decoder layer (``draft_layer``: Llama, or the target's)
    draft logits for x_{k+2} = softcap(scale · lm_head(f̂_{k+1}))   the target's frozen lm_head

Alignment convention (training and inference agree on it): pair k = (token x_{k+1}, feature f_k) sits
at position id k and attends causally to pairs 0..k. Its output f̂_{k+1} is regressed onto f_{k+1}, and
its logits are scored against token x_{k+2}, so pair k is trained iff ``loss_mask[k+2] == 1``.

**The layer** (``EagleConfig.draft_layer``, see `heads.draft_layer`): ``"llama"`` (the default) is a
transformers Llama decoder layer sized from the target, which vLLM and SGLang rebuild for any target;
``"target"`` (heads saved before the option existed) is a layer of the target's own architecture, built
from the target's own config class with ``num_hidden_layers=1`` (so rope_theta / rope scaling, head_dim,
qkv bias, q/k norms, attention scaling and soft-capping all match the target) and the architecture's
own decoder-layer and rotary-embedding classes, found generically through
``AutoModelForCausalLM.from_config``; no modeling file is copied. Either way, deviations from a plain
decoder layer:

- ``input_layernorm`` is replaced by ``nn.Identity()`` (EAGLE: no input norm on layer 0; its input
  ``fc(...)`` mixes a post-norm feature with an embedding and is not normed).
- the layer always uses full causal attention (``layer_types=["full_attention"]``, no sliding window):
  the draft's own prefix is attended in full, as in EAGLE's Llama-based draft.

Embeddings are taken from ``target.get_input_embeddings()`` called as a module, in training and at
inference alike: Gemma/Gemma2/Gemma-3 scale by sqrt(H) inside that embedding module
(``...ScaledWordEmbedding``, and their decoder does not scale again), so the draft sees the scaled
embedding, which is also what the target's decoder sees; Granite's ``embedding_multiplier`` is applied
in the decoder's forward, outside the module, so the draft sees the plain embedding. An engine whose
draft looks up the shared embedding *weight* must multiply Gemma's rows by sqrt(H) (as the module's
``embed_scale``, rounded to the weight dtype) to compute this function; for EAGLE-1 that factor can be
folded into ``fc``'s first H input columns at export. Draft logits apply the target's logit transform
(Gemma2's ``final_logit_softcapping``, Cohere's ``logit_scale``, Granite's ``1 / logits_scaling``) so
that draft and target distributions are the same function of a feature.

The attention kernel is the architecture's default from ``from_config`` (sdpa; eager for Gemma2, whose
attention soft-capping sdpa lacks); both take the 4D additive tree masks of `infer.eagle_draft`.
Training calls `eagle_train_forward` (shift, noise, loss); inference uses `infer.eagle_draft`.

Files: `config` (`EagleConfig`), `module` (`EagleHead`), `loss` (`eagle_train_forward`, `eagle_loss`),
`formats` (the SGLang / vLLM exports and the import of EAGLE-1 checkpoints); this file registers the
head type (`heads.registry`).

The checkpoint holds ``fc.*`` and ``layers.0.*`` only (the SGLang/vLLM EAGLE-1 key layout); the
embedding and lm_head are the target's and are passed at call time.

**Reduced draft vocabulary** (``EagleConfig.draft_vocab_size`` = Vd, off by default; FR-Spec, and the
``d2t``/``t2d`` map EAGLE-3 has, `heads.vocab`): the draft logits are the target lm_head's rows of the Vd
most frequent training labels only (gathered once, `EagleHead.draft_rows`), so a tree depth costs a
[K, H] x [H, Vd] product and a top-k over Vd instead of V; draft ids map back to target ids through
``d2t``. Training scores them against the target distribution renormalised over the draft vocabulary
(`eagle_loss`'s ``vocab``). The checkpoint then also holds ``d2t`` [Vd] and ``t2d`` [V] (checked for
consistency on load). Verification is unchanged (the target scores all V tokens), so generation stays
lossless; tokens outside the draft vocabulary are just never drafted. Neither engine's EAGLE-1 format
carries the map, so such heads are not exported (`heads.eagle.formats.REDUCED_VOCAB_REFUSAL`).
"""

from __future__ import annotations

from heads.draft_config import (
    check_target_arch,
    resolve_draft_layer,
    target_config_dict,
    validate_embed_scale,
    validate_target_config,
)
from heads.draft_layer import (
    build_draft_layer,
    build_layer,
    causal_mask,
    draft_llama_config,
    soft_cap,
    target_logit_transform,
)
from heads.eagle.config import EagleConfig
from heads.eagle.formats import EXPORT_NOTES, EXPORTS, detect, import_state
from heads.eagle.loss import OBJECTIVE, eagle_loss, eagle_train_forward
from heads.eagle.module import EagleHead
from heads.registry import HeadType, register

# (target model_type, format) -> why no engine serves these heads' export (vLLM 0.33, SGLang 0.5.23)
_G2 = "`Gemma2ForCausalLM`"
UNSERVED = {
    ("gemma2", "vllm"): f"vLLM's {_G2} has no `lm_head` to share, so the EAGLE draft has none",
    ("gemma2", "sglang"): f"SGLang's {_G2} has no `get_embed_and_head` for the EAGLE worker",
}

register(
    HeadType(
        name="eagle",
        config=EagleConfig,
        module=EagleHead,
        objective=OBJECTIVE,
        proposer="eagle",
        tree="dynamic",
        exports=EXPORTS,
        import_state=import_state,
        detect=detect,
        export_notes=EXPORT_NOTES,
        unserved=UNSERVED,
        title="EAGLE-1/2",
        tags=("eagle", "eagle-2"),
    )
)

__all__ = [
    "EagleConfig",
    "EagleHead",
    "build_draft_layer",
    "build_layer",
    "causal_mask",
    "check_target_arch",
    "draft_llama_config",
    "eagle_loss",
    "eagle_train_forward",
    "resolve_draft_layer",
    "soft_cap",
    "target_config_dict",
    "target_logit_transform",
    "validate_embed_scale",
    "validate_target_config",
]
