"""What a sweep looks like: the lines of `validate`, `plan`, `status`, `watch` and `list`, and the report.

A line per point (its swept values, state, step, cost, and the metric as mean ± spread over its
seeds), ranked by the metric, the best named. The report is one self-contained HTML page: each
point's curve (seeds averaged) overlaid, and the ranked table. Renderers only: the commands that
call them are in ``views/commands.py``, the notebook's handle (``SweepHandle``) in ``views/run.py``.
Cheap to import, like every view.
"""

from __future__ import annotations

import html
import json
import time
from pathlib import Path

from autoslm.controller.state import EndReason, MemberState, SweepState
from autoslm.controller.status import MemberStatus, PointStatus, SweepStatus


def fmt_value(v) -> str:  # autoslm.sweep's, loaded when first used: it brings pydantic, which `list` does without
    from autoslm.sweep import fmt_value as fmt

    return fmt(v)


def short_key(key: str) -> str:
    from autoslm.sweep import short_key as short

    return short(key)


def _metric(p: PointStatus) -> str:
    if p.metric is None:
        return "-"
    spread = f" ± {p.spread:.3g}" if p.n > 1 else ""
    return f"{p.metric:.4g}{spread}"


def _values(keys: list[str], values: dict) -> list[str]:
    return [fmt_value(values.get(k)) for k in keys]


