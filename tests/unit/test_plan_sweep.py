"""The sweep's decision function, as a table (as test_reconcile is for a run): a sweep record and its
members as just looked at -> Start | Skip | Stop | Cancel. The budget rule of docs/sweeps.md: a member
starts only when what is left covers its estimate, allotted its estimate x HEADROOM (or what is left);
one that cannot fit while nothing runs is skipped; a cancel or a spend that reached the cap ends it all."""

from __future__ import annotations

import pytest

from autoslm.controller.state import EndReason, MemberState
from autoslm.controller.sweeps import Cancel, Member, MemberView, Skip, Start, Stop, SweepRecord, plan_sweep

NOW = 1_000.0


def rec(max_parallel=2, max_usd=None, cancel=False, stopped=None):
    return SweepRecord(
        sweep_id="sw",
        name="sw",
        spec_path=None,
        keys_json="[]",
        max_parallel=max_parallel,
        max_usd=max_usd,
        created_at=0.0,
        cancel_requested=int(cancel),
        stopped=stopped,
    )


def member(i, state="queued", cost=0.0, estimate=1.0, allot=None, has_run=True, pods=False, skipped=None):
    started = state not in ("queued", "skipped")
    m = Member(
        sweep_id="sw",
        member=i,
        point=i,
        seed=0,
        values_json="{}",
        spec_json="{}",
        store_uri="file:///x",
        run_id=f"r{i}",
        estimate_usd=estimate,
        allot_usd=allot,
        started_at=NOW - 10 if started else None,
        skipped=skipped,
    )
    return MemberView(
        m, MemberState(state), cost, pods_left=pods or (started and MemberState(state).live), has_run=has_run and started
    )


def queued(n, **kw):
    return [member(i, **kw) for i in range(n)]


BUDGET = EndReason.SWEEP_BUDGET
TABLE = [
    # (name, record, members, expected actions)
    ("max_parallel bounds the first starts", rec(max_parallel=2), queued(3), [Start(0, None), Start(1, None)]),
    (
        "the cap covers 2 of 4 members: two start, each allotted its estimate x 1.25",
        rec(max_parallel=4, max_usd=2.6),
        queued(4),
        [Start(0, 1.25), Start(1, 1.25)],
    ),
    (
        "the cap's two run: the others wait (what runs may give budget back)",
        rec(max_parallel=4, max_usd=2.6),
        [member(0, "running", 0.5, allot=1.25), member(1, "running", 0.5, allot=1.25), member(2), member(3)],
        [],
    ),
    (
        "the cap's two ended: nothing fits while nothing runs, so the rest is skipped and the sweep stops",
        rec(max_parallel=4, max_usd=2.6),
        [member(0, "succeeded", 0.9, allot=1.25), member(1, "succeeded", 0.9, allot=1.25), member(2), member(3)],
        [
            Skip(2, "budget: estimate $1.00 is over the $0.60 left of sweep.max_usd $2.60", BUDGET),
            Skip(3, "budget: estimate $1.00 is over the $0.60 left of sweep.max_usd $2.60", BUDGET),
            Stop("every member ended", EndReason.ALL_ENDED),
        ],
    ),
    (
        "a member skipped when nothing runs: its estimate is over the cap, a cheaper one still starts",
        rec(max_usd=3.0),
        [member(0, estimate=5.0), member(1, estimate=1.0)],
        [Skip(0, "budget: estimate $5.00 is over the $3.00 left of sweep.max_usd $3.00", BUDGET), Start(1, 1.25)],
    ),
    (
        "cancel mid-sweep: stop, skip the queue, end what runs",
        rec(cancel=True),
        [member(0, "running", 0.3), member(1, "provisioning"), member(2)],
        [
            Stop("cancelled", EndReason.CANCELLED),
            Skip(2, "cancelled", EndReason.CANCELLED),
            Cancel(0, EndReason.CANCELLED),
            Cancel(1, EndReason.CANCELLED),
        ],
    ),
    (
        "cancel after the stop was recorded: only what still runs (or still has a pod) is ended",
        rec(cancel=True, stopped="cancelled"),
        [member(0, "cancelled", 0.3, pods=True), member(1, "cancelled", 0.2), member(2, "skipped", skipped="cancelled")],
        [Cancel(0, EndReason.CANCELLED)],
    ),
    (
        "the spend reaches the cap: stop, skip, end what runs with the sweep's budget as the reason",
        rec(max_parallel=2, max_usd=2.0),
        [member(0, "running", 1.2, allot=1.25), member(1, "running", 0.8, allot=1.25), member(2)],
        [
            Stop("budget spent: $2.00 of sweep.max_usd $2.00", BUDGET),
            Skip(2, "budget spent: $2.00 of sweep.max_usd $2.00", BUDGET),
            Cancel(0, BUDGET),
            Cancel(1, BUDGET),
        ],
    ),
    (
        "a supervisor restart with members in flight: the start cut short before its run row is finished, "
        "same run id, and nothing more starts past max_parallel",
        rec(max_parallel=2, max_usd=10.0),
        [member(0, "running", 0.4, allot=1.25), member(1, "pending", allot=1.25, has_run=False), member(2)],
        [Start(1, 1.25, again=True)],
    ),
    (
        "a restart after a member ended: its slot goes to the next, allotted from what is left",
        rec(max_parallel=2, max_usd=3.25),
        [member(0, "failed", 0.5, allot=1.25), member(1, "running", 0.4, allot=1.25), member(2)],
        [Start(2, 1.0)],
    ),  # the ended one counts its estimate ($1), the running one its allotment ($1.25): $1 is left
    (
        "... and with less left than its estimate it waits for the running one",
        rec(max_parallel=2, max_usd=3.0),
        [member(0, "failed", 0.5, allot=1.25), member(1, "running", 0.4, allot=1.25), member(2)],
        [],
    ),
    (
        "a member whose run ended but whose pod is not gone yet still holds its slot",
        rec(max_parallel=1),
        [member(0, "succeeded", 0.1, pods=True), member(1)],
        [],
    ),
    (
        "every member ended: the sweep stops once",
        rec(),
        [member(0, "succeeded", 0.1), member(1, "failed", 0.1)],
        [Stop("every member ended", EndReason.ALL_ENDED)],
    ),
    ("an ended sweep decides nothing", rec(stopped="every member ended"), [member(0, "succeeded", 0.1)], []),
]


@pytest.mark.parametrize("name,record,members,expected", TABLE, ids=[t[0] for t in TABLE])
def test_plan_sweep(name, record, members, expected):
    assert plan_sweep(record, members, NOW) == expected, name


def test_the_counted_total_never_passes_the_cap():
    """Whatever order members run in, what the started ones may spend (their allotments) stays within max_usd."""
    record = rec(max_parallel=8, max_usd=4.0)
    members = [member(i, estimate=e) for i, e in enumerate([1.5, 0.5, 2.0, 0.7, 0.3])]
    starts = [a for a in plan_sweep(record, members, NOW) if isinstance(a, Start)]
    assert starts and sum(a.allot_usd for a in starts) <= 4.0 + 1e-9
