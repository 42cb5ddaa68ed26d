"""Chat rows: normalise ShareGPT / OpenAI-style conversations, render them with the tokenizer's own chat
template, and find the assistant tokens the heads are trained on (`train.data` explains why).

Finding assistant tokens works for any template without ``{% generation %}`` support: render the
whole conversation; for assistant message ``i`` the turn starts where the rendering of
``messages[:i]`` with ``add_generation_prompt=True`` ends (that text must be a prefix of the whole
rendering) and its content is located right after; the template's end-of-turn token (the first
special token after the content, within the turn) is masked in too, so the heads learn to stop. The
rendered text is tokenized once, with offsets, and a token is masked in iff its characters overlap
an assistant span.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from heads.conversation import ROLES  # noqa: F401  (re-exported: train.data.ROLES)
from heads.conversation import to_messages as _to_messages
from train.sources import DataError, _one_line


def to_messages(conversation: Any, where: str) -> list[dict[str, str]]:
    """Normalise one ShareGPT or OpenAI-style conversation to ``[{"role", "content"}]`` (`heads.conversation.to_messages`,
    the one normaliser: ``from``/``value`` or ``role``/``content`` turns, roles mapped by `ROLES`, leading
    assistant turns dropped); a training conversation needs an assistant turn. Raises DataError naming
    ``where``."""
    return _to_messages(conversation, where, error=DataError)


def _render(tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool, where: str) -> str:
    try:
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    except Exception as e:
        raise DataError(f"{where}: the chat template failed on this conversation ({_one_line(e)})") from e
    if not isinstance(text, str):
        raise DataError(f"{where}: apply_chat_template returned {type(text).__name__}, expected text")
    return text


def _common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _find(text: str, content: str, start: int, end: int) -> tuple[int, int] | None:
    """Character span of ``content`` (as is, else stripped: templates often trim) in ``text[start:end]``."""
    for s in (content, content.strip()):
        i = text.find(s, start, end)
        if i >= 0:
            return i, i + len(s)
    return None


def assistant_spans(
    tokenizer, messages: list[dict[str, str]], where: str
) -> tuple[str, list[tuple[int, int, int]]]:
    """Render ``messages`` with the tokenizer's chat template and locate every assistant turn.

    Returns ``(text, spans)`` with one ``(content_start, content_end, turn_end)`` character triple per
    assistant message: the content is ``text[content_start:content_end]``, and the turn's own
    trailing text (where its end-of-turn token lives) ends by ``turn_end``.

    The turn starts at ``len(render(messages[:i], add_generation_prompt=True))``, which must be a prefix
    of ``render(messages)`` (else DataError: the template is not prefix-consistent). Its end is where
    ``render(messages[:i + 1])`` stops agreeing with ``render(messages)`` (templates may add an EOS
    after the *last* message only). Templates that render earlier assistant turns with less injected
    text than the last one (e.g. dropping an empty ``<think></think>`` block) are accepted too.
    """
    text = _render(tokenizer, messages, False, where)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt = _render(tokenizer, messages[:i], True, where)
        inconsistent = DataError(
            f"{where}: the chat template is not prefix-consistent at message {i} (rendering messages[:{i}] "
            "with add_generation_prompt=True is not a prefix of the rendered conversation), so assistant "
            "tokens cannot be located"
        )
        if not text.startswith(prompt):
            raise inconsistent
        start = len(prompt)
        upto = _render(tokenizer, messages[: i + 1], False, where)
        agree = _common_prefix_len(upto, text)
        found = _find(text, m["content"], start, agree)
        if found is not None:
            spans.append((*found, agree))
            continue
        # The turn renders differently inside the conversation than as its last message: find the
        # content in the standalone rendering, then allow at most as much template text before it.
        alone = _find(upto, m["content"], start, len(upto)) if upto.startswith(prompt) else None
        if alone is None:
            raise DataError(
                f"{where}: the chat template does not render assistant message {i} verbatim, so its tokens "
                "cannot be located"
            )
        found = _find(text, m["content"], start, alone[1])
        if found is None:
            raise inconsistent
        spans.append((*found, min(len(text), found[1] + len(upto) - alone[1])))
    return text, spans


def chat_mask(
    offsets: Sequence[tuple[int, int]],
    ids: Sequence[int],
    spans: Sequence[tuple[int, int, int]],
    end_ids: set[int],
) -> list[int]:
    """Token-level loss mask from assistant character spans.

    offsets: [T] (start, end) characters of each token; ids: [T]; spans: from `assistant_spans`;
    end_ids: special-token ids that can end a turn. A token is masked in if its characters overlap
    an assistant content span, or if it lies between the content and the first ``end_ids`` token that
    ends within the turn, that token included (e.g. ``<|im_end|>``, ``<|eot_id|>``, ``</s>``). Role
    headers, the text after the end-of-turn token, and all other turns stay 0.
    """
    mask = [0] * len(ids)
    starts = [s for s, _ in offsets]
    for c0, c1, turn_end in spans:
        j = bisect.bisect_left(starts, c1)  # first token starting at or after the content's end
        # content tokens: those overlapping [c0, c1) (all start before c1; zero-width ones inside count).
        k = j - 1
        while c1 > c0 and k >= 0 and (offsets[k][1] > c0 or offsets[k][0] >= c0):
            mask[k] = 1
            k -= 1
        # end of turn: everything up to the first special token that ends within the turn.
        for t in range(j, len(ids)):
            if offsets[t][1] > turn_end:
                break
            if ids[t] in end_ids:
                for u in range(j, t + 1):
                    mask[u] = 1
                break
    return mask


def end_ids(tokenizer) -> set[int]:
    """Ids of special tokens (the candidates for an end-of-turn token)."""
    ids = set(tokenizer.all_special_ids)
    ids.update(i for i, tok in tokenizer.added_tokens_decoder.items() if getattr(tok, "special", False))
    return ids
