"""`autoslm report RUN`: one self-contained HTML file about a run.

Curves (inline SVG, seeds overlaid with their mean), eval before/after as paired bars, cost, the timeline of stages and restarts with reasons,
sample GRPO rollouts and the spec. Nothing in the page is fetched from the network: no scripts,
no fonts, no images by URL, so it opens offline and can be mailed or archived as it is.
"""

from __future__ import annotations

import html
import json
import time

from autoslm.controller.nodes import node_words
from autoslm.controller.seed_metrics import Evaluation
from autoslm.controller.status import RunStatus
from autoslm.secrets import redact
from autoslm.views.report.charts import SMOOTHING, svg_bars, svg_chart
from autoslm.views.runview import (
    RunData,
    eval_rows,
    restarts,
    reward_functions,
    rollouts,
    series,
    throughput,
    timeline,
    train_rows,
)

CSS = """
body{font-family:sans-serif;margin:24px;max-width:1100px;color:#222}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px} th{background:#f4f4f4;font-weight:600} td,th{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
pre{background:#f6f6f6;padding:10px;font-size:12px;overflow:auto;white-space:pre-wrap}
.charts{display:flex;flex-wrap:wrap;gap:12px} .muted{color:#777} .bad{color:#b00}
"""


# GRPO's per-step health (docs/grpo.md says how to read them): TRL's own metrics, and the advantage
# numbers the worker adds.
GRPO_DIAGNOSTICS = (
    ("entropy", "entropy (nats/token)"),
    ("grad_norm", "gradient norm"),
    ("completions/mean_length", "completion length (tokens)"),
    ("completions/clipped_ratio", "truncated completions"),
    ("frac_reward_zero_std", "groups with zero reward variance"),
    ("advantage/abs_mean", "mean |advantage|"),
    ("clip_ratio/region_mean", "clipped ratio"),
)


def _esc(v) -> str:
    return html.escape("" if v is None else str(v))


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _table(headers: list[str] | None, rows: list[list], *, row_heads: bool = False) -> str:
    """A table; ``headers=None``: none (a list of name/value rows, its names as row headers)."""
    head = "<tr>" + "".join(f"<th>{_esc(h)}</th>" for h in headers) + "</tr>" if headers else ""

    def cells(r):
        first = f"<th>{_esc(r[0])}</th>" if row_heads else f"<td>{_esc(r[0])}</td>"
        return first + "".join(f"<td>{_esc(c)}</td>" for c in r[1:])

    body = "".join(f"<tr>{cells(r)}</tr>" for r in rows)
    return f"<table>{head}{body}</table>"


# (key, title, lowest value the metric can take, highest): the axis never goes past these.
CURVES = (
    ("loss", "training loss", 0.0, None),
    ("reward", "mean reward", None, None),
    ("reward_std", "reward std", 0.0, None),
    ("kl", "KL", None, None),
    ("learning_rate", "learning rate", 0.0, None),
)
# Drawn as they are: a schedule (not noise) and running averages (already smooth). Every other step
# series gets TensorBoard's smoothing, its raw values faint behind.
UNSMOOTHED = ("learning_rate", "trained_tokens_per_s", "generated_tokens_per_s", "tokens_per_s")
THROUGHPUT = (("trained_tokens_per_s", "trained"), ("generated_tokens_per_s", "generated"))
EVALS = (("eval_loss", "held-out loss", 0.0, None),)


# A multi-turn task's batch numbers (autoslm/critique: the outcome of the first answer -> the final
# one; engine/rollout/turns.py: episodes dropped over their token budget).
CRITIQUE_TITLES = {
    "critique/correction": "correction (wrong -> right)",
    "critique/robustness": "robustness (right -> right)",
    "critique/sycophancy": "sycophancy (right -> wrong)",
    "critique/boundary": "boundary (wrong -> wrong)",
    "critique/accuracy_change": "accuracy change (final - first answer)",
}


def multi_turn_curves(rows: list[dict]) -> list[tuple[str, str, float | None, float | None]]:
    """(key, title, floor, ceiling) of the multi-turn numbers the rows carry, in reading order."""
    keys = {k for r in rows for k in r if k.startswith(("critique/", "multiturn/"))}
    out = [(k, t, -1.0 if k.endswith("change") else 0.0, 1.0) for k, t in CRITIQUE_TITLES.items() if k in keys]
    turns = sorted((k for k in keys if k.startswith("critique/accuracy_turn")), key=lambda k: int(k.rsplit("turn", 1)[1]))
    out += [(k, f"accuracy at turn {k.rsplit('turn', 1)[1]}", 0.0, 1.0) for k in turns]
    out += [
        (k, t, 0.0, None)
        for k, t in (("multiturn/dropped", "episodes dropped over length"), ("multiturn/groups_emptied", "groups left empty"))
        if k in keys
    ]
    return out


