"""`autoslm watch RUN`: a live view of one run, refreshed until the run ends.

Progress with ETA, a loss (or reward) sparkline, tokens/s, heartbeat age, the pod and its state (each
node's, for a replica of several pods), the GPU, the money spent so far and the last events. ``launch`` follows its run with the same view.
Rendering is rich only (no pandas, no plotting): this runs on the CLI path.
"""

from __future__ import annotations

import time

from rich.markup import escape

from autoslm.controller.nodes import node_words
from autoslm.controller.status import RunStatus, SeedStatus
from autoslm.views.runview import (
    RunData,
    collect,
    describe,
    device_words,
    main_curve,
    reward_functions,
    teardown_lines,
    throughput,
    train_rows,
)

STAGE_EVENTS_SHOWN = 5


def _said(seed: SeedStatus | None) -> bool:
    """Whether the seed's last heartbeat message belongs on the stage line: a download's progress in
    setup, or a held-out evaluation's ("evaluating (after): 640/1319")."""
    message = (seed and seed.message) or ""
    return bool(message) and (seed.stage == "setup" or message.startswith("evaluating"))


def local_device(events: list[dict], seed: int) -> str:
    """What a local run's worker runs on: the device its "model_loaded" event names (the GPU's name, or
    CPU); before that, CPU where this machine has no NVIDIA GPU, else "-" (not known yet)."""
    from autoslm.providers.local.provider import local_gpu_count

    said = device_words(events, seed)
    if said is not None:
        return said
    return "-" if local_gpu_count() else "CPU"


def _eta(rows: list[dict], step: int, total: int) -> float | None:
    """Seconds left, from the pace of the logged steps of the current attempt."""
    if not rows or not total or step >= total:
        return None
    recent = [r for r in rows if r["seed"] == rows[-1]["seed"]][-50:]
    if len(recent) < 2 or recent[-1]["step"] <= recent[0]["step"]:
        return None
    rate = (recent[-1]["time"] - recent[0]["time"]) / (recent[-1]["step"] - recent[0]["step"])
    return max(0.0, rate * (total - step))


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def lines(data: RunData, width: int = 80) -> list[str]:
    """The view as plain lines of rich markup (also what a test reads)."""
    from autoslm.views.runview import sparkline

    st = data.status
    spec = data.spec or {}
    first = st.first_seed  # None for a run followed through its store
    rows = train_rows(data.events)
    step, total = st.step or 0, st.total_steps or 0
    frac = step / total if total else 0.0
    bar_w = max(10, min(40, width - 40))
    bar = "█" * int(frac * bar_w) + "░" * (bar_w - int(frac * bar_w))
    out = [
        f"[bold]{st.run_id}[/bold]  {(spec.get('train') or {}).get('method', st.phase)} on {spec.get('model', '?')}"
        f"  state [bold]{st.state}[/bold]  stage {(first and first.stage) or '-'}"
        + (f" ({escape(first.message)})" if _said(first) else ""),
        f"{bar} {step}/{total} ({frac:.0%})  ETA {_clock(_eta(rows, step, total))}",
    ]
    key, pts = main_curve(rows)
    if pts:
        out.append(f"{key:<6} {sparkline([y for _, y in pts], min(40, width - 30))}  last {pts[-1][1]:.4g}")
    per_fn = reward_functions(rows, data.events)
    if per_fn:  # each reward function's latest mean ± std (TRL's rewards/<name>/mean and /std)
        out.append(
            "rewards "
            + "   ".join(
                f"{escape(f['name'])} "
                + ("-" if f["last"] is None else f"{f['last']:.3g}")
                + (f"±{f['std']:.2g}" if f["std"] is not None else "")
                + (f" ({f['errors']} raised)" if f["errors"] else "")
                for f in per_fn
            )
        )
    age = st.last_heartbeat_age_s
    out.append("tokens/s " + throughput(rows) + "   heartbeat " + (f"{age:.0f}s ago" if age is not None else "-"))
    pod = (first and first.pod_id) or st.pod_id or "-"
    gpu = (first and first.gpu) or (local_device(data.events, first.seed if first else 0) if st.provider == "local" else "-")
    cost = st.cost_usd
    out.append(
        f"pod {pod} on {st.provider or '-'} ({first.state if first else st.state})   GPU {gpu}   "
        + (f"${cost:.2f} so far" if cost is not None else "$ unknown")
        + f"   restarts {st.restarts}"
    )
    if first is not None and first.nodes:  # a replica of several pods: which node holds rank 0, and each one's state
        out.append("nodes " + "   ".join(escape(node_words(n)) for n in first.nodes))
    for name, url in (st.trackers or {}).items():
        out.append(f"tracker {name}: {url}")
    shown = [e for e in data.events if e.get("kind") not in ("step", "rollout", "rewards")][-STAGE_EVENTS_SHOWN:]
    if shown:
        out.append("last events:")
        out += [f"  {time.strftime('%H:%M:%S', time.localtime(e['time']))} {describe(e)}" for e in shown]
    if st.error:
        out.append(f"[red]error: {st.error}[/red]")
    for s in st.seeds:  # a pod left billing: said where a followed launch ends, too
        if s.teardown is not None:
            out += [
                f"[red]{escape(line.strip())}[/red]" if i == 0 else escape(line)
                for i, line in enumerate(teardown_lines(s.teardown))
            ]
    return out


