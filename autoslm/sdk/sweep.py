"""The SDK's sweeps: price, launch, look at and cancel a sweep (a JobSpec with a ``[sweep]`` table).

    from autoslm.sdk import Client
    from autoslm.sdk import sweep as sdk_sweep
    sweep_id = sdk_sweep.launch_sweep(Client(), "sweep.toml")
    sdk_sweep.sweep_status(Client(), sweep_id).points

Each (point, seed) becomes an ordinary run when it starts; the scheduling and the budget rule live in
``controller/sweeps.py``, the views in ``views/sweep.py``, the handle (``autoslm.sweep(...)``) in ``views/run.py``.
"""

from __future__ import annotations

import json
import math
import secrets as _random
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from autoslm.controller import daemon, sweeps
from autoslm.controller.seed_metrics import MemberMetrics, SeedMetrics
from autoslm.controller.state import point_state
from autoslm.controller.status import MemberStatus, PointStatus, SweepStatus, member_status
from autoslm.errors import UsageError
from autoslm.layout import RunPaths
from autoslm.sdk import Client, new_run_id, store_uri_for
from autoslm.sdk.looking import follow
from autoslm.store import RunArtifacts

if TYPE_CHECKING:  # a sweep's spec loads when one is launched, not when a run is looked up
    from autoslm.sweep import Sweep

LOCAL_POLL_S = 1.0


# -- pricing ----------------------------------------------------------------------------------------
def estimates(sweep: Sweep, rows_for: Callable) -> list[dict]:
    """Per point: the best usable offer's estimated cost and time of ONE run (one seed), from
    ``rows_for(spec)`` (plan rows, as `autoslm plan` shows them). The ceiling stands in for an unknown estimate."""
    out = []
    for p in sweep.points:
        one = p.spec.model_copy(update={"seed": p.spec.seeds[0]})
        rows = rows_for(one)
        best = next((r for r in rows if r.get("usable", True)), None)
        est = None if best is None else best.get("estimated_cost_usd")
        if best is not None and est is None:
            est = best.get("max_cost_usd")
        out.append(
            {
                "point": p.index,
                "label": p.label,
                "values": p.values,
                "seeds": len(p.spec.seeds),
                "provider": best and best["provider"],
                "gpu": best and best["gpu"],
                "price_per_hour": best and best.get("price_per_hour"),
                "est_hours": best and best.get("est_hours"),
                "estimated_cost_usd": est,
                "usable": best is not None,
            }
        )
    return out


def budget_summary(sweep: Sweep, est: list[dict]) -> dict:
    """What the sweep costs against ``sweep.max_usd``: the total, and how many runs the cap covers
    (members in order, each counted at its estimate: the budget rule of controller/sweeps.py)."""
    cap = sweep.settings.max_usd
    costs = [(e["estimated_cost_usd"] or 0.0) for e in est for _ in range(e["seeds"])]
    total = sum(costs)
    covered, used = 0, 0.0
    for c in costs:
        if cap is None or used + c <= cap + 1e-9:
            covered, used = covered + 1, used + c
    usable = [e for e in est if e["usable"]]
    cheapest = min((e["estimated_cost_usd"] or 0.0 for e in usable), default=None)
    return {
        "points": len(sweep.points),
        "seeds": len(sweep.seeds),
        "runs": len(costs),
        "total_usd": round(total, 4),
        "max_usd": cap,
        "runs_covered": covered,
        "cheapest_run_usd": cheapest,
        "max_parallel": sweep.settings.max_parallel,
        "unusable_points": [e["point"] for e in est if not e["usable"]],
    }


def check_budget(sweep: Sweep, summary: dict) -> None:
    """Refuse a sweep no complete run of which fits its cap, or one with a point that has no usable offer."""
    if summary["unusable_points"]:
        raise UsageError(
            f"no usable offer for point(s) {', '.join(map(str, summary['unusable_points']))} of the sweep",
            hint="`autoslm plan` on one point's settings shows why; pick another gpu or raise the limits",
        )
    cap, cheapest = summary["max_usd"], summary["cheapest_run_usd"]
    if cap is not None and cheapest is not None and cheapest > cap:
        raise UsageError(
            f"sweep.max_usd = ${cap:g} does not cover even the cheapest run (estimated ${cheapest:.2f})",
            hint="raise sweep.max_usd, or make each run cheaper (fewer steps, a cheaper gpu)",
        )


