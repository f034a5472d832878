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

import functools
import json
import time
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from autoslm.controller import state as states
from autoslm.controller.registry import Fence, Registry, RunRecord
from autoslm.controller.state import EndReason, MemberState, SweepState, holds_pod, member_state

if TYPE_CHECKING:  # the supervisor (and what it loads) only where a step acts: `list` reads sweeps without it
    from autoslm.controller.supervisor import Supervisor
    from autoslm.spec import JobSpec

HEADROOM = 1.25  # a running member may spend this times its estimate (where the budget has it)


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
    stopped: str | None = None  # why the sweep stopped starting members (cancelled, the budget spent), in words
    end_reason: str | None = None  # the same as an EndReason

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
    skipped: str | None = None  # why it was never started, in words
    end_reason: str | None = None  # the same as an EndReason

    @property
    def values(self) -> dict:
        return json.loads(self.values_json)

    @functools.cached_property
    def spec(self) -> JobSpec:
        """The member's JobSpec (its point's values and seed applied), parsed once, when first asked."""
        from autoslm.spec import JobSpec

        return JobSpec.from_json(self.spec_json)

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


# -- looking ---------------------------------------------------------------------------------------
@dataclass
class MemberView:
    """A member as the scheduler and the views see it: its row, and its run's replicas if started."""

    m: Member
    state: MemberState
    cost_usd: float
    step: int = 0
    total_steps: int = 0
    pods_left: bool = False
    has_run: bool = False  # its run row is written (a start cut short before it has none)
    error: str | None = None  # its run's error, once it failed
    end_reason: EndReason | None = None

    @property
    def started(self) -> bool:
        return self.m.started_at is not None

    @property
    def live(self) -> bool:
        return self.started and (self.state.live or self.pods_left)

    def reserve(self) -> float:
        """What the member counts against the cap (the budget rule above)."""
        if not self.started:
            return 0.0
        floor = (self.m.allot_usd if self.live else self.m.estimate_usd) or 0.0
        return max(self.cost_usd, floor)


def look(registry: Registry, m: Member, now: float | None = None) -> MemberView:
    reps = registry.replicas(m.run_id) if m.started_at is not None else []
    state = member_state(m.started_at is not None, bool(m.skipped), reps)
    if not reps:
        reason = (
            EndReason(m.end_reason)
            if m.end_reason
            else (EndReason.CANCELLED if m.skipped == EndReason.CANCELLED else EndReason.SWEEP_BUDGET if m.skipped else None)
        )
        return MemberView(m, state, 0.0, end_reason=reason)
    now = registry.clock() if now is None else now
    return MemberView(
        m,
        state,
        sum(r.cost_usd for r in reps),
        min(r.step for r in reps),
        max(r.total_steps for r in reps),
        any(holds_pod(r, now) for r in reps),
        has_run=True,
        error=next((r.error for r in reps if r.error), None),
        end_reason=states.run_end_reason(reps),
    )


def views(registry: Registry, sweep_id: str) -> list[MemberView]:
    return [look(registry, m) for m in SweepBook(registry).members(sweep_id)]


def sweep_state(rec: SweepRecord, members: list[MemberView]) -> SweepState:
    return states.sweep_state(
        live=any(v.live for v in members),
        queued=any(v.m.queued for v in members),
        stopped=bool(rec.stopped),
        cancel_requested=bool(rec.cancel_requested),
        ended=[v.state for v in members if v.started],
    )


def sweep_end_reason(rec: SweepRecord) -> EndReason | None:
    if rec.end_reason:
        return EndReason(rec.end_reason)
    if not rec.stopped:
        return None
    return (
        EndReason.CANCELLED
        if rec.cancel_requested
        else (EndReason.SWEEP_BUDGET if rec.stopped.startswith("budget") else EndReason.ALL_ENDED)
    )


# -- deciding: one pure function, as reconcile is for a run ------------------------------------------
@dataclass(frozen=True)
class Start:
    """Start the member's run with this allotment (``again``: its start was cut short before its run row)."""

    member: int
    allot_usd: float | None
    again: bool = False


