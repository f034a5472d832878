"""The state vocabulary of runs, sweep members and sweeps, the states derived from others, and why a run
ended. Pure: no I/O, nothing imported from the rest of autoslm.

Every state word autoslm writes (registry rows, ``status --json``) is spelled here once. The enums are
``StrEnum``s: a member compares equal to its word, so rows and JSON stay byte for byte what they were.

- ``RunState``: a replica's (one seed's) state, and a run's (``run_state``: all seeds ended -> the
  worst ending; else the most advanced live state).
- ``MemberState``: a sweep member is ``queued`` or ``skipped`` until it starts, then its run's state.
- ``SweepState``: pending (members queued), running (a member live), then how it ended.
- ``EndReason``: why a run (or a sweep, or a skipped member) ended, stored beside the state and shown
  by ``status`` and the report; the words of the error say the cause. A run that a limit ended with
  its adapter handed back is succeeded with ``deadline`` or ``money_limit``; failed with them when
  nothing was saved to hand back.
- ``holds_pod(replica, now)``: whether a replica may still have a pod (a recorded one, or a create
  that may still land): what every "is anything left to end or bill?" asks. ``settled(replicas, now)``:
  a run that needs no look (ended, no replica holding a pod): `list` and `status` then only read.

The status objects built from these (``RunStatus``, ``SweepStatus``) are in ``controller/status.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class RunState(StrEnum):
    PENDING = "pending"
    PROVISIONING = "provisioning"
    RUNNING = "running"
    RECOVERING = "recovering"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in _RUN_TERMINAL

    @property
    def live(self) -> bool:
        return not self.terminal


_RUN_TERMINAL = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED})
# A run whose seeds are in several live states is in the most advanced of them.
_LIVE_ORDER = (RunState.RUNNING, RunState.RECOVERING, RunState.PROVISIONING, RunState.PENDING)
TERMINAL = tuple(s for s in RunState if s.terminal)
STATES = tuple(RunState)
_RUN_STATE = {s.value: s for s in RunState}  # a dict look-up: `list` reads 200 runs' states


class MemberState(StrEnum):
    QUEUED = "queued"
    SKIPPED = "skipped"
    PENDING = "pending"
    PROVISIONING = "provisioning"
    RUNNING = "running"
    RECOVERING = "recovering"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self is MemberState.SKIPPED or (self is not MemberState.QUEUED and RunState(self).terminal)

    @property
    def live(self) -> bool:
        """Started and not ended (a queued member is waiting, not live)."""
        return self is not MemberState.QUEUED and not self.terminal


class SweepState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"  # the budget covered no member

    @property
    def terminal(self) -> bool:
        return self not in (SweepState.PENDING, SweepState.RUNNING)

    @property
    def live(self) -> bool:
        return not self.terminal


class EndReason(StrEnum):
    """Why something ended. The cause in words (the worker's error, the limit's figures) is its error."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"  # the worker failed (its error says why), or DONE came without an adapter
    CANCELLED = "cancelled"
    DEADLINE = "deadline"  # limits.max_hours
    MONEY_LIMIT = "money_limit"  # limits.max_usd (for a sweep's member: its allotment)
    SWEEP_BUDGET = "sweep_budget"  # the sweep's max_usd was spent: its runs were ended, its queue skipped
    RESTARTS = "restarts_exhausted"  # limits.max_restarts relaunches did not get it through
    LAUNCH_FAILED = "launch_failed"  # no pod could be had (no capacity, a provider refused)
    ALL_ENDED = "all_members_ended"  # a sweep: every member ran to its end

    @property
    def words(self) -> str:
        return self.value.replace("_", " ")


# Reasons told from the error words of a run that ended before reasons were stored (schema < 6).
_REASON_BY_ERROR = (
    ("money limit reached", EndReason.MONEY_LIMIT),
    ("time limit reached", EndReason.DEADLINE),
    ("gave up after", EndReason.RESTARTS),
    ("launch failed", EndReason.LAUNCH_FAILED),
    ("no capacity", EndReason.LAUNCH_FAILED),
)