# -- launching --------------------------------------------------------------------------------------
def launch_sweep(
    client: Client,
    spec: str | Path | Sweep,
    *,
    spec_path: str | None = None,
    poll_s: float | None = None,
    rows_for: Callable | None = None,
    supervise: bool | None = None,
    est: list[dict] | None = None,
) -> str:
    """Record the sweep, start its first members, and leave a background supervisor starting the rest.
    Returns the sweep id."""
    from autoslm.sweep import Sweep, load_sweep

    client.registry.require_writable()
    if not isinstance(spec, Sweep):
        spec_path = spec_path or str(spec)
        spec = load_sweep(spec)
    sweep = spec
    est = est or estimates(sweep, rows_for or (lambda s: _rows(client, s)))
    check_budget(sweep, budget_summary(sweep, est))
    now = client.clock()
    stamp = datetime.fromtimestamp(now, timezone.utc).strftime("%Y%m%d-%H%M%S")
    sweep_id = f"{sweep.name}-sweep-{stamp}-{_random.token_hex(2)}"
    members, taken = [], set(client.registry.all_run_ids())
    for p, e in zip(sweep.points, est):
        prepared = client.prepare(p.spec)  # files shipped, image decided: once per point, before any pod
        for seed in p.spec.seeds:
            run_id = new_run_id(prepared.name, now)
            while run_id in taken:
                run_id = new_run_id(prepared.name, now)
            taken.add(run_id)
            one = prepared.model_copy(update={"seed": seed})
            members.append(
                sweeps.Member(
                    sweep_id=sweep_id,
                    member=len(members),
                    point=p.index,
                    seed=seed,
                    values_json=json.dumps(p.values),
                    spec_json=one.to_json(),
                    store_uri=store_uri_for(one, client.home),
                    run_id=run_id,
                    estimate_usd=e["estimated_cost_usd"],
                )
            )
    rec = sweeps.SweepRecord(
        sweep_id=sweep_id,
        name=sweep.name,
        spec_path=spec_path,
        keys_json=json.dumps(sweep.keys),
        max_parallel=sweep.settings.max_parallel,
        max_usd=sweep.settings.max_usd,
        created_at=now,
    )
    sweeps.SweepBook(client.registry).create(rec, members)
    if supervise is None:
        supervise = client.spawn_supervisor
    local = sweep.points[0].spec.compute.is_local
    try:
        sweeps.step(client.supervisor, sweep_id, wait_s=30.0)  # the first members start here: their errors show now
    finally:  # Ctrl-C too: a member whose start was cut short is finished by the supervisor, under its run id
        if supervise:
            daemon.start(client.home, sweep_id, poll_s if poll_s is not None else (LOCAL_POLL_S if local else None))
    return sweep_id


def _rows(client: Client, spec) -> list[dict]:
    if spec.compute.is_local:
        return [{"provider": "local", "gpu": "this machine", "price_per_hour": 0.0, "estimated_cost_usd": 0.0, "usable": True}]
    from dataclasses import asdict

    from autoslm.controller.images import choose_image, pod_vllm
    from autoslm.controller.placement import plan_offers

    return [
        asdict(p)
        for p in plan_offers(
            spec,
            {n: client.providers(n) for n in spec.compute.providers},
            pod_vllm=lambda name: pod_vllm(spec, name),
            image_mode=choose_image(spec.compute.image).mode,
        )
    ]


# -- looking ----------------------------------------------------------------------------------------
def resolve_sweep(client: Client, ref: str) -> sweeps.SweepRecord | None:
    """The sweep ``ref`` names (its id or a unique prefix), or None when it names none (or names a run:
    a prefix that matches runs too is a run's)."""
    if ref.startswith("hf://"):
        return None
    found = sweeps.SweepBook(client.registry).find(ref)
    if found and found[0].sweep_id != ref and client.registry.find_runs(ref):
        return None
    if len(found) > 1:
        raise UsageError(
            f"{ref!r} matches {len(found)} sweeps: {', '.join(r.sweep_id for r in found[:5])}", hint="give more of the id"
        )
    return found[0] if found else None


@dataclass(frozen=True)
class Target:
    """What an id names: a run (``id`` as given: the run commands resolve it) or a sweep (its full id)."""

    id: str
    sweep: bool


def resolve_target(client: Client, ref: str) -> Target:
    """The one answer to "a run or a sweep?" for an id every command and ``autoslm.status/wait/cancel`` take."""
    rec = resolve_sweep(client, ref)
    return Target(rec.sweep_id, True) if rec is not None else Target(ref, False)


def _resolve(client: Client, ref: str) -> sweeps.SweepRecord:
    rec = resolve_sweep(client, ref)
    if rec is None:
        raise UsageError(f"no sweep {ref!r} in {client.registry.path}", hint="`autoslm launch SWEEP.toml` starts one")
    return rec