@dataclass(frozen=True)
class Skip:
    """Never start the member."""

    member: int
    why: str
    reason: EndReason


@dataclass(frozen=True)
class Stop:
    """The sweep starts nothing more (recorded once)."""

    why: str
    reason: EndReason


@dataclass(frozen=True)
class Cancel:
    """End a started member's run (and tick it until its pods are gone)."""

    member: int
    reason: EndReason


SweepAction = Start | Skip | Stop | Cancel


def plan_sweep(rec: SweepRecord, members: list[MemberView], now: float) -> list[SweepAction]:
    """What the sweep does next, from its record and its members as just looked at. No I/O.

    Rules, in order: a member whose start was cut short is started again (same run id); a cancel or
    a spend that reached ``max_usd`` stops the sweep, skips what is queued and ends what runs; then
    queued members start, in order, while fewer than ``max_parallel`` run and the budget rule lets
    them (one that cannot fit while nothing runs never will: skipped); a sweep with nothing queued
    and nothing live stops, every member ended."""
    del now  # the rule has no clock of its own today: a member's deadline is its run's
    out: list[SweepAction] = [Start(v.m.member, v.m.allot_usd, again=True) for v in members if v.started and not v.has_run]
    spent = sum(v.cost_usd for v in members)
    over = rec.max_usd is not None and spent >= rec.max_usd
    if rec.cancel_requested or over:
        reason = EndReason.CANCELLED if rec.cancel_requested else EndReason.SWEEP_BUDGET
        why = (
            str(EndReason.CANCELLED)
            if rec.cancel_requested
            else f"budget spent: ${spent:.2f} of sweep.max_usd ${rec.max_usd:.2f}"
        )
        if not rec.stopped:
            out.append(Stop(why, reason))
        out += [Skip(v.m.member, why, reason) for v in members if v.m.queued]
        out += [Cancel(v.m.member, reason) for v in members if v.live]
        return out
    running = sum(v.live for v in members)
    reserved = sum(v.reserve() for v in members)
    queued_left = 0
    for v in members:
        if not v.m.queued:
            continue
        if running >= rec.max_parallel:
            queued_left += 1
            continue
        allot = None
        if rec.max_usd is not None:
            left = rec.max_usd - reserved
            need = v.m.estimate_usd or 0.0
            if need > left + 1e-9:
                if running == 0:  # nothing runs that could give budget back: it will never fit
                    why = f"budget: estimate ${need:.2f} is over the ${max(left, 0):.2f} left of sweep.max_usd ${rec.max_usd:.2f}"
                    out.append(Skip(v.m.member, why, EndReason.SWEEP_BUDGET))
                else:
                    queued_left += 1
                continue  # a cheaper member may still fit
            allot = min(left, need * HEADROOM) if need > 0 else left
            reserved += max(allot, need)
        out.append(Start(v.m.member, allot))
        running += 1
    if not queued_left and running == 0 and not rec.stopped:
        out.append(Stop("every member ended", EndReason.ALL_ENDED))
    return out


# -- one step: look, decide, apply ----------------------------------------------------------------
def step(sup: Supervisor, sweep_id: str, *, wait_s: float = 2.0) -> bool:
    """One look at the sweep under its lease: tick, stop, or start. False when another process holds it.
    A holder stopped here (SIGSTOP) past ``LEASE_STALE_S`` is taken over; resumed, it applies nothing
    more of what it decided (each action checks the lease first)."""
    from autoslm.controller.supervisor import LEASE_STALE_S, LEASE_TTL_S

    registry = sup.registry
    start = time.monotonic()
    while (fence := registry.take_lease(sweep_id, sup.owner, LEASE_TTL_S, stale_s=LEASE_STALE_S)) is None:
        if time.monotonic() - start >= wait_s:
            return False
        time.sleep(0.05)
    try:
        _step(sup, SweepBook(registry), sweep_id, fence)
    finally:
        registry.release_lease(sweep_id, sup.owner)
    return True


