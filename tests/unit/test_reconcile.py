"""The controller's decision function, as a table: state x pod x heartbeat age x DONE/error x limits."""

from __future__ import annotations

import pytest

from autoslm.controller.reconcile import (
    LIMIT_SAVE_GRACE_S,
    HandBack,
    Launch,
    Limits,
    Seen,
    SetState,
    Terminate,
    ends,
    reconcile,
)
from autoslm.controller.registry import ReplicaRecord
from autoslm.controller.state import EndReason
from autoslm.providers.base import Billed, PodStatus
from autoslm.store.artifacts import ErrorRecord

NOW = 10_000.0
RUNNING = PodStatus("running")
PENDING = PodStatus("pending")
EXITED = PodStatus("exited", "exit code 1", exit_code=1)
EXITED_FATAL = PodStatus("exited", "exit code 2", exit_code=2)
GONE = PodStatus("terminated", "preempted")
UNKNOWN = PodStatus("unknown")
RETRY = ErrorRecord("OSError: disk full", retryable=True)
FATAL = ErrorRecord("dataset file not found", retryable=False)


def replica(state="running", pod="p1", restarts=0, attempt=1, started=NOW - 100):
    return ReplicaRecord("r", 0, state, provider="local", pod_id=pod, attempt=attempt, restarts=restarts, pod_started_at=started)


def replica_with(**kw):
    r = replica()
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def limits(**kw):
    base = dict(deadline=NOW + 3600, max_usd=None, max_restarts=2, heartbeat_timeout_s=600)
    return Limits(**{**base, **kw})


def kinds(actions):
    return [
        type(a).__name__
        + (f":{a.state}" if isinstance(a, SetState) else f":{'resume' if a.resume else 'fresh'}" if isinstance(a, Launch) else "")
        for a in actions
    ]


HB_FRESH = dict(heartbeat_time=NOW - 5, heartbeat_stage="training", heartbeat_attempt=1)
HB_STALE = dict(heartbeat_time=NOW - 5000, heartbeat_stage="training", heartbeat_attempt=1)

