"""The `autoslm` commands that show, try and publish runs and sweeps: watch, report, chat, push; the
bodies of `status`, `plan` and `launch` of a sweep; and the runs table.

Registered on the main typer app by ``autoslm.cli``. Same rules as there: cheap to import (no
pandas, no matplotlib, no torch), the SDK imported inside each command, errors as AutoslmError.
"""

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from autoslm.controller.state import RunState
from autoslm.views.cli_kit import InterruptAnswered

RunRef = Annotated[
    str,
    typer.Argument(
        help="run id, any unique prefix of it, or hf://owner/repo/<phase>/<run_id>, optionally with /seedN", show_default=False
    ),
]


def register(app: typer.Typer, client_factory, console_factory, plan=None) -> None:
    """``plan``: the CLI's (offer rows, plan table, no-offer line) functions, which a rented serve shows as launch does."""
    _register_looks(app, client_factory, console_factory)
    _register_chat(app, client_factory)
    from autoslm.views.export import register as register_export
    from autoslm.views.lm_eval import register as register_eval
    from autoslm.views.serve import register as register_serve

    register_serve(app, client_factory, console_factory, plan)
    register_eval(app, client_factory, console_factory)
    register_export(app, client_factory, console_factory, plan)
    _register_push(app, client_factory, console_factory)


def _register_looks(app: typer.Typer, client_factory, console_factory) -> None:
    """`watch` and `report`: a run's or a sweep's."""

    @app.command()
    def watch(
        run: RunRef,
        poll_s: Annotated[
            Optional[float],
            typer.Option("--poll-s", help="seconds between refreshes (default: 1 for a local run, 10 for a rented pod)"),
        ] = None,
    ):
        """Live view of a run (progress, ETA, loss/reward sparkline, tokens/s, pod, GPU, cost, events) until it ends."""
        from autoslm.views.watch import watch as watch_run

        console = console_factory()
        client = client_factory()
        from autoslm.sdk.sweep import resolve_target

        if (target := resolve_target(client, run)).sweep:
            from autoslm.views.sweep import status_lines

            try:
                st = watch_sweep(client, target.id, console, poll_s=poll_s or 2.0)
            except KeyboardInterrupt:
                console.print("\nstopped watching: the sweep keeps going.")
                raise InterruptAnswered(0) from None
            for line in status_lines(st):
                console.print(line, markup=False, soft_wrap=True)
            return
        try:
            final = watch_run(client, run, console, poll_s=poll_s)
        except KeyboardInterrupt:
            console.print("\nstopped watching: the run keeps going.")
            raise InterruptAnswered(0) from None
        console.print(f"run {final.run_id}: {final.state}")
        if final.state is not RunState.SUCCEEDED:
            raise typer.Exit(1)

    @app.command()
    def report(
        run: RunRef,
        out: Annotated[
            Optional[Path], typer.Option("--out", "-o", help="HTML file to write (default: <run_id>-report.html)")
        ] = None,
    ):
        """Write one self-contained HTML report of a run: curves, spec, timeline, cost, eval, rollouts."""
        from autoslm.sdk.sweep import resolve_target
        from autoslm.views.report import write_report

        client = client_factory()
        if (target := resolve_target(client, run)).sweep:  # one page: every point's curves, the points ranked
            from autoslm.views.sweep import write_sweep_report

            path = write_sweep_report(client, target.id, out)
        else:
            path = write_report(client, run, out)
        console_factory().print(f"report written to {path}")


def _register_chat(app: typer.Typer, client_factory) -> None:
    @app.command()
    def chat(
        run: RunRef,
        prompt: Annotated[Optional[str], typer.Option("--prompt", "-p", help="answer this once and exit (for scripts)")] = None,
        base: Annotated[bool, typer.Option("--base", help="the base model without the run's adapter, to compare")] = False,
        temperature: Annotated[
            float, typer.Option("--temperature", "-t", min=0.0, help="0: greedy (the same answer every time)")
        ] = 0.0,
        max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1, help="longest answer, in tokens")] = 256,
    ):
        """Talk to a run's fine-tuned model here (the base model + its adapter, with the worker extra)."""
        from autoslm.views.chat import chat_command

        chat_command(client_factory(), run, prompt=prompt, base=base, temperature=temperature, max_new_tokens=max_new_tokens)