def charts(data: RunData) -> list[str]:
    """The SVG charts of a run: loss, reward (GRPO), learning rate over steps (seeds overlaid, with
    their mean), and the held-out eval before and after training as paired bars."""
    rows = train_rows(data.events)
    seeds = sorted({r["seed"] for r in rows})
    out = []
    # GRPO's diagnostics: all >= 0; the fractions (truncated, zero-variance groups) also <= 1.
    fractions = ("completions/clipped_ratio", "frac_reward_zero_std", "clip_ratio/region_mean")
    diagnostics = tuple((k, t, 0.0, 1.0 if k in fractions else None) for k, t in GRPO_DIAGNOSTICS)
    for key, title, floor, ceil in CURVES + diagnostics:
        s = {f"seed{seed}": series(rows, key, seed) for seed in seeds}
        s = {k: v for k, v in s.items() if v}
        if s:
            lowest = min(y for pts in s.values() for _, y in pts)
            # A metric that never went below 0 here (a reward, a KL) gets no negative axis either.
            out.append(
                svg_chart(
                    s,
                    title=title,
                    y_floor=floor if floor is not None else (0.0 if lowest >= 0 else None),
                    y_ceil=ceil,
                    smoothing=None if key in UNSMOOTHED else SMOOTHING,
                )
            )
    for fn in reward_functions(rows):  # one curve per reward function, seeds overlaid
        key = f"rewards/{fn['name']}/mean"
        s = {f"seed{seed}": series(rows, key, seed) for seed in seeds}
        s = {k: v for k, v in s.items() if v}
        if not s:
            continue
        lowest = min(y for pts in s.values() for _, y in pts)
        out.append(svg_chart(s, title=f"reward {fn['name']} (mean)", y_floor=0.0 if lowest >= 0 else None, smoothing=SMOOTHING))
    first = seeds[0] if seeds else None
    rates = {what: series(rows, key, first) for key, what in THROUGHPUT}
    rates = {k: v for k, v in rates.items() if v}
    if rates:  # the first seed's: trained (prompt + completion through the policy) and generated tokens
        out.append(svg_chart(rates, title="tokens per second" + (f" (seed{first})" if len(seeds) > 1 else ""), y_floor=0.0))
    for key, title, floor, ceil in multi_turn_curves(rows):
        s = {f"seed{seed}": series(rows, key, seed) for seed in seeds}
        s = {k: v for k, v in s.items() if v}
        if s:
            out.append(svg_chart(s, title=title, y_floor=floor, y_ceil=ceil, smoothing=SMOOTHING))
    evals = eval_rows(data.events)
    for key, title, floor, ceil in EVALS:
        groups = before_after(evals, [(key, "")])
        if groups:
            out.append(svg_bars(groups, title=f"{title}: before and after training", y_floor=floor, y_ceil=ceil))
    temperature = ((data.spec or {}).get("train") or {}).get("temperature")
    scores = before_after(evals, score_measures(evals, temperature))
    if scores:  # greedy beside sampled (what GRPO optimizes) and pass@k, where the run has them
        out.append(svg_bars(scores, title="held-out score: before and after training", y_floor=0.0, y_ceil=1.0))
    return out


def score_measures(evals: list[dict], temperature=None) -> list[tuple[str, str]]:
    """(eval row key, label) of each held-out score the run recorded: greedy, sampled, pass@k."""
    keys = {k for r in evals for k, v in r.items() if v is not None}
    sampled = "sampled" + (f" (T {temperature:g})" if isinstance(temperature, (int, float)) else "")
    out = [(k, label) for k, label in (("eval_score", "greedy"), ("eval_score_sampled", sampled)) if k in keys]
    passes = sorted((k for k in keys if k.startswith("eval_pass@")), key=lambda k: (len(k), k))
    return out + [(k, k.removeprefix("eval_")) for k in passes]