def end_reason(state: str, stored: str | None = None, error: str | None = None) -> EndReason | None:
    """A replica's (or run's) end reason: the stored one, else what its state and error words say; None while live."""
    state = RunState(state)
    if state.live:
        return None
    if stored:
        return EndReason(stored)
    if state is RunState.SUCCEEDED:
        return EndReason.SUCCEEDED
    if state is RunState.CANCELLED:
        return EndReason.CANCELLED
    text = (error or "").lower()
    return next(
        (reason for words, reason in _REASON_BY_ERROR if text.startswith(words) or f": {words}" in text), EndReason.FAILED
    )


def run_end_reason(replicas: Iterable, state: RunState | None = None) -> EndReason | None:
    """A run's end reason: that of the seed that decided its state (the first failed or cancelled one);
    ``state``: the run's, where the caller has it already."""
    replicas = list(replicas)
    state = run_state(replicas) if state is None else state
    if state.live:
        return None
    deciding = next((r for r in replicas if r.state == state), replicas[0])
    return end_reason(deciding.state, getattr(deciding, "end_reason", None), deciding.error)


def run_state(replicas: Iterable) -> RunState:
    """A run's state from its replicas' (anything with ``.state``): all ended -> succeeded only if all
    succeeded, else cancelled if any was, else failed; otherwise the most advanced live state."""
    states = {_RUN_STATE.get(r.state) or RunState(r.state) for r in replicas}
    if states and states <= _RUN_TERMINAL:
        if states == {RunState.SUCCEEDED}:
            return RunState.SUCCEEDED
        return RunState.CANCELLED if RunState.CANCELLED in states else RunState.FAILED
    return next((s for s in _LIVE_ORDER if s in states), RunState.PENDING)


def holds_pod(replica, now: float) -> bool:
    """Whether a replica may still have a pod: a recorded one, or a create that may still land (its
    intent's window is open; an intent without a window, from an older file, may land any time)."""
    if replica.pod_id:
        return True
    if not replica.intent_name:
        return False
    until = getattr(replica, "intent_until", None)
    return until is None or now < until


def settled(replicas: Iterable, now: float) -> bool:
    """Whether a run needs no look: ended, with no pod recorded and no create that may still land."""
    return not run_state(replicas).live and not any(holds_pod(r, now) for r in replicas)


def member_state(started: bool, skipped: bool, replicas: list) -> MemberState:
    """Queued or skipped until it starts; then its run's state (pending while its run row is not written yet)."""
    if not started:
        return MemberState.SKIPPED if skipped else MemberState.QUEUED
    return MemberState(run_state(replicas)) if replicas else MemberState.PENDING


def point_state(states: Iterable[str]) -> MemberState:
    """A sweep point's state from its members' (seeds'): the most advanced live one, else how they ended."""
    states = [MemberState(s) for s in states]
    for s in (MemberState.RUNNING, MemberState.RECOVERING, MemberState.PROVISIONING, MemberState.PENDING, MemberState.QUEUED):
        if s in states:
            return s
    if set(states) == {MemberState.SUCCEEDED}:
        return MemberState.SUCCEEDED
    if set(states) == {MemberState.SKIPPED}:
        return MemberState.SKIPPED
    if MemberState.FAILED in states:
        return MemberState.FAILED
    return MemberState.CANCELLED if MemberState.CANCELLED in states else states[0]


def sweep_state(*, live: bool, queued: bool, stopped: bool, cancel_requested: bool, ended: Iterable[str]) -> SweepState:
    """A sweep's state: running while a member is live, pending while members wait to start, then
    cancelled, skipped (no member started), succeeded (every started member did) or failed.
    ``ended``: the states of the members that started."""
    if live:
        return SweepState.RUNNING
    if queued and not stopped:
        return SweepState.PENDING
    if cancel_requested:
        return SweepState.CANCELLED
    states = set(ended)
    if not states:
        return SweepState.SKIPPED
    return SweepState.SUCCEEDED if states == {RunState.SUCCEEDED} else SweepState.FAILED
