"""The status objects: a run, its seeds, a run's row in the runs table, a sweep, its members and points.
Pure: no I/O; built from records in one place each (``local_status``, ``remote_status``, ``table_row``).

The SDK returns these and the views read their attributes; a dict exists only where JSON is printed
(``status --json``, ``list --json``) or asked for: ``to_json()`` keeps the keys, their order and their
rounding of every release (tests/unit/test_status_snapshot.py pins them byte for byte).

- ``SeedStatus``: one seed (replica) of a run; ``RunStatus``: a run here (``local``) or one followed
  through its store (``hf://``: one seed named, no seed rows).
- ``RunRow``: what the runs table shows of a run, without the per-seed detail (`list` reads 200 runs).
- ``MemberStatus`` / ``PointStatus`` / ``SweepStatus``: a sweep, a row per member (run) and per point.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from autoslm.controller.nodes import NodeRow, node_rows
from autoslm.controller.seed_metrics import MemberMetrics, SeedMetrics, seeds_metrics
from autoslm.controller.serve_status import ServeStatus, serve_status
from autoslm.controller.state import EndReason, MemberState, RunState, SweepState, end_reason, run_end_reason, run_state


@dataclass(frozen=True)
class TeardownStatus:
    """A pod whose terminate the provider keeps refusing (controller/billing.end_pod records each
    refusal): it may still bill. The supervisor tries again every look; ``pods_page`` is where the
    vendor's console ends it by hand."""

    provider: str | None
    pod_id: Any
    failures: int
    since: float | None
    error: str | None
    vendor: str | None  # the vendor's name for people ("RunPod")
    pods_page: str | None

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in TeardownStatus.__dataclass_fields__}


def teardown_status(r) -> TeardownStatus | None:
    """The replica's failing teardown, or None (no pod left, or no terminate of it refused)."""
    failures = getattr(r, "teardown_failures", 0) or 0
    if not r.pod_id or not failures:
        return None
    from autoslm.providers import VENDORS

    vendor = VENDORS.get(r.provider or "")
    return TeardownStatus(
        provider=r.provider,
        pod_id=r.pod_id,
        failures=failures,
        since=r.teardown_since,
        error=r.teardown_error,
        vendor=vendor.title if vendor else None,
        pods_page=(vendor.pods_page or None) if vendor else None,
    )


@dataclass(frozen=True)
class SeedStatus:
    """One seed of a run as ``status --json`` lists it under ``seeds``."""

    seed: int
    state: RunState
    step: int
    total_steps: int
    provider: str | None
    pod_id: Any
    gpu: str | None
    restarts: int
    attempt: int
    cost_usd: float
    stage: str | None
    message: str | None
    loss: float | None
    last_heartbeat_age_s: float | None
    error: str | None
    end_reason: EndReason | None
    adapter: str | None = None  # where its adapter lies, once the run succeeded
    teardown: TeardownStatus | None = None  # its pod's terminate keeps failing
    nodes: tuple[NodeRow, ...] = ()  # a replica of several pods (compute.nodes > 1): each node; () for one pod

    def to_json(self) -> dict:
        out = {
            "seed": self.seed,
            "state": self.state,
            "step": self.step,
            "total_steps": self.total_steps,
            "provider": self.provider,
            "pod_id": self.pod_id,
            "gpu": self.gpu,
            "restarts": self.restarts,
            "attempt": self.attempt,
            "cost_usd": self.cost_usd,
            "stage": self.stage,
            "message": self.message,
            "loss": self.loss,
            "last_heartbeat_age_s": self.last_heartbeat_age_s,
            "error": self.error,
            "end_reason": self.end_reason,
        }
        if self.adapter is not None:
            out["adapter"] = self.adapter
        out["teardown"] = None if self.teardown is None else self.teardown.to_json()
        if self.nodes:  # only a replica of several pods: one pod's JSON is as it always was
            out["nodes"] = [n.to_json() for n in self.nodes]
        return out


@dataclass(frozen=True)
class RunRow:
    """A run as the runs table shows it (`list`), summed over its seeds."""

    run_id: str
    name: str | None
    state: RunState
    phase: str
    step: int
    total_steps: int
    provider: str | None
    restarts: int
    cost_usd: float | None
    created_at: float | None

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in RunRow.__dataclass_fields__}


