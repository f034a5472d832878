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
from autoslm.views.cli_kit import click_errors, command_for, command_names, install_fast_paths, usage_error

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Fine-tune small language models on rented GPUs (RunPod, Vast.ai) or locally, from one TOML JobSpec.",
)

install_fast_paths()

SpecArg = Annotated[Path, typer.Argument(help="JobSpec TOML file", show_default=False)]
RunArg = Annotated[str, typer.Argument(help="run id (or a unique prefix)", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON")]


def _console():
    """Every line printed whole: rich never hard-wraps it (soft wrap). A terminal folds a long line for
    the eye and copies it back as one; a pipe or a file gets it as written. Hard wrapping at the
    console's width (80 where the output is not a terminal) would break a path or a run id in two
    wherever the machine's paths happened to put the edge."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


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
        from autoslm.envs.registry import is_multi_turn
        from autoslm.envs.reward_check import reward_warnings
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
            plan_rows=_plan_rows,
            check_data=lambda x: _check_data(x, plan_only=spec),
            console=_console(),
            print_json=_print_json,
        )
    _spec_warnings(s, spec)
    _check_data(s, plan_only=spec)
    problems: dict[str, str] = {}
    rows = _plan_rows(s, keyless=True, problems=problems, lookup=True)
    if json_out:
        _print_json(rows)
        return
    _render_plan(s, rows, problems)


def _check_data(s, plan_only: Path | None = None) -> None:
    """A Hub dataset must exist and have usable columns (and an lm-eval task's data exist) before offers
    are shown or a pod is rented.
    ``plan_only`` (the spec's path): only prices are asked for, so a Hub that cannot be reached is a
    warning on stderr, not the end (`launch` checks again before renting)."""
    from autoslm.errors import StoreUnavailable
    from autoslm.store.hub_check import check_data

    try:
        check_data(s)
    except StoreUnavailable as e:
        if plan_only is None:
            raise
        sys.stderr.write(
            f"warning: {plan_only}: {e.message}; the plan below assumes the data is there, "
            "and `autoslm launch` checks it again before renting\n"
        )


def _plan_rows(s, keyless: bool = False, problems: dict[str, str] | None = None, lookup: bool = False) -> list[dict]:
    """Offers for the spec. ``keyless``: a provider without a key still shows what it can (autoslm.controller.keyless).
    ``problems``, when given, receives why a provider could not be asked (said under the table instead of logged).
    ``lookup``: `plan` only looks, so each provider is tried once; a launch keeps the retries."""
    if s.compute.is_local:
        from autoslm.providers.local.provider import describe_processes

        n = s.compute.gpu_count
        return [
            {
                "provider": "local",
                "gpu": describe_processes(n) or "this machine",
                "gpu_count": n,
                "price_per_hour": 0.0,
                "fits": True,
                "estimated_cost_usd": 0.0,
            }
        ]
    from dataclasses import asdict

    from autoslm.controller.placement import plan_placement
    from autoslm.providers import get_provider

    notes: dict[str, str] = {}
    if keyless:
        from autoslm.controller.keyless import plan_providers

        providers, notes = plan_providers(s.compute.providers)
    else:
        providers = {n: get_provider(n) for n in s.compute.providers}
    from autoslm.controller.images import choose_image, pod_vllm

    # What generates on each provider's pod decides the memory plan (vLLM's share or generate()'s KV);
    # the image the pods start (published or bootstrap), their set-up time.
    placement = plan_placement(
        s, providers, lookup=lookup, pod_vllm=lambda name: pod_vllm(s, name), image_mode=choose_image(s.compute.image).mode
    )
    if not placement.offers and placement.problems and len(placement.problems) == len(providers):
        raise next(iter(placement.problems.values()))  # as plan_offers: no provider answered, say why
    if problems is not None:  # each unreachable provider, to be said under the table
        problems.update({name: str(e) for name, e in placement.problems.items()})
    rows = [asdict(p) if not isinstance(p, dict) else p for p in placement.offers]
    for r in rows:
        if r["provider"] in notes:
            r["price_source"] = "catalog" if r.get("location") == "catalog" else "live"
            r["note"] = notes[r["provider"]] + (f"; {r['note']}" if r.get("note") else "")
    return rows


def _render_plan(s, rows: list[dict], problems: dict[str, str] | None = None) -> None:
    import shutil

    from autoslm.views.plan import plan_table, wrap

    if not rows:
        _console().print("no offers match: try another gpu, a higher max_price_per_hour, or interruptible = true")
        raise typer.Exit(3)
    width = shutil.get_terminal_size().columns
    lines = [plan_table(rows, width, title=f"offers for {s.name} ({s.model})", problems=problems)]
    # The offer a launch takes, in one line that scripts can read.
    best = next((r for r in rows if r.get("usable", True)), None)
    if best is not None:
        est, most = best.get("estimated_cost_usd"), best.get("max_cost_usd")
        cost = (f"estimated cost ${est:.2f}" if est is not None else "estimated cost unknown") + (
            f", at most ${most:.2f} within the limits" if most is not None else ""
        )
        source = " (catalog price, not a live offer)" if best.get("price_source") == "catalog" else ""
        lines.append(
            wrap(f"best offer: {best['provider']} {best['gpu']} at ${best['price_per_hour']:.3f}/hour{source}; {cost}", width)
        )
    if not s.compute.is_local:
        from autoslm.controller.images import describe
        from autoslm.catalog.spec_checks import recipe_summary

        lines += [wrap(describe(s), width), wrap(recipe_summary(s), width)]
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


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
            plan_rows=_plan_rows,
            check_data=_check_data,
            console=console,
            client_factory=lambda: _client(log=lambda m: console.print(f"[dim]{m}[/dim]")),
        )
    _check_data(s)
    if not s.compute.is_local:
        problems: dict[str, str] = {}
        rows = _plan_rows(s, problems=problems)
        usable = [r for r in rows if r.get("usable", True)]
        if not usable:
            if rows:
                _render_plan(s, rows[:5], problems)
            raise typer.Exit(_no_offers(console, rows))
        _render_plan(s, usable[:5], problems)
        best = usable[0]
        if not yes:
            if not sys.stdin.isatty():
                from autoslm.errors import UsageError

                raise UsageError("refusing to rent a GPU without confirmation (no terminal to ask on): pass --yes")
            typer.confirm(f"launch on {best['provider']} {best['gpu']} at ${best['price_per_hour']:.3f}/hour?", abort=True)
    client = _client(log=lambda m: console.print(f"[dim]{m}[/dim]"))
    from autoslm.sdk import LaunchInterrupted

    # A closed terminal (SIGHUP) or a `kill` (SIGTERM) ends a launch as Ctrl-C does: the run is left
    # with a background supervisor (or nothing running), never with a pod that nobody watches.
    _signals_interrupt()
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
        raise typer.Exit(130) from None
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
        _detach(client, run.run_id, poll_s, console)
        return
    from autoslm.views.result import print_result

    print_result(final, console)
    if final["state"] != RunState.SUCCEEDED:
        raise typer.Exit(1)


def _signals_interrupt() -> None:
    import signal

    def interrupt(signum, _frame):
        signal.signal(signum, signal.SIG_IGN)  # once: the teardown it starts must not be cut short again
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, interrupt)


def _detach(client, run_id: str, poll_s, console) -> None:
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


def _supervisor_log(client, run_id: str) -> Path:
    from autoslm.controller.daemon import logfile

    return logfile(client.home, run_id)


def _no_offers(console, rows: list[dict]) -> int:
    """One line on what to change when nothing can be rented: the limit every offer fails, where they agree."""
    from autoslm.controller.placement import NO_OFFER_HINT, unusable_hint

    said = (
        f"no offer is usable: {unusable_hint([r.get('note') or '' for r in rows])}"
        if rows
        else f"no offers match: {NO_OFFER_HINT}"
    )
    console.print(said, markup=False)
    return 3


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
    from autoslm.sdk_sweep import resolve_target

    client = _client()
    if (target := resolve_target(client, run)).sweep:
        from autoslm.views.commands import sweep_status

        return sweep_status(client, target.id, json_out, _console(), _print_json)
    st = client.status(run)
    if json_out:
        _print_json(st)
        return
    from autoslm.views.result import print_result

    console = _console()
    print_result(st, console)
    for name, url in (st.get("trackers") or {}).items():
        console.print(f"  tracker {name}: {url}")
    from autoslm.views.runview import seed_lines

    for s in st.get("seeds", []):
        for line in seed_lines(s, live=RunState(s["state"]).live):
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
    settled = None if json_out else _settled_rows(home, limit)
    if settled is None:
        client = _client()
        rows, registry = client.list_runs(limit=limit), client.registry
    else:
        rows, registry = settled
    if json_out:
        _print_json(rows)
        return
    from autoslm.views.commands import runs_table

    import shutil

    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    sys.stdout.write(runs_table(rows, registry.all_run_ids(), shutil.get_terminal_size().columns, color) + "\n")
    if registry.has_sweeps():
        from autoslm.views.sweep import sweeps_lines

        for line in sweeps_lines(registry, limit=limit):
            sys.stdout.write(line + "\n")


def _settled_rows(home: Path, limit: int):
    """(the runs table's rows, the registry) straight from the records when nothing needs a look: no run
    live, no pod or create left, no sweep with members to start, a registry this version may write. The
    common case, served without loading the SDK, the providers or pydantic; None when a tick is due."""
    import time

    from autoslm.controller import state
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
        if state.run_state(replicas).live or any(state.holds_pod(r, now) for r in replicas):
            return None
        provider = None if replicas[0].provider else state.spec_provider(run.spec_json)
        # The table shows no adapter and no seed: none is looked up (`list --json` and `status RUN` say them).
        rows.append(state.table_row(run, replicas, provider))
    return rows, registry


def _home() -> Path:
    from autoslm.secrets import autoslm_home

    return autoslm_home()


@app.command()
def logs(
    run: RunArg,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing until the run ends")] = False,
    seed: Annotated[Optional[int], typer.Option(help="which seed (default: the first)")] = None,
    events: Annotated[bool, typer.Option("--events", help="print the run's events from the store instead")] = False,
):
    """Print a run's worker log (local runs) or its events (any run)."""
    client = _client()
    if events:
        for e in client.events(run, seed):
            sys.stdout.write(json.dumps(e, default=str) + "\n")
        return
    path = client.log_file(run, seed)
    if follow:
        for line in client.follow_logs(run, seed):
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        return
    if path.exists():
        sys.stdout.write(path.read_text(errors="replace"))
    else:
        for e in client.events(run, seed):
            sys.stdout.write(json.dumps(e, default=str) + "\n")


# -- cancel / download / gc -----------------------------------------------------------------------
@app.command()
def cancel(run: RunArg):
    """Stop a run (or every run of a sweep) and tear down its pods."""
    from autoslm.sdk_serve import cancel_ref  # a run that has ended and is being served: its serve
    from autoslm.sdk_sweep import resolve_target

    client = _client(log=lambda m: _console().print(f"[dim]{m}[/dim]"))
    if (target := resolve_target(client, run)).sweep:
        from autoslm.sdk_sweep import cancel_sweep

        st = cancel_sweep(client, target.id)
        _console().print(f"sweep {st['sweep_id']}: {st['state']} ({st['running']} run(s) still ending)")
        return
    st = client.cancel(cancel_ref(client, run))
    _console().print(f"run {st['run_id']}: {st['state']}")


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

_register_views(app, _client, _console, plan=(_plan_rows, _render_plan, _no_offers))


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
    except KeyboardInterrupt:
        sys.exit(130)
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
