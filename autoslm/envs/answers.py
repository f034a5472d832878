"""Final answers in the shapes math datasets write them: ``answer_format = "gsm8k"`` or ``"boxed"``.

A ``prompt + answer`` dataset whose answers are worked solutions (GSM8K: reasoning, then ``#### 72``;
MATH: reasoning with the result in ``\\boxed{...}``) cannot be scored by matching the whole answer.
``[environment] answer_format`` says where the final answer sits, for both the reward and the held-out
evaluation:

- ``"gsm8k"``: the gold answer is the number after the dataset's ``####``; a completion scores 1 only
  when it ends its reasoning the same way, ``#### <number>`` (the last such mark in its final 300
  characters, commas and ``$`` removed), with exactly the gold string -- the strict scoring verl's
  GSM8K baselines use (``verl/utils/reward_score/gsm8k.py``, method "strict").
- ``"boxed"``: the gold answer is the content of the answer's last ``\\boxed{...}`` (the whole answer
  when it has none); a completion scores 1 when its last ``\\boxed{...}`` holds the same value
  (numbers compared as numbers, text with spaces removed).

Pure Python: the laptop's ``validate`` and the pod's reward use the same functions.
"""

from __future__ import annotations

import re

ANSWER_FORMATS = ("gsm8k", "boxed")
_GSM8K_MARK = re.compile(r"#### (\-?[0-9\.\,]+)")
_GOLD_MARK = re.compile(r"####\s*(\-?[0-9\.\,]+)")
_CLIP = 300  # verl reads only the completion's last 300 characters (a long ramble is slow to scan)


def gsm8k_gold(answer: str) -> str | None:
    """The number after the dataset answer's ``####`` (commas removed); None without one."""
    found = _GOLD_MARK.findall(answer or "")
    return found[-1].replace(",", "").replace("$", "") if found else None


def gsm8k_extract(completion: str) -> str | None:
    """The strict final answer of a completion: its last ``#### <number>``; None without one."""
    found = _GSM8K_MARK.findall((completion or "")[-_CLIP:])
    return found[-1].replace(",", "").replace("$", "") if found else None


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; None without one."""
    text = text or ""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        return None
    depth = 0
    for i in range(brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1 : i].strip()
    return None


def gold_answer(answer: str | None, fmt: str | None) -> str | None:
    """The final answer a dataset row holds, in ``fmt`` (None: the answer as it is)."""
    if answer is None or fmt is None:
        return answer
    if fmt == "gsm8k":
        return gsm8k_gold(answer)
    if fmt == "boxed":
        return last_boxed(answer) or answer.strip()
    raise ValueError(f"unknown answer_format {fmt!r}; use one of {', '.join(ANSWER_FORMATS)}")


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _same(a: str, b: str) -> bool:
    x, y = _number(a), _number(b)
    if x is not None and y is not None:
        return x == y
    squash = lambda s: re.sub(r"\s+", "", s).strip("$.").lower()  # noqa: E731
    return squash(a) == squash(b)


def format_reward(answer: str | None, completion: str, fmt: str) -> float:
    """1.0 when ``completion`` gives the row's final answer in ``fmt``'s shape, else 0.0."""
    gold = gold_answer(answer, fmt)
    if gold is None:
        return 0.0
    if fmt == "gsm8k":
        return 1.0 if gsm8k_extract(completion) == gold else 0.0
    got = last_boxed(completion)
    return 1.0 if got is not None and _same(got, gold) else 0.0
