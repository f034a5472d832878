"""The SDK's supervision of runs: every command that looks at a run leaves it with a background
supervisor when it is live (or has a pod left) and none acts on it (see controller/daemon.py)."""

from __future__ import annotations

from autoslm.controller.registry import RegistryLocked, is_busy
from autoslm.controller.state import holds_pod, run_state


class Supervision:
    """``Client``'s part that starts and finds background supervisors (needs ``home``, ``registry``, ``clock``)."""

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