TABLE = [
    # (name, replica, seen, limits, expected)
    ("new run launches", replica("pending", pod=None), Seen(), limits(), ["Launch:fresh"]),
    ("provisioning, pod pending", replica("provisioning"), Seen(pod=PENDING), limits(), []),
    ("first heartbeat -> running", replica("provisioning"), Seen(pod=RUNNING, **HB_FRESH), limits(), ["SetState:running"]),
    ("running and healthy", replica("running"), Seen(pod=RUNNING, **HB_FRESH), limits(), []),
    (
        "heartbeat of an older attempt is not progress",
        replica("recovering", attempt=2),
        Seen(pod=RUNNING, **HB_FRESH),
        limits(),
        [],
    ),
    ("done -> terminate, succeeded", replica(), Seen(pod=RUNNING, done=True), limits(), ["Terminate", "SetState:succeeded"]),
    ("done, pod already gone", replica(), Seen(pod=GONE, done=True), limits(), ["SetState:succeeded"]),
    ("fatal error -> terminate, failed", replica(), Seen(pod=RUNNING, error=FATAL), limits(), ["Terminate", "SetState:failed"]),
    (
        "exited with retryable error -> relaunch",
        replica(),
        Seen(pod=EXITED, error=RETRY),
        limits(),
        ["Terminate", "SetState:recovering", "Launch:resume"],
    ),
    (
        "preempted -> relaunch with resume",
        replica(),
        Seen(pod=GONE),
        limits(),
        ["Terminate", "SetState:recovering", "Launch:resume"],
    ),
    ("preempted, restarts used up -> failed", replica(restarts=2), Seen(pod=GONE), limits(), ["Terminate", "SetState:failed"]),
    ("store cannot tell DONE -> wait, never relaunch", replica(), Seen(pod=GONE, done=None), limits(), []),
    ("provider cannot tell -> wait", replica(), Seen(pod=UNKNOWN, **HB_FRESH), limits(), []),
    (
        "silent pod -> replaced",
        replica(started=NOW - 5000),
        Seen(pod=RUNNING, **HB_STALE),
        limits(),
        ["Terminate", "SetState:recovering", "Launch:resume"],
    ),
    (
        "stuck provisioning -> replaced",
        replica("provisioning", started=NOW - 5000),
        Seen(pod=PENDING),
        limits(),
        ["Terminate", "SetState:recovering", "Launch:resume"],
    ),
    ("exit code 2 without error file -> failed", replica(), Seen(pod=EXITED_FATAL), limits(), ["Terminate", "SetState:failed"]),
    (
        "done, pod exited but still exists -> terminate it",
        replica(),
        Seen(pod=EXITED, done=True),
        limits(),
        ["Terminate", "SetState:succeeded"],
    ),
    (
        "terminal with an exited pod that still exists -> terminate",
        replica("succeeded"),
        Seen(pod=EXITED),
        limits(),
        ["Terminate"],
    ),
    (
        "past deadline -> terminate, hand back",
        replica(),
        Seen(pod=RUNNING, **HB_FRESH),
        limits(deadline=NOW - 1),
        ["Terminate", "HandBack"],
    ),
    (
        "over money limit -> terminate, hand back",
        replica(),
        Seen(pod=RUNNING, **HB_FRESH),
        limits(max_usd=1.0, run_cost_usd=1.5),
        ["Terminate", "HandBack"],
    ),
    (
        "cancel -> terminate, cancelled",
        replica(),
        Seen(pod=RUNNING),
        limits(cancel_requested=True),
        ["Terminate", "SetState:cancelled"],
    ),
    ("cancel before launch", replica("pending", pod=None), Seen(), limits(cancel_requested=True), ["SetState:cancelled"]),
    ("terminal with a live pod -> terminate", replica("succeeded"), Seen(pod=RUNNING), limits(), ["Terminate"]),
    ("terminal, pod gone -> nothing", replica("failed"), Seen(pod=GONE), limits(), []),
    ("recovering with no capacity last time -> try again", replica("recovering", pod=None), Seen(), limits(), ["Launch:resume"]),
    ("done wins over a stale error", replica(), Seen(pod=GONE, done=True, error=RETRY), limits(), ["SetState:succeeded"]),
    # liveness: startup has its own timeout; error heartbeats are not life; a crash loop is a failure
    (
        "slow start within the startup timeout",
        replica("provisioning", started=NOW - 1200),
        Seen(pod=RUNNING),
        limits(startup_timeout_s=1800),
        [],
    ),
    (
        "slow start past the startup timeout",
        replica("provisioning", started=NOW - 2000),
        Seen(pod=RUNNING),
        limits(startup_timeout_s=1800),
        ["Terminate", "SetState:recovering", "Launch:resume"],
    ),
    (
        "setup heartbeats do not reset the startup timeout",
        replica("provisioning", started=NOW - 2000),
        Seen(pod=RUNNING, heartbeat_time=NOW - 5, heartbeat_stage="setup", heartbeat_attempt=1),
        limits(startup_timeout_s=1800),
        ["Terminate", "SetState:recovering", "Launch:resume"],
    ),
    (
        "a heartbeat late by less than the store's commit lag is not silence",
        replica(started=NOW - 5000),
        Seen(pod=RUNNING, heartbeat_time=NOW - 640, heartbeat_stage="training", heartbeat_attempt=1),
        limits(store_lag_s=60),
        [],
    ),
    (
        "a heartbeat later than timeout + commit lag is silence",
        replica(started=NOW - 5000),
        Seen(pod=RUNNING, heartbeat_time=NOW - 670, heartbeat_stage="training", heartbeat_attempt=1),
        limits(store_lag_s=60),
        ["Terminate", "SetState:recovering", "Launch:resume"],
    ),
    (
        "past max_usd with the pod gone and the store unsure -> hand back, never relaunched",
        replica(pod=None, state="recovering"),
        Seen(done=None),
        limits(max_usd=1.0, run_cost_usd=1.2),
        ["HandBack"],
    ),
    (
        "error heartbeats are not signs of life",
        replica("provisioning", started=NOW - 5000),
        Seen(pod=RUNNING, heartbeat_time=NOW - 5, heartbeat_stage="error", heartbeat_attempt=1),
        limits(startup_timeout_s=1800),
        ["Terminate", "SetState:recovering", "Launch:resume"],
    ),
    (
        "crash loop in a live pod -> replaced",
        replica_with(error_beats=3),
        Seen(pod=RUNNING, error=RETRY),
        limits(),
        ["Terminate", "SetState:recovering", "Launch:resume"],
    ),
    (
        "crash loop, restarts used up -> failed",
        replica_with(error_beats=3, restarts=2),
        Seen(pod=RUNNING, error=RETRY),
        limits(),
        ["Terminate", "SetState:failed"],
    ),
    # success means an adapter
    (
        "DONE without an adapter -> failed",
        replica(),
        Seen(pod=RUNNING, done=True, adapter=False),
        limits(),
        ["Terminate", "SetState:failed"],
    ),
    ("DONE, adapter unknown -> wait", replica(), Seen(pod=RUNNING, done=True, adapter=None), limits(), []),
]


