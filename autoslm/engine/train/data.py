"""Turn environment examples into model text: the model's own chat template and the run's thinking flag.

The prompt is rendered exactly as it will be at inference (``add_generation_prompt=True`` with
``enable_thinking``), and SFT learns only the completion after it, so train and serve see the same
tokens and the loss falls on the assistant's tokens alone.
"""

from __future__ import annotations

from autoslm.envs.base import Example, Messages


def render_prompt(tokenizer, messages: Messages, thinking: bool, tools=None) -> str:
    kwargs = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=thinking, **kwargs)


def render_completion(example: Example, thinking: bool) -> str:
    """The assistant text SFT learns (the EOS token is appended by the trainer)."""
    if example.target is None:
        raise ValueError("example has no SFT target")
    if thinking:
        reasoning = str(example.info.get("reasoning", "")).strip()
        return f"<think>\n{reasoning}\n</think>\n\n{example.target}"
    return example.target


def sft_rows(examples: list[Example], tokenizer, thinking: bool, tools=None) -> list[dict]:
    """Prompts are rendered with the environment's tools, as GRPO and inference will see them."""
    return [
        {"prompt": render_prompt(tokenizer, ex.prompt, thinking, tools), "completion": render_completion(ex, thinking)}
        for ex in examples
    ]


def count_too_long(rows: list[dict], tokenizer, max_length: int) -> int:
    return sum(len(tokenizer(r["prompt"] + r["completion"])["input_ids"]) > max_length for r in rows)
