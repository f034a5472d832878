"""Thinking in completions: the answer part (``strip_thinking``: a closed ``<think>...</think>`` block
removed; one that never closes means no answer), the thinking itself (``thinking_text``) and its
length in tokens (``thinking_tokens``, for the thinking-length penalty).

Pure Python: the rewards, the multi-turn episodes and the held-out evaluation all read answers so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)


def strip_thinking(text: str | None, thinking: bool, opened_in_prompt: bool = False) -> str | None:
    """The answer part of a completion.

    Thinking off: ``text`` unchanged. Thinking on: everything up to the last ``</think>`` is removed
    (this also covers templates that open ``<think>`` in the prompt, so the completion holds only the
    closing tag); an opened block that never closes returns None, meaning "no answer". With
    ``opened_in_prompt`` a completion without ``</think>`` is all thinking, hence None too.
    """
    if text is None:
        return None
    if not thinking:
        return text
    if THINK_CLOSE in text:
        return text.rsplit(THINK_CLOSE, 1)[1].lstrip()
    if THINK_OPEN in text or opened_in_prompt:
        return None
    return text


def thinking_text(text: str | None, opened_in_prompt: bool = False) -> str:
    """The thinking inside ``text`` (closed blocks, and an unclosed trailing one), markers removed."""
    if not text:
        return ""
    head = text.split(THINK_CLOSE, 1)[0]
    if (opened_in_prompt or THINK_CLOSE in text) and THINK_OPEN not in head:
        text = THINK_OPEN + text  # the chat template opened the block in the prompt
    parts = [m[len(THINK_OPEN) : -len(THINK_CLOSE)] for m in _THINK_BLOCK.findall(text)]
    rest = _THINK_BLOCK.sub("", text)
    if THINK_OPEN in rest:
        parts.append(rest.split(THINK_OPEN, 1)[1])
    return "".join(parts)


def approx_tokens(text: str) -> int:
    """A tokenizer-free length: ~4 characters per token, the usual ratio for English BPE vocabularies."""
    return math.ceil(len(text) / 4) if text else 0


def thinking_tokens(text: str | None, count_tokens: Callable[[str], int] | None = None, opened_in_prompt: bool = False) -> int:
    return (count_tokens or approx_tokens)(thinking_text(text, opened_in_prompt)) if text else 0


__all__ = ["THINK_CLOSE", "THINK_OPEN", "approx_tokens", "strip_thinking", "thinking_text", "thinking_tokens"]
