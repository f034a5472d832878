"""Sweeps in the registry, and the loop that runs one under its budget: a small scheduler over runs.

A sweep's members are its (point, seed) pairs; each becomes an ordinary run when it starts, and from
then on is supervised like any run (preemption, relaunch, resume and limits stay per run). ``step``
runs under the sweep's own lease (the leases table, keyed by the sweep id): it ticks the started
runs, then starts queued members while fewer than ``max_parallel`` run and the budget allows.

The budget rule (docs/sweeps.md). A member counts against ``max_usd`` for at least its estimate; while
it runs, for its allotment: its estimate plus ``HEADROOM``, or what is left if less. A member starts
only when what is left covers its estimate, and its run's own ``limits.max_usd`` is set to its
allotment, so its supervisor and its pod's watchdog end it there: the counted total never passes
``max_usd``, and so neither does the spend. When the spend reaches ``max_usd`` anyway, running pods
are ended and nothing new starts. A member that can no longer fit (nothing runs, too little is left)
is skipped.

The member's run id is written before its run row, and the row before any pod: a supervisor killed
at any point leaves a member that the next ``step`` finishes starting, never one started twice.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, fields

from autoslm.controller.registry import TERMINAL, Registry, RunRecord, run_state
from autoslm.controller.supervisor import LEASE_TTL_S, Supervisor

HEADROOM = 1.25  # a running member may spend this times its estimate (where the budget has it)
QUEUED, SKIPPED = "queued", "skipped"


@dataclass
class SweepRecord:
    sweep_id: str
    name: str
    spec_path: str | None
    keys_json: str
    max_parallel: int
    max_usd: float | None
    created_at: float
    cancel_requested: int = 0
    stopped: str | None = None  # why the sweep stopped starting members (cancelled, the budget spent)

    @property
    def keys(self) -> list[str]:
        return json.loads(self.keys_json)


@dataclass
class Member:
    sweep_id: str
    member: int
    point: int
    seed: int
    values_json: str
    spec_json: str
    store_uri: str
    run_id: str
    estimate_usd: float | None = None
    allot_usd: float | None = None
    started_at: float | None = None
    skipped: str | None = None

    @property
    def values(self) -> dict:
        return json.loads(self.values_json)

    @property
    def queued(self) -> bool:
        return self.started_at is None and self.skipped is None


class SweepBook:
    """A home's sweeps and their members, as records (the registry keeps their rows)."""

    def __init__(self, registry: Registry):
        self.registry = registry

    def create(self, rec: SweepRecord, members: list[Member]) -> None:
        self.registry.insert_sweep(rec.__dict__, [m.__dict__ for m in members])

    def get(self, sweep_id: str) -> SweepRecord | None:
        row = self.registry.sweep_row(sweep_id)
        return _rec(SweepRecord, row) if row else None

    def find(self, prefix: str) -> list[SweepRecord]:
        return [_rec(SweepRecord, r) for r in self.registry.find_sweep_rows(prefix)]

    def open_ids(self) -> list[str]:
        """Sweeps that have not stopped starting members (their supervisor may still have work)."""
        return self.registry.open_sweep_ids()

    def members(self, sweep_id: str) -> list[Member]:
        return [_rec(Member, r) for r in self.registry.member_rows(sweep_id)]

    def sweep_of_run(self, run_id: str) -> str | None:
        return self.registry.sweep_of_run(run_id)

    def update_member(self, sweep_id: str, member: int, **changes) -> None:
        self.registry.update_member(sweep_id, member, **changes)

    def update(self, sweep_id: str, **changes) -> None:
        self.registry.update_sweep(sweep_id, **changes)


def _rec(cls, row: dict):
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in row.items() if k in names})


