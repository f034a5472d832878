"""What one run looked like, as plain data: its status, spec, events, curves, timeline and rollouts.

Shared by ``autoslm watch``, ``autoslm report``, ``autoslm push`` and the notebook frames. It reads
through the SDK's Client (the registry for runs launched here, the store for ``hf://`` references)
and must stay light: no pandas, no matplotlib, no torch; the CLI imports it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from autoslm.controller.nodes import node_words
from autoslm.controller.seed_metrics import SeedMetrics
from autoslm.controller.status import RunStatus, SeedStatus, TeardownStatus
from autoslm.layout import RunPaths
from autoslm.store import RunArtifacts

# TRL's log keys -> the names the frames, report and watch use (others pass through unchanged).
RENAME = {"train_tokens_per_second": "tokens_per_s", "rewards/std": "reward_std"}
# Event kinds that mark a stage of a run's life, with how to say them in one line.
STAGE_EVENTS = (
    "worker_start",
    "model_loaded",
    "eval",
    "train_begin",
    "resume",
    "checkpoint",
    "error",
    "done",
    "already_done",
    "preempted",
    "prompts_dropped",
    "generation",
    "tracker",
)
SPARK = "▁▂▃▄▅▆▇█"


@dataclass
class RunData:
    ref: str  # run id, or hf://owner/repo/<phase>/<run_id>[/seedN]
    status: RunStatus
    spec: dict | None
    events: list[dict] = field(default_factory=list)  # each with "seed"
    metrics: dict[int, SeedMetrics] = field(default_factory=dict)  # seed -> its metrics.json

    @property
    def run_id(self) -> str:
        return self.status.run_id

    def train_rows(self) -> list[dict]:
        return train_rows(self.events)

    def eval_rows(self) -> list[dict]:
        return eval_rows(self.events)


def artifacts_of(client, ref: str) -> tuple[str, list[RunArtifacts]]:
    """(run id, one RunArtifacts per seed) for a run id, a unique prefix, or an hf:// reference."""
    if ref.startswith("hf://"):
        from autoslm.layout import parse_remote

        uri, paths = parse_remote(ref)
        return paths.run_id, [RunArtifacts(client.stores(uri), paths)]
    run = client.resolve(ref)
    store = client.stores(run.store_uri)
    return run.run_id, [
        RunArtifacts(store, RunPaths(run.phase, run.run_id, r.seed)) for r in client.registry.replicas(run.run_id)
    ]


def read_events(client, ref: str) -> list[dict]:
    _, arts = artifacts_of(client, ref)
    out = []
    for art in arts:
        out += [{"seed": art.paths.seed, **e.model_dump()} for e in art.read_events()]
    return sorted(out, key=lambda e: e["time"])


def collect(client, ref: str, *, tick: bool = True) -> RunData:
    """Everything the views need about one run, in one pass over the store."""
    if ref.startswith("hf://"):
        status = client.status(ref)
    else:
        status = client.status(ref, tick=tick)
        ref = status.run_id
    _, arts = artifacts_of(client, ref)
    spec = None
    if not ref.startswith("hf://"):
        spec = json.loads(client.resolve(ref).spec_json)
    events, metrics = [], {}
    for art in arts:
        events += [{"seed": art.paths.seed, **e.model_dump()} for e in art.read_events()]
        m = art.get_metrics()
        if m:
            metrics[art.paths.seed] = SeedMetrics.of(m)
        if spec is None:
            meta = art.get_json(art.paths.train_meta) or {}
            spec = meta.get("spec")
    events.sort(key=lambda e: e["time"])
    return RunData(ref=ref, status=status, spec=spec, events=events, metrics=metrics)


