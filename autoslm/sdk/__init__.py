"""The Python SDK: what the CLI and notebooks call. Composes registry, providers, store and supervisor.

    import autoslm
    run = autoslm.launch("jobspecs/quickstart.toml", detach=True)
    run.wait()
    print(run.status().state, run.download("adapter/"))

``Client`` takes its collaborators (home directory, provider factory, store factory, clock) as
arguments, so tests and notebooks can point it anywhere without patching anything. Its jobs live in
one module each: launching here, supervision (``sdk/supervision.py``), looking at runs
(``sdk/looking.py``: typed statuses, ``controller/status.py``) and acting on them (``sdk/acting.py``).
"""

from __future__ import annotations

import functools
import secrets as _random
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from autoslm.controller.home import default_providers, default_stores, home_path, supervisor_of
from autoslm.controller.registry import Registry, RunRecord
from autoslm.controller.state import RunState, run_state
from autoslm.errors import AutoslmError, UsageError
from autoslm.providers.base import Provider
from autoslm.sdk.acting import Acting, RunBusy
from autoslm.sdk.looking import Looking, remote_status, require_remote_run
from autoslm.sdk.supervision import Supervision
from autoslm.store import Store

if TYPE_CHECKING:  # the JobSpec's models and the supervisor load when a command needs them, not to read a run
    from autoslm.controller.supervisor import Supervisor
    from autoslm.spec import JobSpec, ServeSpec

__all__ = [
    "INTERRUPTED_WAIT_S",
    "Client",
    "LaunchInterrupted",
    "RunBusy",
    "new_run_id",
    "remote_status",
    "require_remote_run",
    "store_uri_for",
]


# How long a command interrupted by Ctrl-C waits for the registry's lock on its way out: it says what
# it can at once and leaves the rest to the run's supervisor.
INTERRUPTED_WAIT_S = 0.3


