"""Built-in task "autoslm/calc-tool": arithmetic the model should solve by calling a calculator tool.

``tools()`` gives TRL the ``calculator`` function (type hints + Google-style docstring, which is what
``GRPOTrainer(tools=...)`` turns into the tool schema). The main reward checks the final answer (the
last number of the last assistant message); a small, separately weighted bonus rewards a calculator
call in the transcript. Splits are fixed and disjoint, independent of the run's seed, like
"autoslm/arith". The calculator parses with ``ast`` and evaluates a whitelist of number operations:
it must never call ``eval`` or reach names, attributes or calls.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import random
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from autoslm.envs.base import Environment, Example, Messages

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
MAX_EXPRESSION_CHARS = 200
MAX_MAGNITUDE = 10**60  # results beyond this are refused: keeps a tool call cheap whatever the model writes
MAX_EXPONENT = 64

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNOPS = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNOPS:
        return _UNOPS[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and (
            abs(right) > MAX_EXPONENT or (abs(left) > 1 and abs(right) * math.log10(abs(left)) > 60)
        ):
            raise ValueError("number too large")
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ValueError("division by zero")
        value = _BINOPS[type(node.op)](left, right)
        if isinstance(value, complex) or abs(value) > MAX_MAGNITUDE:
            raise ValueError("number too large")
        return value
    raise ValueError(f"unsupported syntax: {type(node).__name__}")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: The arithmetic expression to evaluate, using numbers, + - * / // % ** and parentheses, e.g. "12 * (3 + 4)".

    Returns:
        The value of the expression.
    """
    text = str(expression).strip().replace("×", "*").replace("÷", "/").replace("^", "**").replace("−", "-")
    if not text:
        raise ValueError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot parse {text!r}") from None
    value = _evaluate(tree)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("result is not a finite number")
        if value.is_integer() and abs(value) < 2**53:
            return str(int(value))
        return format(value, ".12g")
    return str(value)


class CalcToolParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n_train: Annotated[int, Field(ge=1, le=1_000_000, description="train examples")] = 2000
    n_eval: Annotated[int, Field(ge=0, le=10_000, description="held-out examples, disjoint from train")] = 64
    max_operand: Annotated[int, Field(ge=2, le=10**9, description="operands are drawn from 0..max_operand")] = 999
    ops: Annotated[list[Literal["+", "-", "*"]], Field(min_length=1, description="operators to use")] = ["+", "-", "*"]
    tool_bonus: Annotated[
        float, Field(ge=0, le=1, description="reward weight of calling the calculator at all (0 = no bonus)")
    ] = 0.1
    instruction: Annotated[str, Field(description="appended to every question")] = (
        "Use the calculator tool, then answer with the number only."
    )


def last_number(text: str | None) -> str | None:
    found = _NUMBER.findall(text or "")
    return found[-1] if found else None


def _same_number(got: str | None, want: str | None) -> bool:
    if got is None or want is None:
        return False
    try:
        return math.isclose(float(got), float(want), rel_tol=0, abs_tol=1e-9)
    except ValueError:
        return False


def called_calculator(messages: Messages) -> bool:
    """Whether the transcript holds a calculator call: a parsed tool call, a tool result, or the raw
    ``<tool_call>`` text a template without a response parser leaves in the content."""
    for m in messages:
        role = m.get("role")
        if role == "assistant":
            for call in m.get("tool_calls") or []:
                fn = call.get("function", call) if isinstance(call, dict) else {}
                if isinstance(fn, dict) and fn.get("name") == "calculator":
                    return True
            content = m.get("content")
            if isinstance(content, str) and "<tool_call>" in content and "calculator" in content:
                return True
        elif role == "tool" and m.get("name") in (None, "calculator"):
            return True
    return False


def tool_use(example: Example, messages: Messages) -> float:
    return 1.0 if called_calculator(messages) else 0.0


tool_use.takes_messages = True  # the bonus reads the whole transcript, not just the final answer


class CalcToolEnv(Environment):
    name = "autoslm/calc-tool"
    Params = CalcToolParams

    def __init__(self, params: dict | None = None, seed: int = 0, thinking: bool = False):
        self.p = CalcToolParams.model_validate(params or {})
        self.seed = seed
        self.thinking = thinking
        space = len(self.p.ops) * (self.p.max_operand + 1) ** 2
        n_eval = min(self.p.n_eval, space // 4)
        rng = random.Random(1234)
        eval_set: dict[tuple, None] = {}
        while len(eval_set) < n_eval:
            eval_set[self._draw(rng)] = None
        self._eval = list(eval_set)
        rng = random.Random(4321)
        self._train = []
        while len(self._train) < self.p.n_train:
            t = self._draw(rng)
            if t not in eval_set:
                self._train.append(t)

    def _draw(self, rng: random.Random) -> tuple[int, str, int]:
        return (rng.randint(0, self.p.max_operand), rng.choice(self.p.ops), rng.randint(0, self.p.max_operand))

    def _example(self, a: int, op: str, b: int) -> Example:
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        question = f"What is {a} {op} {b}? {self.p.instruction}".strip()
        call = json.dumps({"name": "calculator", "arguments": {"expression": f"{a} {op} {b}"}})
        return Example(
            prompt=[{"role": "user", "content": question}],
            answer=str(value),
            # SFT teaches the first move, the call (in the Qwen3 tool-call format); GRPO then rewards
            # the answer given after the tool's result.
            target=f"<tool_call>\n{call}\n</tool_call>",
            info={"expression": f"{a} {op} {b}", "reasoning": f"calculator({a} {op} {b}) = {value}"},
        )

    def train_examples(self) -> list[Example]:
        return [self._example(*t) for t in self._train]

    def eval_examples(self) -> list[Example]:
        return [self._example(*t) for t in self._eval]

    def reward(self, example: Example, completion: str) -> float:
        return 1.0 if _same_number(last_number(completion), example.answer) else 0.0

    def reward_functions(self):
        out = [("correct", self.reward, 1.0)]
        if self.p.tool_bonus > 0:
            out.append(("tool_use", tool_use, self.p.tool_bonus))
        return out

    def tools(self):
        return [calculator]