def before_after(evals: list[dict], measures: list[tuple[str, str]]) -> dict[str, tuple[float | None, float | None]]:
    """label -> (before, after) per measure and seed: the first evaluation before training and the last after."""
    seeds = sorted({r["seed"] for r in evals})
    groups = {}
    for key, label in measures:
        for seed in seeds:
            mine = [r for r in evals if r["seed"] == seed and r.get(key) is not None]
            before = next((float(r[key]) for r in mine if r["when"] == "before"), None)
            after = next((float(r[key]) for r in reversed(mine) if r["when"] == "after"), None)
            if before is not None or after is not None:
                name = " ".join(x for x in (label, f"seed{seed}" if len(seeds) > 1 or not label else "") if x)
                groups[name] = (before, after)
    return groups


def _eval_section(data: RunData) -> str:
    rows = []
    for seed, m in sorted(data.metrics.items()):
        b, a = (m.before or Evaluation()).figures, (m.after or Evaluation()).figures
        for k in sorted(set(b) | set(a)):
            rows.append([f"seed{seed}", k, b.get(k), a.get(k)])
    harness = _harness_section(data)
    if not rows:
        return '<p class="muted">no evaluation recorded (eval_samples = 0, or the run has not finished)</p>' + harness
    return (
        "<p>protocol: the training prompt (the task's own held-out split, scored by its reward)</p>"
        + _table(["seed", "metric", "before", "after"], rows)
        + _validation_notes(data)
        + harness
    )


def _harness_section(data: RunData) -> str:
    """lm-evaluation-harness, base -> adapter, each score with its protocol; and the seconds it took
    beside the training's."""
    from autoslm.recipes.harness import block_words, metric_rows, protocol_words, time_words

    rows, said = [], []
    for seed, m in sorted(data.metrics.items()):
        block = m.lm_eval
        if not block:
            continue
        for r in metric_rows(block):
            rows.append([f"seed{seed}", r["task"], r["metric"], r["base"], r["adapter"], protocol_words(block, r)])
        words = "; ".join(
            x for x in (time_words(m.train_time_s, m.lm_eval_time_s), *block_words(block)) if x
        )  # each only where it is known
        if words:
            said.append(f"seed{seed}: {words}")
    if not said and not rows:
        return ""
    notes = "".join(f"<p class='muted'>{_esc(x)}</p>" for x in said)
    return (
        "<h3>lm-evaluation-harness (base -> adapter)</h3>"
        + (_table(["seed", "task", "metric", "base", "adapter", "protocol"], rows) if rows else "")
        + notes
    )


def _validation_notes(data: RunData) -> str:
    """What [eval] decided per seed: the step of the adapter handed back, and an early stop."""
    items = []
    for seed, m in sorted(data.metrics.items()):
        said = [x for x in (m.stop_reason and f"stopped early: {m.stop_reason}", m.note) if x]
        if not said and m.validation and m.validation.keep_best and m.after_step is not None:
            said.append(f"adapter from step {m.after_step}, the best evaluation by {m.validation.metric}")
        items += [f"<li>seed{_esc(seed)}: {_esc(x)}</li>" for x in said]
    return f"<ul>{''.join(items)}</ul>" if items else ""


def _rewards_section(data: RunData) -> str:
    """Each reward function's mean at the first and last logged step, its last std, and its errors."""
    found = reward_functions(train_rows(data.events), data.events)
    if not found:
        return ""
    num = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731 - no mean: it raised on every completion
    rows = [[f["name"], num(f["first"], ".4g"), num(f["last"], ".4g"), num(f["std"], ".3g"), f["errors"]] for f in found]
    return "<h2>Reward functions</h2>" + _table(
        ["function", "first step mean", "last step mean", "last step std", "completions it raised on"], rows
    )


def _cost_section(st: RunStatus) -> str:
    rows = [["total", f"${st.cost_usd:.4f}" if st.cost_usd is not None else "unknown (followed from the store)"]]
    for s in st.seeds:
        rows.append(
            [
                f"seed{s.seed}",
                f"${s.cost_usd:.4f} on {s.provider or '?'} {s.gpu or ''}, {s.restarts} restart(s), attempt {s.attempt}",
            ]
        )
    return _table(None, rows, row_heads=True) + _nodes_section(st)


def _nodes_section(st: RunStatus) -> str:
    """A replica of several pods (compute.nodes): each seed's nodes, which holds rank 0, and each one's
    state at the last look."""
    rows = [
        [f"seed{s.seed}", f"node {n.node}", ", ".join(map(str, n.ranks)), n.pod_id or "-", node_words(n).split(": ", 1)[1]]
        for s in st.seeds
        for n in s.nodes
    ]
    if not rows:
        return ""
    return "<h3>nodes</h3>" + _table(["seed", "node", "training ranks (rank 0 reports)", "pod", "state"], rows)


