"""``jsonl:path`` datasets: one JSON object a line, either prompt/answer rows or chat ``messages`` rows.

- ``{"prompt": "...", "answer": "..."}`` (optional ``"system"``): SFT learns the answer; GRPO rewards a
  completion that matches it (numbers compared as numbers, text after normalising case and spaces).
- ``{"messages": [{"role": ..., "content": ...}, ...]}``: SFT learns the last assistant message given
  everything before it; its content is also the reference answer.

The last ``eval_fraction`` of the rows (or the file ``eval_path``) is the held-out split.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from autoslm.envs.arith import last_number
from autoslm.envs.base import Environment, Example
from autoslm.errors import FatalWorkerError


class JsonlParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    eval_fraction: Annotated[float, Field(ge=0, lt=1, description="share of rows held out for eval (the last ones)")] = 0.1
    eval_path: Annotated[str | None, Field(description="a separate jsonl file for eval (overrides eval_fraction)")] = None
    max_rows: Annotated[int | None, Field(ge=1, description="use only the first N rows")] = None


def read_rows(path: Path, limit: int | None = None) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise FatalWorkerError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            rows.append(row_to_example_check(row, path, lineno))
            if limit and len(rows) >= limit:
                break
    if not rows:
        raise FatalWorkerError(f"{path}: no rows")
    return rows


def row_to_example_check(row, path, lineno) -> dict:
    if not isinstance(row, dict):
        raise FatalWorkerError(f"{path}:{lineno}: each line must be a JSON object")
    if "messages" in row:
        msgs = row["messages"]
        if not (isinstance(msgs, list) and msgs and all(isinstance(m, dict) and "role" in m and "content" in m for m in msgs)):
            raise FatalWorkerError(f"{path}:{lineno}: messages must be a list of {{role, content}} objects")
        if msgs[-1]["role"] != "assistant":
            raise FatalWorkerError(f"{path}:{lineno}: the last message must be the assistant's (what SFT learns)")
    elif "prompt" not in row:
        raise FatalWorkerError(f'{path}:{lineno}: a row needs "prompt" (with "answer") or "messages"')
    return row


def _example(row: dict) -> Example:
    if "messages" in row:
        msgs = row["messages"]
        return Example(prompt=msgs[:-1], answer=msgs[-1]["content"], target=msgs[-1]["content"])
    prompt = ([{"role": "system", "content": row["system"]}] if row.get("system") else []) + [
        {"role": "user", "content": str(row["prompt"])}
    ]
    answer = None if row.get("answer") is None else str(row["answer"])
    return Example(prompt=prompt, answer=answer, target=answer, info={k: v for k, v in row.items() if k not in ("prompt", "answer", "system")})


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().strip(".").lower()


class JsonlEnv(Environment):
    Params = JsonlParams

    def __init__(self, path: str | Path, params: dict, seed: int = 0, thinking: bool = False):
        self.path = Path(path)
        self.name = f"jsonl:{self.path.name}"
        self.p = JsonlParams.model_validate(params)
        rows = read_rows(self.path, self.p.max_rows)
        if self.p.eval_path:
            self._train, self._eval = rows, read_rows(Path(self.p.eval_path))
        else:
            n_eval = int(len(rows) * self.p.eval_fraction)
            self._train, self._eval = rows[: len(rows) - n_eval], rows[len(rows) - n_eval:]

    def train_examples(self) -> list[Example]:
        return [_example(r) for r in self._train]

    def eval_examples(self) -> list[Example]:
        return [_example(r) for r in self._eval]

    def reward(self, example: Example, completion: str) -> float:
        if example.answer is None:
            raise FatalWorkerError(f"{self.path}: rows have no answer, so completions cannot be scored")
        want = example.answer
        if re.fullmatch(r"-?\d+", want.strip()):
            return 1.0 if last_number(completion) == want.strip() else 0.0
        return 1.0 if _norm(completion) == _norm(want) else 0.0