@dataclass(frozen=True)
class RunStatus:
    """One run as ``status`` shows it. ``local``: a run in this home's registry (with its name, seeds
    and, in ``detail``, metrics and trackers); otherwise a run followed through its store (``hf://``),
    whose one seed is named. ``metrics``: each seed's results (``seed0``...: its metrics.json, typed).
    ``to_json`` keeps the keys, their order and their rounding of every release."""

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
    seeds: tuple[SeedStatus, ...] = ()  # a local run: one per seed (replica)
    seed: int | None = None  # an hf:// run: the seed the reference names
    metrics: dict[str, SeedMetrics] | None = None
    trackers: dict | None = None
    detail: bool = True
    serve: ServeStatus | None = None  # a serve run (`autoslm serve`): what it serves, where, until when

    @property
    def first_seed(self) -> SeedStatus | None:
        """The first seed's row (None for a run followed through its store, which has none)."""
        return self.seeds[0] if self.seeds else None

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
                "metrics": next(iter(self.metrics.values())).to_json() if self.metrics else None,
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
            "seeds": [s.to_json() for s in self.seeds],
            "end_reason": self.end_reason,
        }
        if self.detail:
            out["metrics"] = None if self.metrics is None else {k: m.to_json() for k, m in self.metrics.items()}
            out["trackers"] = self.trackers
        if self.serve is not None:
            out["serve"] = self.serve.to_json()
        return out


def seed_status(r, now: float, adapter: str | None = None, shape: tuple[int, int] = (1, 1)) -> SeedStatus:
    """One seed of a run from its replica record. ``shape``: the run's (compute.nodes, compute.gpu_count)."""
    return SeedStatus(
        seed=r.seed,
        state=RunState(r.state),
        step=r.step,
        total_steps=r.total_steps,
        provider=r.provider,
        pod_id=r.pod_id,
        gpu=r.gpu,
        restarts=r.restarts,
        attempt=r.attempt,
        cost_usd=round(r.cost_usd, 4),
        stage=r.stage,
        message=r.message,
        loss=r.loss,
        last_heartbeat_age_s=None if r.heartbeat_at is None else round(max(0.0, now - r.heartbeat_at), 1),
        error=r.error,
        end_reason=end_reason(r.state, getattr(r, "end_reason", None), r.error),
        adapter=adapter,
        teardown=teardown_status(r),
        nodes=node_rows(getattr(r, "nodes", None), *shape),
    )


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
    row = table_row(run, replicas, default_provider)
    state = row.state
    handed_back = state is RunState.SUCCEEDED and not adapter_missing and bool(adapters)
    where = adapters if handed_back else [None] * len(replicas)
    shape = spec_shape(run.spec_json)
    seeds = tuple(seed_status(r, now, a, shape) for r, a in zip(replicas, where))
    ages = [s.last_heartbeat_age_s for s in seeds if s.last_heartbeat_age_s is not None]
    error = next((s.error for s in seeds if s.error), None)
    if state is RunState.SUCCEEDED and adapter_missing:
        error = "the run is marked succeeded but its adapter is not in the store"
    return RunStatus(
        run_id=run.run_id,
        name=run.name,
        state=state,
        phase=run.phase,
        step=row.step,
        total_steps=row.total_steps,
        provider=row.provider,
        pod_id=seeds[0].pod_id if len(seeds) == 1 else [s.pod_id for s in seeds],
        restarts=row.restarts,
        cost_usd=row.cost_usd,
        last_heartbeat_age_s=max(ages) if ages else None,
        adapter=adapters[0] if handed_back else None,
        error=error,
        store=run.store_uri,
        created_at=run.created_at,
        seeds=seeds,
        end_reason=run_end_reason(replicas, state),
        detail=detail,
        metrics=seeds_metrics(metrics),
        trackers=trackers,
        serve=serve_status(run, seeds, state, now, metrics) if detail else None,
    )


def table_row(run, replicas: list, default_provider: str | None) -> RunRow:
    """What the runs table shows of a run (`list`), summed over its seeds: ``local_status``'s figures,
    without the per-seed detail it builds (a table of 200 runs needs none of it)."""
    return RunRow(
        run_id=run.run_id,
        name=run.name,
        state=run_state(replicas),
        phase=run.phase,
        step=min(r.step for r in replicas),
        total_steps=max(r.total_steps for r in replicas),
        provider=replicas[0].provider or default_provider,
        restarts=sum(r.restarts for r in replicas),
        cost_usd=round(sum(round(r.cost_usd, 4) for r in replicas), 4),
        created_at=run.created_at,
    )