# -- the scheduler ----------------------------------------------------------------------------------
@dataclass
class MemberView:
    """A member as the scheduler and the views see it: its row, and its run's replicas if started."""

    m: Member
    state: str
    cost_usd: float
    step: int = 0
    total_steps: int = 0
    pods_left: bool = False

    @property
    def live(self) -> bool:
        return self.m.started_at is not None and (self.state not in TERMINAL or self.pods_left)

    def reserve(self) -> float:
        """What the member counts against the cap (the budget rule above)."""
        if self.m.started_at is None:
            return 0.0
        floor = (self.m.allot_usd if self.live else self.m.estimate_usd) or 0.0
        return max(self.cost_usd, floor)


def look(registry: Registry, m: Member) -> MemberView:
    if m.started_at is None:
        return MemberView(m, SKIPPED if m.skipped else QUEUED, 0.0)
    reps = registry.replicas(m.run_id)
    if not reps:
        return MemberView(m, "pending", 0.0)  # started, its run row not written yet: the next step writes it
    return MemberView(m, run_state(reps), sum(r.cost_usd for r in reps), min(r.step for r in reps),
                      max(r.total_steps for r in reps), any(r.pod_id or r.intent_name for r in reps))


def views(registry: Registry, sweep_id: str) -> list[MemberView]:
    return [look(registry, m) for m in SweepBook(registry).members(sweep_id)]


def sweep_state(rec: SweepRecord, members: list[MemberView]) -> str:
    if any(v.live for v in members):
        return "running"
    if any(v.m.queued for v in members) and not rec.stopped:
        return "pending"
    if rec.cancel_requested:
        return "cancelled"
    states = {v.state for v in members if v.m.started_at is not None}
    if not states:
        return "skipped"  # the budget covered no member
    return "succeeded" if states == {"succeeded"} else "failed"


def step(sup: Supervisor, sweep_id: str, *, wait_s: float = 2.0) -> bool:
    """One look at the sweep under its lease: tick, stop, or start. False when another process holds it."""
    registry = sup.registry
    start = time.monotonic()
    while not registry.acquire_lease(sweep_id, sup.owner, LEASE_TTL_S):
        if time.monotonic() - start >= wait_s:
            return False
        time.sleep(0.05)
    try:
        _step(sup, SweepBook(registry), sweep_id)
    finally:
        registry.release_lease(sweep_id, sup.owner)
    return True


def _step(sup: Supervisor, book: SweepBook, sweep_id: str) -> None:
    registry = sup.registry
    rec = book.get(sweep_id)
    for m in book.members(sweep_id):
        if m.started_at is not None and registry.get_run(m.run_id) is None:
            _create_run(sup, rec, m)  # a start cut short before its run row: finish it, same run id
        v = look(registry, m)
        if v.live:
            run = registry.get_run(m.run_id)
            try:
                sup.tick(run)
            except Exception as e:  # noqa: BLE001 - one run's trouble must not stop the others
                sup.log(f"{sweep_id}: {m.run_id}: {e}")
    members = views(registry, sweep_id)
    spent = sum(v.cost_usd for v in members)
    over = rec.max_usd is not None and spent >= rec.max_usd
    if rec.cancel_requested or over:
        why = "cancelled" if rec.cancel_requested else f"budget spent: ${spent:.2f} of sweep.max_usd ${rec.max_usd:.2f}"
        if not rec.stopped:
            book.update(sweep_id, stopped=why)
            sup.log(f"{sweep_id}: stopping ({why})")
        for v in members:
            if v.m.queued:
                book.update_member(sweep_id, v.m.member, skipped=why)
            elif v.live:
                if v.state not in TERMINAL:
                    registry.request_cancel(v.m.run_id)
                sup.tick(registry.get_run(v.m.run_id), wait_s=30.0)
        return
    running = sum(v.live for v in members)
    for v in members:
        if not v.m.queued:
            continue
        if running >= rec.max_parallel:
            break
        allot = None
        if rec.max_usd is not None:
            left = rec.max_usd - sum(x.reserve() for x in members)
            need = v.m.estimate_usd or 0.0
            if need > left + 1e-9:
                if running == 0:  # nothing runs that could give budget back: it will never fit
                    why = f"budget: estimate ${need:.2f} is over the ${max(left, 0):.2f} left of sweep.max_usd ${rec.max_usd:.2f}"
                    book.update_member(sweep_id, v.m.member, skipped=why)
                    sup.log(f"{sweep_id}: member {v.m.member} skipped ({why})")
                continue  # a cheaper member may still fit
            allot = min(left, need * HEADROOM) if need > 0 else left
        _start(sup, book, rec, v.m, allot)
        running += 1
    if not any(v.m.queued for v in views(registry, sweep_id)) and not rec.stopped and not any(x.live for x in views(registry, sweep_id)):
        book.update(sweep_id, stopped="every member ended")


