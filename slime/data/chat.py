"""Chat transcripts as training samples: the tokenizer's chat template, the loss on assistant turns only.

:func:`render_messages` is the one place a transcript becomes ``{tokens, response_length, loss_mask}``:
the SFT warm-up's agent demonstrations and ``kind: SFTJob`` rows both go through it. Guaranteed: the
tokens are the template's own rendering of the whole transcript, and loss mask 1 covers exactly each
assistant message's tokens through its end-of-turn token. Not done: templates that are not
prefix-stable (they are refused, naming the reason).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["render_messages", "split_last_reply", "stop_ids"]


def stop_ids(tokenizer: Any) -> set[int]:
    """Token ids that end a turn: EOS and, where the vocabulary has it, ``<|im_end|>``."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != getattr(tokenizer, "unk_token_id", None):
        ids.add(im_end)
    return ids


def render_messages(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """An SFT sample ``{tokens, response_length, loss_mask}`` from a chat transcript.

    The prompt is everything before the first assistant message; loss mask 1 covers each assistant
    message's tokens up to and including its end-of-turn token (what the model generates); template
    glue, tool results and user text get 0. ``tools``: OpenAI tool schemas the template lists. Raises
    ``ValueError`` if the template is not prefix-stable or there is no assistant message."""

    def enc(msgs: Sequence[Mapping[str, Any]], gen: bool) -> list[int]:
        text = tokenizer.apply_chat_template(list(msgs), tools=tools, tokenize=False, add_generation_prompt=gen)
        return list(tokenizer.encode(text, add_special_tokens=False))

    full = enc(messages, False)
    stops = stop_ids(tokenizer)
    mask = [0] * len(full)
    first = None
    for k, msg in enumerate(messages):
        if msg.get("role") != "assistant":
            continue
        prefix = enc(messages[:k], True)
        if full[: len(prefix)] != prefix:
            raise ValueError("the chat template is not prefix-stable; cannot mark assistant tokens")
        first = len(prefix) if first is None else first
        end = len(enc(messages[: k + 1], False))
        span_end = next((i + 1 for i in range(len(prefix), end) if full[i] in stops), end)
        mask[len(prefix) : span_end] = [1] * (span_end - len(prefix))
    if first is None:
        raise ValueError("the transcript has no assistant message to learn")
    return {"tokens": full, "response_length": len(full) - first, "loss_mask": mask[first:]}


def split_last_reply(messages: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], str] | None:
    """``(the messages before the last assistant message, its text)``: a held-out prompt and its reference
    reply for evaluating generations; None without an assistant message."""
    for k in range(len(messages) - 1, -1, -1):
        if messages[k].get("role") == "assistant":
            return list(messages[:k]), str(messages[k].get("content") or "")
    return None