def sweep_status(client: Client, ref: str, *, tick: bool = True) -> SweepStatus:
    """The sweep, a row per member (run) and a row per point ranked by the metric; resumes a sweep
    whose supervisor died (`status` is also a step of the scheduler)."""
    rec = _resolve(client, ref)
    if tick and not client.registry.read_only:
        sweeps.step(client.supervisor, rec.sweep_id)
        client.ensure_sweep_supervised(rec.sweep_id)
        rec = _resolve(client, rec.sweep_id)
    views = sweeps.views(client.registry, rec.sweep_id)
    runs = [_member_row(client, v) for v in views]
    metric = _choose_metric(runs)
    runs = [replace(r, metric=r.metrics.get(metric) if metric else None) for r in runs]
    points = _points(runs, metric)
    return SweepStatus(
        sweep_id=rec.sweep_id,
        name=rec.name,
        state=sweeps.sweep_state(rec, views),
        keys=rec.keys,
        max_parallel=rec.max_parallel,
        max_usd=rec.max_usd,
        spent_usd=round(sum(r.cost_usd for r in runs), 4),
        stopped=rec.stopped,
        metric=metric,
        higher_is_better=metric in HIGHER_BETTER,
        running=sum(1 for v in views if v.live),
        points=tuple(points),
        runs=tuple(runs),
        best=points[0] if points and points[0].metric is not None else None,
        end_reason=sweeps.sweep_end_reason(rec),
    )


# Preference order: the first any run has is the sweep's metric.
METRICS = MemberMetrics.NAMES
HIGHER_BETTER = ("eval_score", "reward")


def _member_row(client: Client, v: sweeps.MemberView) -> MemberStatus:
    m = v.m
    found = None
    if v.started and v.state.terminal:
        try:
            found = RunArtifacts(client.stores(m.store_uri), RunPaths(m.spec.phase, m.run_id, m.seed)).get_metrics()
        except Exception:  # noqa: BLE001 - metrics are a bonus in a status, never its failure
            found = None
    return member_status(
        member=m.member,
        point=m.point,
        seed=m.seed,
        values=m.values,
        run_id=m.run_id,
        state=v.state,
        step=v.step,
        total_steps=v.total_steps,
        cost_usd=v.cost_usd,
        estimate_usd=m.estimate_usd,
        allot_usd=m.allot_usd,
        skipped=m.skipped,
        metrics=MemberMetrics.of(SeedMetrics.of(found) if found else None),
        error=v.error,
        end_reason=v.end_reason,
    )


def _choose_metric(runs: list[MemberStatus]) -> str | None:
    return next((k for k in METRICS if any(r.metrics.get(k) is not None for r in runs)), None)


def _points(runs: list[MemberStatus], metric: str | None) -> list[PointStatus]:
    """A row per point: its values, its runs' states, cost, and the metric's mean ± spread over seeds; ranked."""
    by: dict[int, list[MemberStatus]] = {}
    for r in runs:
        by.setdefault(r.point, []).append(r)
    out = []
    for point, rs in sorted(by.items()):
        vals = [r.metric for r in rs if r.metric is not None]
        mean = sum(vals) / len(vals) if vals else None
        spread = math.sqrt(sum((x - mean) ** 2 for x in vals) / (len(vals) - 1)) if len(vals) > 1 else (0.0 if vals else None)
        states = [r.state for r in rs]
        out.append(
            PointStatus(
                point=point,
                values=rs[0].values,
                states=states,
                state=point_state(states),
                step=min(r.step for r in rs),
                total_steps=max(r.total_steps for r in rs),
                cost_usd=round(sum(r.cost_usd for r in rs), 4),
                metric=mean,
                spread=spread,
                n=len(vals),
                seeds=[r.seed for r in rs],
                run_ids=[r.run_id for r in rs],
            )
        )
    higher = metric in HIGHER_BETTER
    out.sort(key=lambda p: (p.metric is None, -(p.metric or 0.0) if higher else (p.metric or 0.0), p.point))
    return [replace(p, rank=rank if p.metric is not None else None) for rank, p in enumerate(out, 1)]


def cancel_sweep(client: Client, ref: str) -> SweepStatus:
    """End every run of the sweep and start nothing more."""
    rec = _resolve(client, ref)
    book = sweeps.SweepBook(client.registry)
    if not sweeps.done(client.registry, rec.sweep_id):  # an ended sweep keeps its outcome
        book.update(rec.sweep_id, cancel_requested=1)
    sweeps.step(client.supervisor, rec.sweep_id, wait_s=60.0)
    for v in sweeps.views(client.registry, rec.sweep_id):
        if v.live and client.spawn_supervisor:
            client.start_supervisor(v.m.run_id)  # a teardown that failed must not rest on this one command
    return sweep_status(client, rec.sweep_id, tick=False)


def wait_sweep(
    client: Client,
    ref: str,
    *,
    poll_s: float = 2.0,
    timeout: float | None = None,
    on_update: Callable[[SweepStatus], None] | None = None,
) -> SweepStatus:
    return follow(client, lambda: sweep_status(client, ref), poll_s, timeout, on_update)
