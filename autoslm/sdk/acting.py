"""The SDK's acting on a run that exists: cancel it, download its adapter, and end stray pods (gc)."""

from __future__ import annotations

from pathlib import Path

from autoslm.controller.state import RunState, holds_pod, run_state
from autoslm.controller.status import RunStatus
from autoslm.errors import AutoslmError, UsageError
from autoslm.layout import RunPaths, adapter_location, parse_remote
from autoslm.sdk.looking import remote_status
from autoslm.store import RunArtifacts
from autoslm.store.adapters import check_adapter


class Acting:
    """``Client``'s part that changes a run: cancel, download, gc."""

    def cancel(self, run_id: str) -> RunStatus:
        """Cancel wins: the flag is set at once, and whoever holds the run's lease checks it right
        before and right after any create. We wait for the lease (a relaunch in flight) to tear down."""
        run = self.resolve(run_id)
        replicas = self.registry.replicas(run.run_id)
        # A succeeded run whose pod still runs lm-eval after the hand-back: the cancel ends that pod (the
        # run stays succeeded with its adapter).
        if run_state(replicas).live or any(r.pod_id for r in replicas):
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
        return self.run_status(run, replicas)

    def download(self, run_id: str, to: str | Path | None = None) -> Path:
        if run_id.startswith("hf://"):
            uri, paths = parse_remote(run_id)
            st = remote_status(run_id, self.stores, self.clock())  # says so when the repo or run is not there
            if st.state is not RunState.SUCCEEDED:
                raise UsageError(
                    f"{run_id} is {st.state}: only a succeeded run has an adapter",
                    hint=f"`autoslm status {run_id}` says how far it is",
                )
            targets = [paths]
            store_uri = uri
            name = paths.run_id
        else:
            run = self.resolve(run_id)
            st = self.status(run.run_id)
            if run.spec.kind == "train" and run.spec.export is not None:  # `autoslm export --on`: what it wrote, not an adapter
                return self._download_export(run, st, to)
            if st.state is not RunState.SUCCEEDED:
                raise UsageError(f"run {run.run_id} is {st.state}: only a succeeded run has an adapter")
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

    def _download_export(self, run, st, to) -> Path:
        """An export run's files (merged weights, or a GGUF and its Modelfile), into ``to``."""
        from autoslm.sdk.export_remote import place_fetched

        if st.state is not RunState.SUCCEEDED:
            raise UsageError(f"export run {run.run_id} is {st.state}: only a succeeded export has files")
        dest = Path(to) if to else Path.cwd() / f"{run.run_id}-export"
        seed = self.registry.replicas(run.run_id)[0].seed
        place_fetched(RunArtifacts(self.stores(run.store_uri), RunPaths(run.phase, run.run_id, seed)), dest)
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
