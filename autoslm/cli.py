"""The `autoslm` command: parse -> SDK call -> render. It catches AutoslmError only.

Exit codes: 0 success, 1 run failed or cancelled, 2 bad input or usage, 3 provider/store unreachable.
Errors print one line (no traceback unless AUTOSLM_DEBUG=1). Importing this module must stay cheap:
no torch, no transformers, and the SDK itself is imported only inside the commands that need it.
"""

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from autoslm.controller.state import RunState
from autoslm.errors import AutoslmError
from autoslm.views import offers
from autoslm.views.cli_kit import (
    InterruptAnswered,
    click_errors,
    command_for,
    command_names,
    install_fast_paths,
    leave_now,
    signals_interrupt,
    usage_error,
)
from autoslm.views.cli_kit import console as _console

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Fine-tune small language models on rented GPUs (RunPod, Vast.ai, Hugging Face Jobs) or locally, from one TOML JobSpec.",
)

install_fast_paths()

SpecArg = Annotated[Path, typer.Argument(help="JobSpec TOML file", show_default=False)]
RunArg = Annotated[str, typer.Argument(help="run id (or a unique prefix)", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON")]


def _client(log=None):
    from autoslm.sdk import Client

    def notify(msg: str) -> None:  # beside the answer, never in it (`--json` stays JSON)
        sys.stderr.write(msg + "\n")
        sys.stderr.flush()

    return Client(log=log or (lambda msg: None), notify=notify)


def _print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


# -- validate / plan ------------------------------------------------------------------------------
@app.command()
def validate(spec: SpecArg):
    """Check a JobSpec without running anything."""
    from autoslm.sweep import Sweep, load_any

    s = load_any(spec)
    if isinstance(s, Sweep):
        from autoslm.views.sweep import validate_line

        return _console().print(validate_line(spec, s))
    _spec_warnings(s, spec)
    seeds = ", ".join(map(str, s.seeds))
    _console().print(
        f"ok: {spec} ({s.train.method} on {s.model}, task {s.environment.id}, seeds {seeds}, "
        f"provider {'/'.join(s.compute.providers)}, store {s.artifacts.store})"
    )


def _spec_warnings(s, path) -> None:
    """What a valid spec may still get wrong, on stderr: fields its providers do not read; for GRPO, vLLM's share,
    episodes near the context, LoRA on a head the catalog cannot say is tied, a reward file only the pod can import."""
    from autoslm.spec import unused_fields, worker_may_have_vllm

    found = unused_fields(s)
    if s.train.method == "grpo":
        from autoslm.catalog import model_info
        from autoslm.catalog.spec_checks import vllm_share_issues
        from autoslm.envs.context import context_issues
        from autoslm.envs.reward_check import reward_warnings
        from autoslm.envs.task_table import is_multi_turn
        from autoslm.recipes.generation import sleep_allowed, tied_lora_issues

        allow = sleep_allowed(s, is_multi_turn(s))
        found += vllm_share_issues(s, model_info(s.model), allow_sleep=allow)[1] + context_issues(s)[1]
        found += tied_lora_issues(s, model_info(s.model), worker_may_have_vllm(s))[1] + reward_warnings(s)
    for field, message in found:
        sys.stderr.write(f"warning: {path}: {field}: {message}\n")


@app.command()
def plan(spec: SpecArg, json_out: JsonOpt = False):
    """Show matching GPU offers, whether the model fits, and the estimated cost. Creates nothing."""
    from autoslm.sweep import Sweep, load_any

    s = load_any(spec)
    if isinstance(s, Sweep):
        from autoslm.views.commands import sweep_plan

        return sweep_plan(
            s,
            json_out=json_out,
            plan_rows=offers.plan_rows,
            check_data=lambda x: offers.check_data(x, plan_only=spec),
            console=_console(),
            print_json=_print_json,
        )
    _spec_warnings(s, spec)
    offers.check_data(s, plan_only=spec)
    problems: dict[str, str] = {}
    rows = offers.plan_rows(s, keyless=True, problems=problems, lookup=True)
    if json_out:
        _print_json(rows)
        return
    offers.render_plan(s, rows, problems)


# -- launch ---------------------------------------------------------------------------------------
@app.command()
def launch(
    spec: SpecArg,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="return at once; follow with `autoslm status`")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask before renting a GPU")] = False,
    poll_s: Annotated[
        Optional[float], typer.Option("--poll-s", help="seconds between the supervisor's looks at the run", hidden=True)
    ] = None,
):
    """Launch a run (or a sweep) and follow it until it ends (Ctrl-C detaches; a background supervisor keeps it going)."""
    from autoslm.sweep import Sweep, load_any

    s = load_any(spec)  # parsed once: a sweep's points are expanded here and nowhere else
    console = _console()
    if isinstance(s, Sweep):
        from autoslm.views.commands import sweep_launch

        return sweep_launch(
            spec,
            s,
            detach=detach,
            yes=yes,
            poll_s=poll_s,
            plan_rows=offers.plan_rows,
            check_data=offers.check_data,
            console=console,
            client_factory=lambda: _client(log=lambda m: console.print(f"[dim]{m}[/dim]")),
        )
    offers.check_data(s)
    if not s.compute.is_local:
        offers.confirm_best(s, console, yes=yes)
    client = _client(log=lambda m: console.print(f"[dim]{m}[/dim]"))
    from autoslm.sdk import LaunchInterrupted

    # A closed terminal (SIGHUP) or a `kill` (SIGTERM) ends a launch as Ctrl-C does: the run is left
    # with a background supervisor (or nothing running), never with a pod that nobody watches.
    signals_interrupt()
    try:
        # A rented pod always gets a background supervisor: a closed terminal must not leave it unwatched.
        supervise = detach or not s.compute.is_local
        run = client.launch(s, detach=True, spec_path=str(spec), supervise=supervise, poll_s=poll_s)
    except LaunchInterrupted as e:
        # Say what may be running and how to stop it: a pod whose create was in flight may live on.
        running = "; ".join(e.running) or "nothing recorded yet"
        kept = (
            f"A background supervisor (pid {e.supervisor_pid}) keeps the run: it adopts a pod that lands, or starts it. "
            if e.supervisor_pid
            else ""
        )
        console.print(
            f"\ninterrupted while launching run {e.run_id}. Running: {running}.\n{kept}"
            f"`autoslm cancel {e.run_id}` stops it (and `autoslm gc` finds any pod left), "
            f"`autoslm status {e.run_id}` follows it."
        )
        raise InterruptAnswered(130) from None
    console.print(
        f"run [bold]{run.run_id}[/bold] launched ({s.train.method}, {len(s.seeds)} seed(s), provider {'/'.join(s.compute.providers)})"
    )
    if detach:
        console.print(
            f"a background supervisor follows it (log: {_supervisor_log(client, run.run_id)}); "
            f"see it with: autoslm status {run.run_id}"
        )
        return
    try:
        final = _follow(client, run.run_id, console, poll_s)
    except KeyboardInterrupt:
        from autoslm.views.watch import detach

        detach(client, run.run_id, poll_s, console)
        raise InterruptAnswered(0) from None
    from autoslm.views.result import print_result

    print_result(final, console)
    if final.state is not RunState.SUCCEEDED:
        raise typer.Exit(1)


def _supervisor_log(client, run_id: str) -> Path:
    from autoslm.controller.daemon import logfile

    return logfile(client.home, run_id)


def _follow(client, run_id: str, console, poll_s: float | None = None) -> dict:
    """Follow the run (reading what its supervisor records), refreshed as often as that supervisor looks."""
    from autoslm.views.watch import watch

    return watch(client, run_id, console, poll_s=poll_s)


# -- status / list / logs -------------------------------------------------------------------------
@app.command()
def status(
    run: Annotated[
        Optional[str], typer.Argument(help="run id, prefix, or hf://owner/repo/<phase>/<run_id>, optionally with /seedN")
    ] = None,
    json_out: JsonOpt = False,
):
    """Show one run in detail, or all runs."""
    if run is None:
        return list_(json_out=json_out, limit=200)
    from autoslm.sdk.sweep import resolve_target

    client = _client()
    if (target := resolve_target(client, run)).sweep:
        from autoslm.views.commands import sweep_status

        return sweep_status(client, target.id, json_out, _console(), _print_json)
    st = client.status(run)
    if st.serve is not None:  # a live serve says the URL its user reaches (where the vendor's status names it)
        from autoslm.sdk.serve_endpoint import as_reached

        st = as_reached(client, st)
    if json_out:
        _print_json(st.to_json())
        return
    from autoslm.views.result import print_result

    console = _console()
    print_result(st, console)  # a serve's status speaks of serving: its lines are all there
    if st.serve is not None:
        return
    for name, url in (st.trackers or {}).items():
        console.print(f"  tracker {name}: {url}")
    from autoslm.views.runview import seed_lines

    for s in st.seeds:
        for line in seed_lines(s, live=s.state.live):
            console.print(line, markup=False)


@app.command("list")
def list_(json_out: JsonOpt = False, limit: Annotated[int, typer.Option("--limit", "-n", help="newest N runs")] = 200):
    """List the runs launched from this machine."""
    home = _home()
    if not (home / "registry.db").exists():
        if json_out:
            _print_json([])
        else:
            _console().print("no runs yet: `autoslm launch jobspecs/quickstart.toml` starts one")
        return
    from autoslm.views.commands import settled_rows

    settled = None if json_out else settled_rows(home, limit)
    if settled is None:
        client = _client()
        rows, registry = client.list_runs(limit=limit), client.registry
    else:
        rows, registry = settled
    if json_out:
        _print_json([r.to_json() for r in rows])
        return
    import shutil

    from autoslm.views.commands import runs_table

    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    sys.stdout.write(runs_table(rows, registry.all_run_ids(), shutil.get_terminal_size().columns, color) + "\n")
    if registry.has_sweeps():
        from autoslm.views.sweep import sweeps_lines

        for line in sweeps_lines(registry, limit=limit):
            sys.stdout.write(line + "\n")


def _home() -> Path:
    from autoslm.secrets import autoslm_home

    return autoslm_home()


@app.command()
def logs(
    run: RunArg,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing until the run ends")] = False,
    seed: Annotated[Optional[int], typer.Option(help="which seed (default: the first)")] = None,
    events: Annotated[bool, typer.Option("--events", help="print the run's events from the store instead")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the run's events as JSON lines")] = False,
    node: Annotated[
        int, typer.Option("--node", help="which node of a run of several pods on this machine (default 0: training rank 0's)")
    ] = 0,
):
    """Print a run's own output: its worker's log (a run on this machine: node 0's, which holds training rank
    0, for a run of several nodes; --node for another) or its job's (a vendor that keeps it, Hugging Face
    Jobs); else, or with --events, its events from the store."""
    client = _client()
    if as_json:
        for e in client.events(run, seed):
            sys.stdout.write(json.dumps(e, default=str) + "\n")
        return
    if follow and not events:
        for line in client.follow_logs(run, seed, node=node):
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        return
    lines = None if events else client.own_logs(run, seed, node)
    if not lines:
        from autoslm.views.runview import event_line

        lines = [event_line(e) for e in client.events(run, seed)]
    for line in lines:
        sys.stdout.write(line + "\n")


# -- cancel / download / gc -----------------------------------------------------------------------
@app.command()
def cancel(run: RunArg):
    """Stop a run (or every run of a sweep) and tear down its pods."""
    from autoslm.sdk.serve import cancel_ref  # a run that has ended and is being served: its serve
    from autoslm.sdk.sweep import resolve_target

    client = _client(log=lambda m: _console().print(f"[dim]{m}[/dim]"))
    if (target := resolve_target(client, run)).sweep:
        from autoslm.sdk.sweep import cancel_sweep

        st = cancel_sweep(client, target.id)
        _console().print(f"sweep {st.sweep_id}: {st.state} ({st.running} run(s) still ending)")
        return
    st = client.cancel(cancel_ref(client, run))
    _console().print(f"run {st.run_id}: {st.state}")


@app.command()
def download(run: RunArg, to: Annotated[Optional[Path], typer.Option("--to", help="directory to write the adapter into")] = None):
    """Download a succeeded run's adapter."""
    dest = _client().download(run, to)
    _console().print(f"adapter written to {dest}")


@app.command()
def gc(
    pods: Annotated[
        Optional[list[str]], typer.Argument(help="only these pod ids (ended even when no registry here knows them)")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="only say what would be terminated")] = False,
    all_homes: Annotated[
        bool, typer.Option("--all-homes", help="also end pods started from other AUTOSLM_HOMEs on these accounts")
    ] = False,
):
    """Terminate autoslm pods whose run has ended or is unknown, found in every provider's own list."""
    import sqlite3

    from autoslm.controller.registry import RegistryCorrupt, RegistryLocked, RegistryReadOnly

    console = _console()
    named = tuple(pods or ())
    try:
        try:
            report = _client().gc(dry_run=dry_run, all_homes=all_homes, pods=named)
        except sqlite3.DatabaseError as e:
            # Damage found only by a later read (sqlite reads pages lazily) comes raw: said as what it is.
            from autoslm.controller.registry import registry_error

            raise registry_error(e, _home() / "registry.db") from None
    except (RegistryCorrupt, RegistryLocked, RegistryReadOnly) as e:
        # Without a readable registry nothing here can tell a supervised pod from a stray one: end only
        # what the user names (or, with --all-homes, every autoslm pod), and list the rest.
        from autoslm.controller.gc import sweep
        from autoslm.controller.podnames import home_id
        from autoslm.providers import get_provider

        sys.stderr.write(f"warning: {e}; without it, gc ends only the pods you name (or all, with --all-homes)\n")
        report = sweep(get_provider, home_id(_home()), None, dry_run=dry_run, all_homes=all_homes, pods=named)
    for line in report.lines():
        console.print(line)
    if not report.terminated and not report.would_terminate and not report.failures:
        console.print("nothing to terminate")
    if report.failures:
        raise typer.Exit(3)


from autoslm.views.commands import register as _register_views  # noqa: E402 - after the commands above: help order

_register_views(app, _client, _console, plan=(offers.plan_rows, offers.render_plan, offers.no_offers))


def app_command_names() -> list[str]:
    return command_names(app)


def main() -> None:
    from autoslm.secrets import redact

    debug = os.environ.get("AUTOSLM_DEBUG") == "1"
    command = command_for(app, sys.argv[1:])
    try:
        rv = command(standalone_mode=False)
    except AutoslmError as e:
        if debug:
            raise
        first, *rest = str(e).split("\n")
        sys.stderr.write(redact(f"error: {first}") + "\n")
        for line in rest:
            sys.stderr.write(redact(f"error: {line}") + "\n")
        sys.exit(e.exit_code)
    # (An except clause's classes are looked up only when something was raised: click's, only then.)
    except click_errors()[2]:
        sys.stderr.write("aborted: nothing was launched\n")
        sys.exit(1)
    except click_errors()[1] as e:
        usage_error(e, app_command_names())
    except click_errors()[0] as e:
        sys.stderr.write(f"error: {e.format_message()}\n")
        sys.exit(1)
    except InterruptAnswered as e:
        leave_now(e.code)
    except KeyboardInterrupt:
        leave_now(130)
    except Exception as e:  # noqa: BLE001 - one line for users, the traceback on request
        if debug:
            raise
        import sqlite3

        if isinstance(e, sqlite3.DatabaseError):
            # Locked, read-only or damaged: each said as what it is (only damage may be moved aside).
            from autoslm.controller.registry import registry_error

            err = registry_error(e, _home() / "registry.db")
            sys.stderr.write(redact(f"error: {err}") + "\n")
            sys.exit(err.exit_code)
        sys.stderr.write(redact(f"internal error: {type(e).__name__}: {e} (AUTOSLM_DEBUG=1 shows the traceback)") + "\n")
        sys.exit(1)
    sys.exit(rv if isinstance(rv, int) else 0)