def _step(sup: Supervisor, book: SweepBook, sweep_id: str, fence: Fence) -> None:
    rec = book.get(sweep_id)
    members = _look(sup, book, sweep_id)
    actions = plan_sweep(rec, members, sup.clock())
    _apply(sup, book, rec, {v.m.member: v for v in members}, actions, fence)


def _look(sup: Supervisor, book: SweepBook, sweep_id: str) -> list[MemberView]:
    """Tick every started member's run (its own supervisor's work: preemption, limits, billing), then look."""
    registry = sup.registry
    for m in book.members(sweep_id):
        v = look(registry, m)
        if v.live and v.has_run:
            try:
                sup.tick(registry.get_run(m.run_id))
            except Exception as e:  # noqa: BLE001 - one run's trouble must not stop the others
                sup.log(f"{sweep_id}: {m.run_id}: {e}")
    return views(registry, sweep_id)


def _apply(
    sup: Supervisor, book: SweepBook, rec: SweepRecord, members: dict[int, MemberView], actions: list[SweepAction], fence: Fence
) -> None:
    registry = sup.registry
    for a in actions:
        if not registry.holds(fence):  # taken over while this process was stopped: the new holder decides
            sup.log(f"{rec.sweep_id}: another process took the sweep over; not acting on what this one saw")
            return
        if isinstance(a, Stop):
            book.update(rec.sweep_id, stopped=a.why, end_reason=str(a.reason))
            sup.log(f"{rec.sweep_id}: stopping ({a.why})")
        elif isinstance(a, Skip):
            book.update_member(rec.sweep_id, a.member, skipped=a.why, end_reason=str(a.reason))
            if a.reason is not EndReason.CANCELLED:
                sup.log(f"{rec.sweep_id}: member {a.member} skipped ({a.why})")
        elif isinstance(a, Cancel):
            v = members[a.member]
            if v.state.live:
                registry.request_cancel(v.m.run_id, a.reason)
            sup.tick(registry.get_run(v.m.run_id), wait_s=30.0)
        elif isinstance(a, Start):
            m = members[a.member].m
            if not a.again:
                now = sup.clock()
                book.update_member(m.sweep_id, m.member, started_at=now, allot_usd=a.allot_usd)  # first: the intent
                m.started_at, m.allot_usd = now, a.allot_usd
            _create_run(sup, rec, m)


def _create_run(sup: Supervisor, rec: SweepRecord, m: Member) -> None:
    spec = m.spec
    if m.allot_usd is not None:
        own = spec.limits.max_usd
        limits = spec.limits.model_copy(update={"max_usd": min(own, m.allot_usd) if own else m.allot_usd})
        spec = spec.model_copy(update={"limits": limits})
    now = sup.clock()
    run = RunRecord(
        run_id=m.run_id,
        name=spec.name,
        phase=spec.phase,
        spec_json=spec.to_json(),
        spec_path=rec.spec_path,
        store_uri=m.store_uri,
        created_at=now,
        deadline=now + spec.limits.max_hours * 3600,
    )
    sup.registry.create_run(run, [m.seed])
    sup.log(
        f"{rec.sweep_id}: started member {m.member} (point {m.point}, seed {m.seed}) as run {m.run_id}"
        + (f", allotted ${m.allot_usd:.2f}" if m.allot_usd is not None else "")
    )
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


def once(sup: Supervisor, sweep_id: str, poll_s: float) -> str | None:
    """One look of the background supervisor (controller/daemon.py) at a sweep: None while it has work,
    else what it ended as (the supervisor then exits)."""
    step(sup, sweep_id, wait_s=poll_s)
    if not done(sup.registry, sweep_id):
        return None
    rec = SweepBook(sup.registry).get(sweep_id)
    return f"{sweep_state(rec, views(sup.registry, sweep_id))} ({rec.stopped})"