def _start(sup: Supervisor, book: SweepBook, rec: SweepRecord, m: Member, allot: float | None) -> None:
    now = sup.clock()
    book.update_member(m.sweep_id, m.member, started_at=now, allot_usd=allot)  # first: the intent
    m.started_at, m.allot_usd = now, allot
    _create_run(sup, rec, m)


def _create_run(sup: Supervisor, rec: SweepRecord, m: Member) -> None:
    from autoslm.spec import JobSpec

    spec = JobSpec.from_json(m.spec_json)
    if m.allot_usd is not None:
        own = spec.limits.max_usd
        limits = spec.limits.model_copy(update={"max_usd": min(own, m.allot_usd) if own else m.allot_usd})
        spec = spec.model_copy(update={"limits": limits})
    now = sup.clock()
    run = RunRecord(run_id=m.run_id, name=spec.name, phase=spec.phase, spec_json=spec.to_json(), spec_path=rec.spec_path,
                    store_uri=m.store_uri, created_at=now, deadline=now + spec.limits.max_hours * 3600)
    sup.registry.create_run(run, [m.seed])
    sup.log(f"{rec.sweep_id}: started member {m.member} (point {m.point}, seed {m.seed}) as run {m.run_id}"
            + (f", allotted ${m.allot_usd:.2f}" if m.allot_usd is not None else ""))
    try:
        sup.tick(run, wait_s=30.0)  # launches its pod
    except Exception as e:  # noqa: BLE001 - a member that cannot start fails alone; the sweep goes on
        sup.log(f"{rec.sweep_id}: run {m.run_id} could not start: {e}")
        try:
            sup.abort_launch(run, str(e))
        except Exception as abort_error:  # noqa: BLE001 - its next tick ends what is left
            sup.log(f"{rec.sweep_id}: run {m.run_id}: teardown failed too: {abort_error}")


def done(registry: Registry, sweep_id: str) -> bool:
    """Nothing queued that can start, nothing live, no pod left."""
    rec = SweepBook(registry).get(sweep_id)
    members = views(registry, sweep_id)
    return not any(v.live for v in members) and (rec.stopped is not None or not any(v.m.queued for v in members))


def supervise(sup: Supervisor, sweep_id: str, poll_s: float, log) -> int:
    """The background supervisor's loop for a sweep (controller/daemon.py): step until it is done."""
    unexpected = 0
    while True:
        if sup.registry.read_only:
            log(f"{sweep_id}: the registry is from a newer autoslm (read-only here); supervisor exits")
            return 1
        try:
            step(sup, sweep_id, wait_s=poll_s)
            unexpected = 0
            if done(sup.registry, sweep_id):
                rec = SweepBook(sup.registry).get(sweep_id)
                log(f"{sweep_id}: {sweep_state(rec, views(sup.registry, sweep_id))} ({rec.stopped}); supervisor exits")
                return 0
        except Exception as e:  # noqa: BLE001 - an outage must not leave the sweep unwatched
            unexpected += 1
            log(f"{sweep_id}: {type(e).__name__}: {e}")
            if unexpected >= 60:
                log(f"{sweep_id}: giving up after {unexpected} errors in a row; `autoslm gc` ends its pods")
                return 1
        time.sleep(poll_s)
