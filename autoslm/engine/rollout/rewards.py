"""Environment rewards as TRL reward functions, and per-group reward statistics. The answer part of a
completion is ``engine.rollout.thinking``'s; each call's time bound ``engine.rollout.reward_call``'s.

Pure Python (no torch, no trl import): TRL calls what ``build_reward_set`` returns, and the tests call
it directly.

How examples reach the reward functions
---------------------------------------
TRL hands each reward function ``prompts``, ``completions``, ``completion_ids`` and, as keyword
arguments, every other dataset column (one value per completion, already repeated per group) plus
whatever a ``rollout_func`` returned beyond its required keys. So the GRPO dataset is built with
``rows_from_examples(examples)``; one row per ``Example``:

    "prompt"         list of chat messages (Example.prompt): TRL renders it with the chat template
    "answer"         Example.answer, "" when None
    "info"           json.dumps(Example.info): a string column, so Arrow never has to unify the
                     shapes of different examples' info dicts
    "example_index"  position of the example in its split (for transcripts and debugging)

and ``example_from_row`` rebuilds the ``Example`` a reward function scores. A multi-turn rollout adds a
``"transcript"`` column (the whole conversation, prompt included); when present it replaces
``prompt + completion`` as the thing scored.

What a reward function sees
---------------------------
Completions arrive as strings or as message lists (conversational prompts; with tools, the list holds
assistant turns with ``tool_calls`` and ``tool`` results). ``strip_thinking`` (``engine.rollout.thinking``) removes a closed
``<think>...</think>`` block when the run thinks; a think block that never closes means the model gave
no answer, which scores 0 on every environment function (not None: TRL would treat None as
"unscorable" and exclude the completion from the baseline, so an endless ramble would go unpunished).
An environment function takes ``(Example, text)``, or ``(Example, messages)`` when it carries the
attribute ``takes_messages = True``; a function with a ``score_batch(examples, texts)`` method (the LLM
judge) is called once per batch so it can run requests concurrently.

Each call of a reward function is bounded (``engine.rollout.reward_call``: ``bounded_call``, ``REWARD_CALL_LIMIT_S``): one that does
not return in time ends the run with one line naming it and the line of its file it was at, as the
local check before launch says it; the watchdog's time and money limits are only the backstop.

Weights are applied by TRL: pass ``RewardSet.weights`` as ``GRPOConfig(reward_weights=...)``. The
thinking length penalty (``train.thinking_length_penalty``: coef x the answer's thinking tokens, subtracted)
is its own function ("thinking_length_penalty", weight 1), so TRL logs it as its own reward component.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from autoslm.engine.rollout.reward_call import REWARD_CALL_LIMIT_S, bounded_call
from autoslm.engine.rollout.thinking import approx_tokens, strip_thinking, thinking_tokens
from autoslm.envs.base import Environment, Example, Messages

_REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")


# ---------------------------------------------------------------------------------------------------
# Dataset rows


def example_to_row(example: Example, index: int) -> dict[str, Any]:
    return {
        "prompt": [dict(m) for m in example.prompt],
        "answer": "" if example.answer is None else str(example.answer),
        "info": json.dumps(example.info or {}, sort_keys=True, default=str),
        "example_index": index,
    }


def rows_from_examples(examples: Sequence[Example]) -> list[dict[str, Any]]:
    return [example_to_row(ex, i) for i, ex in enumerate(examples)]


def example_from_row(prompt: Any, answer: Any = None, info: Any = None) -> Example:
    if isinstance(info, str):
        try:
            info = json.loads(info) if info else {}
        except json.JSONDecodeError:
            info = {}
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
    return Example(prompt=messages, answer=(answer if answer not in (None, "") else None), info=dict(info or {}))


# ---------------------------------------------------------------------------------------------------
# Completions in their TRL shapes


def content_text(content: Any) -> str:
    """A message's content as text (strings, or lists of typed parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return str(content)


def completion_messages(completion: Any) -> Messages:
    if isinstance(completion, str):
        return [{"role": "assistant", "content": completion}]
    return [dict(m) for m in (completion or [])]


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """Text up to the first stop string: what a stop-aware generator would have returned."""
    cut = len(text)
    for s in stop:
        if s:
            i = text.find(s)
            if i != -1:
                cut = min(cut, i)
    return text[:cut]


@dataclass
class Scored:
    """One completion prepared for scoring."""

    example: Example
    messages: Messages  # prompt + completion (or the rollout's transcript), assistant thinking stripped
    answer: str | None  # last assistant text without thinking; None: no answer (unclosed think)
    thinking_tokens: int