def _register_push(app: typer.Typer, client_factory, console_factory) -> None:
    @app.command()
    def push(
        run: RunRef,
        to: Annotated[str, typer.Option("--to", help="Hub model repo, owner/name", show_default=False)],
        private: Annotated[bool, typer.Option("--private", help="create the repo private")] = False,
        merge: Annotated[
            bool,
            typer.Option("--merged", "--merge", help="upload weights merged with the base model instead of the adapter"),
        ] = False,
        gguf: Annotated[
            bool, typer.Option("--gguf", help="upload the merged weights as GGUF (llama.cpp's converter) with a Modelfile")
        ] = False,
        quant: Annotated[
            Optional[str], typer.Option("--quant", help="the GGUF's type with --gguf: f16 (default), q8_0, q4_k_m...")
        ] = None,
    ):
        """Publish a succeeded run's adapter (or merged weights, or their GGUF) to a Hub model repo, with a model card."""
        from autoslm.views.push import push as push_run

        console = console_factory()
        log = lambda m: console.print(m, markup=False, soft_wrap=True, highlight=False)  # noqa: E731
        url = push_run(client_factory(), run, to, private=private, merge=merge, gguf=gguf, quant=quant, log=log)
        console.print(f"pushed to {url}")


def unique_prefixes(ids: list[str], min_len: int = 4) -> dict[str, str]:
    """The shortest prefix of each id that no other id starts with (at least ``min_len`` characters):
    one longer than what it shares with either neighbour in sorted order."""
    srt = sorted(set(ids))
    shared = [_common_len(a, b) for a, b in zip(srt, srt[1:])]  # shared[i]: srt[i] with srt[i + 1]
    out = {}
    for i, rid in enumerate(srt):
        common = max(shared[i - 1] if i else 0, shared[i] if i < len(shared) else 0)
        out[rid] = rid[: max(min_len, common + 1)]
    return out


