"""The SDK's looking at runs: resolve a reference, a run's status (from the registry, or from the store
for an ``hf://`` run), the runs list, waiting, events and logs. Everything returned is typed
(``controller/status.py``): dicts only through ``to_json()``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from autoslm.controller import status as statuses
from autoslm.controller.podspec import log_path
from autoslm.controller.registry import RegistryLocked, ReplicaRecord, RunRecord
from autoslm.controller.state import RunState, run_state, settled
from autoslm.controller.status import RunStatus
from autoslm.errors import UsageError
from autoslm.layout import RunPaths, adapter_location, parse_remote, tracker_urls
from autoslm.providers.base import node_log_path
from autoslm.store import RunArtifacts, Store

S = TypeVar("S")  # a status: RunStatus or SweepStatus


def follow(client, look: Callable[[], S], poll_s: float, timeout: float | None, on_update: Callable[[S], None] | None) -> S:
    """Look (a run's or a sweep's status) every ``poll_s`` until it ends or ``timeout`` passes; the last look."""
    start = client.clock()
    while True:
        st = look()
        if on_update:
            on_update(st)
        if st.state.terminal or (timeout is not None and client.clock() - start > timeout):
            return st
        client.sleep(poll_s)


class Looking:
    """``Client``'s part that reads runs (ticking them where no supervisor does)."""

    def resolve(self, run_id: str) -> RunRecord:
        runs = self.registry.find_runs(run_id)
        if not runs:
            raise UsageError(f"no run {run_id!r} in {self.registry.path}", hint="`autoslm list` shows the runs")
        if len(runs) > 1:
            raise UsageError(
                f"{run_id!r} matches {len(runs)} runs: {', '.join(r.run_id for r in runs[:5])}", hint="give more of the id"
            )
        return runs[0]

    def status(self, run_id: str, *, tick: bool = True) -> RunStatus:
        """The run now (``to_json()``: what ``status --json`` prints); an ``hf://`` reference is read from its store."""
        if run_id.startswith("hf://"):
            return remote_status(run_id, self.stores, self.clock())
        run = self.resolve(run_id)
        self._say_read_only()
        # A follower reads; the supervisor acts: a run whose background supervisor is alive is shown as
        # it records it (one process acting on a run, and no lock traffic from the ones looking).
        tick = tick and not self.registry.read_only and self.supervised_by(run.run_id) is None
        replicas = self.registry.replicas(run.run_id)
        # Ended with no pod or create left: nothing to act on (nor the supervisor's code to load).
        tick = tick and not settled(replicas, self.clock())
        if tick:
            try:
                replicas = self.supervisor.tick(run)
            except RegistryLocked as e:  # reads still work: answer from what was recorded, and say so
                self.notify(f"note: {e}; showing the run as last recorded")
                tick = False
        if tick:
            self.ensure_supervised([run.run_id])
        return self.run_status(run, replicas)

    def list_runs(self, *, tick: bool = True, limit: int = 50) -> list[RunStatus]:
        """The newest runs, without their store's detail (no metrics, trackers or adapter check)."""
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
                out.append(self.run_status(run, replicas, detail=False))
        if tick:
            started = self.ensure_supervised([r.run_id for r in live])
            if self.spawn_supervisor:  # a sweep between runs (one ended, the next not started) has no live run
                from autoslm.controller.sweeps import SweepBook

                for sweep_id in SweepBook(self.registry).open_ids():
                    self._ensure_sweep(sweep_id, started)
        return out

    def run_status(self, run: RunRecord, replicas: list[ReplicaRecord], detail: bool = True) -> RunStatus:
        """A run of this home as ``status`` shows it (what its records say, and in ``detail`` what its store holds)."""
        succeeded = run_state(replicas) is RunState.SUCCEEDED
        provider = None if all(r.provider for r in replicas[:1]) else statuses.spec_provider(run.spec_json)
        return statuses.local_status(
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
        if not statuses.spec_reports_to(run.spec_json):
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
        on_update: Callable[[RunStatus], None] | None = None,
    ) -> RunStatus:
        """Look at the run until it ends (or ``timeout`` passes); its last status."""
        remote = run_id.startswith("hf://")  # a run followed through its store only
        run = None if remote else self.resolve(run_id)
        if poll_s is None:
            poll_s = 1.0 if run is not None and run.spec.compute.is_local else 10.0
        return follow(self, lambda: self.status(run_id if run is None else run.run_id), poll_s, timeout, on_update)

    def events(self, run_id: str, seed: int | None = None) -> list[dict]:
        run = self.resolve(run_id)
        seeds = [seed] if seed is not None else [r.seed for r in self.registry.replicas(run.run_id)]
        out = []
        for s in seeds:
            art = RunArtifacts(self.stores(run.store_uri), RunPaths(run.phase, run.run_id, s))
            out += [{"seed": s, **e.model_dump()} for e in art.read_events()]
        return sorted(out, key=lambda e: e["time"])

    def log_file(self, run_id: str, seed: int | None = None, node: int = 0) -> Path:
        """A seed's log file here; ``node``: which node of a replica of several pods (0 holds rank 0, the
        one that reports; each other node's log lies beside it)."""
        run = self.resolve(run_id)
        seed = seed if seed is not None else self.registry.replicas(run.run_id)[0].seed
        nodes = statuses.spec_shape(run.spec_json)[0]
        if not 0 <= node < nodes:
            raise UsageError(
                f"--node {node}: run {run.run_id} has " + (f"nodes 0 to {nodes - 1}" if nodes > 1 else "one node (0)"),
                hint="leave out --node for node 0, the one that holds training rank 0",
            )
        if node and not run.spec.compute.is_local:
            raise UsageError(f"--node {node}: only a run on this machine keeps each node's log here", hint="leave out --node")
        return node_log_path(log_path(self.home, run.run_id, seed), node)

    def own_logs(self, run_id: str, seed: int | None = None, node: int = 0) -> list[str] | None:
        """The worker's own output: its log file (a run on this machine; ``node``: which node of several),
        else what the vendor keeps of its pods' output (``Capabilities.pod_logs``: each attempt's, oldest
        first); None where there is neither."""
        path = self.log_file(run_id, seed, node)
        if path.exists():
            return path.read_text(errors="replace").splitlines()
        run = self.resolve(run_id)
        providers = self._pod_log_providers(run)
        if not providers:
            return None
        r = self._replica(run, seed)
        lines: list[str] = []
        for attempt in range(1, r.attempt + 1):
            lines += self._attempt_logs(run, r, attempt, providers, follow=False)
        return lines

    def _pod_log_providers(self, run: RunRecord) -> list:
        from autoslm.providers import VENDORS

        return [self.providers(n) for n in run.spec.compute.providers if VENDORS[n].capabilities.pod_logs]

    def _replica(self, run: RunRecord, seed: int | None) -> ReplicaRecord:
        replicas = self.registry.replicas(run.run_id)
        return next((r for r in replicas if r.seed == seed), replicas[0]) if seed is not None else replicas[0]

    def _attempt_logs(self, run: RunRecord, r: ReplicaRecord, attempt: int, providers: list, *, follow: bool) -> Iterator[str]:
        """One attempt's pod output, under a line that names it where the replica had several."""
        from autoslm.controller.podnames import pod_name

        name = pod_name(self.supervisor.home_id, run.run_id, r.seed, attempt)
        if r.attempt > 1:
            yield f"==> attempt {attempt}: {name} <=="
        for provider in providers:
            yield from provider.pod_logs(name, follow=follow)

    def follow_logs(self, run_id: str, seed: int | None = None, poll_s: float = 0.5, node: int = 0) -> Iterator[str]:
        """Yield log lines as they are written, until the run ends."""
        path = self.log_file(run_id, seed, node)
        run = self.resolve(run_id)
        providers = [] if path.exists() else self._pod_log_providers(run)
        if providers:
            yield from self._follow_pod_logs(run, seed, providers, poll_s)
            return
        pos = 0
        while True:
            if path.exists():
                with open(path, encoding="utf-8", errors="replace") as f:
                    f.seek(pos)
                    chunk = f.read()
                    pos = f.tell()
                yield from chunk.splitlines()
            if self.status(run_id).state.terminal:
                return
            self.sleep(poll_s)

    def _follow_pod_logs(self, run: RunRecord, seed: int | None, providers: list, poll_s: float) -> Iterator[str]:
        """Each attempt's pod output as the vendor streams it, from its create to its end, until the run ends."""
        attempt = 1
        while True:
            ended = self.status(run.run_id).state.terminal
            r = self._replica(run, seed)
            if r.attempt >= attempt and (r.pod_id or r.attempt > attempt or ended):
                yield from self._attempt_logs(run, r, attempt, providers, follow=True)
                attempt += 1
            elif ended:
                return
            else:
                self.sleep(poll_s)


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


def remote_status(ref: str, stores: Callable[[str], Store], now: float) -> RunStatus:
    """Follow a run from a machine that did not launch it: everything comes from the store."""
    uri, paths = parse_remote(ref)
    store = stores(uri)
    art = RunArtifacts(store, paths)
    done, error, hb, metrics = art.is_done(), art.get_error(), art.get_heartbeat(), art.get_metrics()
    if not (done or error or hb or metrics):
        require_remote_run(ref, store, paths)
    return statuses.remote_status(
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
    )
