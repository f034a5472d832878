"""`autoslm chat RUN` and ``Run.chat``: talk to what a run trained, on this machine (or, while
`autoslm serve` serves the run, to that endpoint).

This module is light (no torch): it finds the run, its base model, its ``thinking`` setting and its
adapter (a local run, a run id of this home, or an ``hf://`` run reference, whose adapter it
downloads), and says in one line why it cannot chat (no adapter yet, no worker extra). The model
itself is loaded by ``autoslm.views.chat_model``, imported only when a chat starts.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from autoslm.controller.state import RunState
from autoslm.errors import UsageError
from autoslm.layout import adapter_location
from autoslm.store.adapters import AdapterDamaged, check_adapter

WORKER_EXTRA = ("torch", "transformers", "peft")


@dataclass
class ChatTarget:
    run_id: str
    model: str
    thinking: bool
    trust_remote_code: bool
    adapter: Path | None  # None: the base model alone (--base)
    source: str | None = None  # where the adapter came from (its store location), for messages


def require_worker_extra() -> None:
    def absent(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except (ImportError, ValueError):
            return True

    missing = [m for m in WORKER_EXTRA if absent(m)]
    if missing:
        raise UsageError(
            f"autoslm chat runs the model here and needs the worker extra ({', '.join(missing)} missing)",
            hint="pip install 'autoslm[worker]'",
        )


def find_target(client, ref: str, workdir: Path, *, base: bool = False) -> ChatTarget:
    """The run's model and settings, and its adapter fetched into ``workdir`` (unless ``base``)."""
    from autoslm.views.runview import artifacts_of, collect

    data = collect(client, ref, tick=False)
    spec = data.spec or {}
    st = data.status
    run_id = data.run_id
    if not spec.get("model"):
        raise UsageError(
            f"run {run_id}: its spec is not in the store yet, so its model is unknown",
            hint=f"wait until it has started (`autoslm status {run_id}`)",
        )
    adapter = where = None
    if not base:
        state = st.state
        if state is not RunState.SUCCEEDED:
            step = f" at step {st.step}/{st.total_steps}" if st.total_steps else ""
            hint = (
                f"`autoslm watch {run_id}` follows it to the end; --base chats with the base model meanwhile"
                if state.live
                else "--base chats with the base model"
            )
            raise UsageError(f"run {run_id} is {state}{step}: it has no adapter yet", hint=hint)
        _, arts = artifacts_of(client, data.ref)
        adapter = workdir / "adapter"
        arts[0].fetch_adapter(adapter)
        if not (adapter / "adapter_config.json").exists():
            raise UsageError(f"run {run_id}: no adapter in its store ({st.store})")
        where = adapter_location(arts[0].store.uri, arts[0].paths)
        try:
            check_adapter(adapter)
        except AdapterDamaged as e:  # name the file where the user can find it: in the store, not our temp folder
            raise AdapterDamaged(
                f"{where}/{e.path.name}",
                e.problem,
                hint="the run's adapter in its store is damaged; relaunch the run, or --base chats with the base model",
            ) from None
    return ChatTarget(
        run_id, spec["model"], bool(spec.get("thinking", False)), bool(spec.get("trust_remote_code", False)), adapter, where
    )


class Chat:
    """A loaded model (and adapter) with a conversation. ``ask`` returns the answer; ``on_text`` streams it."""

    def __init__(
        self,
        client,
        ref: str,
        *,
        base: bool = False,
        temperature: float = 0.0,
        max_new_tokens: int = 256,
        device: str | None = None,
    ):
        require_worker_extra()
        self._tmp = tempfile.TemporaryDirectory(prefix="autoslm-chat-")
        self.target = find_target(client, ref, Path(self._tmp.name), base=base)
        from autoslm.views.chat_model import load

        self.model = load(self.target, client.home, device=device)
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.history: list[dict] = []

    def ask(self, text: str, on_text=None) -> str:
        self.history.append({"role": "user", "content": text})
        answer = self.model.generate(
            self.history, temperature=self.temperature, max_new_tokens=self.max_new_tokens, on_text=on_text
        )
        self.history.append({"role": "assistant", "content": answer})
        return answer

    def reset(self) -> None:
        self.history = []

    def close(self) -> None:
        self._tmp.cleanup()


class RemoteChat:
    """A conversation with a running serve of the run (`autoslm serve`): its OpenAI endpoint answers."""

    def __init__(self, url: str, model: str, run_id: str, temperature: float, max_new_tokens: int, headers=None):
        self.url, self.temperature, self.max_new_tokens, self.history = url, temperature, max_new_tokens, []
        self.headers = headers or {}  # the bearer from the environment, where the endpoint needs one
        self.target = ChatTarget(run_id, model, False, False, None, url)
        self.model = SimpleNamespace(device=url)  # where it runs, as the chat's first line says

    def ask(self, text: str, on_text=None) -> str:
        from autoslm.sdk.serve_endpoint import chat_remote

        self.history.append({"role": "user", "content": text})
        answer = chat_remote(
            self.url,
            self.target.model,
            self.history,
            temperature=self.temperature,
            max_tokens=self.max_new_tokens,
            headers=self.headers,
        )
        self.history.append({"role": "assistant", "content": answer})
        if on_text is not None:
            on_text(answer)
        return answer

    def reset(self) -> None:
        self.history = []

    def close(self) -> None:
        pass


def open_chat(client, ref: str, *, base: bool, temperature: float, max_new_tokens: int):
    """The run's serve endpoint while one answers (not for --base), else the model loaded here."""
    if not base:
        from autoslm.sdk.serve import serving_run
        from autoslm.sdk.serve_endpoint import endpoint

        serve_id = serving_run(client, ref)
        found = endpoint(client, serve_id) if serve_id else None
        if found is not None and found.url:
            sys.stderr.write(f"talking to the serve {serve_id} at {found.url} (model {found.model})\n")
            return RemoteChat(found.url, found.model, serve_id, temperature, max_new_tokens, found.headers())
    return Chat(client, ref, base=base, temperature=temperature, max_new_tokens=max_new_tokens)


def chat_command(client, ref: str, *, prompt: str | None, base: bool, temperature: float, max_new_tokens: int) -> None:
    """The CLI: one answer for ``prompt``, else a conversation on the terminal until /exit or Ctrl-D."""
    chat = open_chat(client, ref, base=base, temperature=temperature, max_new_tokens=max_new_tokens)

    def out(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    try:
        if prompt is not None:
            chat.ask(prompt, on_text=out)
            out("\n")
            return
        t = chat.target
        what = "the base model" if t.adapter is None and t.source is None else "its adapter"
        sys.stderr.write(
            f"chatting with {t.model} + {what} (run {t.run_id}, on {chat.model.device}); "
            "/reset starts over, /exit or Ctrl-D ends\n"
        )
        while True:
            try:
                text = input("> ")
            except EOFError:
                out("\n")
                return
            if text.strip() in ("/exit", "/quit"):
                return
            if text.strip() == "/reset":
                chat.reset()
                continue
            if not text.strip():
                continue
            chat.ask(text, on_text=out)
            out("\n")
    finally:
        chat.close()
