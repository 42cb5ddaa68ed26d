"""EAGLE-3 draft head (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language
Models via Training-Time Test").

Differences from EAGLE-1/2 (`heads.eagle`): the draft reads *three* target layers instead of the last
one, predicts tokens rather than features (no regression loss), has its own final norm and its own
lm_head over a reduced draft vocabulary, and is trained on its own multi-step rollouts ("training-time
test", TTT) so that it sees at training time the inputs it gets at inference.

    g_k = fc(cat(a_low_k, a_mid_k, a_high_k))          fc: Linear(3H -> H, no bias); target features
    o_k = layer(x = g_k, attn input = cat(input_norm(embed(x_{k+1})), hidden_norm(g_k)) | pairs <= k)
    draft logits for x_{k+2} = lm_head(norm(o_k))       own norm and lm_head: [H -> draft_vocab]

**EAGLE-3.1** (``fc_norm`` and ``norm_output``, both off by default; the names and meaning of vLLM
speculators' ``Eagle3SpeculatorConfig``, which SpecForge's ``LlamaForCausalLMEagle3`` shares): each aux
feature gets its own RMSNorm before ``fc``, g_k = fc(cat(n_0(a_low_k), n_1(a_mid_k), n_2(a_high_k))), and
the draft's output is its post-norm state h_k = norm(o_k): the logits are lm_head(h_k) and h_k, not o_k, is
what the next step (TTT step or tree depth) is fed. The head's ``forward`` returns h under
``norm_output`` and ``logits`` skips the norm, so the proposer's calls stay the same.

**P-EAGLE** (``parallel_draft: K``, 0 = off; parallel drafting as in the P-EAGLE write-up and vLLM's
parallel token drafting): one draft forward proposes K depths. After the root pair (x_{k+1}, g_k) at
position k come K-1 placeholder slots at positions k+1..k+K-1, fed the learned token embedding
``mask_embed`` [H] and feature ``mask_hidden`` [H] (saved with the heads) instead of a drafted token and
the previous step's output; the layer attends causally over the prefix, the root and the earlier slots,
and slot j's output scores depth j+1. Training runs the TTT unroll with these inputs at steps j >= 1
(slot j = step j, with the same attention: the step-0 keys of pairs <= k plus pair k's own keys at
slots 1..j, so every position t of the sequence gets its K-slot block in K layer calls over all
positions, O(K·N²) scores, without a (K·N)² mask); the loss of depth j+1 is applied at slot j.

**Aux layer ids** index the HF ``hidden_states`` tuple: id ``i`` is the *input* of decoder layer ``i``
(0 = the embedding output; ``L`` would be the final-normed output, which neither engine captures, and is
not allowed). vLLM's ``eagle_aux_hidden_state_layer_ids`` uses these numbers as-is (id k =
``hidden_states[k]``); SGLang captures the output of layer j = selfspec id j + 1, so selfspec id i is
SGLang id i - 1 >= -1; exporting converts. Both engines capture the three in increasing layer order, so
the ids must be distinct and strictly increasing, inside ``[0, L-1]`` (checked by `Eagle3Config`, one-line
``ValueError``). The default is EAGLE-3's ``(2, L//2, L-3)`` where that is strictly increasing (L >= 7),
else ``(0, L//2, L-1)`` (L = 3..6: (0,1,2), (0,2,3), (0,2,4), (0,3,5)). A 1- or 2-layer target has
fewer than 3 distinct layer inputs (fc is 3H -> H): its ids repeat ((0, 0, 0), (0, 1, 1)) with a
warning that no engine serves such heads; heads saved before ids were checked load with a warning.

**The layer** (``Eagle3Config.draft_layer``, see `heads.draft_layer`): a Llama decoder layer sized from
the target (``"llama"``, the default, as SpecForge and speculators build it), or one decoder layer of the
target's own architecture (``"target"``, built by `heads.draft_layer.build_draft_layer`, so RoPE, head_dim,
q/k norms, biases and soft-capping match; the layer needs a ``post_attention_layernorm``, which Cohere's
and Phi's parallel blocks lack). Its q/k/v (or Phi-3's fused qkv) projections are widened to take 2H,
and its ``input_layernorm`` is replaced by the fusion ``cat(input_norm(emb), hidden_norm(g))``; the
residual stream is the fused g. The three norms (``input_norm``, ``hidden_norm``, final ``norm``) are
copies of the layer's own post-attention norm. Embeddings: as `heads.eagle` (the target's embedding
module's output; Gemma's sqrt(H) scale is nearly cancelled by ``input_norm``, exactly so up to its eps).
The layer's attention kernel is `eagle3_attention` (plain softmax attention that also does the TTT
"diagonal" keys), used both in training and at inference, so the two compute the same function.

**Alignment** (the same as `heads.eagle`): pair k = (token x_{k+1}, feature g_k) sits at position id k
and predicts x_{k+2}. TTT step j >= 1 feeds, at pair k, the token x_{k+1+j} with the draft's own step
j-1 output o^{j-1}_k (pre-norm, not through fc) at position id k+j, and predicts x_{k+2+j}. Its query
attends to the step-0 keys of pairs 0..k (the real prefix) and to pair k's own keys at steps 1..j.
This is exactly what a chain of depth j+1 sees at inference (`infer.eagle_draft`): the root pair k is
committed in the draft cache with the real prefix, and the node at depth d sits at position k+d and
attends to the prefix and its ancestors. Step j at pair k is scored against the target distribution
at position k+1+j iff ``loss_mask[k+2+j]``.

**Draft vocabulary**: ``d2t`` [Vd] int64 with target_id = i + d2t[i] and ``t2d`` [V] bool (which target
ids are in the draft vocab), both buffers in the checkpoint, built by `build_vocab_map` from the
token frequencies under the loss mask (`count_tokens`). Without a draft vocab size they are the
identity. The checkpoint holds ``fc.*``, ``input_norm.*``, ``hidden_norm.*``, ``midlayer.*``,
``norm.*``, ``lm_head.*``, ``d2t``, ``t2d``; never the target's embedding or lm_head.

Files: `config` (`Eagle3Config`, the aux layer ids, the draft vocabulary map), `attention` (the layer's
TTT attention kernel), `module` (`Eagle3Head`), `loss` (`eagle3_train_forward`, `eagle3_loss`),
`formats` (the SGLang / speculators exports and the import of EAGLE-3 checkpoints); this file registers
the head type (`heads.registry`).
"""