def status_lines(st: SweepStatus) -> list[str]:
    """The sweep as aligned text: a header, a row per point (best first), the best named."""
    cap = f" of ${st.max_usd:.2f}" if st.max_usd else ""
    out = [
        f"sweep {st.sweep_id}: {st.state}, {st.running}/{st.max_parallel} running, "
        f"${st.spent_usd:.2f} spent{cap}" + (f" ({st.stopped})" if st.stopped and st.state != SweepState.RUNNING else "")
    ]
    metric = st.metric or "metric"
    keys = st.keys
    headers = ["rank", "point", *map(short_key, keys), "state", "step", "cost $", f"{metric} (mean ± sd)", "seeds"]
    rows = []
    for p in st.points:
        states = ",".join(sorted(set(p.states)))
        rows.append(
            [
                str(p.rank or "-"),
                str(p.point),
                *_values(keys, p.values),
                states,
                f"{p.step}/{p.total_steps}",
                f"{p.cost_usd:.2f}",
                _metric(p),
                str(len(p.seeds)),
            ]
        )
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    out.append("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    best = st.best
    if best:
        better = "higher" if st.higher_is_better else "lower"
        vals = ", ".join(f"{k}={fmt_value(best.values.get(k))}" for k in keys)
        out.append(f"best: point {best.point} ({vals}): {metric} {_metric(best)} ({better} is better)")
    skipped = [r.skipped for r in st.runs if r.skipped and r.skipped != EndReason.CANCELLED]
    if skipped:
        out.append(f"{len(skipped)} run(s) not started: {skipped[0]}")
    for r in st.runs:  # each failed member by its run id (what `status`, `logs` and `report` take) and why
        if r.state == MemberState.FAILED:
            out.append(f"failed: run {r.run_id} (point {r.point}, seed {r.seed}): {r.error or 'no error recorded'}")
    return out


def sweeps_lines(registry, limit: int = 200) -> list[str]:
    """The sweeps of this home, newest first, under `autoslm list` (their runs are in the table above)."""
    from autoslm.controller import sweeps

    recs = sorted(sweeps.SweepBook(registry).find(""), key=lambda r: -r.created_at)[:limit]
    out = []
    for rec in recs:
        members = sweeps.views(registry, rec.sweep_id)
        out.append(
            f"  {rec.sweep_id}  {sweeps.sweep_state(rec, members)}  {len(members)} runs  "
            f"${sum(v.cost_usd for v in members):.2f}" + (f" of ${rec.max_usd:.2f}" if rec.max_usd else "")
        )
    return (["sweeps (`autoslm status SWEEP` ranks their points):"] + out) if out else []


def plan_lines(summary: dict, est: list[dict], keys: list[str]) -> list[str]:
    """A sweep's price: a row per point (one run's estimate, times its seeds), the total, the cap."""
    headers = ["point", *map(short_key, keys), "offer", "est hours", "est $/run", "seeds", "est $"]
    rows = []
    for e in est:
        one = e["estimated_cost_usd"]
        offer = f"{e['provider']} {e['gpu']}" if e["usable"] else "no usable offer"
        rows.append(
            [
                str(e["point"]),
                *_values(keys, e["values"]),
                offer,
                "-" if e["est_hours"] is None else f"{e['est_hours']:.2f}",
                "-" if one is None else f"{one:.2f}",
                str(e["seeds"]),
                "-" if one is None else f"{one * e['seeds']:.2f}",
            ]
        )
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    line = (
        f"sweep: {summary['points']} points x {summary['seeds']} seed(s) = {summary['runs']} runs, "
        f"{summary['max_parallel']} at a time; estimated ${summary['total_usd']:.2f} in all"
    )
    if summary["max_usd"] is not None:
        line += f"; sweep.max_usd ${summary['max_usd']:.2f} covers {summary['runs_covered']} of the {summary['runs']} runs"
    out.append(line)
    return out


def validate_line(spec: Path, sw) -> str:
    """`validate` of a sweep file (``sw``: its Sweep, parsed once by the caller)."""
    cap = f", sweep.max_usd ${sw.settings.max_usd:g}" if sw.settings.max_usd else ""
    return (
        f"ok: {spec} is a sweep of {len(sw.points)} points ({', '.join(sw.keys)}) x {len(sw.seeds)} seed(s) = "
        f"{len(sw.members())} runs, {sw.settings.max_parallel} at a time{cap}"
    )


# -- the report -------------------------------------------------------------------------------------
def _curves(client, st: SweepStatus) -> list[str]:
    """Per point, its runs' training curve averaged over seeds at each step, all points overlaid."""
    from autoslm.views.report.charts import SMOOTHING, svg_chart
    from autoslm.views.runview import read_events, train_rows

    per_point: dict[int, list[list[dict]]] = {}
    for r in st.runs:
        if r.state in (MemberState.QUEUED, MemberState.SKIPPED):
            continue
        try:
            rows = train_rows(read_events(client, r.run_id))
        except Exception:  # noqa: BLE001 - a run whose store cannot be read is left out of the chart
            continue
        per_point.setdefault(r.point, []).append(rows)
    out = []
    keys = st.keys
    for key, title in (("reward", "mean reward (seeds averaged)"), ("loss", "training loss (seeds averaged)")):
        series = {}
        for p in sorted(st.points, key=lambda p: p.point):
            by_step: dict[int, list[float]] = {}
            for rows in per_point.get(p.point, []):
                for row in rows:
                    if row.get(key) is not None:
                        by_step.setdefault(row["step"], []).append(float(row[key]))
            if by_step:
                name = f"p{p.point} " + " ".join(f"{short_key(k)}={fmt_value(p.values.get(k))}" for k in keys)
                series[name] = [(s, sum(v) / len(v)) for s, v in sorted(by_step.items())]
        if series:
            out.append(svg_chart(series, title=title, smoothing=SMOOTHING))  # each point smoothed over its raw curve
    return out


def _ended(r: MemberStatus) -> str:
    """A member's state, with why it ended (and a failure's error)."""
    reason = r.end_reason
    text = r.state if not reason or reason == r.state else f"{r.state} ({EndReason(reason).words})"
    return text + (f": {r.error}" if r.error else "")


def render_report(client, st: SweepStatus) -> str:
    from autoslm.secrets import redact
    from autoslm.views.report import CSS, _table

    keys = st.keys
    metric = st.metric or "metric"
    rows = [
        [
            p.rank or "-",
            p.point,
            *_values(keys, p.values),
            ",".join(sorted(set(p.states))),
            f"{p.step}/{p.total_steps}",
            f"{p.cost_usd:.2f}",
            _metric(p),
            " ".join(p.run_ids),
        ]
        for p in st.points
    ]
    best = st.best
    named = (
        "<p><b>best: point {} ({})</b>: {} {}</p>".format(
            best.point,
            html.escape(", ".join(f"{k}={fmt_value(best.values.get(k))}" for k in keys)),
            html.escape(metric),
            html.escape(_metric(best)),
        )
        if best
        else "<p class='muted'>no point has a metric yet</p>"
    )
    cap = f" of ${st.max_usd:.2f}" if st.max_usd else ""
    title = f"autoslm sweep {st.sweep_id}"
    curves = _curves(client, st)
    body = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p class='muted'>report written {time.strftime('%Y-%m-%d %H:%M:%S')}; {st.state}"
        + (f" ({EndReason(st.end_reason).words})" if st.end_reason else "")
        + "; "
        f"${st.spent_usd:.2f} spent{cap}; ranked by {html.escape(metric)} "
        f"({'higher' if st.higher_is_better else 'lower'} is better)</p>",
        named,
        "<h2>Points, ranked</h2>",
        _table(["rank", "point", *keys, "state", "step", "cost $", f"{metric} (mean ± sd)", "runs"], rows),
        "<h2>Curves</h2>",
        "<div class='charts'>" + ("\n".join(curves) or "<p class='muted'>no steps logged yet</p>") + "</div>",
        "<h2>Runs</h2>",
        _table(
            ["run", "point", "seed", "state", "cost $", "metrics"],
            [
                [
                    r.run_id,
                    r.point,
                    r.seed,
                    r.skipped or _ended(r),
                    f"{r.cost_usd:.2f}",
                    json.dumps(r.metrics.to_json()),
                ]
                for r in st.runs
            ],
        ),
    ]
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
    return redact(page)


def write_sweep_report(client, ref: str, out=None) -> Path:
    from autoslm.sdk.sweep import sweep_status

    st = sweep_status(client, ref)
    path = Path(out) if out else Path.cwd() / f"{st.sweep_id}-report.html"
    path.write_text(render_report(client, st), encoding="utf-8")
    return path
