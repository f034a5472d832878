"""The notebook's handles. ``Run``: one run, the SDK's operations on it, plus what it looks like
(metrics frame, plot, report, push); ``autoslm.launch`` and ``autoslm.attach`` return one.
``SweepHandle``: one sweep, the same operations over its runs; ``autoslm.sweep`` returns one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autoslm.controller.status import RunStatus, SweepStatus
    from autoslm.sdk import Client


@dataclass
class Run:
    """A handle on one run, for notebooks. ``run_id`` may also be an ``hf://owner/repo/<phase>/<run_id>``
    reference to a run launched elsewhere (see ``autoslm.attach``)."""

    client: "Client"
    run_id: str
    _chat: object = field(default=None, repr=False, compare=False)

    def status(self) -> RunStatus:
        """The run now (``.state``, ``.step``, ``.seeds``...; ``.to_json()`` for a dict)."""
        return self.client.status(self.run_id)

    def wait(self, timeout: float | None = None, poll_s: float | None = None, on_update=None, progress: bool = True) -> RunStatus:
        """Block until the run ends (or ``timeout`` seconds); a progress bar unless ``progress=False``
        (a widget in Jupyter, text elsewhere; none when ``on_update`` is given). Returns the status."""
        if progress and on_update is None:
            from autoslm.views.notebook import wait_with_progress

            return wait_with_progress(self.client, self.run_id, timeout=timeout, poll_s=poll_s)
        return self.client.wait(self.run_id, timeout=timeout, poll_s=poll_s, on_update=on_update)

    def cancel(self) -> RunStatus:
        return self.client.cancel(self.run_id)

    def download(self, to: str | Path | None = None) -> Path:
        return self.client.download(self.run_id, to)

    def events(self) -> list[dict]:
        from autoslm.views.runview import read_events

        return read_events(self.client, self.run_id)

    def metrics(self):
        """A pandas DataFrame: one row per training step (loss, learning rate, reward, KL, tokens/s...) plus eval rows."""
        from autoslm.views.notebook import run_metrics

        return run_metrics(self.client, self.run_id)

    def plot(self):
        """A matplotlib Figure of the loss (and reward) curves and eval before/after."""
        from autoslm.views.notebook import plot_frame

        return plot_frame(self.metrics(), title=self.run_id)

    def logs(self) -> str:
        """The worker's own output (its log here, or its job's where the vendor keeps it), else the run's
        events, one line each."""
        from autoslm.views.runview import event_line

        lines = None if self.run_id.startswith("hf://") else self.client.own_logs(self.run_id)
        return "".join(line + "\n" for line in (lines or [event_line(e) for e in self.events()]))

    def report(self, out: str | Path | None = None) -> Path:
        from autoslm.views.report import write_report

        return write_report(self.client, self.run_id, out)

    def chat(
        self, message: str, *, base: bool = False, temperature: float = 0.0, max_new_tokens: int = 256, reset: bool = False
    ) -> str:
        """The fine-tuned model's answer to ``message`` (the conversation goes on from call to call; ``reset``
        starts over). Loads the base model and the adapter here once (the worker extra: torch, transformers, peft)."""
        from autoslm.views.chat import Chat

        if self._chat is None or (self._chat.target.adapter is None) != base:
            self._chat = Chat(self.client, self.run_id, base=base)
        if reset:
            self._chat.reset()
        self._chat.temperature, self._chat.max_new_tokens = temperature, max_new_tokens
        return self._chat.ask(message)

    def serve(self, *, step: int | None = None, **kwargs):
        """Serve the adapter (or the kept checkpoint of ``step``) behind vLLM's OpenAI server, as `autoslm serve`:
        ``on`` ("local" or a provider, with ``ttl`` and ``max_usd``), ``gpu``, ``port``, ``wait_s``. A ``Serve``:
        ``.url``, ``.curl()``, ``.chat(message)``, ``.cancel()``."""
        from autoslm.sdk.serve import serve

        return serve(self.client, self.run_id if step is None else f"{self.run_id}@{step}", **kwargs)

    def push(self, to: str, *, private: bool = False, merge: bool = False, gguf: bool = False, quant: str | None = None) -> str:
        """Publish the adapter (merged weights with ``merge``, their GGUF with ``gguf`` and ``quant``) to the Hub
        model repo ``to`` with a model card; returns its URL."""
        from autoslm.views.push import push

        return push(self.client, self.run_id, to, private=private, merge=merge, gguf=gguf, quant=quant)

    def export(
        self, to: str | Path | None = None, *, format: str = "merged", quant: str | None = None, step: int | None = None, log=None
    ) -> list[Path]:
        """Write the run's adapter merged into its base model (``format`` "merged"), as GGUF ("gguf", ``quant``
        f16, q8_0, q4_k_m...; an Ollama Modelfile beside it) or a GGUF LoRA ("gguf-lora") into ``to``, here, as
        `autoslm export`; ``step`` exports a kept checkpoint. Returns the paths written."""
        from autoslm.sdk.export import export

        ref = self.run_id if step is None else f"{self.run_id}@{step}"
        return export(self.client, ref, format=format, quant=quant, to=to, log=log).files

    def __repr__(self) -> str:
        return f"Run({self.run_id!r})"


class SweepHandle:
    """A sweep from a notebook: ``status()``, ``wait()``, ``cancel()``, ``frame()`` (a row per run), ``report()``."""

    def __init__(self, client, sweep_id: str):
        self.client, self.sweep_id = client, sweep_id

    def __repr__(self) -> str:
        return f"SweepHandle({self.sweep_id!r})"

    def status(self) -> SweepStatus:
        from autoslm.sdk.sweep import sweep_status

        return sweep_status(self.client, self.sweep_id)

    def wait(self, timeout: float | None = None, poll_s: float = 2.0) -> SweepStatus:
        from autoslm.sdk.sweep import wait_sweep

        return wait_sweep(self.client, self.sweep_id, timeout=timeout, poll_s=poll_s)

    def cancel(self) -> SweepStatus:
        from autoslm.sdk.sweep import cancel_sweep

        return cancel_sweep(self.client, self.sweep_id)

    def report(self, out=None) -> Path:
        from autoslm.views.sweep import write_sweep_report

        return write_sweep_report(self.client, self.sweep_id, out)

    def frame(self):
        """A pandas DataFrame: a row per run, the swept values as columns, then point, seed, state, cost and metrics."""
        from autoslm.views.notebook import _need

        pd = _need("pandas")
        st = self.status()
        rows = []
        for r in st.runs:
            row = {k: r.values.get(k) for k in st.keys}
            row.update(
                point=r.point,
                seed=r.seed,
                run_id=r.run_id,
                state=r.state,
                step=r.step,
                cost_usd=r.cost_usd,
                metric=r.metric,
                **r.metrics.to_json(),
            )
            rows.append(row)
        return pd.DataFrame(rows)