@pytest.mark.parametrize("name, r, seen, lim, expected", TABLE, ids=[t[0] for t in TABLE])
def test_reconcile_table(name, r, seen, lim, expected):
    assert kinds(reconcile(r, seen, lim, NOW)) == expected


def test_failure_message_names_the_cause():
    actions = reconcile(replica(restarts=2), Seen(pod=EXITED, error=RETRY), limits(), NOW)
    final = actions[-1]
    assert isinstance(final, SetState) and "gave up after 2 restarts" in final.error and "disk full" in final.error
    actions = reconcile(replica(), Seen(pod=RUNNING, error=FATAL), limits(), NOW)
    assert actions[-1].error == "dataset file not found"


def test_terminate_always_precedes_relaunch():
    actions = reconcile(replica(), Seen(pod=GONE), limits(), NOW)
    assert isinstance(actions[0], Terminate) and isinstance(actions[-1], Launch)


# Every decision that ends a run says why (controller/state.EndReason): stored, then shown by status and the report.
REASONS = [
    ("done", replica(), Seen(pod=RUNNING, done=True), limits(), "succeeded"),
    ("done without adapter", replica(), Seen(pod=RUNNING, done=True, adapter=False), limits(), "failed"),
    ("fatal error", replica(), Seen(pod=RUNNING, error=FATAL), limits(), "failed"),
    ("deadline", replica(), Seen(pod=RUNNING, **HB_FRESH), limits(deadline=NOW - 1), "deadline"),
    ("money limit", replica(), Seen(pod=RUNNING, **HB_FRESH), limits(max_usd=1.0, run_cost_usd=1.5), "money_limit"),
    ("cancel", replica(), Seen(pod=RUNNING), limits(cancel_requested=True), "cancelled"),
    (
        "the sweep's budget",
        replica(),
        Seen(pod=RUNNING),
        limits(cancel_requested=True, cancel_reason=EndReason.SWEEP_BUDGET),
        "sweep_budget",
    ),
    ("restarts used up", replica(restarts=2), Seen(pod=GONE), limits(), "restarts_exhausted"),
]


@pytest.mark.parametrize("name,r,seen,lim,reason", REASONS, ids=[c[0] for c in REASONS])
def test_an_ending_carries_its_reason(name, r, seen, lim, reason):
    final = [a for a in reconcile(r, seen, lim, NOW) if ends(a)]
    assert len(final) == 1 and final[0].reason == reason, (name, final)


# A limit hands back what was learned: the worker's own stop (DONE, its heartbeat naming the limit), and
# the backstops (the deadline or the bill seen here, the in-pod watchdog's error record naming the limit).
HB_SAVING_AT_LIMIT = dict(heartbeat_time=NOW - 5, heartbeat_stage="saving", heartbeat_attempt=1, heartbeat_limit="max_hours")
WATCHDOG_LIMIT = ErrorRecord("time limit (limits.max_hours) reached", retryable=False, limit="max_hours")
LIMITS = [
    (
        "the worker stopped before the time limit",
        replica(),
        Seen(pod=RUNNING, done=True, heartbeat_limit="max_hours"),
        limits(),
        ["Terminate", "SetState:succeeded"],
        "deadline",
    ),
    (
        "the worker stopped before the money limit, pod gone",
        replica(),
        Seen(pod=GONE, done=True, heartbeat_limit="max_usd"),
        limits(),
        ["SetState:succeeded"],
        "money_limit",
    ),
    (
        "the watchdog ended it at the time limit",
        replica(),
        Seen(pod=EXITED_FATAL, error=WATCHDOG_LIMIT),
        limits(),
        ["Terminate", "HandBack"],
        "deadline",
    ),
    (
        "past the deadline while the worker saves at it: wait",
        replica(),
        Seen(pod=RUNNING, **HB_SAVING_AT_LIMIT),
        limits(deadline=NOW - 1),
        [],
        None,
    ),
    (
        "its grace is over",
        replica(),
        Seen(pod=RUNNING, **HB_SAVING_AT_LIMIT),
        limits(deadline=NOW - LIMIT_SAVE_GRACE_S - 1),
        ["Terminate", "HandBack"],
        "deadline",
    ),
    (
        "a limit seen by an older attempt is no grace",
        replica(attempt=2),
        Seen(pod=RUNNING, **HB_SAVING_AT_LIMIT),
        limits(deadline=NOW - 1),
        ["Terminate", "HandBack"],
        "deadline",
    ),
    ("past the deadline, pod gone", replica(), Seen(pod=GONE), limits(deadline=NOW - 1), ["HandBack"], "deadline"),
    (
        "over the money limit",
        replica(),
        Seen(pod=RUNNING, **HB_FRESH),
        limits(max_usd=1.0, run_cost_usd=1.5),
        ["Terminate", "HandBack"],
        "money_limit",
    ),
]