def prepare(
    prompt: Any,
    completion: Any,
    row: dict[str, Any],
    *,
    thinking: bool,
    stop: Sequence[str] = (),
    opened_in_prompt: bool = False,
    count_tokens: Callable[[str], int] | None = None,
    transcript: Messages | None = None,
) -> Scored:
    example = example_from_row(prompt, row.get("answer"), row.get("info"))
    if transcript is not None:
        prompt_len = len(example.prompt)
        head, tail = [dict(m) for m in transcript[:prompt_len]], [dict(m) for m in transcript[prompt_len:]]
    else:
        head = [dict(m) for m in example.prompt] if isinstance(prompt, list) else []
        tail = completion_messages(completion)
    answer: str | None = ""
    think = 0
    for msg in tail:
        if msg.get("role") != "assistant":
            continue
        raw = content_text(msg.get("content"))
        if stop:
            raw = cut_at_stop(raw, stop)
        for key in _REASONING_KEYS:  # a response parser may already have split the thinking out
            if msg.get(key):
                think += (count_tokens or approx_tokens)(content_text(msg[key]))
        think += thinking_tokens(raw, count_tokens, opened_in_prompt) if thinking else 0
        stripped = strip_thinking(raw, thinking, opened_in_prompt)
        msg["content"] = stripped if stripped is not None else ""
        answer = stripped
    return Scored(example=example, messages=head + tail, answer=answer, thinking_tokens=think)


# ---------------------------------------------------------------------------------------------------
# TRL reward functions


