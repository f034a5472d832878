"""The controller's brain: one pure function from what we see to what we do. No I/O here.

``reconcile(replica, seen, limits, now)`` looks at one replica (one seed of a run), what its pod and
its artifacts say, the run's limits and the time, and returns the actions to take. The supervisor
applies them. Rules, in priority order:

1. A terminal replica whose pod still exists (running, or exited but not removed): terminate it
   (nobody pays for a forgotten GPU or a stopped instance's disk) -- unless lm-eval runs on it after
   the hand-back (``harness_runs``), until a limit passes (rule 5's) or a cancel is asked for.
2. Cancel requested: terminate, cancelled.
3. DONE in the store: terminate, succeeded -- only with the adapter in the store too (DONE without
   it is a failure). Only a read that *saw* DONE counts. A worker that stopped training before a
   limit says so in its last heartbeat: the run succeeded, its end reason names the limit. A worker
   whose "done" heartbeat names lm-eval (``layout.HARNESS_ACTIVITY``: the adapter, metrics and DONE are
   in the store, and the harness runs after them) keeps its pod: succeeded, no terminate; the pod ends
   when the worker exits (rule 1 then), or at a limit.
4. A non-retryable error from the worker: terminate, failed; one the in-pod watchdog wrote at a
   limit: as rule 5.
5. Past the deadline or over the money limit: terminate, and hand back what was learned
   (``HandBack``: the supervisor puts the newest checkpoint's adapter, or keep_best's choice, in the run's place, then the run
   succeeded with the limit as its end reason; failed only when there is nothing to hand back). A
   worker that stopped before the deadline by itself and is saving gets ``LIMIT_SAVE_GRACE_S`` more.
6. Never launched: launch.
7. Pod alive but silent longer than its timeout: treat as lost (rule 8). Until the attempt's first
   training heartbeat the startup timeout applies, counted from the pod's start: it bounds the time
   to the first training step (image pull, a model prefetch), and "setup" heartbeats do not reset it
   (a download stuck at 10% sends them forever). After it, the heartbeat timeout, plus the store's
   commit lag (a Hub store sees a heartbeat up to one commit interval late). Error heartbeats are not signs of life, and a worker
   that keeps failing inside a live pod (``CRASH_LOOP_ERRORS`` error beats without training
   progress: RunPod restarts the container each time) is lost too.
8. Pod gone without DONE: relaunch with resume while restarts remain, else failed.
   When the store could not tell whether DONE is there, wait: a network error never makes a finished
   run train again.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoslm.controller.nodes import recorded
from autoslm.controller.registry import ReplicaRecord
from autoslm.controller.state import EndReason, RunState
from autoslm.layout import HARNESS_ACTIVITY, LIMIT_HOURS, LIMIT_USD, WORKER_EXIT_FATAL
from autoslm.providers.base import POD_ALIVE, POD_TERMINATED, PodStatus
from autoslm.store.artifacts import ErrorRecord
from autoslm.vendors.billing import pod_cost_usd

ALIVE = POD_ALIVE  # the provider's words for a pod that is starting or running
TRAINING_STAGES = ("training", "saving", "uploading", "done")
# A worker that stopped training before the deadline and is saving its adapter (its heartbeat names the
# limit) is given this long past the deadline, as the in-pod watchdog gives it (DEADLINE_GRACE_S).
LIMIT_SAVE_GRACE_S = 120.0
_LIMIT_REASON = {LIMIT_HOURS: EndReason.DEADLINE, LIMIT_USD: EndReason.MONEY_LIMIT}
CRASH_LOOP_ERRORS = 3
# How a terminate says why in the supervisor's log.
_TERMINATE_WORDS = {
    EndReason.SUCCEEDED: "run succeeded",
    EndReason.FAILED: "run failed",
    EndReason.DEADLINE: "time limit",
    EndReason.MONEY_LIMIT: "money limit",
}


@dataclass(frozen=True)
class Seen:
    """One look at the world for one replica. ``None`` means "could not tell"."""

    pod: PodStatus | None = None
    done: bool | None = False
    error: ErrorRecord | None = None
    heartbeat_time: float | None = None
    heartbeat_stage: str | None = None
    heartbeat_attempt: int | None = None
    adapter: bool | None = True  # with DONE: is the adapter in the store (None: could not tell)
    heartbeat_limit: str | None = None  # the limit the worker stopped training before (layout.LIMIT_*), if it did
    heartbeat_activity: str | None = None  # what the worker does within its stage (layout.HARNESS_ACTIVITY: lm-eval)


@dataclass(frozen=True)
class Limits:
    deadline: float
    max_usd: float | None
    max_restarts: int
    heartbeat_timeout_s: float
    startup_timeout_s: float = 2700.0
    store_lag_s: float = 0.0  # how late a heartbeat may reach the store (the worker's commit interval)
    cancel_requested: bool = False
    cancel_reason: EndReason = EndReason.CANCELLED  # a user's cancel, or the run's sweep spent its budget
    run_cost_usd: float = 0.0  # across all replicas and attempts


@dataclass(frozen=True)
class Launch:
    resume: bool


@dataclass(frozen=True)
class Terminate:
    reason: str


@dataclass(frozen=True)
class SetState:
    state: RunState
    error: str | None = None
    reason: EndReason | None = None  # with a terminal state: why it ended


@dataclass(frozen=True)
class HandBack:
    """A limit ended the run: hand back what it learned (the adapter the worker saved if it reached the
    store, else keep_best's choice where the run hands that back, else the newest checkpoint's:
    ``controller/handback.py``), then succeeded with ``reason``;
    failed with ``error`` (and ``reason``) when there is nothing to hand back."""

    reason: EndReason
    error: str


Action = Launch | Terminate | SetState | HandBack


def ends(action: Action) -> bool:
    """Does this action end the replica (a terminal state, or a hand-back, which decides one)?"""
    return isinstance(action, HandBack) or (isinstance(action, SetState) and action.state.terminal)


def reconcile(r: ReplicaRecord, seen: Seen, limits: Limits, now: float) -> list[Action]:
    # An exited pod still exists (RunPod restarts its container; a stopped Vast instance bills its
    # disk): only a pod the provider calls terminated needs nothing more.
    pod_exists = r.pod_id is not None and (seen.pod is None or seen.pod.state != POD_TERMINATED)
    if r.terminal:
        if pod_exists and seen.pod is not None and not harness_runs(r, seen, limits, now):
            return [Terminate(f"run is {r.state}")]
        return []
    if limits.cancel_requested:
        return _end(pod_exists, RunState.CANCELLED, limits.cancel_reason)
    ended = _ended(r, seen, limits, now, pod_exists)
    if ended is not None:
        return ended
    if r.pod_id is None:  # a relaunch that found no capacity last time resumes when it tries again
        return [Launch(resume=r.state == RunState.RECOVERING)]
    if seen.pod is None or seen.pod.state == "unknown":
        return []  # the provider could not tell us: look again next time
    if seen.pod.state in ALIVE:
        return _while_alive(r, seen, limits, now)
    # The pod is gone (exited or terminated) and DONE is not known to be there.
    if seen.done is None:
        return []  # could not tell: never relaunch a run that may have finished
    if seen.pod.exit_code == WORKER_EXIT_FATAL and seen.error is None:
        return _end(
            pod_exists, RunState.FAILED, EndReason.FAILED, "the worker exited with a non-retryable error (see `autoslm logs`)"
        )
    return _relaunch_or_fail(r, seen, limits, seen.pod.message or f"pod {seen.pod.state}")


def _end(pod_exists: bool, state: RunState, why: EndReason, error: str | None = None) -> list[Action]:
    return ([Terminate(_TERMINATE_WORDS.get(why, why.words))] if pod_exists else []) + [SetState(state, error, why)]


def _hand_back(pod_exists: bool, why: EndReason, error: str) -> list[Action]:
    return ([Terminate(_TERMINATE_WORDS.get(why, why.words))] if pod_exists else []) + [HandBack(why, error)]


def _ended(r: ReplicaRecord, seen: Seen, limits: Limits, now: float, pod_exists: bool) -> list[Action] | None:
    """Rules 3 to 5: what DONE, a non-retryable error or a passed limit decide; None when none applies."""
    if seen.done:
        if seen.adapter is None:
            return []  # DONE seen, the adapter's presence unknown: look again
        if not seen.adapter:
            return _end(
                pod_exists, RunState.FAILED, EndReason.FAILED, "the worker marked the run DONE but no adapter is in the store"
            )
        why = _LIMIT_REASON.get(seen.heartbeat_limit, EndReason.SUCCEEDED)
        if harness_runs(r, seen, limits, now):  # handed back; its pod is lm-eval's until the worker exits
            return [SetState(RunState.SUCCEEDED, None, why)]
        return _end(pod_exists, RunState.SUCCEEDED, why)
    if seen.error is not None and not seen.error.retryable:
        if seen.error.limit in _LIMIT_REASON:  # the in-pod watchdog ended it at a limit
            return _hand_back(pod_exists, _LIMIT_REASON[seen.error.limit], seen.error.message)
        return _end(pod_exists, RunState.FAILED, EndReason.FAILED, seen.error.message)
    if now > limits.deadline and not _saving_at_limit(r, seen, limits, now):
        return _hand_back(
            pod_exists, EndReason.DEADLINE, f"time limit reached (limits.max_hours); last step {r.step}/{r.total_steps}"
        )
    if limits.max_usd is not None and limits.run_cost_usd >= limits.max_usd:
        return _hand_back(
            pod_exists,
            EndReason.MONEY_LIMIT,
            f"money limit reached: ${limits.run_cost_usd:.2f} spent, limits.max_usd is ${limits.max_usd:.2f}",
        )
    return None


def _while_alive(r: ReplicaRecord, seen: Seen, limits: Limits, now: float) -> list[Action]:
    """Rule 7 on a live pod: a crash loop or a silent worker is replaced; else the state its heartbeat says."""
    if r.error_beats >= CRASH_LOOP_ERRORS:
        why = seen.error.message if seen.error else "the worker keeps failing"
        return _relaunch_or_fail(
            r, seen, limits, f"crash loop: {r.error_beats} failures in pod {r.pod_id} without training progress ({why})"
        )
    fresh = seen.heartbeat_attempt == r.attempt and seen.heartbeat_stage in TRAINING_STAGES
    starting = r.state != RunState.RUNNING and not fresh
    if starting:
        timeout, last_sign = limits.startup_timeout_s, r.pod_started_at or 0.0
    else:
        timeout, last_sign = limits.heartbeat_timeout_s + limits.store_lag_s, _last_sign_of_life(r, seen)
    if now - last_sign > timeout:
        what = "no training heartbeat" if starting else "no heartbeat"
        return _relaunch_or_fail(r, seen, limits, f"{what} for {int(now - last_sign)}s")
    want = RunState.RUNNING if fresh else (RunState.RECOVERING if r.state == RunState.RECOVERING else RunState.PROVISIONING)
    return [SetState(want)] if want != r.state else []


def harness_runs(r: ReplicaRecord, seen: Seen, limits: Limits, now: float) -> bool:
    """Is this attempt's worker running lm-eval after its hand-back, on a pod that is still its own to
    keep: its "done" heartbeat names the harness and is fresh, no cancel was asked for, and neither
    limit has passed (the worker ends the harness before either; past the deadline it has the same
    grace as a worker saving at its limit)."""
    fresh = seen.heartbeat_time is not None and now - seen.heartbeat_time <= limits.heartbeat_timeout_s + limits.store_lag_s
    return (
        seen.heartbeat_activity == HARNESS_ACTIVITY
        and seen.heartbeat_stage == "done"
        and seen.heartbeat_attempt == r.attempt
        and fresh
        and (seen.pod is None or seen.pod.state in ALIVE or seen.pod.state == "unknown")  # never ended on a guess
        and not limits.cancel_requested
        and now <= limits.deadline + LIMIT_SAVE_GRACE_S
        and (limits.max_usd is None or limits.run_cost_usd < limits.max_usd)
    )


def after_hand_back(r: ReplicaRecord, now: float, heartbeat_timeout_s: float) -> bool:
    """From the replica's record alone (what a supervisor deciding whether to keep looking has): a
    succeeded replica whose pod is still there and whose worker still beats "done" -- lm-eval after the
    hand-back, which its ticks watch until the worker exits or a limit ends the pod."""
    return (
        r.state == RunState.SUCCEEDED
        and r.pod_id is not None
        and r.stage == "done"
        and r.heartbeat_at is not None
        and now - r.heartbeat_at <= heartbeat_timeout_s
    )


def _saving_at_limit(r: ReplicaRecord, seen: Seen, limits: Limits, now: float) -> bool:
    """Has this attempt's worker stopped before the time limit by itself, and is it still within its grace to save?"""
    return (
        seen.heartbeat_limit == LIMIT_HOURS
        and seen.heartbeat_attempt == r.attempt
        and seen.heartbeat_stage != "error"
        and now <= limits.deadline + LIMIT_SAVE_GRACE_S
    )


