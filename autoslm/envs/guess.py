"""Built-in task "autoslm/guess": a multi-turn game, guess a hidden number from 1 to N.

Each turn the model replies with a number and the environment answers "higher", "lower" or "correct".
The episode ends on a correct guess or after ``max_turns`` guesses. Rewards are computed from the
transcript alone (replaying the game against ``Example.answer``, the hidden number), so they are
deterministic and need no state kept between the rollout and the reward functions:
"solved" (1 when the number was found) and "speed" (1 for a first-try hit, down to 1/max_turns for a
hit on the last turn, 0 when unsolved), weighted by ``speed_weight``.

Hidden numbers come from fixed generators (train and eval use different streams), independent of the
run's seed, like the other built-ins. The prompt never reveals the number. GRPO only: there is no SFT
target. The rollout that plays the game under TRL lives in ``autoslm.engine.rollout.multiturn``.
"""

from __future__ import annotations

import random
import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from autoslm.envs.base import Environment, Example, Messages, StepResult

_INT = re.compile(r"-?\d+")

CORRECT, HIGHER, LOWER = "correct", "higher", "lower"


class GuessParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n_train: Annotated[int, Field(ge=1, le=1_000_000, description="train episodes")] = 2000
    n_eval: Annotated[int, Field(ge=0, le=10_000, description="held-out episodes")] = 64
    max_number: Annotated[int, Field(ge=2, le=1_000_000, description="the hidden number is drawn from 1..max_number")] = 100
    max_turns: Annotated[int, Field(ge=1, le=50, description="guesses allowed per episode")] = 8
    speed_weight: Annotated[float, Field(ge=0, le=10, description="reward weight of finding the number in few turns")] = 0.5


def parse_guess(text: str | None) -> int | None:
    """The model's guess: the last whole number in its reply."""
    found = _INT.findall(text or "")
    return int(found[-1]) if found else None


def replay(secret: int, assistant_turns: list[str], max_turns: int) -> tuple[bool, int]:
    """(solved, guesses used) for the given assistant replies, stopping at the first correct one."""
    used = 0
    for text in assistant_turns[:max_turns]:
        used += 1
        if parse_guess(text) == secret:
            return True, used
    return False, used


def _assistant_turns(example: Example, messages: Messages) -> list[str]:
    tail = messages[len(example.prompt) :] if messages[: len(example.prompt)] == example.prompt else messages
    out = []
    for m in tail:
        if m.get("role") == "assistant":
            c = m.get("content")
            out.append(c if isinstance(c, str) else "")
    return out


class GuessEnv(Environment):
    name = "autoslm/guess"
    Params = GuessParams
    multi_turn = True

    def __init__(self, params: dict | None = None, seed: int = 0, thinking: bool = False):
        self.p = GuessParams.model_validate(params or {})
        self.seed = seed
        self.thinking = thinking
        self.max_turns = self.p.max_turns
        rng = random.Random(2024)
        self._train = [rng.randint(1, self.p.max_number) for _ in range(self.p.n_train)]
        rng = random.Random(4202)
        self._eval = [rng.randint(1, self.p.max_number) for _ in range(self.p.n_eval)]

    def _question(self) -> str:
        return (
            f"Let's play a game. I am thinking of a whole number from 1 to {self.p.max_number}. "
            f'Guess it: reply with one number. After each guess I will say "{HIGHER}" (the number is larger), '
            f'"{LOWER}" (it is smaller) or "{CORRECT}". You have {self.p.max_turns} guesses.'
        )

    def _example(self, secret: int, index: int, split: str) -> Example:
        return Example(
            prompt=[{"role": "user", "content": self._question()}],
            answer=str(secret),
            target=None,
            info={"max_number": self.p.max_number, "max_turns": self.p.max_turns, "episode": f"{split}-{index}"},
        )

    def train_examples(self) -> list[Example]:
        return [self._example(s, i, "train") for i, s in enumerate(self._train)]

    def eval_examples(self) -> list[Example]:
        return [self._example(s, i, "eval") for i, s in enumerate(self._eval)]

    # -- the game ----------------------------------------------------------------------------------

    def step(self, example: Example, messages: Messages, state: dict) -> StepResult:
        """React to the latest assistant message (thinking already removed by the rollout)."""
        secret = int(example.answer)
        state["turns"] = state.get("turns", 0) + 1
        last = next((m.get("content") for m in reversed(messages) if m.get("role") == "assistant"), "")
        guess = parse_guess(last if isinstance(last, str) else "")
        if guess == secret:
            return StepResult(reply=CORRECT, done=True, reward=self._score(True, state["turns"]))
        if guess is None:
            reply = f"Please reply with one whole number from 1 to {self.p.max_number}."
        else:
            reply = HIGHER if guess < secret else LOWER
        if state["turns"] >= self.p.max_turns:
            return StepResult(reply=reply, done=True, reward=0.0)
        return StepResult(reply=reply, done=False)

    def _speed(self, solved: bool, used: int) -> float:
        return (self.p.max_turns - used + 1) / self.p.max_turns if solved else 0.0

    def _score(self, solved: bool, used: int) -> float:
        return (1.0 if solved else 0.0) + self.p.speed_weight * self._speed(solved, used)

    # -- rewards -----------------------------------------------------------------------------------

    def outcome(self, example: Example, messages: Messages) -> tuple[bool, int]:
        return replay(int(example.answer), _assistant_turns(example, messages), self.p.max_turns)

    def reward(self, example: Example, completion: str) -> float:
        """A single reply: solved only when the first guess is right."""
        return 1.0 if parse_guess(completion) == int(example.answer) else 0.0

    def reward_messages(self, example: Example, messages: Messages) -> float:
        return self._score(*self.outcome(example, messages))

    def reward_functions(self):
        def solved(example: Example, messages: Messages) -> float:
            return 1.0 if self.outcome(example, messages)[0] else 0.0

        def speed(example: Example, messages: Messages) -> float:
            return self._speed(*self.outcome(example, messages))

        solved.takes_messages = True
        speed.takes_messages = True
        out = [("solved", solved, 1.0)]
        if self.p.speed_weight > 0:
            out.append(("speed", speed, self.p.speed_weight))
        return out
