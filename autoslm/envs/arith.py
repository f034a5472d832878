"""Built-in task "autoslm/arith": small-integer arithmetic with a checkable answer.

Train and eval splits are disjoint and fixed (they do not depend on the run's seed, so replicates see
the same data). Works for SFT (target = the answer) and GRPO (reward = 1 when the last number in the
completion equals the answer).
"""

from __future__ import annotations

import random
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from autoslm.envs.base import Environment, Example

_NUMBER = re.compile(r"-?\d+")
# Problem spaces up to this size are built whole and shuffled (the quickstart's 100 sums: its data stays
# what its learning bounds were measured on); larger ones are sampled by index.
SHUFFLED_UP_TO = 100_000


class ArithParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n_train: Annotated[int, Field(ge=1, le=1_000_000, description="train examples (drawn with replacement)")] = 2000
    n_eval: Annotated[int, Field(ge=0, le=10_000, description="held-out examples, disjoint from train")] = 64
    max_operand: Annotated[int, Field(ge=2, le=10_000, description="operands are drawn from 0..max_operand")] = 9
    ops: Annotated[list[Literal["+", "-", "*"]], Field(min_length=1, description="operators to use")] = ["+"]
    instruction: Annotated[str, Field(description="appended to every question")] = "Answer with the number only."


def last_number(text: str) -> str | None:
    found = _NUMBER.findall(text or "")
    return found[-1] if found else None


class ArithEnv(Environment):
    name = "autoslm/arith"
    Params = ArithParams

    def __init__(self, params: dict, seed: int = 0, thinking: bool = False):
        self.p = ArithParams.model_validate(params)
        self.thinking = thinking
        side = self.p.max_operand + 1
        size = len(self.p.ops) * side * side
        n_eval = min(self.p.n_eval, size // 4)
        if size <= SHUFFLED_UP_TO:
            problems = [(a, op, b) for op in self.p.ops for a in range(side) for b in range(side)]
            random.Random(1234).shuffle(problems)
            self._eval, pool = problems[:n_eval], problems[n_eval:]
            rng = random.Random(4321)
            self._train = [pool[rng.randrange(len(pool))] for _ in range(self.p.n_train)]
            return
        # A large space (3 million problems at max_operand 999 with three operators) is sampled by index
        # rather than built and shuffled whole, which took 5 s of every rank's start.
        held = random.Random(1234).sample(range(size), n_eval)
        held_set, rng, train = set(held), random.Random(4321), []
        while len(train) < self.p.n_train:
            i = rng.randrange(size)
            if i not in held_set:
                train.append(i)

        def problem(i: int) -> tuple[int, str, int]:
            return (i // side) % side, self.p.ops[i // (side * side)], i % side

        self._eval, self._train = [problem(i) for i in held], [problem(i) for i in train]

    def _example(self, a: int, op: str, b: int) -> Example:
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        question = f"What is {a} {op} {b}? {self.p.instruction}".strip()
        return Example(
            prompt=[{"role": "user", "content": question}],
            answer=str(value),
            target=str(value),
            info={"reasoning": f"{a} {op} {b} = {value}"},
        )

    def train_examples(self) -> list[Example]:
        return [self._example(*t) for t in self._train]

    def eval_examples(self) -> list[Example]:
        return [self._example(*t) for t in self._eval]

    def reward(self, example: Example, completion: str) -> float:
        return 1.0 if last_number(completion) == example.answer else 0.0
