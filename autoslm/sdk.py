"""The Python SDK: what the CLI and notebooks call. Composes registry, providers, store and supervisor.

    import autoslm
    run = autoslm.launch("jobspecs/quickstart.toml", detach=True)
    run.wait()
    print(run.status()["state"], run.download("adapter/"))

``Client`` takes its collaborators (home directory, provider factory, store factory, clock) as
arguments, so tests and notebooks can point it anywhere without patching anything.
"""

from __future__ import annotations

import secrets as _random
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path

from autoslm.controller.home import open_home
from autoslm.controller import state as states
from autoslm.controller.registry import RegistryLocked, ReplicaRecord, RunRecord, is_busy
from autoslm.controller.state import RunState, holds_pod, run_state
from autoslm.controller.supervisor import log_path
from autoslm.errors import AutoslmError, UsageError
from autoslm.layout import RunPaths, adapter_location, parse_remote, tracker_urls
from autoslm.providers.base import Provider
from autoslm.spec import JobSpec, load_spec
from autoslm.store import RunArtifacts, Store
from autoslm.store.adapters import check_adapter


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


class Client:
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
        self.supervisor = open_home(home, providers=providers, stores=stores, clock=clock, log=log)
        self.home, self.registry = self.supervisor.home, self.supervisor.registry
        self.providers, self.stores = self.supervisor.providers, self.supervisor.store

    # -- launching --------------------------------------------------------------------------------
    def prepare(self, spec: JobSpec | str | Path) -> JobSpec:
        """Load the spec and check everything that can be checked before money is spent."""
        if isinstance(spec, dict):
            from autoslm.spec import validate_dict

            # A dict has no file: its folder is the one this process runs in, where its relative paths
            # point, and a reward file outside it is refused as for a spec file (it would be uploaded).
            spec = validate_dict(spec, "<dict>", base_dir=Path.cwd())
        elif not isinstance(spec, JobSpec):
            spec = load_spec(spec)
        spec = self._resolve_init_adapter(spec)
        for name in spec.compute.providers:
            self.providers(name)  # a missing key fails here, before any pod
        store = self.stores(store_uri_for(spec, self.home))
        ensure = getattr(store, "ensure_repo", None)
        if callable(ensure):
            ensure(private=spec.artifacts.private)
        from autoslm.store.hub_check import check_data
        from autoslm.store.shipping import ship_local_files

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
        ref = getattr(spec.train, "init_from_adapter", None)
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
        spec: JobSpec | str | Path | dict,
        *,
        detach: bool = False,
        spec_path: str | None = None,
        on_update: Callable[[dict], None] | None = None,
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
            deadline=now + spec.limits.max_hours * 3600,
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
        if left:
            pid = self.start_supervisor(run.run_id) if self.spawn_supervisor else None
            watch = (
                f"a background supervisor (pid {pid}) keeps ending them" if pid else f"`autoslm cancel {run.run_id}` stops them"
            )
            message = f"{e}; run {run.run_id} failed{torn}, and these may still run: {'; '.join(left)}"
            hint = f"{watch}; `autoslm gc` finds any that appears late"
        else:
            message = f"{e}; run {run.run_id} failed{torn}, and nothing it started is left running"
            hint = None
        if not isinstance(e, AutoslmError):
            return e  # a bug, not a provider's answer: its own traceback says most (the run is ended)
        try:
            return type(e)(message, hint=hint)
        except TypeError:  # an error class with its own arguments
            err = AutoslmError(message, hint=hint)
            err.exit_code = e.exit_code
            return err

    def ensure_supervised(self, run_ids: list[str]) -> dict[str, int]:
        """Start a supervisor for each run here that is live (or has pods left) and has none, and say
        so. Every command that looks at runs calls it: a SIGKILLed supervisor, a launch killed before
        it started one, or a crash must not leave a live pod unwatched until someone happens to look."""
        from autoslm.controller import daemon, sweeps

        started: dict[str, int] = {}
        if not self.spawn_supervisor or self.registry.read_only:
            return started
        book = sweeps.SweepBook(self.registry)
        for run_id in run_ids:
            if run_id in self._following:
                continue  # this process launched it and ticks it until it ends (a followed launch)
            sweep_id = book.sweep_of_run(run_id)
            if sweep_id is not None:  # a sweep's run: the sweep's one supervisor ticks it
                self._ensure_sweep(sweep_id, started)
                continue
            run = self.registry.get_run(run_id)
            # A rented pod always has one; a local run only if it had one (its pidfile outlives a crash).
            if run is None or (run.spec.compute.is_local and not daemon.pidfile(self.home, run_id).exists()):
                continue
            replicas = self.registry.replicas(run_id)
            # An ended run's intent is no pod: its tick (any `status`) adopts and ends one that lands late.
            # A create that may still land counts too: a pod is adopted (and ended) only by a tick.
            now = self.clock()
            live = run_state(replicas).live or any(holds_pod(r, now) for r in replicas)
            if not live or daemon.supervising(self.home, run_id, self.registry, now) is not None:
                continue
            started[run_id] = self._supervise_anew("run", run_id)
        return started

    def _ensure_sweep(self, sweep_id: str, started: dict[str, int]) -> None:
        if sweep_id not in started and (pid := self.ensure_sweep_supervised(sweep_id)) is not None:
            started[sweep_id] = pid

    def ensure_sweep_supervised(self, sweep_id: str) -> int | None:
        """A sweep with runs to tick or members to start gets a supervisor again if its own died, or is
        stopped or not beating (as a run's does); the pid of the one started, else None."""
        from autoslm.controller import daemon, sweeps

        if not self.spawn_supervisor or self.registry.read_only or sweeps.done(self.registry, sweep_id):
            return None
        if daemon.supervising(self.home, sweep_id, self.registry, self.clock()) is not None:
            return None
        return self._supervise_anew("sweep", sweep_id)

    def _supervise_anew(self, kind: str, key: str) -> int:
        """Start a supervisor for a run or sweep that none supervises, in place of one that runs but no
        longer supervises (stopped, hung, taken over: the new one takes its lease over once stale, and
        the old one, should it resume, exits without writing), and say so."""
        from autoslm.controller import daemon

        frozen = daemon.running_pid(self.home, key)
        pid = self.start_supervisor(key, replace=frozen is not None)
        why = f"supervisor {frozen} is stopped or not beating" if frozen is not None else "none was running"
        self.notify(f"started a background supervisor for {kind} {key} (pid {pid}): {why}")
        return pid

    def _say_read_only(self) -> None:
        if self.registry.read_only:
            self.notify(
                f"note: the run registry {self.registry.path} is from a newer autoslm (schema "
                f"{self.registry.newer_version}): read-only here, so runs are shown as last recorded"
            )

    def start_supervisor(self, run_id: str, poll_s: float | None = None, *, replace: bool = False) -> int:
        """Leave a background process ticking the run until it ends (see controller/daemon.py)."""
        from autoslm.controller import daemon

        return daemon.start(self.home, run_id, poll_s, replace=replace)

    def supervised_by(self, run_id: str) -> int | None:
        """The pid of the background supervisor that acts on this run (its own, or its sweep's) while it
        is alive and beating; None when this process is the one to act (it follows a launch it ticks, or
        no live supervisor holds the run). Reads only."""
        from autoslm.controller import daemon, sweeps

        if run_id in self._following:
            return None
        sweep_id = sweeps.SweepBook(self.registry).sweep_of_run(run_id)
        return daemon.supervising(self.home, sweep_id or run_id, self.registry, self.clock())

    def what_runs(self, run_id: str, *, wait_s: float | None = None) -> list[str]:
        """Pods a run has (or may have: a create whose answer was not recorded), in words. ``wait_s``:
        wait at most that long for another process's lock on the registry, then say it could not look."""
        import sqlite3

        try:
            with self.registry.waiting_at_most(self.registry.lock_wait_s if wait_s is None else wait_s):
                replicas = self.registry.replicas(run_id)
        except (sqlite3.OperationalError, RegistryLocked) as e:
            if wait_s is None or not is_busy(e):
                raise
            return [f"unknown for now (the run registry is busy; `autoslm status {run_id}` shows them)"]
        out = []
        for r in replicas:
            if r.pod_id:
                out.append(f"seed {r.seed}: {r.provider} pod {r.pod_id}")
            elif r.intent_name:
                out.append(f"seed {r.seed}: maybe a {r.intent_provider} pod named {r.intent_name} (its create was in flight)")
        return out

    # -- looking ----------------------------------------------------------------------------------
    def resolve(self, run_id: str) -> RunRecord:
        runs = self.registry.find_runs(run_id)
        if not runs:
            raise UsageError(f"no run {run_id!r} in {self.registry.path}", hint="`autoslm list` shows the runs")
        if len(runs) > 1:
            raise UsageError(
                f"{run_id!r} matches {len(runs)} runs: {', '.join(r.run_id for r in runs[:5])}", hint="give more of the id"
            )
        return runs[0]

    def status(self, run_id: str, *, tick: bool = True) -> dict:
        if run_id.startswith("hf://"):
            return remote_status(run_id, self.stores, self.clock())
        run = self.resolve(run_id)
        self._say_read_only()
        # A follower reads; the supervisor acts: a run whose background supervisor is alive is shown as
        # it records it (one process acting on a run, and no lock traffic from the ones looking).
        tick = tick and not self.registry.read_only and self.supervised_by(run.run_id) is None
        replicas = None
        if tick:
            try:
                replicas = self.supervisor.tick(run)
            except RegistryLocked as e:  # reads still work: answer from what was recorded, and say so
                self.notify(f"note: {e}; showing the run as last recorded")
                tick = False
        if replicas is None:
            replicas = self.registry.replicas(run.run_id)
        if tick:
            self.ensure_supervised([run.run_id])
        return self._status_json(run, replicas)

    def list_runs(self, *, tick: bool = True, limit: int = 50) -> list[dict]:
        out = []
        self._say_read_only()
        tick = tick and not self.registry.read_only
        runs = self.registry.list_runs(limit=limit)
        live = [r for r in runs if run_state(self.registry.replicas(r.run_id)).live] if tick else []
        unsupervised = [r for r in live if self.supervised_by(r.run_id) is None]  # the others' supervisors act
        names = {x.provider for r in live for x in self.registry.replicas(r.run_id) if x.provider and x.pod_id}
        with self.supervisor.shared_look(names):  # one list call per provider for all the runs
            for run in runs:
                replicas = self.registry.replicas(run.run_id)
                if run in unsupervised:
                    try:
                        replicas = self.supervisor.tick(run)
                    except Exception:  # noqa: BLE001 - one unreachable provider must not hide the other runs
                        pass
                out.append(self._status_json(run, replicas, detail=False))
        if tick:
            started = self.ensure_supervised([r.run_id for r in live])
            if self.spawn_supervisor:  # a sweep between runs (one ended, the next not started) has no live run
                from autoslm.controller.sweeps import SweepBook

                for sweep_id in SweepBook(self.registry).open_ids():
                    self._ensure_sweep(sweep_id, started)
        return out

    def _status_json(self, run: RunRecord, replicas: list[ReplicaRecord], detail: bool = True) -> dict:
        return self.run_status(run, replicas, detail).to_json()

    def run_status(self, run: RunRecord, replicas: list[ReplicaRecord], detail: bool = True) -> states.RunStatus:
        """A run of this home as ``status`` shows it (what its records say, and in ``detail`` what its store holds)."""
        succeeded = run_state(replicas) is RunState.SUCCEEDED
        provider = None if all(r.provider for r in replicas[:1]) else states.spec_provider(run.spec_json)
        return states.local_status(
            run,
            replicas,
            self.clock(),
            default_provider=provider,
            adapters=[adapter_location(run.store_uri, RunPaths(run.phase, run.run_id, r.seed)) for r in replicas]
            if succeeded
            else None,
            adapter_missing=succeeded and detail and not self._adapters_present(run, replicas),
            detail=detail,
            metrics=self._metrics(run, replicas) if detail else None,
            trackers=self._trackers(run, replicas) if detail else None,
        )

    def _adapters_present(self, run: RunRecord, replicas: list[ReplicaRecord]) -> bool:
        """Never print an adapter path that does not exist (a store that cannot tell: trust the record)."""
        for r in replicas:
            try:
                if not RunArtifacts(self.stores(run.store_uri), RunPaths(run.phase, run.run_id, r.seed)).has_adapter():
                    return False
            except Exception:  # noqa: BLE001 - an unreachable store is not a missing adapter
                continue
        return True

    def _metrics(self, run: RunRecord, replicas: list[ReplicaRecord]) -> dict | None:
        """metrics.json of each seed that has one (eval before/after, loss, reward curve)."""
        found = {}
        for r in replicas:
            try:
                m = RunArtifacts(self.stores(run.store_uri), RunPaths(run.phase, run.run_id, r.seed)).get_metrics()
            except Exception:  # noqa: BLE001 - metrics are a bonus in status, never a failure
                m = None
            if m:
                found[f"seed{r.seed}"] = m
        return found or None

    def _trackers(self, run: RunRecord, replicas: list[ReplicaRecord]) -> dict[str, str]:
        """Tracker run URLs (wandb, mlflow...) the worker announced, from the first seed's events."""
        if not run.spec.train.report_to:
            return {}
        try:
            art = RunArtifacts(self.stores(run.store_uri), RunPaths(run.phase, run.run_id, replicas[0].seed))
            return tracker_urls([e.model_dump() for e in art.read_events()])
        except Exception:  # noqa: BLE001 - a bonus in status, never a failure
            return {}

    def wait(
        self,
        run_id: str,
        *,
        timeout: float | None = None,
        poll_s: float | None = None,
        on_update: Callable[[dict], None] | None = None,
    ) -> dict:
        remote = run_id.startswith("hf://")  # a run followed through its store only
        run = None if remote else self.resolve(run_id)
        if poll_s is None:
            poll_s = 1.0 if run is not None and run.spec.compute.is_local else 10.0
        start = self.clock()
        while True:
            st = self.status(run_id if run is None else run.run_id)
            if on_update:
                on_update(st)
            if RunState(st["state"]).terminal:
                return st
            if timeout is not None and self.clock() - start > timeout:
                return st
            self.sleep(poll_s)

    def events(self, run_id: str, seed: int | None = None) -> list[dict]:
        run = self.resolve(run_id)
        seeds = [seed] if seed is not None else [r.seed for r in self.registry.replicas(run.run_id)]
        out = []
        for s in seeds:
            art = RunArtifacts(self.stores(run.store_uri), RunPaths(run.phase, run.run_id, s))
            out += [{"seed": s, **e.model_dump()} for e in art.read_events()]
        return sorted(out, key=lambda e: e["time"])

    def log_file(self, run_id: str, seed: int | None = None) -> Path:
        run = self.resolve(run_id)
        seed = seed if seed is not None else self.registry.replicas(run.run_id)[0].seed
        return log_path(self.home, run.run_id, seed)

    def follow_logs(self, run_id: str, seed: int | None = None, poll_s: float = 0.5) -> Iterator[str]:
        """Yield log lines as they are written, until the run ends."""
        path = self.log_file(run_id, seed)
        pos = 0
        while True:
            if path.exists():
                with open(path, encoding="utf-8", errors="replace") as f:
                    f.seek(pos)
                    chunk = f.read()
                    pos = f.tell()
                yield from chunk.splitlines()
            if RunState(self.status(run_id)["state"]).terminal:
                return
            self.sleep(poll_s)

    # -- acting -----------------------------------------------------------------------------------
    def cancel(self, run_id: str) -> dict:
        """Cancel wins: the flag is set at once, and whoever holds the run's lease checks it right
        before and right after any create. We wait for the lease (a relaunch in flight) to tear down."""
        run = self.resolve(run_id)
        if run_state(self.registry.replicas(run.run_id)).live:
            self.registry.request_cancel(run.run_id)
        try:
            replicas = self.supervisor.tick(run, wait_s=60.0)
        finally:
            # A teardown that failed (or waits on a busy lease) must not rest on this one command.
            left = [r for r in self.registry.replicas(run.run_id) if holds_pod(r, self.clock())]
            if left and self.spawn_supervisor:
                from autoslm.controller import daemon

                awake = daemon.supervising(self.home, run.run_id, self.registry, self.clock()) is not None
                self.start_supervisor(run.run_id, replace=not awake)
        if not self.supervisor.acted and run_state(replicas).live:
            # Never live after a wait: say who holds the run, since when, and that the cancel stands.
            info = self.registry.lease_info(run.run_id) or {}
            now = self.clock()
            held = f" for {now - info['taken_at']:.0f}s" if info.get("taken_at") else ""
            beat = f", last heard from {now - info['beat_at']:.0f}s ago" if info.get("beat_at") else ""
            who = f"process {info['pid']}" if info.get("pid") else "another process"
            raise RunBusy(
                f"run {run.run_id} is held by {who}{held}{beat}: the cancel is recorded, and that process ends the "
                "run at its next look (a relaunch in flight is ended as soon as it lands)",
                hint=f"`autoslm status {run.run_id}` shows when it is cancelled"
                + (
                    f"; if process {info['pid']} is stuck, ending it (kill {info['pid']}) lets the next command act"
                    if info.get("pid")
                    else ""
                ),
            )
        return self._status_json(run, replicas)

    def download(self, run_id: str, to: str | Path | None = None) -> Path:
        if run_id.startswith("hf://"):
            uri, paths = parse_remote(run_id)
            st = remote_status(run_id, self.stores, self.clock())  # says so when the repo or run is not there
            if st["state"] != RunState.SUCCEEDED:
                raise UsageError(
                    f"{run_id} is {st['state']}: only a succeeded run has an adapter",
                    hint=f"`autoslm status {run_id}` says how far it is",
                )
            targets = [paths]
            store_uri = uri
            name = paths.run_id
        else:
            run = self.resolve(run_id)
            st = self.status(run.run_id)
            if st["state"] != RunState.SUCCEEDED:
                raise UsageError(f"run {run.run_id} is {st['state']}: only a succeeded run has an adapter")
            store_uri, name = run.store_uri, run.run_id
            targets = [RunPaths(run.phase, run.run_id, r.seed) for r in self.registry.replicas(run.run_id)]
        dest = Path(to) if to else Path.cwd() / f"{name}-adapter"
        store = self.stores(store_uri)
        for paths in targets:
            out = dest if len(targets) == 1 else dest / f"seed{paths.seed}"
            RunArtifacts(store, paths).fetch_adapter(out)
            if not (out / "adapter_config.json").exists():
                raise UsageError(f"no adapter at {adapter_location(store_uri, paths)}")
            check_adapter(
                out,
                hint=f"the copy in the store is damaged ({adapter_location(store_uri, paths)}): "
                "download it again; if it stays so, relaunch the run",
            )
        return dest

    def gc(self, *, dry_run: bool = False, all_homes: bool = False, pods: tuple[str, ...] = ()):
        """End autoslm pods whose run is over or unknown, found in every provider's own list (see
        controller/gc.py). Live runs are ticked first (that is what ends them); a run whose tick
        failed (a teardown the provider refused) is reported as a failure. ``pods``: only these.
        Returns a GcReport."""
        from autoslm.controller.gc import sweep

        troubled: dict[str, str] = {}
        live: list[str] = []
        if not dry_run and not self.registry.read_only:
            for run in self.registry.list_runs(limit=10_000):
                if run_state(self.registry.replicas(run.run_id)).live:
                    live.append(run.run_id)
                    try:
                        self.supervisor.tick(run)
                    except Exception as e:  # noqa: BLE001 - one run's trouble must not stop the sweep
                        self.supervisor.log(f"{run.run_id}: {e}")
                        troubled[run.run_id] = str(e)
        self._say_read_only()
        report = sweep(
            self.providers,
            self.supervisor.home_id,
            self.registry,
            dry_run=dry_run,
            all_homes=all_homes,
            pods=pods,
            troubled=troubled,
            on_end=self.supervisor.bill_ended,
        )
        if not dry_run:
            self.ensure_supervised(live)
        return report


