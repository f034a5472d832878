"""SFT on whole chats: every assistant turn is learned, tool calls included, not only the last one.

Used for examples that carry a ``conversation`` (chat datasets with several assistant turns, tool
calls or a ``tools`` column). How the loss is masked depends on the model's chat template:

- With ``{% generation %}`` markers, or a template TRL knows how to patch for training (Qwen3, Llama 3,
  Gemma, ... see ``trl.chat_template_utils.get_training_chat_template``; TRL's ``assistant_only_loss``
  uses the same), each chat is tokenized once with the template's assistant-token mask, and the rows
  go to SFTTrainer pre-tokenized (``input_ids`` + ``labels``, -100 outside assistant turns).
- Otherwise each assistant turn becomes a prompt/completion row: the prompt is the chat before that
  turn rendered with a generation prompt, the completion what the template adds for the turn. Same
  loss, at the cost of re-reading the earlier turns once per turn.

Single-reply examples in the same run are turned into two-message chats so that one dataset reaches
the trainer. The ``thinking`` flag is passed to the template as ``enable_thinking``.
"""

from __future__ import annotations

from autoslm.envs.base import Example, Messages


def chats(examples: list[Example]) -> list[tuple[Messages, list | None]]:
    """(chat, tools) for each example that SFT can learn from."""
    out = []
    for ex in examples:
        if ex.conversation is not None:
            chat = ex.conversation
        elif ex.target is not None:
            chat = [*ex.prompt, {"role": "assistant", "content": ex.target}]
        else:
            continue
        out.append((chat, ex.info.get("tools") if isinstance(ex.info, dict) else None))
    return out


def training_template(tokenizer) -> str | None:
    """A chat template that marks assistant tokens, or None when neither the model's nor TRL's has one."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    template = tokenizer.chat_template
    if not template:
        return None
    try:
        patched = get_training_chat_template(tokenizer)
    except ValueError:
        return template if has_generation_markers(template) else None
    return patched if patched is not None else template


def tokenized_rows(pairs, tokenizer, template: str, thinking: bool, max_length: int) -> tuple[list[dict], int]:
    """(rows with input_ids and labels, how many were cut at max_length)."""
    rows, too_long = [], 0
    for chat, tools in pairs:
        out = tokenizer.apply_chat_template(
            chat,
            tools=tools,
            chat_template=template,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
            enable_thinking=thinking,
        )
        ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
        if not any(mask):
            continue
        if len(ids) > max_length:
            too_long += 1
            ids, mask = ids[:max_length], mask[:max_length]
            if not any(mask):
                continue
        rows.append({"input_ids": ids, "labels": [t if m else -100 for t, m in zip(ids, mask)]})
    return rows, too_long


def per_turn_rows(pairs, tokenizer, thinking: bool) -> list[dict]:
    """Prompt/completion rows, one per assistant turn, from the template's own rendering."""
    eos = tokenizer.eos_token or ""
    rows = []
    for chat, tools in pairs:
        kwargs = {"tools": tools} if tools else {}
        for i, m in enumerate(chat):
            if m.get("role") != "assistant":
                continue
            prompt = tokenizer.apply_chat_template(
                chat[:i], add_generation_prompt=True, tokenize=False, enable_thinking=thinking, **kwargs
            )
            full = tokenizer.apply_chat_template(chat[: i + 1], tokenize=False, enable_thinking=thinking, **kwargs)
            if not full.startswith(prompt):
                continue  # the template rewrites history here: this turn cannot be isolated
            completion = full[len(prompt) :].rstrip()
            if eos and completion.endswith(eos):
                completion = completion[: -len(eos)]  # the trainer appends EOS itself
            if completion:
                rows.append({"prompt": prompt, "completion": completion})
    return rows