def new_run_id(name: str, now: float) -> str:
    stamp = datetime.fromtimestamp(now, timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{name}-{stamp}-{_random.token_hex(2)}"


def store_uri_for(spec: JobSpec, home: Path) -> str:
    if spec.artifacts.store == "hf":
        return f"hf://{spec.artifacts.repo}"
    path = Path(spec.artifacts.path).expanduser() if spec.artifacts.path else home / "artifacts"
    return path.resolve().as_uri()


class Client(Supervision, Looking, Acting):
    """The SDK: launch runs here; supervise, look at and act on them (one mixin per job)."""

    def __init__(
        self,
        home: Path | str | None = None,
        *,
        providers: Callable[[str], Provider] | None = None,
        stores: Callable[[str], Store] | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        log: Callable[[str], None] = lambda msg: None,
        notify: Callable[[str], None] | None = None,
    ):
        # What a command must tell its user beside its answer (a supervisor it started, a read-only
        # registry): the CLI writes it to stderr, so `--json` output stays JSON.
        self.notify = notify or log
        self._following: set[str] = set()  # runs this process launched without a supervisor and follows
        self.clock, self.sleep = clock, sleep
        # A detached run gets a supervisor process, which builds its own providers from the
        # environment: only a Client using those same defaults may start one.
        self.spawn_supervisor = providers is None and stores is None
        self.home = home_path(home)
        self.registry = Registry(self.home, clock=clock)
        self.providers, self.stores = providers or default_providers(), stores or default_stores()
        self._supervisor_log = log

    @functools.cached_property
    def supervisor(self) -> Supervisor:
        """The home's supervisor, over this client's registry, providers and stores: built when a command
        first acts (launches, ticks, cancels), so one that only reads never loads it."""
        return supervisor_of(self.home, self.registry, self.providers, self.stores, self.clock, self._supervisor_log)

    # -- launching --------------------------------------------------------------------------------
    def prepare(self, spec: JobSpec | ServeSpec | str | Path) -> JobSpec | ServeSpec:
        """Load the spec and check everything that can be checked before money is spent. A serve
        (``ServeSpec``, built by sdk/serve.py) has no data to check or ship: its adapter is in a store."""
        if isinstance(spec, dict):
            from autoslm.spec import validate_dict

            # A dict has no file: its folder is the one this process runs in, where its relative paths
            # point, and a reward file outside it is refused as for a spec file (it would be uploaded).
            spec = validate_dict(spec, "<dict>", base_dir=Path.cwd())
        else:
            from autoslm.spec import JobSpec, ServeSpec, load_spec

            if not isinstance(spec, (JobSpec, ServeSpec)):
                spec = load_spec(spec)
        if spec.kind == "train":
            spec = self._resolve_init_adapter(spec)
        for name in spec.compute.providers:
            self.providers(name)  # a missing key fails here, before any pod
        store = self.stores(store_uri_for(spec, self.home))
        ensure = getattr(store, "ensure_repo", None)
        if callable(ensure):
            ensure(private=spec.artifacts.private)
        from autoslm.store.hub_check import check_data
        from autoslm.store.shipping import ship_local_files

        if spec.kind == "train":
            check_data(spec)  # a Hub dataset that is missing or unusable fails here, before any pod
            spec = ship_local_files(spec, store)  # the worker reads the store's copy, never a laptop path
        from autoslm.controller.images import resolve_image

        spec = resolve_image(spec)  # "auto" -> the published image or "bootstrap", once for every attempt
        if spec.compute.image == "bootstrap":
            from autoslm.controller.wheel import ship_wheel

            ship_wheel(store, self.home / "wheels")  # before any pod: a store that refuses it fails here
        return spec

    def _resolve_init_adapter(self, spec: JobSpec) -> JobSpec:
        """``train.init_from_adapter`` may name a run id, a prefix, or a run name (the newest
        succeeded run of that name): pin it to one succeeded SFT run id before anything starts."""
        ref = spec.train.init_from_adapter if spec.train.method == "grpo" else None
        if not ref:
            return spec
        candidates = [r for r in self.registry.find_runs(ref)] or [
            r for r in self.registry.list_runs(limit=10_000) if r.name == ref
        ]
        succeeded = [
            r for r in candidates if r.phase == "sft" and run_state(self.registry.replicas(r.run_id)) is RunState.SUCCEEDED
        ]
        if not succeeded:
            raise UsageError(
                f"train.init_from_adapter = {ref!r}: no succeeded SFT run here matches it",
                hint="launch the SFT run first (e.g. `autoslm launch jobspecs/quickstart.toml`), or give its run id",
            )
        chosen = max(succeeded, key=lambda r: r.created_at)
        if chosen.store_uri != store_uri_for(spec, self.home):
            raise UsageError(
                f"train.init_from_adapter: run {chosen.run_id} kept its adapter in {chosen.store_uri}, not in this run's store"
            )
        return spec.model_copy(update={"train": spec.train.model_copy(update={"init_from_adapter": chosen.run_id})})

    def launch(
        self,
        spec: JobSpec | ServeSpec | str | Path | dict,
        *,
        detach: bool = False,
        spec_path: str | None = None,
        on_update: Callable | None = None,
        poll_s: float | None = None,
        supervise: bool | None = None,
    ) -> RunRecord:
        """Start a run. ``detach``: return at once. A supervisor process ticks the run until it ends
        (``supervise``; default: with the default providers, for a rented pod or a detached run).

        Ctrl-C during the launch raises ``LaunchInterrupted`` naming the run (a supervisor then keeps
        it); a launch that fails in any seed ends the run as failed, tears down and bills the seeds it
        started, and says what is left, before raising."""
        self.registry.require_writable()  # a registry of a newer autoslm: nothing is created
        if isinstance(spec, (str, Path)):
            spec_path = spec_path or str(spec)
        spec = self.prepare(spec)
        now = self.clock()
        run = RunRecord(
            run_id=new_run_id(spec.name, now),
            name=spec.name,
            phase=spec.phase,
            spec_json=spec.to_json(),
            spec_path=spec_path,
            store_uri=store_uri_for(spec, self.home),
            created_at=now,
            deadline=now + spec.limits.time_limit_s,  # a serve's: its TTL
        )
        self.registry.create_run(run, spec.seeds)
        if supervise is None:  # a rented pod always gets one: a closed notebook must not leave it unwatched
            supervise = self.spawn_supervisor and (detach or not spec.compute.is_local)
        # Whatever ends this launch, it leaves nothing live or a supervised run.
        try:
            self.supervisor.tick(run, wait_s=30.0)  # launches the pods; raises when a seed cannot get one
            if supervise:
                self.start_supervisor(run.run_id, poll_s)
        except KeyboardInterrupt:  # Ctrl-C, or (through the CLI) SIGHUP or SIGTERM
            # The run stays (a create in flight may land): a supervisor adopts or ends what it left.
            pid = self.start_supervisor(run.run_id, poll_s) if self.spawn_supervisor else None
            raise LaunchInterrupted(run.run_id, self.what_runs(run.run_id, wait_s=INTERRUPTED_WAIT_S), pid) from None
        except Exception as e:
            raise self._launch_failed(run, e) from None
        if not supervise:
            self._following.add(run.run_id)
        if not detach:
            self.wait(run.run_id, on_update=on_update, poll_s=poll_s)
        return run

    def _launch_failed(self, run: RunRecord, e: Exception) -> Exception:
        """End a launch that failed (any error, in any seed) as a failed run: tear down and bill what it
        started, and say what is left. The error keeps its class (and so its exit code)."""
        try:
            left, ended = self.supervisor.abort_launch(run, str(e))
        except Exception as abort_error:  # noqa: BLE001 - say both; a supervisor retries the teardown
            left, ended = [f"unknown: the teardown failed too ({abort_error})"], []
        torn = f"; tore down {', '.join(ended)}" if ended else ""
        # The error's own words, then the run's end; its hint (what to do) closes the one line.
        what, own_hint = (e.message, e.hint) if isinstance(e, AutoslmError) else (str(e), None)
        if left:
            pid = self.start_supervisor(run.run_id) if self.spawn_supervisor else None
            watch = (
                f"a background supervisor (pid {pid}) keeps ending them" if pid else f"`autoslm cancel {run.run_id}` stops them"
            )
            message = f"{what}; run {run.run_id} failed{torn}, and these may still run: {'; '.join(left)}"
            hint = "; ".join(h for h in (own_hint, f"{watch}; `autoslm gc` finds any that appears late") if h)
        else:
            message = f"{what}; run {run.run_id} failed{torn}, and nothing it started is left running"
            hint = own_hint
        if not isinstance(e, AutoslmError):
            return e  # a bug, not a provider's answer: its own traceback says most (the run is ended)
        try:
            return type(e)(message, hint=hint)
        except TypeError:  # an error class with its own arguments
            err = AutoslmError(message, hint=hint)
            err.exit_code = e.exit_code
            return err


class LaunchInterrupted(KeyboardInterrupt):
    """Ctrl-C while a launch was creating pods: the run exists, and may have pods."""

    def __init__(self, run_id: str, running: list[str], supervisor_pid: int | None = None):
        super().__init__(run_id)
        self.run_id = run_id
        self.running = running
        self.supervisor_pid = supervisor_pid  # the background supervisor that keeps the run, if one was started