def train_rows(events: list[dict]) -> list[dict]:
    """One row per (seed, step) from the "step" events; a step logged twice (after a resume, or the
    trainer's closing log) keeps the last value of each key."""
    rows: dict[tuple[int, int], dict] = {}
    for e in events:
        if e.get("kind") != "step" or e.get("step") is None:
            continue
        row = {"seed": e.get("seed", 0), "step": e["step"], "kind": "train", "time": e["time"]}
        for k, v in (e.get("data") or {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                row[RENAME.get(k, k)] = v
        # The trainer's closing log (runtime, train_loss) repeats the last step: it adds to that step's row.
        rows[(row["seed"], row["step"])] = {**rows.get((row["seed"], row["step"]), {}), **row}
    return [rows[k] for k in sorted(rows)]


def eval_rows(events: list[dict]) -> list[dict]:
    """One row per held-out evaluation (before, during, after training)."""
    out = []
    for e in events:
        if e.get("kind") != "eval":
            continue
        d = e.get("data") or {}
        row = {
            "seed": e.get("seed", 0),
            "step": e.get("step") or 0,
            "kind": "eval",
            "time": e["time"],
            "when": d.get("when"),
            "eval_loss": d.get("loss"),
            "eval_score": d.get("score"),
            "eval_n": d.get("n"),
        }
        # GRPO's score at the training temperature, and pass@k where the run's validation draws k samples.
        for k, v in d.items():
            if (k == "score_sampled" or k.startswith("pass@")) and isinstance(v, (int, float)) and not isinstance(v, bool):
                row[f"eval_{k}"] = v
        out.append(row)
    return out


def reward_functions(rows: list[dict], events: list[dict] | None = None) -> list[dict]:
    """Each reward function's numbers from TRL's per-step ``rewards/<name>/mean`` and ``/std`` (first
    seed): its first and last mean, last std, and how many completions it raised on (``on_reward_error
    = "none"``, from the "rewards" events)."""
    seed = rows[0]["seed"] if rows else None
    names = list(
        dict.fromkeys(
            k.split("/")[1] for r in rows for k in r if k.startswith("rewards/") and k.endswith("/mean") and k.count("/") == 2
        )
    )
    errors: dict[str, int] = {}
    for e in events or []:
        if e.get("kind") == "rewards" and e.get("seed", 0) == (seed or 0):
            for k, v in (e.get("data") or {}).items():
                if k.startswith("reward_errors/") and isinstance(v, (int, float)):
                    errors[k.split("/", 1)[1]] = errors.get(k.split("/", 1)[1], 0) + int(v)
    out = []
    for name in names + [n for n in errors if n not in names]:  # a function that always raised has no mean
        means = series(rows, f"rewards/{name}/mean", seed)
        stds = series(rows, f"rewards/{name}/std", seed)
        out.append(
            {
                "name": name,
                "first": means[0][1] if means else None,
                "last": means[-1][1] if means else None,
                "std": stds[-1][1] if stds else None,
                "steps": len(means),
                "errors": errors.get(name, 0),
            }
        )
    return out


def series(rows: list[dict], key: str, seed: int | None = None) -> list[tuple[float, float]]:
    return [(r["step"], float(r[key])) for r in rows if r.get(key) is not None and (seed is None or r["seed"] == seed)]


def main_curve(rows: list[dict]) -> tuple[str, list[tuple[float, float]]]:
    """The curve a glance wants: reward for GRPO runs, loss otherwise."""
    for key in ("reward", "loss"):
        s = series(rows, key, seed=rows[0]["seed"] if rows else None)
        if s:
            return key, s
    return "loss", []


def throughput(rows: list[dict]) -> str:
    """The last logged tokens per second, saying which: "1,234 trained, 456 generated" (GRPO counts
    both: prompt + completion tokens through the policy, and completion tokens written), "-" before any."""

    def last(*keys: str) -> float | None:
        return next((r[k] for r in reversed(rows) for k in keys if r.get(k)), None)

    parts = [
        f"{v:,.0f} {what}"
        for v, what in ((last("trained_tokens_per_s", "tokens_per_s"), "trained"), (last("generated_tokens_per_s"), "generated"))
        if v
    ]
    return ", ".join(parts) or "-"


def sparkline(values: list[float], width: int = 40) -> str:
    if not values:
        return ""
    if len(values) > width:  # keep the shape: average into ``width`` buckets
        n = len(values)
        values = [
            sum(values[i * n // width : (i + 1) * n // width]) / max(1, (i + 1) * n // width - i * n // width)
            for i in range(width)
        ]
    lo, hi = min(values), max(values)
    span = hi - lo or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, int((v - lo) / span * (len(SPARK) - 1) + 0.5))] for v in values)


def stage_words(stage: str | None, message: str | None) -> str:
    """A seed's stage as a user reads it: a held-out evaluation beats under "training" or "saving" with its
    progress as the message ("evaluating (after): 640/1319", engine/pod/heartbeat.py), and that is what it does."""
    if message and message.startswith("evaluating"):
        return message.replace(":", "", 1)
    if message and message.startswith("serving ") and stage == "training":  # a serve (`autoslm serve`) beats as training
        return "serving"
    return stage or "-"


def seed_lines(s: SeedStatus, *, live: bool) -> list[str]:
    """`status`'s lines for one seed: state, step, stage, pod (where it has one); while it lives, its last
    heartbeat's message where the stage does not already say it; each node of a replica of several pods
    (which holds rank 0, and its state); and a pod whose teardown keeps failing."""
    age = s.last_heartbeat_age_s
    stage = stage_words(s.stage, s.message)
    out = [
        f"  seed{s.seed}: {s.state} step {s.step}/{s.total_steps} stage {stage}"
        + (f" pod {s.pod_id}" if s.pod_id else "")
        + (f" on {s.gpu}" if s.gpu else "")
        + f" restarts {s.restarts}"
        + (f" heartbeat {age:.0f}s ago" if age is not None else "")
    ]
    if s.message and live and (stage == (s.stage or "-") or stage == "serving"):
        out.append(f"    {s.message}")
    out += [f"    {node_words(n)}" + (f" pod {n.pod_id}" if n.pod_id else "") for n in s.nodes]
    if s.teardown is not None:
        out += teardown_lines(s.teardown)
    return out


def duration(seconds: float | None) -> str:
    """ "1h 05m", "12m 30s", "45s"."""
    s = int(seconds or 0)
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 60}m {s % 60:02d}s" if s >= 60 else f"{s}s"


