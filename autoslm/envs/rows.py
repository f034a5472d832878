"""Dataset rows -> Examples: the row formats TRL users already have, shared by ``jsonl:`` and ``hf:``.

After ``params.columns`` has renamed a dataset's own column names to these, a row is one of:

- ``messages``: a chat (``role``/``content``, assistant ``tool_calls``, ``tool`` results). SFT learns
  every assistant turn, tool calls included; the last assistant turn is also the reference answer.
- ``prompt`` + ``completion``: the prompt is text (one user message) or messages; the completion is
  text or assistant messages (then learned like a chat's assistant turns).
- ``prompt`` + ``answer`` (optional ``system``): SFT learns the answer; GRPO rewards a completion that
  matches it (numbers compared as numbers, text after normalising case, spaces and a final period).
- optional ``tools``: the function schemas the chat may call (a list, or that list as a JSON string);
  they are rendered into the prompt by the model's chat template.

Pure Python (no torch, no datasets): the launch-time check reads the same column rules. A problem is
raised as ``RowError`` without a location; the caller adds the file and line or the split and row.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from autoslm.envs.arith import last_number
from autoslm.envs.base import Environment, Example, Messages

FORMATS_HELP = 'accepted formats: "messages"; "prompt" + "completion"; "prompt" + "answer" (+ optional "tools")'
COLUMNS_HINT = 'rename yours with params.columns, e.g. columns = { prompt = "question", answer = "solution" }'
KNOWN = ("messages", "prompt", "completion", "answer", "system", "tools")


class RowError(ValueError):
    """A row that cannot be used; the message has no location (the caller knows it)."""


def rename(row: Mapping[str, Any], columns: Mapping[str, str] | None) -> dict[str, Any]:
    """Apply ``params.columns`` ({autoslm name: the dataset's column name}) to one row."""
    out = dict(row)
    for ours, theirs in (columns or {}).items():
        if theirs in row:
            out[ours] = row[theirs]
            if theirs != ours and theirs not in KNOWN:
                out.pop(theirs, None)
    return out


def missing_columns(columns: set[str] | list[str], judged: bool = False) -> str | None:
    """None when rows with these columns are usable; otherwise what is missing and what is accepted.
    With an LLM judge (``judged``) a prompt alone is enough: the judge scores without an answer."""
    cols = set(columns)
    if "messages" in cols or ("prompt" in cols and ("completion" in cols or "answer" in cols or judged)):
        return None
    found = ", ".join(sorted(cols)) or "none"
    if "prompt" in cols:
        missing = 'missing column "answer" (or "completion")'
    elif "completion" in cols or "answer" in cols:
        missing = 'missing column "prompt"'
    else:
        missing = 'missing column "messages" (or "prompt")'
    return f"{missing}; columns found: {found}; {FORMATS_HELP}; {COLUMNS_HINT}"


def clean(value: Any) -> Any:
    """Drop None entries from dicts, recursively. Arrow gives every struct in a column the union of
    all keys, filling the absent ones with None, which a chat template would render as null."""
    if isinstance(value, Mapping):
        return {k: clean(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def parse_tools(value: Any) -> list[dict] | None:
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise RowError(f'"tools" is not valid JSON ({e.msg})') from None
    if not isinstance(value, list) or not all(isinstance(t, Mapping) for t in value):
        raise RowError('"tools" must be a list of function schemas ({"type": "function", "function": {...}})')
    return [clean(t) for t in value]


def _messages(value: Any, what: str) -> Messages:
    if not isinstance(value, (list, tuple)) or not value:
        raise RowError(f'"{what}" must be a non-empty list of {{role, content}} messages')
    msgs = []
    for m in clean(list(value)):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RowError(f'"{what}" must be a list of {{role, content}} messages')
        if "content" not in m and not m.get("tool_calls"):
            raise RowError(f'a {m["role"]!r} message in "{what}" has no content')
        for call in m.get("tool_calls") or []:
            args = (call.get("function") or {}).get("arguments") if isinstance(call, dict) else None
            if isinstance(args, str):  # OpenAI style: arguments as a JSON string; templates want a dict
                try:
                    call["function"]["arguments"] = json.loads(args)
                except json.JSONDecodeError:
                    pass
        msgs.append(m)
    return msgs


def _as_prompt(value: Any, system: Any) -> Messages:
    if isinstance(value, (list, tuple)):
        return _messages(value, "prompt")
    if value is None or isinstance(value, Mapping):
        raise RowError('"prompt" must be text or a list of messages')
    msgs = [{"role": "system", "content": str(system)}] if system else []
    return msgs + [{"role": "user", "content": str(value)}]


def turn_text(message: Mapping[str, Any]) -> str:
    """An assistant turn as text: its content, then its tool calls in the Qwen/Hermes format."""
    parts = [message["content"]] if isinstance(message.get("content"), str) and message["content"] else []
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call) if isinstance(call, Mapping) else {}
        payload = json.dumps({"name": fn.get("name"), "arguments": fn.get("arguments", {})})
        parts.append(f"<tool_call>\n{payload}\n</tool_call>")
    return "\n".join(parts)


def _needs_chat(msgs: Messages) -> bool:
    """A chat only SFT's whole-conversation path can learn: several assistant turns, or tool use."""
    return sum(m["role"] == "assistant" for m in msgs) > 1 or any(m.get("tool_calls") or m["role"] == "tool" for m in msgs)


def to_example(row: Mapping[str, Any]) -> Example:
    """One (already renamed) row -> an Example. Raises RowError."""
    tools = parse_tools(row.get("tools"))
    info: dict[str, Any] = {"tools": tools} if tools else {}
    if "messages" in row:
        msgs = _messages(row["messages"], "messages")
        last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=None)
        if last is None:
            raise RowError('"messages" has no assistant turn: nothing to learn')
        chat = msgs[: last + 1]
        text = turn_text(chat[last])
        return Example(
            prompt=chat[:last], answer=text, target=text, info=info, conversation=chat if (_needs_chat(chat) or tools) else None
        )
    if "prompt" not in row:
        raise RowError(missing_columns(row.keys()) or 'missing column "prompt"')
    prompt = _as_prompt(row["prompt"], row.get("system"))
    extra = {k: v for k, v in row.items() if k not in KNOWN}
    if row.get("completion") is not None:
        completion = row["completion"]
        if isinstance(completion, (list, tuple)):
            turns = _messages(completion, "completion")
            if not any(m["role"] == "assistant" for m in turns):
                raise RowError('"completion" has no assistant message: nothing to learn')
            last = max(i for i, m in enumerate(turns) if m["role"] == "assistant")
            chat = prompt + turns[: last + 1]
            text = turn_text(turns[last])
            return Example(
                prompt=chat[: len(prompt) + last],
                answer=text,
                target=text,
                info={**extra, **info},
                conversation=chat if (_needs_chat(chat) or tools) else None,
            )
        text = str(completion)
        return Example(
            prompt=prompt,
            answer=text,
            target=text,
            info={**extra, **info},
            conversation=[*prompt, {"role": "assistant", "content": text}] if tools else None,
        )
    answer = None if row.get("answer") is None else str(row["answer"])
    return Example(
        prompt=prompt,
        answer=answer,
        target=answer,
        info={**extra, **info},
        conversation=[*prompt, {"role": "assistant", "content": answer}] if tools and answer is not None else None,
    )


PROMPT_TEMPLATE_HELP = 'a text with "{prompt}" where the row\'s prompt goes, e.g. "{prompt} Answer after ####."'


def prompt_template_problem(template: str | None) -> str | None:
    if template is None:
        return None
    if "{prompt}" not in template:
        return f"must contain {{prompt}}: {PROMPT_TEMPLATE_HELP}"
    try:
        template.format(prompt="")
    except (IndexError, KeyError, ValueError) as e:
        return f"cannot be filled in ({e}); write literal braces as {{{{ and }}}}: {PROMPT_TEMPLATE_HELP}"
    return None


def _checked_template(template: str | None) -> str | None:
    problem = prompt_template_problem(template)
    if problem:
        raise ValueError(problem)
    return template


# The ``prompt_template`` parameter of the row formats (jsonl:, hf:), checked where the params are read.
PromptTemplate = Annotated[
    str | None,
    Field(description='the user message as "{prompt} ..." around each row\'s prompt, e.g. "{prompt} Answer after ####."'),
    AfterValidator(_checked_template),
]


def apply_template(example: Example, template: str | None) -> Example:
    """The example with its last user message put through ``template`` (``"{prompt}"`` marks where it goes)."""
    if not template:
        return example
    prompt = [dict(m) for m in example.prompt]
    for m in reversed(prompt):
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            m["content"] = template.format(prompt=m["content"])
            break
    example.prompt = prompt
    return example


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().strip(".").lower()


def match_reward(answer: str, completion: str) -> float:
    """1 when the completion gives the answer: the last number for a numeric answer, else the
    normalised text."""
    want = answer.strip()
    if re.fullmatch(r"-?\d+", want):
        return 1.0 if last_number(completion) == want else 0.0
    return 1.0 if _norm(completion) == _norm(want) else 0.0


class RowsEnvironment(Environment):
    """An environment made of rows in these formats (a jsonl file, a Hub dataset): the subclass fills
    ``_train`` and ``_eval``; GRPO scores a completion by matching the row's answer."""

    name: str
    _train: list[Example]
    _eval: list[Example]

    def train_examples(self) -> list[Example]:
        return list(self._train)

    def eval_examples(self) -> list[Example]:
        return list(self._eval)

    # How a completion is scored, set once by the subclass's constructor from [environment]:
    answer_format: str | None = None  # answer_format: where the row's final answer sits
    scored_by_rewards: bool = False  # rewards without "env": the reward functions score, rows need no answer

    def reward(self, example: Example, completion: str) -> float:
        if example.answer is None:
            if self.scored_by_rewards:
                raise NotImplementedError(f"{self.name}: rows have no answer; the reward functions score completions")
            from autoslm.errors import FatalWorkerError

            raise FatalWorkerError(f"{self.name}: rows have no answer, so completions cannot be scored")
        if self.answer_format:
            from autoslm.envs.answers import format_reward

            return format_reward(example.answer, completion, self.answer_format)
        return match_reward(example.answer, completion)
