"""The Environment interface that the worker trains against. Pure Python: no torch here.

An environment gives train and held-out eval examples, each with prompt messages. SFT trains on
``Example.target`` (the assistant's reply). GRPO samples completions and scores them with ``reward``
(single-turn), ``reward_messages`` (a whole transcript), several weighted ``reward_functions``, or,
for multi-turn tasks, drives the conversation with ``step``. Tools, when present, are plain Python
callables with type hints and a docstring (what TRL's ``tools=`` expects).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Messages = list[dict[str, Any]]


@dataclass
class Example:
    prompt: Messages  # system/user messages up to the point where the model answers
    answer: str | None = None  # the reference answer a reward checks against
    target: str | None = None  # the assistant reply SFT learns (None: the env cannot be used for SFT)
    info: dict[str, Any] = field(default_factory=dict)
    # The whole chat when SFT must learn more than ``target``: every assistant turn, tool calls and
    # tool results (a chat dataset's rows). None for a single reply.
    conversation: Messages | None = None


@dataclass
class StepResult:
    """What a multi-turn environment says after the model's turn."""

    reply: str | None  # the environment's next user message; None when the episode ended
    done: bool
    reward: float | None = None  # set when done


class Environment:
    """Base class with the defaults; a task overrides what it has."""

    name: str = "environment"
    multi_turn: bool = False
    max_turns: int = 1

    def train_examples(self) -> list[Example]:
        raise NotImplementedError

    def eval_examples(self) -> list[Example]:
        return []

    def reward(self, example: Example, completion: str) -> float:
        """Score one completion (thinking already stripped) in [0, 1] where possible."""
        raise NotImplementedError(f"{self.name} has no reward: it can be used for SFT only")

    def reward_messages(self, example: Example, messages: Messages) -> float:
        """Score a whole transcript; the default scores the last assistant message."""
        last = next((m["content"] for m in reversed(messages) if m.get("role") == "assistant"), "")
        return self.reward(example, last or "")

    def reward_functions(self) -> list[tuple[str, Callable[[Example, str], float], float]]:
        """(name, fn, weight) triples; the default is the single ``reward`` with weight 1."""
        return [("correct", self.reward, 1.0)]

    def tools(self) -> list[Callable] | None:
        return None

    def step(self, example: Example, messages: Messages, state: dict) -> StepResult:
        """Multi-turn only: react to the model's latest turn (the last message in ``messages``)."""
        raise NotImplementedError(f"{self.name} is single-turn")