def teardown_lines(td: TeardownStatus) -> list[str]:
    """A pod whose terminate keeps failing: it may still bill, and what to do about it."""
    import time

    since = f" since {time.strftime('%H:%M:%S', time.localtime(td.since))}" if td.since else ""
    where = f" in {td.vendor or td.provider}'s console ({td.pods_page})" if td.pods_page else ""
    out = [
        f"    teardown failing: ending {td.provider} pod {td.pod_id} was refused {td.failures} time"
        + ("s" if td.failures != 1 else "")
        + f"{since}; it may still be billing"
    ]
    if td.error:
        out.append(f"      last refusal: {td.error}")
    out.append(
        f"      autoslm tries again at each look; to stop paying now, end pod {td.pod_id}{where}, "
        f"or run `autoslm gc` once {td.provider} answers again"
    )
    return out


def device_words(events: list[dict], seed: int = 0) -> str | None:
    """The device a seed's worker said it loaded the model on (its newest "model_loaded" event): the
    GPU's name, or "CPU"; None before it said (or from a worker that did not)."""
    for e in reversed(events):
        if e.get("kind") == "model_loaded" and e.get("seed", 0) == seed:
            device = (e.get("data") or {}).get("device") or {}
            if device.get("kind") == "cuda":
                return device.get("name") or "CUDA GPU"
            if device.get("kind") == "cpu":
                return "CPU"
    return None