def _common_len(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


# The columns beside the run id, and the order in which they give way when the terminal is too narrow
# for all of them (the least useful first). The run id never gives way: it is what every other command
# takes, and a wrapped or cut one is a wrong one. The state stays too: it is what a look is for.
RUN_COLUMNS = ["state", "phase", "step", "provider", "restarts", "cost $", "created"]
GIVE_WAY = ["created", "restarts", "provider", "phase", "cost $", "step"]


def runs_table(rows: list, all_ids: list[str], width: int = 120, color: bool = False) -> str:
    """The runs as aligned text no wider than ``width`` where that can be done without touching a run
    id: each id whole on its own line (other columns leave first; an id longer than the terminal is
    still printed whole, for the terminal to fold), its shortest unique prefix in bold on a terminal.
    Plain string building on purpose: a rich Table of 200 rows costs more than starting the program.
    ``rows``: the runs' ``RunRow``s or ``RunStatus``es (their common attributes)."""
    prefixes = unique_prefixes(all_ids)
    cells = [
        {
            "run id": r.run_id,
            "state": r.state,
            "phase": r.phase,
            "step": f"{r.step}/{r.total_steps}",
            "provider": str(r.provider),
            "restarts": str(r.restarts),
            "cost $": f"{r.cost_usd:.2f}",
            "created": time.strftime("%Y-%m-%d %H:%M", time.localtime(r.created_at)),
        }
        for r in rows
    ]
    headers = ["run id"] + RUN_COLUMNS
    gap = 2

    def widths_of(cols: list[str]) -> list[int]:
        return [max([len(h)] + [len(c[h]) for c in cells]) for h in cols]

    for col in GIVE_WAY:
        if sum(widths_of(headers)) + gap * (len(headers) - 1) <= width:
            break
        headers.remove(col)
    widths = widths_of(headers)

    def line(values: list[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(values, widths)).rstrip()

    out = [line(headers), "  ".join("-" * w for w in widths)]
    for c in cells:
        rid = c["run id"]
        shown = rid.ljust(widths[0])
        if color:  # bold the unique prefix
            p = prefixes.get(rid, rid)
            shown = f"\x1b[1m{p}\x1b[0m" + shown[len(p) :]
        out.append(("  ".join([shown] + [c[h].ljust(w) for h, w in zip(headers[1:], widths[1:])])).rstrip())
    out.append("(bold: the prefix every command accepts)" if color else "(any unique prefix of a run id will do)")
    return "\n".join(out)


# -- a sweep's status, plan and launch (cli.py hands them its helpers) ----------------------------------------
def _print_lines(console, lines: list[str]) -> None:
    for line in lines:
        console.print(line, markup=False, soft_wrap=True)


def price_sweep(sw, rows_for, check_data):
    """(per-point estimates, budget summary): the sweep's price, as `plan` shows it."""
    from autoslm.sdk.sweep import budget_summary, estimates

    for p in sw.points:
        check_data(p.spec)  # a Hub dataset that is missing fails before any offer is asked for
    est = estimates(sw, rows_for)
    return est, budget_summary(sw, est)


def sweep_status(client, sweep_id: str, json_out: bool, console, print_json) -> None:
    from autoslm.sdk.sweep import sweep_status as status_of
    from autoslm.views.sweep import status_lines

    st = status_of(client, sweep_id)
    if json_out:
        return print_json(st.to_json())
    _print_lines(console, status_lines(st))


def sweep_plan(sw, *, json_out: bool, plan_rows, check_data, console, print_json) -> None:
    """`plan` of a sweep file (``sw``: its Sweep, parsed once by the caller)."""
    from autoslm.sdk.sweep import check_budget
    from autoslm.views.sweep import plan_lines

    est, summary = price_sweep(sw, lambda s: plan_rows(s, keyless=True), check_data)
    if json_out:
        print_json({"sweep": summary, "points": est})
    else:
        _print_lines(console, plan_lines(summary, est, sw.keys))
    check_budget(sw, summary)  # after the table: the numbers say why


def sweep_launch(spec: Path, sw, *, detach: bool, yes: bool, poll_s, plan_rows, check_data, console, client_factory) -> None:
    """`launch` of a sweep file: priced, confirmed (for rented pods), recorded, its first members started, followed."""
    import sys

    from autoslm.sdk.sweep import check_budget, launch_sweep
    from autoslm.views.sweep import plan_lines, status_lines

    est, summary = price_sweep(sw, lambda s: plan_rows(s, keyless=False), check_data)
    cloud = not sw.points[0].spec.compute.is_local
    if cloud:
        _print_lines(console, plan_lines(summary, est, sw.keys))
    check_budget(sw, summary)
    if cloud and not yes:
        if not sys.stdin.isatty():
            from autoslm.errors import UsageError

            raise UsageError("refusing to rent GPUs without confirmation (no terminal to ask on): pass --yes")
        typer.confirm(f"launch the sweep: {summary['runs']} runs, {summary['max_parallel']} at a time?", abort=True)
    client = client_factory()
    sweep_id = launch_sweep(client, sw, spec_path=str(spec), poll_s=poll_s, est=est)
    console.print(f"sweep [bold]{sweep_id}[/bold] launched ({summary['runs']} runs, {summary['max_parallel']} at a time)")
    if detach:
        console.print(f"a background supervisor starts the rest; see it with: autoslm status {sweep_id}")
        return
    try:
        st = watch_sweep(client, sweep_id, console, poll_s=10.0 if cloud else 1.0)
    except KeyboardInterrupt:
        console.print(
            f"\ndetached: a background supervisor keeps the sweep going. `autoslm status {sweep_id}` follows it, "
            f"`autoslm cancel {sweep_id}` stops it."
        )
        raise InterruptAnswered(0) from None
    _print_lines(console, status_lines(st))
    if st.state != RunState.SUCCEEDED:
        raise typer.Exit(1)


def watch_sweep(client, ref: str, console, poll_s: float = 2.0):
    """Refresh the status lines until the sweep ends (a live table on a terminal, changes only otherwise)."""
    from autoslm.sdk.sweep import sweep_status as status_of
    from autoslm.views.sweep import status_lines

    last = None
    if console.is_terminal:
        from rich.live import Live
        from rich.text import Text

        with Live(console=console, auto_refresh=False) as live:
            while True:
                st = status_of(client, ref)
                live.update(Text("\n".join(status_lines(st))), refresh=True)
                if st.state.terminal:
                    return st
                time.sleep(poll_s)
    while True:
        st = status_of(client, ref)
        now = [(p.point, tuple(p.states), p.step) for p in st.points]
        if now != last:
            console.print(
                f"{st.state}: {st.running} running, ${st.spent_usd:.2f} spent; "
                + "; ".join(
                    f"p{p.point} {','.join(sorted(set(p.states)))} {p.step}/{p.total_steps}"
                    for p in sorted(st.points, key=lambda p: p.point)
                ),
                markup=False,
                soft_wrap=True,
            )
            last = now
        if st.state.terminal:
            return st
        time.sleep(poll_s)


def settled_rows(home: Path, limit: int):
    """(the runs table's rows, the registry) straight from the records when nothing needs a look: no run
    live, no pod or create left, no sweep with members to start, a registry this version may write. The
    common case, served without loading the SDK, the providers or pydantic; None when a tick is due."""
    import time

    from autoslm.controller import state, status
    from autoslm.controller.registry import Registry

    registry = Registry(home)
    if registry.read_only:
        return None
    if registry.has_sweeps():
        from autoslm.controller.sweeps import SweepBook

        if SweepBook(registry).open_ids():
            return None
    now, rows = time.time(), []
    runs = registry.list_runs(limit=limit)
    every = registry.replicas_of([run.run_id for run in runs])
    for run in runs:
        replicas = every[run.run_id]
        if not state.settled(replicas, now):
            return None
        provider = None if replicas[0].provider else status.spec_provider(run.spec_json)
        # The table shows no adapter and no seed: none is looked up (`list --json` and `status RUN` say them).
        rows.append(status.table_row(run, replicas, provider))
    return rows, registry
