"""Chat rows: one normaliser for ShareGPT (``from``/``value``) and OpenAI-style (``role``/``content``)
conversations, for every layer that reads them (training data, held-out prompts, benchmark prompts).

It lives in `heads`, the bottom layer, so `train` and `infer` share it (train.data's reader can call it
with its own error type).
"""

from __future__ import annotations

from typing import Any

# Role names accepted in a turn -> the chat-template role they stand for.
ROLES = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "model": "assistant",
}


def _turn(turn: Any, j: int, where: str, error: type[Exception]) -> dict[str, str]:
    if not isinstance(turn, dict):
        raise error(f"{where}: message {j} must be an object with role/content, got {type(turn).__name__}")
    role = turn["role"] if turn.get("role") is not None else turn.get("from")
    content = turn["content"] if turn.get("content") is not None else turn.get("value")
    if role is None:
        raise error(f"{where}: message {j} has no role (expected a 'role' or 'from' key)")
    if role not in ROLES:
        raise error(f"{where}: message {j} has unknown role {role!r}; expected one of {', '.join(ROLES)}")
    if not isinstance(content, str):
        raise error(f"{where}: message {j} content is not a string (got {type(content).__name__})")
    return {"role": ROLES[role], "content": content}


def to_messages(
    conversation: Any, where: str, *, need_answer: bool = True, error: type[Exception] = ValueError
) -> list[dict[str, str]]:
    """One conversation as ``[{"role", "content"}]`` with roles mapped by `ROLES` (human -> user,
    gpt/model -> assistant). Assistant turns before any user or system turn are dropped (nothing asked
    them; templates cannot render the empty conversation before them, as FastChat/Medusa preprocessing
    also does). ``need_answer``: a conversation without an assistant turn is an error. Every problem is
    one ``error`` naming ``where``."""
    if not isinstance(conversation, (list, tuple)) or not conversation:
        kind = "an empty list" if isinstance(conversation, (list, tuple)) else type(conversation).__name__
        raise error(f"{where}: conversation must be a non-empty list of messages, got {kind}")
    messages = [_turn(turn, j, where, error) for j, turn in enumerate(conversation)]
    first = next((j for j, m in enumerate(messages) if m["role"] != "assistant"), len(messages))
    messages = messages[first:]
    if need_answer and not any(m["role"] == "assistant" for m in messages):
        raise error(f"{where}: conversation has no assistant turn")
    return messages