def _timeline_section(data: RunData) -> str:
    t = timeline(data.events)
    rows = [[_when(e["time"]), f"seed{e['seed']}", e["step"], e["kind"], e["text"]] for e in t]
    out = _table(["time", "seed", "step", "stage", "what"], rows) if rows else '<p class="muted">no events yet</p>'
    rs = restarts(data.events)
    if rs:
        out += "<h3>restarts</h3>" + _table(
            ["time", "seed", "attempt", "reason"], [[_when(r["time"]), f"seed{r['seed']}", r["attempt"], r["reason"]] for r in rs]
        )
    return out


def _rollout_section(data: RunData) -> str:
    found = rollouts(data.events)
    if not found:
        return ""
    parts = ["<h2>Sample rollouts</h2>"]
    for r in found:
        parts.append(f"<h3>step {r['step']} (seed{r['seed']})</h3>")
        for s in r["samples"][:4]:
            rewards = ", ".join(
                f"{k} {v:.3g}" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in (s.get("rewards") or {}).items()
            )
            text = _messages_text(s.get("transcript") or s.get("completion"))
            parts.append(f"<p class='muted'>rewards: {_esc(rewards)}</p><pre>{_esc(text)}</pre>")
    return "\n".join(parts)


def _messages_text(x) -> str:
    """A completion or transcript as readable lines ("assistant: ..."), whatever shape TRL logged."""
    if isinstance(x, str):
        return x
    if isinstance(x, list) and all(isinstance(m, dict) and "role" in m for m in x):
        lines = []
        for m in x:
            content = m.get("content")
            if not isinstance(content, str):
                content = json.dumps(content, ensure_ascii=False)
            calls = m.get("tool_calls")
            lines.append(
                f"{m['role']}: {content}" + (f"  [tool calls: {json.dumps(calls, ensure_ascii=False)}]" if calls else "")
            )
        return "\n".join(lines)
    return json.dumps(x, indent=1, ensure_ascii=False)


def render_html(data: RunData) -> str:
    st, spec = data.status, data.spec or {}
    train = spec.get("train") or {}
    title = f"autoslm run {st.run_id}"
    head = [
        ["state", st.state],
        ["method", train.get("method") or st.phase],
        ["model", spec.get("model")],
        ["task", (spec.get("environment") or {}).get("id")],
        ["steps", f"{st.step}/{st.total_steps}"],
        ["store", st.store],
    ]
    if st.end_reason:  # why it ended (controller/state.EndReason), beside its state
        head.insert(1, ["end reason", st.end_reason.words])
    rate = throughput(train_rows(data.events))
    if rate != "-":
        head.append(["tokens/s (last logged)", rate])
    if st.error:
        head.append(["error", st.error])
    if st.adapter:
        head.append(["adapter", st.adapter])
    for seed, m in sorted((st.metrics or {}).items()):
        if m.stop_reason:  # why training stopped short: [eval] stop_at, a limit
            head.append([f"stopped ({seed})", m.stop_reason])
    for name, url in (st.trackers or {}).items():
        head.append([f"tracker ({name})", url])
    curves = charts(data)
    body = [
        f"<h1>{_esc(title)}</h1>",
        f"<p class='muted'>report written {_when(time.time())}</p>",
        _table(None, head, row_heads=True),
        "<h2>Curves</h2>",
        "<div class='charts'>" + ("\n".join(curves) or '<p class="muted">no steps logged yet</p>') + "</div>",
        _rewards_section(data),
        "<h2>Eval before and after</h2>",
        _eval_section(data),
        "<h2>Cost</h2>",
        _cost_section(st),
        "<h2>Timeline</h2>",
        _timeline_section(data),
        _rollout_section(data),
        "<h2>Spec</h2>",
        f"<pre>{_esc(json.dumps(spec, indent=2))}</pre>",
    ]
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{_esc(title)}</title>"
        f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
    return redact(page)  # error texts and rollouts come from the worker: scrub them once more


def write_report(client, ref: str, out=None):
    """Collect a run and write its report; returns the path written."""
    from dataclasses import replace
    from pathlib import Path

    from autoslm.layout import tracker_urls
    from autoslm.views.runview import collect

    data = collect(client, ref)
    if data.status.trackers is None:  # a run followed through its store: its events name them
        data.status = replace(data.status, trackers=tracker_urls(data.events))
    path = Path(out) if out else Path.cwd() / f"{data.run_id}-report.html"
    path.write_text(render_html(data), encoding="utf-8")
    return path