def watch(client, ref: str, console, *, poll_s: float | None = None) -> RunStatus:
    """Show the live view until the run ends; returns its final status."""
    from rich.live import Live
    from rich.text import Text

    if poll_s is None:
        st = client.status(ref) if ref.startswith("hf://") else None
        local = st is None and client.resolve(ref).spec.compute.is_local
        poll_s = 1.0 if local else 10.0

    def view(data: RunData):
        return Text.from_markup("\n".join(lines(data, console.width)))

    data = collect(client, ref)
    if not console.is_terminal:
        # A pipe or a file gets no redraws: the final view once, each line whole (a live view crops
        # its lines to the screen; here that would cut a tracker's path or an error in two).
        while data.status.state.live:
            client.sleep(poll_s)
            data = _refresh(client, ref, data)
        for line in lines(data, console.width):
            console.print(line, soft_wrap=True)
        return data.status
    with Live(view(data), console=console, refresh_per_second=4, transient=False) as live:
        while data.status.state.live:
            client.sleep(poll_s)
            data = _refresh(client, ref, data)
            live.update(view(data))
    return data.status


def _refresh(client, ref: str, data: RunData) -> RunData:
    """The view's next look; the last one again while another process holds the run registry past its
    lock wait (a tool left open on the file): the run goes on, and so does the view."""
    import sqlite3

    from autoslm.controller.registry import RegistryLocked, is_busy

    try:
        return collect(client, ref)
    except (RegistryLocked, sqlite3.OperationalError) as e:
        if not is_busy(e):
            raise
        return data


def detach(client, run_id: str, poll_s, console) -> None:
    """Ctrl-C on a followed launch: leave the run with a live supervisor, and say which (or that it ended)."""
    import sqlite3

    from autoslm.controller import daemon
    from autoslm.controller.registry import RegistryLocked, is_busy
    from autoslm.controller.state import holds_pod, run_state
    from autoslm.sdk import INTERRUPTED_WAIT_S

    try:  # what the registry says at once; a registry another process holds is no reason to keep the user
        with client.registry.waiting_at_most(INTERRUPTED_WAIT_S):
            replicas = client.registry.replicas(run_id)
    except (sqlite3.OperationalError, RegistryLocked) as e:
        if not is_busy(e):
            raise
        replicas = None
    if replicas is not None and run_state(replicas).terminal and not any(holds_pod(r, client.clock()) for r in replicas):
        console.print(f"\nrun {run_id} is {run_state(replicas)}: nothing left to supervise")
        return
    pid = daemon.running_pid(client.home, run_id) or client.start_supervisor(run_id, poll_s)
    console.print(
        f"\ndetached: a background supervisor (pid {pid}) keeps the run going. "
        f"`autoslm status {run_id}` follows it, `autoslm cancel {run_id}` stops it."
    )