@functools.lru_cache(maxsize=64)
def spec_provider(spec_json: str) -> str:
    """The first provider a run's JobSpec (as recorded, JSON) names, read without building the JobSpec
    (runs of one spec, a sweep's or a repeated launch's, read it once)."""
    import json

    provider = (json.loads(spec_json).get("compute") or {}).get("provider", "local")
    return provider if isinstance(provider, str) else provider[0]


def spec_reports_to(spec_json: str) -> bool:
    """Whether a run's recorded JobSpec (JSON) is a training run that reports to a tracker (``train.report_to``),
    read without building the JobSpec."""
    import json

    spec = json.loads(spec_json)
    return spec.get("kind", "train") == "train" and bool((spec.get("train") or {}).get("report_to"))


@functools.lru_cache(maxsize=64)
def spec_shape(spec_json: str) -> tuple[int, int]:
    """(compute.nodes, compute.gpu_count) of a run's recorded JobSpec, read without building the JobSpec."""
    import json

    try:
        compute = json.loads(spec_json).get("compute") or {}
        return int(compute.get("nodes") or 1), int(compute.get("gpu_count") or 1)
    except (ValueError, TypeError, AttributeError):
        return 1, 1  # a record this version cannot read: shown as one pod


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
        metrics=None if metrics is None else {f"seed{seed}": SeedMetrics.of(metrics)},
        local=False,
        end_reason=end_reason(state, _limit_reason(metrics) if done else None, error.message if error else None),
    )


def _limit_reason(metrics) -> str | None:
    """A finished run that a limit ended with its adapter handed back says so in metrics.json (``limit``)."""
    name = ((metrics or {}).get("limit") or {}).get("name") if isinstance(metrics, dict) else None
    return {"max_hours": EndReason.DEADLINE, "max_usd": EndReason.MONEY_LIMIT}.get(name)


# -- sweeps -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemberStatus:
    """A sweep member (one point's one seed, a run once started) as ``status SWEEP --json`` lists it
    under ``runs``. ``metrics``: its figures by name (eval_score, reward, eval_loss, final_loss);
    ``metric``: the one the sweep ranks by; ``skipped``: why it never started."""

    member: int
    point: int
    seed: int
    values: dict
    run_id: str
    state: MemberState
    step: int
    total_steps: int
    cost_usd: float
    estimate_usd: float | None
    allot_usd: float | None
    skipped: str | None
    metrics: MemberMetrics
    error: str | None  # a failed member's run error (None for any other)
    end_reason: EndReason | None
    metric: float | None = None

    def to_json(self) -> dict:
        out = {k: getattr(self, k) for k in MemberStatus.__dataclass_fields__}
        out["metrics"] = self.metrics.to_json()
        return out


def member_status(*, cost_usd: float, error: str | None, state: MemberState, **fields) -> MemberStatus:
    """A member from its records: its cost rounded as every other, its run's error only where it failed."""
    return MemberStatus(cost_usd=round(cost_usd, 4), error=error if state is MemberState.FAILED else None, state=state, **fields)


@dataclass(frozen=True)
class PointStatus:
    """A sweep point (its values, over its seeds): the metric's mean ± spread over ``n`` seeds that have
    it, and its ``rank`` among the points (None without the metric)."""

    point: int
    values: dict
    states: list
    state: MemberState
    step: int
    total_steps: int
    cost_usd: float
    metric: float | None
    spread: float | None
    n: int
    seeds: list
    run_ids: list
    rank: int | None = None

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in PointStatus.__dataclass_fields__}


@dataclass(frozen=True)
class SweepStatus:
    """A sweep as ``status SWEEP`` shows it: its settings and spend, a row per member (run) and a
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
    points: tuple[PointStatus, ...] = field(default_factory=tuple)
    runs: tuple[MemberStatus, ...] = field(default_factory=tuple)
    best: PointStatus | None = None
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
            "points": [p.to_json() for p in self.points],
            "runs": [r.to_json() for r in self.runs],
            "best": None if self.best is None else self.best.to_json(),
            "end_reason": self.end_reason,
        }