@pytest.mark.parametrize("name,r,seen,lim,expected,reason", LIMITS, ids=[c[0] for c in LIMITS])
def test_a_limit_hands_back_what_was_learned(name, r, seen, lim, expected, reason):
    actions = reconcile(r, seen, lim, NOW)
    assert kinds(actions) == expected, name
    final = [a for a in actions if ends(a)]
    assert [a.reason for a in final] == ([reason] if reason else []), name
    assert all(isinstance(a, SetState) or isinstance(a, HandBack) and "limit" in a.error for a in final), final


# -- the bill: one rule (vendors.billing.pod_cost_usd), decided without I/O ------------------------------------
class Beat:
    def __init__(self, **kw):
        self.__dict__.update(dict(step=5, total_steps=10, time=NOW - 5, stage="training", loss=1.0, message=None, attempt=1) | kw)


BILLED = dict(price_per_hour=3.6, cost_at=NOW - 100, cost_usd=1.0)  # $0.001 a second


@pytest.mark.parametrize(
    "r, seen, hb, want",
    [
        # alive: billed from the last bill to now
        (replica_with(**BILLED), Seen(pod=RUNNING), None, {"cost_usd": 1.1, "cost_at": NOW}),
        # exited but not removed, or the provider could not tell: a pod bills until it is gone
        (replica_with(**BILLED), Seen(pod=EXITED), None, {"cost_usd": 1.1, "cost_at": NOW}),
        (replica_with(**BILLED), Seen(pod=None), None, {"cost_usd": 1.1, "cost_at": NOW}),
        # the vendor says when it bills the pod (a Hugging Face job: while it runs): only that part of the span
        (replica_with(**BILLED), Seen(pod=PodStatus("pending", billed=Billed(None))), None, {"cost_usd": 1.0, "cost_at": NOW}),
        (
            replica_with(**BILLED),
            Seen(pod=PodStatus("running", billed=Billed(NOW - 50))),
            None,
            {"cost_usd": 1.05, "cost_at": NOW},
        ),
        (
            replica_with(**BILLED),
            Seen(pod=PodStatus("exited", billed=Billed(NOW - 7200, NOW - 50))),
            None,
            {"cost_usd": 1.05, "cost_at": NOW},
        ),
        (replica_with(**BILLED), Seen(pod=PodStatus("terminated", billed=Billed(None))), None, {"cost_usd": 1.0, "cost_at": NOW}),
        # a finished run's pod the provider cannot tell about: no guess
        (replica_with(state="succeeded", **BILLED), Seen(pod=None), None, {"cost_usd": 1.0, "cost_at": NOW}),
        # no price, no start, no pod: nothing to bill
        (replica_with(**{**BILLED, "price_per_hour": None}), Seen(pod=RUNNING), None, {}),
        (replica_with(**{**BILLED, "cost_at": None}), Seen(pod=RUNNING), None, {}),
        # progress from the heartbeat; an error beat of this attempt counts toward a crash loop
        (
            replica_with(step=3),
            Seen(pod=RUNNING),
            Beat(),
            {
                "step": 5,
                "total_steps": 10,
                "heartbeat_at": NOW - 5,
                "stage": "training",
                "loss": 1.0,
                "message": None,
                "error_beats": 0,
            },
        ),
        (
            replica_with(step=5),
            Seen(pod=RUNNING),
            Beat(stage="error"),
            {
                "step": 5,
                "total_steps": 10,
                "heartbeat_at": NOW - 5,
                "stage": "error",
                "loss": 1.0,
                "message": None,
                "error_beats": 1,
                "last_error_beat": NOW - 5,
            },
        ),
    ],
)
def test_the_bill_and_progress_of_one_look(r, seen, hb, want):
    from autoslm.controller.reconcile import account

    got = account(r, seen, hb, NOW)
    assert got.keys() == want.keys() and all(got[k] == pytest.approx(v) for k, v in want.items()), got


def test_a_pod_about_to_end_is_billed_to_now_by_the_same_rule():
    from autoslm.controller.reconcile import bill_to
    from autoslm.vendors.billing import pod_cost_usd

    assert bill_to(replica_with(**BILLED), NOW) == {"cost_usd": pytest.approx(1.1), "cost_at": NOW}
    assert bill_to(replica_with(pod_id=None, **BILLED), NOW) == {}
    assert pod_cost_usd(0.69, 100.0, 100.0 + 3600) == pytest.approx(0.69)
    assert pod_cost_usd(0.69, 200.0, 100.0) == 0.0 and pod_cost_usd(None, 0.0, 10.0) == 0.0