from __future__ import annotations

from heads.eagle3.attention import ATTN_IMPLEMENTATION, eagle3_attention
from heads.eagle3.config import (
    Eagle3Config,
    build_vocab_map,
    check_aux_ids,
    count_tokens,
    default_aux_layer_ids,
)
from heads.eagle3.formats import EXPORT_NOTES, EXPORTS, detect, import_state
from heads.eagle3.loss import OBJECTIVE, eagle3_loss, eagle3_train_forward, ttt_scored
from heads.eagle3.module import Eagle3Head
from heads.registry import HeadType, register

# (target model_type, format) -> why no engine serves these heads' export (vLLM 0.33, SGLang 0.5.23);
# ``vllm`` is EAGLE-3's alias of ``speculators``
_NO_EAGLE3 = "vLLM's `{}` does not implement `SupportsEagle3` (the hidden states EAGLE-3 reads)"
UNSERVED = {
    ("gemma2", "speculators"): _NO_EAGLE3.format("Gemma2ForCausalLM"),
    ("gemma2", "vllm"): _NO_EAGLE3.format("Gemma2ForCausalLM"),
    ("gemma2", "sglang"): "SGLang's `Gemma2ForCausalLM` has no `set_eagle3_layers_to_capture`",
    ("gemma3_text", "speculators"): _NO_EAGLE3.format("Gemma3ForCausalLM"),
    ("gemma3_text", "vllm"): _NO_EAGLE3.format("Gemma3ForCausalLM"),
}


def _proposer(config: Eagle3Config) -> str:
    """Heads trained for parallel drafting (``parallel_draft`` K > 0) draft all depths in one forward."""
    return "parallel" if getattr(config, "parallel_draft", 0) else "eagle"


def _draft_defaults(config: Eagle3Config) -> dict[str, int]:
    """P-EAGLE heads (``parallel_draft`` = K) draft depth K. Their one draft forward computes all K depths
    whatever ``depth`` is, so the EAGLE-2 default of 6 would only throw the deeper ones away (measured on
    the demo target: K = 8 heads at depth 8 reach τ +0.75 / +0.88 and 1.08-1.10x the tokens/s of depth 6)."""
    return {"depth": config.parallel_draft} if config.parallel_draft else {}


register(
    HeadType(
        name="eagle3",
        config=Eagle3Config,
        module=Eagle3Head,
        objective=OBJECTIVE,
        proposer=_proposer,
        tree="dynamic",
        exports=EXPORTS,
        import_state=import_state,
        detect=detect,
        export_notes=EXPORT_NOTES,
        unserved=UNSERVED,
        title="EAGLE-3",
        tags=("eagle", "eagle-3"),
        draft_defaults=_draft_defaults,
    )
)

__all__ = [
    "ATTN_IMPLEMENTATION",
    "Eagle3Config",
    "Eagle3Head",
    "build_vocab_map",
    "check_aux_ids",
    "count_tokens",
    "default_aux_layer_ids",
    "eagle3_attention",
    "eagle3_loss",
    "eagle3_train_forward",
    "ttt_scored",
]