class RewardLog:
    """Per-function reward values: the latest batch, and running sums since the last ``drain``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.last: dict[str, list[float]] = {}
        self._sum: dict[str, float] = {}
        self._n: dict[str, int] = {}
        self._errors: dict[str, int] = {}
        self.errors_total: dict[str, int] = {}

    def count_errors(self, name: str, n: int) -> None:
        """Completions a function raised on (``on_reward_error = "none"``: they scored None)."""
        with self._lock:
            self._errors[name] = self._errors.get(name, 0) + n
            self.errors_total[name] = self.errors_total.get(name, 0) + n

    def drain_errors(self) -> dict[str, int]:
        """Per function, the completions it raised on since the previous call."""
        with self._lock:
            out = {k: v for k, v in self._errors.items() if v}
            self._errors.clear()
            return out

    def record(self, name: str, values: Sequence[float]) -> None:
        with self._lock:
            self.last[name] = list(values)
            finite = [v for v in values if v is not None and not math.isnan(v)]
            self._sum[name] = self._sum.get(name, 0.0) + sum(finite)
            self._n[name] = self._n.get(name, 0) + len(finite)

    def drain(self) -> dict[str, float]:
        """Mean of each function since the previous drain (for heartbeats and events)."""
        with self._lock:
            out = {k: self._sum[k] / self._n[k] for k in self._sum if self._n[k]}
            self._sum.clear()
            self._n.clear()
            return out


class _TRLReward:
    """One TRL reward function: ``fn(prompts, completions, **columns) -> list[float]``."""

    def __init__(
        self,
        name: str,
        score: Callable[[list[Scored]], list[float]],
        prepare_kw: dict,
        log: RewardLog,
        limit_s: float | None = REWARD_CALL_LIMIT_S,
    ):
        self.__name__ = name  # TRL names the logged metric rewards/<__name__>/mean after it
        self._score = score
        self.limit_s = limit_s
        self._prepare_kw = prepare_kw
        self._log = log

    def __call__(self, prompts, completions, **kwargs) -> list[float]:
        n = len(completions)
        transcripts = kwargs.get("transcript")
        items = []
        for i in range(n):
            row = {k: _pick(kwargs.get(k), i) for k in ("answer", "info")}
            transcript = _pick(transcripts, i) if transcripts is not None else None
            items.append(prepare(prompts[i], completions[i], row, transcript=transcript, **self._prepare_kw))
        scored = bounded_call(
            lambda: self._score(items),
            shown=self.__name__,
            n=n,
            limit_s=self.limit_s,
            source=getattr(self._score, "source", None),
        )
        values = [float(v) for v in scored]
        if len(values) != n:
            raise ValueError(f"reward function {self.__name__} returned {len(values)} values for {n} completions")
        self._log.record(self.__name__, values)
        return values


def _pick(column: Any, i: int) -> Any:
    if isinstance(column, list):
        return column[i] if i < len(column) else None
    return column


@dataclass
class RewardSet:
    funcs: list[Callable]
    weights: list[float]
    names: list[str]
    log: RewardLog = field(default_factory=RewardLog)

    def grpo_config_kwargs(self) -> dict[str, Any]:
        return {"reward_weights": list(self.weights)}


def _env_scorer(fn: Callable) -> Callable[[list[Scored]], list[float]]:
    takes_messages = bool(getattr(fn, "takes_messages", False))
    batch = getattr(fn, "score_batch", None)

    def score(items: list[Scored]) -> list[float]:
        if batch is not None and not takes_messages:
            todo = [i for i, it in enumerate(items) if it.answer is not None]
            got = list(batch([items[i].example for i in todo], [items[i].answer for i in todo])) if todo else []
            out = [0.0] * len(items)
            for i, v in zip(todo, got, strict=True):
                out[i] = float(v)
            return out
        out = []
        for it in items:
            if it.answer is None:
                out.append(0.0)
            elif takes_messages:
                out.append(float(fn(it.example, it.messages)))
            else:
                out.append(float(fn(it.example, it.answer)))
        return out

    code = getattr(fn, "__code__", None)
    score.source = code.co_filename if code is not None else None  # for the line a loop was at
    return score


def build_reward_set(
    env: Environment,
    *,
    thinking: bool,
    thinking_length_penalty: float = 0.0,
    judge: Any = None,
    judge_weight: float | None = None,
    count_tokens: Callable[[str], int] | None = None,
    stop: Sequence[str] = (),
    opened_in_prompt: bool = False,
    named: Sequence[Any] | None = None,
) -> RewardSet:
    """TRL reward functions for ``env`` (+ an optional judge with ``score_batch``) and their weights.

    ``count_tokens`` measures thinking for the penalty (pass the tokenizer's length; the default is a
    character estimate). ``stop`` cuts each completion at the first stop string before scoring, for
    generators that cannot stop on strings themselves. ``named`` (``[environment] rewards``, prepared by
    ``named_rewards.prepare``: items with ``kind``, ``name``, ``weight`` and ``make(name, log)``) replaces
    the environment's functions by those listed, an item of kind "env" standing for them.
    """
    log = RewardLog()
    kw = dict(thinking=thinking, stop=tuple(stop), opened_in_prompt=opened_in_prompt, count_tokens=count_tokens)
    funcs, weights, names = [], [], []

    def add_env(scale: float) -> None:
        for name, fn, weight in env.reward_functions():
            funcs.append(_TRLReward(_unique(name, names), _env_scorer(fn), kw, log))
            weights.append(float(weight) * scale)
            names.append(funcs[-1].__name__)

    if not named:
        add_env(1.0)
    for item in named or ():
        if item.kind == "env":
            add_env(item.weight)
            continue
        funcs.append(item.make(_unique(item.name, names), log))
        weights.append(item.weight)
        names.append(funcs[-1].__name__)
    if judge is not None:
        funcs.append(_TRLReward(_unique("judge", names), _env_scorer(judge), kw, log, limit_s=None))
        weights.append(float(judge_weight if judge_weight is not None else getattr(judge, "weight", 1.0)))
        names.append(funcs[-1].__name__)
    if thinking and thinking_length_penalty > 0:

        def penalty(items: list[Scored]) -> list[float]:
            return [-thinking_length_penalty * it.thinking_tokens for it in items]

        funcs.append(_TRLReward(_unique("thinking_length_penalty", names), penalty, kw, log))
        weights.append(1.0)
        names.append(funcs[-1].__name__)
    return RewardSet(funcs=funcs, weights=weights, names=names, log=log)


def _unique(name: str, taken: list[str]) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "reward"
    out, k = name, 2
    while out in taken:
        out, k = f"{name}_{k}", k + 1
    return out


# ---------------------------------------------------------------------------------------------------
# Group statistics and dynamic sampling


def _groups(rewards: Sequence[float], group_size: int) -> list[list[float]]:
    if group_size < 1 or len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size}")
    return [list(rewards[i : i + group_size]) for i in range(0, len(rewards), group_size)]


def _all_equal(group: Sequence[float], tol: float) -> bool:
    vals = [v for v in group if v is not None and not math.isnan(v)]
    return not vals or max(vals) - min(vals) <= tol


def group_stats(rewards: Sequence[float], group_size: int, tol: float = 1e-6) -> dict[str, float]:
    """Mean and (population) std of the rewards, and the share of groups whose rewards are all equal
    (those give GRPO no signal)."""
    groups = _groups(rewards, group_size)
    vals = [v for v in rewards if v is not None and not math.isnan(v)]
    mean = sum(vals) / len(vals) if vals else float("nan")
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals)) if vals else float("nan")
    flat = sum(_all_equal(g, tol) for g in groups)
    return {
        "reward_mean": mean,
        "reward_std": std,
        "frac_groups_all_equal": flat / len(groups) if groups else 0.0,
        "groups": float(len(groups)),
    }


def groups_to_keep(rewards: Sequence[float], group_size: int, tol: float = 1e-6) -> list[int]:
    """Dynamic sampling (DAPO): indices of the groups whose rewards differ, i.e. that carry signal."""
    return [i for i, g in enumerate(_groups(rewards, group_size)) if not _all_equal(g, tol)]


def keep_mask(rewards: Sequence[float], group_size: int, tol: float = 1e-6) -> list[bool]:
    """Per completion: True when its group is kept by ``groups_to_keep``."""
    keep = set(groups_to_keep(rewards, group_size, tol))
    return [i // group_size in keep for i in range(len(rewards))]
