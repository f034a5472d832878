"""One tick's working state and the lease it runs under.

A tick reads a run once (``Registry.take_and_look``) and keeps what it decides in memory (``Tick.set``,
``Tick.mark_ended``) until ``Tick.apply`` writes it in one transaction, fenced by the run's lease. Right
before every provider action (create, terminate) ``Tick.check`` makes sure the lease is still the one
the tick decided under: a holder that stalled and was taken over acts on nothing (``LeaseLost``).
"""

from __future__ import annotations

import dataclasses

from autoslm.controller.registry import Fence, LeaseLost, Registry, ReplicaRecord, RunLook

# Longer than one provider call with all its retries (http.RetryPolicy.max_total_s is 300 s): a
# holder that dies on this host frees it at once; one on another machine holds it this long at most.
LEASE_TTL_S = 600.0
LEASE_WAIT_S = 2.0  # how long a reader waits for a busy run before answering from the registry
# A holder on this host that is stopped (SIGSTOP) and has not beaten its lease for this long is taken over.
LEASE_STALE_S = 15.0
# Any holder, on any host, stopped or not, whose lease has not beaten for this long is taken over: a
# tick beats at every write, a background supervisor its own lease (controller/daemon.py) every
# LEASE_BEAT_S. Writes are fenced, so taking over one that was only slow costs it its tick, never a double act.
LEASE_HUNG_S = 120.0
LEASE_BEAT_S = 5.0


class Tick:
    """One tick's working state: what it read (once), and the writes it decided, not yet applied.

    ``fence`` None: a write outside the run's lease (``gc``'s bill, a teardown whose lease could not be
    had), which records what was done and checks nothing."""

    def __init__(self, look: RunLook, fence: Fence | None, registry: Registry):
        self.run, self.fence, self.cancel, self.cancel_reason = look.run, fence, look.cancel_requested, look.cancel_reason
        self.registry = registry
        self.reps = {r.seed: r for r in look.replicas}
        self.ended = set(look.ended)
        self.changes: dict[int, dict] = {}
        self.marks: list[tuple[str, str, str]] = []

    @property
    def replicas(self) -> list[ReplicaRecord]:
        return [self.reps[s] for s in sorted(self.reps)]

    def set(self, seed: int, **changes) -> ReplicaRecord:
        """Decide changes to a replica: seen at once by the rest of the tick, written at the next apply
        (only what differs from what it holds: a look that changes nothing writes nothing of it)."""
        now = self.reps[seed]
        changes = {k: v for k, v in changes.items() if getattr(now, k) != v}
        if changes:
            self.reps[seed] = dataclasses.replace(now, **changes)
            self.changes.setdefault(seed, {}).update(changes)
        return self.reps[seed]

    def mark_ended(self, provider: str, pod_id: str) -> None:
        self.ended.add((provider, pod_id))
        self.marks.append((provider, pod_id, self.run.run_id))

    def spent(self) -> float:
        return sum(r.cost_usd for r in self.reps.values())

    def holds(self) -> bool:
        """Whether the lease is still the one this tick decided under (always, outside the lease)."""
        return self.fence is None or self.registry.holds(self.fence)

    def check(self) -> None:
        """Right before a provider action: the lease must still be the one this tick decided under."""
        if not self.holds():
            raise LeaseLost(self.run.run_id)

    def apply(self, *, release: bool = False) -> None:
        """Write what the tick decided so far, in one transaction, fenced by (and renewing) its lease."""
        changes = {(self.run.run_id, seed): c for seed, c in self.changes.items()}
        self.registry.apply(self.fence, changes, self.marks, ttl_s=LEASE_TTL_S, release=release)
        self.changes, self.marks = {}, []