def describe(e: dict) -> str:
    """One line for an event in a timeline."""
    d, kind = e.get("data") or {}, e.get("kind")
    if kind == "worker_start":
        return f"worker started (attempt {d.get('attempt')}, host {d.get('host')})"
    if kind == "model_loaded":
        return f"model {d.get('model')} loaded in {d.get('seconds')}s"
    if kind == "eval":
        parts = [f"{k} {d[k]:.4g}" for k in ("loss", "score") if isinstance(d.get(k), (int, float))]
        return f"eval {d.get('when')}: " + ", ".join(parts)
    if kind == "train_begin":
        return f"training began ({d.get('max_steps')} steps)"
    if kind == "resume":
        return f"resumed from the checkpoint at step {d.get('from_step')}"
    if kind == "checkpoint":
        return "final checkpoint saved" if d.get("final") else "checkpoint saved"
    if kind == "error":
        return f"error ({'will retry' if d.get('retryable') else 'fatal'}): {d.get('message')}"
    if kind == "done":
        loss = d.get("final_loss")
        return f"done at step {d.get('steps')}" + (f", final loss {loss:.4g}" if isinstance(loss, (int, float)) else "")
    if kind == "tracker":
        return f"tracker {d.get('name')}: {d.get('url')}"
    text = ", ".join(f"{k}={v}" for k, v in d.items() if not isinstance(v, (dict, list)))
    return f"{kind}" + (f": {text}" if text else "")


def event_line(e: dict) -> str:
    """One event as a line a person reads (`autoslm logs`): when, which seed, at which step, what."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.get("time") or 0))
    step = f" step {e['step']}" if e.get("step") is not None else ""
    return f"{when} seed{e.get('seed', 0)}{step}: {describe(e)}"


def timeline(events: list[dict]) -> list[dict]:
    """Stages and restarts with their reasons, in order (per-step events left out)."""
    return [
        {"time": e["time"], "seed": e.get("seed", 0), "step": e.get("step"), "kind": e["kind"], "text": describe(e)}
        for e in events
        if e.get("kind") in STAGE_EVENTS
    ]


def restarts(events: list[dict]) -> list[dict]:
    """Each worker start after the first, with the reason the previous attempt ended (its last error)."""
    out, last_error = [], {}
    for e in events:
        seed = e.get("seed", 0)
        if e["kind"] == "error":
            last_error[seed] = (e.get("data") or {}).get("message")
        if e["kind"] == "worker_start" and (e.get("data") or {}).get("attempt", 1) > 1:
            out.append(
                {
                    "time": e["time"],
                    "seed": seed,
                    "attempt": e["data"]["attempt"],
                    "reason": last_error.pop(seed, None) or "the pod stopped without a word (preempted or lost)",
                }
            )
    return out


def rollouts(events: list[dict], steps: int = 3) -> list[dict]:
    """Sample GRPO rollouts from the last few steps that logged some."""
    found: dict[tuple[int, int], dict] = {}  # one per (seed, step): the last logged wins
    for e in events:
        if e.get("kind") == "rollout" and (e.get("data") or {}).get("samples"):
            found[(e.get("seed", 0), e.get("step") or 0)] = e
    last = sorted(found.values(), key=lambda e: e["time"])[-steps:]
    return [{"step": e.get("step"), "seed": e.get("seed", 0), "samples": e["data"]["samples"]} for e in last]


def final_metrics(data: RunData) -> dict:
    """The numbers a model card or a report headline wants, from the first seed's metrics.json."""
    if not data.metrics:
        return {}
    m = data.metrics[min(data.metrics)]
    named = (
        ("steps", m.steps),
        ("final_loss", m.final_loss),
        ("tokens_per_s", m.tokens_per_s),
        ("train_time_s", m.train_time_s),
        ("reward_first", m.reward_first),
        ("reward_last", m.reward_last),
    )
    out = {k: v for k, v in named if v is not None}
    for when, ev in (("before", m.before), ("after", m.after)):
        for k, v in (ev.figures if ev else {}).items():
            if isinstance(v, (int, float)):
                out[f"eval_{k}_{when}"] = v
    return out