class RunBusy(AutoslmError):
    """Another live process holds the run's lease past the wait: what it does next is its own."""

    exit_code = 1


class LaunchInterrupted(KeyboardInterrupt):
    """Ctrl-C while a launch was creating pods: the run exists, and may have pods."""

    def __init__(self, run_id: str, running: list[str], supervisor_pid: int | None = None):
        super().__init__(run_id)
        self.run_id = run_id
        self.running = running
        self.supervisor_pid = supervisor_pid  # the background supervisor that keeps the run, if one was started


def require_remote_run(ref: str, store: Store, paths: RunPaths) -> None:
    """A reference into a store names a repo that exists and a run with files in it, or says which not.
    (A typo otherwise reads as a run that has not started yet, forever.)"""
    if not store.exists():
        raise UsageError(
            f"{ref}: no store {store.uri} (the repo does not exist, or this token cannot see it)",
            hint="check the owner/repo part; a private repo needs HF_TOKEN",
        )
    if not store.list_files(f"{paths.phase}/{paths.run_id}"):
        raise UsageError(
            f"{ref}: no run {paths.run_id} under {paths.phase}/ in {store.uri}",
            hint="check the phase and run id (a run launched moments ago shows once its worker starts)",
        )
    if not store.list_files(paths.prefix):
        raise UsageError(
            f"{ref}: run {paths.run_id} has no seed{paths.seed} in {store.uri}", hint="leave out /seedN for the first seed"
        )


def remote_status(ref: str, stores: Callable[[str], Store], now: float) -> dict:
    """Follow a run from a machine that did not launch it: everything comes from the store."""
    uri, paths = parse_remote(ref)
    store = stores(uri)
    art = RunArtifacts(store, paths)
    done, error, hb, metrics = art.is_done(), art.get_error(), art.get_heartbeat(), art.get_metrics()
    if not (done or error or hb or metrics):
        require_remote_run(ref, store, paths)
    return states.remote_status(
        run_id=paths.run_id,
        phase=paths.phase,
        seed=paths.seed,
        store=uri,
        done=done,
        error=error,
        heartbeat=hb,
        metrics=metrics,
        adapter=adapter_location(uri, paths),
        now=now,
    ).to_json()
