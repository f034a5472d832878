"""The Ollama ``Modelfile`` beside an exported GGUF: ``FROM`` the file, the run's chat template as Ollama's
``TEMPLATE`` (a Go template), its stop tokens and sampling as ``PARAMETER`` lines.

Ollama does not read Jinja, so the template is derived from the run's own: the Jinja template is
rendered on marker messages (a system prompt, a user turn, an assistant turn in the history, the
generation prompt with the run's ``thinking`` setting) and the text around each marker becomes the Go
template's text around ``.System`` and each message's ``.Content``. ``render_go`` renders that
Go template the way Ollama does for these few actions, so a test compares both renderings. No action
trims whitespace (``{{-``): the text around them is the template's, byte for byte.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_SYS, _U1, _A1, _U2 = "\x01SYSTEM\x01", "\x01USER1\x01", "\x01ASSISTANT\x01", "\x01USER2\x01"


@dataclass(frozen=True)
class TurnText:
    """The text the chat template puts around each part of a conversation."""

    head: str  # before everything (a BOS token, say)
    system: tuple[str, str]
    user: tuple[str, str]
    assistant: tuple[str, str]
    generation: str  # the generation prompt (with the run's thinking setting)


def turn_text(render) -> TurnText:
    """``render(messages, add_generation_prompt)`` -> text, the run's chat template; its parts."""
    with_history = render(
        [{"role": "user", "content": _U1}, {"role": "assistant", "content": _A1}, {"role": "user", "content": _U2}], True
    )
    with_system = render([{"role": "system", "content": _SYS}, {"role": "user", "content": _U1}], True)
    u1, a1, u2 = (with_history.index(m) for m in (_U1, _A1, _U2))
    between = with_history[u1 + len(_U1) : a1]  # user's end + assistant's start
    after_a = with_history[a1 + len(_A1) : u2]  # assistant's end + user's start
    # An assistant turn ends as it does when it is the last message; the next user turn starts after that.
    last = render([{"role": "user", "content": _U1}, {"role": "assistant", "content": _A1}], False)
    assistant_end = last[last.index(_A1) + len(_A1) :]
    head_and_user = with_history[:u1]
    if not (after_a.startswith(assistant_end) and head_and_user.endswith(after_a[len(assistant_end) :])):
        # Else: the longest text that both follows the assistant and starts the first user turn.
        cut = next(c for c in range(len(after_a) + 1) if head_and_user.endswith(after_a[c:]))
        assistant_end = after_a[:cut]
    user_start = after_a[len(assistant_end) :]
    head = head_and_user[: len(head_and_user) - len(user_start)]
    user_end_gen = with_history[u2 + len(_U2) :]
    # A user turn ends as an assistant turn does (the end-of-turn token); what follows starts the answer.
    if assistant_end and between.startswith(assistant_end) and user_end_gen.startswith(assistant_end):
        user_end = assistant_end
    else:
        user_end = _common_prefix(between, user_end_gen)
    s = with_system.index(_SYS)
    system_start = with_system[len(head) : s]
    system_end = with_system[s + len(_SYS) : with_system.index(_U1) - len(user_start)]
    return TurnText(
        head=head,
        system=(system_start, system_end),
        user=(user_start, user_end),
        assistant=(between[len(user_end) :], assistant_end),
        generation=user_end_gen[len(user_end) :],
    )


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _go_text(s: str) -> str:
    """Literal text inside a Go template: only ``{{`` needs escaping."""
    return s.replace("{{", '{{ "{{" }}')


def go_template(t: TurnText) -> str:
    """Ollama's TEMPLATE for the parts: the system prompt, every message, then the generation prompt."""
    return (
        _go_text(t.head)
        + "{{ if .System }}"
        + _go_text(t.system[0])
        + "{{ .System }}"
        + _go_text(t.system[1])
        + "{{ end }}"
        + "{{ range .Messages }}"
        + '{{ if eq .Role "user" }}'
        + _go_text(t.user[0])
        + "{{ .Content }}"
        + _go_text(t.user[1])
        + '{{ else if eq .Role "assistant" }}'
        + _go_text(t.assistant[0])
        + "{{ .Content }}"
        + _go_text(t.assistant[1])
        + "{{ end }}{{ end }}"
        + _go_text(t.generation)
    )


def render_go(t: TurnText, system: str | None, messages: list[dict]) -> str:
    """What Ollama makes of ``go_template(t)`` for a conversation (its actions are only these)."""
    out = t.head + (t.system[0] + system + t.system[1] if system else "")
    for m in messages:
        start, end = t.user if m["role"] == "user" else t.assistant
        out += start + m["content"] + end
    return out + t.generation


def modelfile(gguf: str, template: str, stops: list[str], sampling: dict, *, base: str, run_id: str, adapter: bool) -> str:
    """The Modelfile's text. For an adapter, FROM is the base model's GGUF, which the user supplies."""
    lines = [f"# Ollama Modelfile for autoslm run {run_id} (base model {base}): ollama create NAME -f Modelfile"]
    if adapter:
        lines += [f"# FROM: {base} as GGUF, the weights this adapter was trained on (e.g. autoslm export RUN --format gguf)"]
        lines += ["FROM ./base.gguf", f"ADAPTER ./{gguf}"]
    else:
        lines += [f"FROM ./{gguf}"]
    lines += [f'TEMPLATE """{template}"""']
    lines += [f"PARAMETER stop {json.dumps(s)}" for s in stops]
    lines += [f"PARAMETER {k} {v}" for k, v in sampling.items()]
    return "\n".join(lines) + "\n"
