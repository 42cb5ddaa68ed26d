"""The demo target's tokenizer: a byte-level BPE with role tokens and a ChatML-like chat template."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

UNK, PAD, BOS, EOS = "<unk>", "<pad>", "<s>", "<|end|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
SPECIAL_TOKENS = [UNK, PAD, BOS, EOS, *ROLE_TOKENS.values()]  # ids 0..6, in this order

# ChatML-like: <s><|system|>...<|end|>\n<|user|>...<|end|>\n<|assistant|>...<|end|>\n. No newline
# follows a role tag: byte-level BPE would merge it with the content's indentation ("\n    "), so the
# generation prompt (ending in the bare tag) would tokenize unlike training text. BOS is written by
# the template (tokenize chat text with add_special_tokens=False); `generation` marks what
# `return_assistant_tokens_mask=True` reports as assistant tokens.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{- raise_exception('unsupported role ' + message['role'] + '; use system, user or assistant') -}}"
    "{%- endif -%}"
    "{{- '<|' + message['role'] + '|>' -}}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- generation -%}{{- message['content'] + '<|end|>' -}}{%- endgeneration -%}{{- '\\n' -}}"
    "{%- else -%}"
    "{{- message['content'] + '<|end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>' -}}{%- endif -%}"
)


def train_tokenizer(texts: list[str], vocab_size: int, max_length: int):
    """A byte-level BPE trained on ``texts``, wrapped as a `PreTrainedTokenizerFast` with the chat template.

    Plain ``tokenizer(text)`` prepends ``<s>`` (as the training documents start); the chat template
    writes ``<s>`` itself, so chat text is tokenized with ``add_special_tokens=False``.
    """
    from transformers import PreTrainedTokenizerFast  # heavy; only building a tokenizer needs it

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
            ),
        ]
    )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        extra_special_tokens=list(ROLE_TOKENS.values()),
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf
