"""The state vocabulary of runs, sweep members and sweeps, the states derived from others, why a run
ended, and the one shape of a status. Pure: no I/O, nothing imported from the rest of autoslm.

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
  that may still land): what every "is anything left to end or bill?" asks.
- ``RunStatus`` / ``SweepStatus``: what ``status --json`` prints, for a run here, an ``hf://`` run
  followed through its store, and a sweep, built in one place each.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


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


# -- the status shapes ------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunStatus:
    """One run as ``status --json`` shows it. ``local``: a run in this home's registry (with its name,
    seeds and, in detail, metrics and trackers); otherwise a run followed through its store (``hf://``),
    whose one seed is named. ``to_json`` keeps the keys, their order and their rounding of every release."""

    run_id: str
    state: RunState
    phase: str
    step: int
    total_steps: int
    provider: str | None
    pod_id: Any
    restarts: int
    cost_usd: float | None
    last_heartbeat_age_s: float | None
    adapter: str | None
    error: str | None
    store: str
    end_reason: EndReason | None = None
    local: bool = True
    name: str | None = None
    created_at: float | None = None
    seeds: tuple = ()  # a local run: one dict per seed (replica)
    seed: int | None = None  # an hf:// run: the seed the reference names
    metrics: Any = None
    trackers: dict | None = None
    detail: bool = True

    def to_json(self) -> dict:
        if not self.local:
            return {
                "run_id": self.run_id,
                "state": self.state,
                "phase": self.phase,
                "seed": self.seed,
                "step": self.step,
                "total_steps": self.total_steps,
                "provider": self.provider,
                "pod_id": self.pod_id,
                "restarts": self.restarts,
                "cost_usd": self.cost_usd,
                "last_heartbeat_age_s": self.last_heartbeat_age_s,
                "adapter": self.adapter,
                "error": self.error,
                "store": self.store,
                "metrics": self.metrics,
                "end_reason": self.end_reason,
            }
        out = {
            "run_id": self.run_id,
            "name": self.name,
            "state": self.state,
            "phase": self.phase,
            "step": self.step,
            "total_steps": self.total_steps,
            "provider": self.provider,
            "pod_id": self.pod_id,
            "restarts": self.restarts,
            "cost_usd": self.cost_usd,
            "last_heartbeat_age_s": self.last_heartbeat_age_s,
            "adapter": self.adapter,
            "error": self.error,
            "store": self.store,
            "created_at": self.created_at,
            "seeds": [dict(s) for s in self.seeds],
            "end_reason": self.end_reason,
        }
        if self.detail:
            out["metrics"] = self.metrics
            out["trackers"] = self.trackers
        return out


def replica_json(r, now: float) -> dict:
    """One seed of a run as ``status --json`` lists it under ``seeds``."""
    return {
        "seed": r.seed,
        "state": r.state,
        "step": r.step,
        "total_steps": r.total_steps,
        "provider": r.provider,
        "pod_id": r.pod_id,
        "gpu": r.gpu,
        "restarts": r.restarts,
        "attempt": r.attempt,
        "cost_usd": round(r.cost_usd, 4),
        "stage": r.stage,
        "message": r.message,
        "loss": r.loss,
        "last_heartbeat_age_s": None if r.heartbeat_at is None else round(max(0.0, now - r.heartbeat_at), 1),
        "error": r.error,
        "end_reason": end_reason(r.state, getattr(r, "end_reason", None), r.error),
    }


def local_status(
    run,
    replicas: list,
    now: float,
    *,
    default_provider: str | None,
    adapters: list[str] | None,
    adapter_missing: bool,
    detail: bool,
    metrics=None,
    trackers=None,
) -> RunStatus:
    """A run of this home from its records. ``adapters``: where each seed's adapter lies once succeeded;
    ``adapter_missing``: marked succeeded, but the store has no adapter (said as its error)."""
    seeds = [replica_json(r, now) for r in replicas]
    row = table_row(run, replicas, default_provider)
    state = row["state"]
    ages = [s["last_heartbeat_age_s"] for s in seeds if s["last_heartbeat_age_s"] is not None]
    error = next((s["error"] for s in seeds if s["error"]), None)
    adapter = None
    if state is RunState.SUCCEEDED and adapter_missing:
        error = "the run is marked succeeded but its adapter is not in the store"
    elif state is RunState.SUCCEEDED and adapters:
        adapter = adapters[0]
        for s, where in zip(seeds, adapters):
            s["adapter"] = where
    return RunStatus(
        run_id=run.run_id,
        name=run.name,
        state=state,
        phase=run.phase,
        step=row["step"],
        total_steps=row["total_steps"],
        provider=row["provider"],
        pod_id=seeds[0]["pod_id"] if len(seeds) == 1 else [s["pod_id"] for s in seeds],
        restarts=row["restarts"],
        cost_usd=row["cost_usd"],
        last_heartbeat_age_s=max(ages) if ages else None,
        adapter=adapter,
        error=error,
        store=run.store_uri,
        created_at=run.created_at,
        seeds=tuple(seeds),
        end_reason=run_end_reason(replicas, state),
        detail=detail,
        metrics=metrics,
        trackers=trackers,
    )


def table_row(run, replicas: list, default_provider: str | None) -> dict:
    """What the runs table shows of a run (`list`), summed over its seeds: ``local_status``'s figures,
    without the per-seed detail it builds (a table of 200 runs needs none of it)."""
    return {
        "run_id": run.run_id,
        "name": run.name,
        "state": run_state(replicas),
        "phase": run.phase,
        "step": min(r.step for r in replicas),
        "total_steps": max(r.total_steps for r in replicas),
        "provider": replicas[0].provider or default_provider,
        "restarts": sum(r.restarts for r in replicas),
        "cost_usd": round(sum(round(r.cost_usd, 4) for r in replicas), 4),
        "created_at": run.created_at,
    }


@functools.lru_cache(maxsize=64)
def spec_provider(spec_json: str) -> str:
    """The first provider a run's JobSpec (as recorded, JSON) names, read without building the JobSpec
    (runs of one spec, a sweep's or a repeated launch's, read it once)."""
    import json

    provider = (json.loads(spec_json).get("compute") or {}).get("provider", "local")
    return provider if isinstance(provider, str) else provider[0]


# Heartbeat stages that tell a remote run is being worked on (its store is all we see of it).
_WORKING_STAGES = ("training", "saving", "uploading", "loading", "setup")


def remote_status(
    *, run_id: str, phase: str, seed: int, store: str, done: bool, error, heartbeat, metrics, adapter: str | None, now: float
) -> RunStatus:
    """A run followed through its store only (``hf://``): its state from DONE, its error and its heartbeat."""
    if done:
        state = RunState.SUCCEEDED
    elif error is not None and not error.retryable:
        state = RunState.FAILED
    elif heartbeat is not None and heartbeat.stage in _WORKING_STAGES:
        state = RunState.RUNNING
    elif heartbeat is not None and heartbeat.stage == "error":
        state = RunState.RECOVERING
    else:
        state = RunState.PENDING
    hb = heartbeat
    return RunStatus(
        run_id=run_id,
        state=state,
        phase=phase,
        seed=seed,
        step=hb.step if hb else 0,
        total_steps=hb.total_steps if hb else 0,
        provider=None,
        pod_id=None,
        restarts=max(0, (hb.attempt - 1)) if hb else 0,
        cost_usd=None,
        last_heartbeat_age_s=round(max(0.0, now - hb.time), 1) if hb else None,
        adapter=adapter if done else None,
        error=error.message if error else None,
        store=store,
        metrics=metrics,
        local=False,
        end_reason=end_reason(state, _limit_reason(metrics) if done else None, error.message if error else None),
    )


def _limit_reason(metrics) -> str | None:
    """A finished run that a limit ended with its adapter handed back says so in metrics.json (``limit``)."""
    name = ((metrics or {}).get("limit") or {}).get("name") if isinstance(metrics, dict) else None
    return {"max_hours": EndReason.DEADLINE, "max_usd": EndReason.MONEY_LIMIT}.get(name)


@dataclass(frozen=True)
class SweepStatus:
    """A sweep as ``status SWEEP --json`` shows it: its settings and spend, a row per member (run) and a
    row per point, ranked by the metric."""

    sweep_id: str
    name: str
    state: SweepState
    keys: list
    max_parallel: int
    max_usd: float | None
    spent_usd: float
    stopped: str | None
    metric: str | None
    higher_is_better: bool
    running: int
    points: list = field(default_factory=list)
    runs: list = field(default_factory=list)
    best: dict | None = None
    end_reason: EndReason | None = None

    def to_json(self) -> dict:
        return {
            "sweep_id": self.sweep_id,
            "name": self.name,
            "state": self.state,
            "keys": self.keys,
            "max_parallel": self.max_parallel,
            "max_usd": self.max_usd,
            "spent_usd": self.spent_usd,
            "stopped": self.stopped,
            "metric": self.metric,
            "higher_is_better": self.higher_is_better,
            "running": self.running,
            "points": self.points,
            "runs": self.runs,
            "best": self.best,
            "end_reason": self.end_reason,
        }


def why_skipped(row: dict) -> str | None:
    """Why a member row (``member_row``) was never started, in words; None for one that started."""
    return row.get("skipped")


def member_row(
    *,
    member: int,
    point: int,
    seed: int,
    values: dict,
    run_id: str,
    state: MemberState,
    step: int,
    total_steps: int,
    cost_usd: float,
    estimate_usd: float | None,
    allot_usd: float | None,
    skipped: str | None,
    metrics: dict,
    error: str | None,
    end_reason: EndReason | None,
) -> dict:
    """A sweep member as ``status SWEEP --json`` lists it under ``runs``: a failed one with its run's error."""
    return {
        "member": member,
        "point": point,
        "seed": seed,
        "values": values,
        "run_id": run_id,
        "state": state,
        "step": step,
        "total_steps": total_steps,
        "cost_usd": round(cost_usd, 4),
        "estimate_usd": estimate_usd,
        "allot_usd": allot_usd,
        "skipped": skipped,
        "metrics": metrics,
        "error": error if state is MemberState.FAILED else None,
        "end_reason": end_reason,
    }