def _last_sign_of_life(r: ReplicaRecord, seen: Seen) -> float:
    # An error heartbeat is a worker saying it failed, not that it lives.
    hb = seen.heartbeat_time if seen.heartbeat_attempt == r.attempt and seen.heartbeat_stage != "error" else None
    times = [t for t in (r.pod_started_at, hb) if t]
    return max(times) if times else 0.0


def _relaunch_or_fail(r: ReplicaRecord, seen: Seen, limits: Limits, why: str) -> list[Action]:
    # Terminate first: a replacement is safe only after the old pod is asked to go, or a slow old pod
    # and the new one would both train (and both bill).
    stop = [Terminate(f"replacing: {why}")]
    if r.restarts >= limits.max_restarts:
        last = seen.error.message if seen.error else why
        return stop + [
            SetState(RunState.FAILED, f"gave up after {r.restarts} restarts (limits.max_restarts): {last}", EndReason.RESTARTS)
        ]
    return stop + [SetState(RunState.RECOVERING), Launch(resume=True)]


# -- the bill -------------------------------------------------------------------------------------
def account(r: ReplicaRecord, seen: Seen, hb, now: float) -> dict:
    """The replica's changes from one look: its bill to now and its progress from the heartbeat.

    A pod is billed (``pod_cost_usd``, the one billing rule) from its last bill (``cost_at``; at first
    its create) to now, whether alive, stopped, or the provider could not tell: a pod bills until it
    is gone, not until its last heartbeat (a hung worker sends none), and an exited pod still exists;
    where the pod's status says when the vendor bills it (``PodStatus.billed``), only that part of the span.
    Never under-bill: a run under max_usd on paper is relaunched. A finished run's pod the provider
    cannot tell about is not billed further (no guess). ``hb``: the store's heartbeat, or None.
    A replica of several pods keeps each node's state from the look (``controller/nodes.py``)."""
    changes: dict = {}
    if seen.pod is not None and seen.pod.nodes:
        nodes = recorded(seen.pod.nodes)
        if nodes != r.nodes:
            changes["nodes"] = nodes
    if r.pod_id and r.cost_at is not None and r.price_per_hour:
        since, until = r.cost_at, r.cost_at if (seen.pod is None and r.terminal) else now
        billed = seen.pod.billed if seen.pod is not None else None
        if billed is not None:  # the vendor says when it bills the pod: only that part of this span
            since = max(since, billed.since) if billed.since is not None else until
            until = min(until, billed.until) if billed.until is not None else until
        changes.update(cost_usd=r.cost_usd + pod_cost_usd(r.price_per_hour, since, until), cost_at=now)
    if hb is not None:
        changes.update(
            step=hb.step,
            total_steps=hb.total_steps or r.total_steps,
            heartbeat_at=hb.time,
            stage=hb.stage,
            loss=hb.loss,
            message=hb.message,
        )
        if hb.attempt == r.attempt and hb.stage == "error" and hb.time != r.last_error_beat:
            # A worker failing again inside a live pod (RunPod restarts the container): count it.
            changes.update(error_beats=r.error_beats + 1, last_error_beat=hb.time)
        elif hb.attempt == r.attempt and hb.stage in TRAINING_STAGES and hb.step > r.step:
            changes["error_beats"] = 0  # training progress: whatever failed before is not a loop
    return changes


def bill_to(r: ReplicaRecord, now: float) -> dict:
    """The changes that bill a pod about to end for its time since its last bill (from its create, at first)."""
    if r.pod_id and r.cost_at is not None and r.price_per_hour:
        return {"cost_usd": r.cost_usd + pod_cost_usd(r.price_per_hour, r.cost_at, now), "cost_at": now}
    return {}
