"""lm-eval after the hand-back, as the controller sees it: a run whose worker handed back its adapter,
metrics and DONE, and runs lm-evaluation-harness after them (its "done" heartbeat names it,
``layout.HARNESS_ACTIVITY``), succeeded; its pod is the harness's until the worker exits or a limit
passes (``reconcile``'s rules 1 and 3), and its supervisor keeps looking meanwhile (``after_hand_back``)."""

from __future__ import annotations

import pytest

from autoslm.controller.reconcile import LIMIT_SAVE_GRACE_S, Seen, SetState, after_hand_back, reconcile
from autoslm.controller.state import EndReason, RunState
from tests.unit.test_reconcile import EXITED, NOW, RUNNING, UNKNOWN, kinds, limits, replica, replica_with

# lm-eval after the hand-back: DONE and a "done" heartbeat naming the harness (layout.HARNESS_ACTIVITY).
# The run succeeded with its adapter; its pod is the harness's until the worker exits or a limit passes.
HB_HARNESS = dict(heartbeat_time=NOW - 5, heartbeat_stage="done", heartbeat_attempt=1, heartbeat_activity="lm_eval")
HARNESS = [
    (
        "DONE, lm-eval follows -> succeeded, pod kept",
        replica(),
        Seen(pod=RUNNING, done=True, **HB_HARNESS),
        limits(),
        ["SetState:succeeded"],
    ),
    ("succeeded, lm-eval runs -> nothing", replica("succeeded"), Seen(pod=RUNNING, done=True, **HB_HARNESS), limits(), []),
    (
        "provider unsure while lm-eval runs -> nothing",
        replica("succeeded"),
        Seen(pod=UNKNOWN, done=True, **HB_HARNESS),
        limits(),
        [],
    ),
    (
        "lm-eval ended, worker still there -> terminate",
        replica("succeeded"),
        Seen(pod=RUNNING, done=True, heartbeat_time=NOW - 1, heartbeat_stage="done", heartbeat_attempt=1),
        limits(),
        ["Terminate"],
    ),
    (
        "worker exited after lm-eval -> terminate (remove)",
        replica("succeeded"),
        Seen(pod=EXITED, done=True, **HB_HARNESS),
        limits(),
        ["Terminate"],
    ),
    (
        "lm-eval's heartbeat gone silent -> terminate",
        replica("succeeded"),
        Seen(pod=RUNNING, done=True, **{**HB_HARNESS, "heartbeat_time": NOW - 700}),
        limits(),
        ["Terminate"],
    ),
    (
        "lm-eval past the deadline and its grace -> terminate",
        replica("succeeded"),
        Seen(pod=RUNNING, done=True, **HB_HARNESS),
        limits(deadline=NOW - LIMIT_SAVE_GRACE_S - 1),
        ["Terminate"],
    ),
    (
        "lm-eval within the grace past the deadline -> nothing (the worker is writing what it cut)",
        replica("succeeded"),
        Seen(pod=RUNNING, done=True, **HB_HARNESS),
        limits(deadline=NOW - 10),
        [],
    ),
    (
        "lm-eval over the money limit -> terminate",
        replica("succeeded"),
        Seen(pod=RUNNING, done=True, **HB_HARNESS),
        limits(max_usd=1.0, run_cost_usd=1.0),
        ["Terminate"],
    ),
    (
        "DONE at the money limit while lm-eval would follow -> terminate, succeeded",
        replica(),
        Seen(pod=RUNNING, done=True, **HB_HARNESS),
        limits(max_usd=1.0, run_cost_usd=1.2),
        ["Terminate", "SetState:succeeded"],
    ),
    (
        "cancel while lm-eval runs -> terminate",
        replica("succeeded"),
        Seen(pod=RUNNING, done=True, **HB_HARNESS),
        limits(cancel_requested=True),
        ["Terminate"],
    ),
    (
        "an older attempt's lm-eval heartbeat keeps nothing",
        replica("succeeded", attempt=2),
        Seen(pod=RUNNING, done=True, **HB_HARNESS),
        limits(),
        ["Terminate"],
    ),
]


@pytest.mark.parametrize("name, r, seen, lim, expected", HARNESS, ids=[t[0] for t in HARNESS])
def test_a_pod_running_lm_eval_after_the_hand_back_is_kept_until_it_ends_or_a_limit(name, r, seen, lim, expected):
    assert kinds(reconcile(r, seen, lim, NOW)) == expected


def test_the_hand_back_before_lm_eval_keeps_the_limits_end_reason():
    seen = Seen(pod=RUNNING, done=True, heartbeat_limit="max_hours", **HB_HARNESS)
    [action] = reconcile(replica(), seen, limits(), NOW)
    assert action == SetState(RunState.SUCCEEDED, None, EndReason.DEADLINE)


def test_a_supervisor_keeps_looking_while_the_record_says_lm_eval_runs():
    def rec(**kw):
        return replica_with(**{"state": "succeeded", "stage": "done", "heartbeat_at": NOW - 30, **kw})

    assert after_hand_back(rec(), NOW, 600)
    assert not after_hand_back(rec(heartbeat_at=NOW - 700), NOW, 600)  # the worker went silent
    assert not after_hand_back(rec(pod_id=None), NOW, 600)  # its pod is gone
    assert not after_hand_back(rec(stage="error"), NOW, 600)
    assert not after_hand_back(replica_with(state="failed", stage="done", heartbeat_at=NOW - 30), NOW, 600)
