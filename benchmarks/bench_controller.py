"""How fast does a preempted run train again, and how many provider calls does supervising cost?

    python benchmarks/bench_controller.py [--rounds 3] [--poll-s 1.0] [--runs 100]

Everything runs against the fake RunPod on 127.0.0.1, whose pods run the chaos suite's stand-in
worker (tests/chaos/standin_worker.py: real heartbeats, checkpoints every 5 steps, a 100 ms "step").

1. Preemption to the first new training step. A run is launched, preempted at step 17 (its last
   checkpoint is step 15), and ticked every ``--poll-s`` seconds by an in-process supervisor. It prints
   the time from the preemption to the first training step of the new pod, the steps lost (trained
   before the preemption, trained again after it), and, as the baseline measured in the same process,
   the time from a fresh launch to its first training step: the ratio says what recovery costs
   beyond a cold start (the detection delay is at most one poll).
2. Provider calls per run per poll with ``--runs`` concurrent runs: ticking each run on its own (what
   one background supervisor per detached run does), and ticking them all in one `autoslm list`
   (one list call per provider, shared by every run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: autoslm and tests.fakes

from autoslm.providers.http import RetryPolicy  # noqa: E402
from autoslm.providers.runpod.provider import RunPodProvider  # noqa: E402
from autoslm.sdk import Client  # noqa: E402
from autoslm.spec import JobSpec  # noqa: E402
from tests.fakes.runpod import FakeRunPod  # noqa: E402

STANDIN = str(Path(__file__).resolve().parents[1] / "tests" / "chaos" / "standin_worker.py")


def spec(store: Path, steps: int) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "bench",
            "model": "autoslm/tiny",
            "environment": {"id": "autoslm/arith"},
            "train": {"method": "sft", "max_steps": steps, "save_every": 5},
            "compute": {"provider": "runpod", "gpu": "RTX 4090"},
            "artifacts": {"store": "local", "path": str(store)},
            "limits": {"max_hours": 1, "max_restarts": 5},
        }
    )


def client_for(fake: FakeRunPod, home: Path) -> Client:
    rp = RunPodProvider(fake.api_key, base_url=fake.url, retry=RetryPolicy(attempts=3, backoff_s=0.05))
    return Client(home, providers=lambda name: rp)


def heartbeat(store: Path, run_id: str) -> dict | None:
    try:
        return json.loads((store / "sft" / run_id / "seed0" / "heartbeat.json").read_text())
    except (OSError, ValueError):
        return None


def until(
    store: Path, run_id: str, client: Client, poll_s: float, pred, timeout: float = 60.0, first_tick_s: float = 0.0
) -> tuple[float, dict]:
    """Tick every poll_s, watch the heartbeat every 5 ms; return (when pred held, that heartbeat)."""
    start = time.monotonic()
    next_tick = start + first_tick_s
    while time.monotonic() - start < timeout:
        hb = heartbeat(store, run_id)
        if hb and pred(hb):
            return time.monotonic(), hb
        if time.monotonic() >= next_tick:
            client.status(run_id)
            next_tick = time.monotonic() + poll_s
        time.sleep(0.005)
    raise SystemExit(f"timed out; last heartbeat {heartbeat(store, run_id)}")


def recovery(fake: FakeRunPod, tmp: Path, poll_s: float, rnd: int) -> dict:
    store, home = tmp / f"store{rnd}", tmp / f"home{rnd}"
    client = client_for(fake, home)
    t_launch = time.monotonic()
    run = client.launch(spec(store, 40), detach=True)
    t_first, _ = until(
        store, run.run_id, client, poll_s, lambda hb: hb["attempt"] == 1 and hb["stage"] == "training" and hb["step"] >= 1
    )
    _, hb = until(store, run.run_id, client, poll_s, lambda hb: hb["step"] >= 17)
    (pod,) = [p for p in fake.pods() if run.run_id in p.name and not p.deleted]
    fake.preempt(pod.id)
    t_pre = time.monotonic()
    step_at_preempt = heartbeat(store, run.run_id)["step"]
    t_back, hb2 = until(
        store,
        run.run_id,
        client,
        poll_s,
        lambda hb: hb["attempt"] == 2 and hb["stage"] == "training" and hb["step"] > hb["metrics"].get("resumed_from", 1e9),
        first_tick_s=poll_s / 2,
    )  # a preemption lands, on average, half a poll before the next look
    client.cancel(run.run_id)
    return {
        "cold_start_s": t_first - t_launch,
        "recovery_s": t_back - t_pre,
        "steps_lost": step_at_preempt - int(hb2["metrics"]["resumed_from"]),
    }


def calls_per_poll(fake: FakeRunPod, tmp: Path, runs: int, polls: int = 3) -> dict:
    client = client_for(fake, tmp / "home-many")
    ids = [client.launch(spec(tmp / "store-many", 1000), detach=True).run_id for _ in range(runs)]

    def provider_calls() -> int:
        return len(fake.requests)

    before = provider_calls()
    for _ in range(polls):
        for rid in ids:
            client.status(rid)
    per_run = (provider_calls() - before) / (runs * polls)
    before = provider_calls()
    for _ in range(polls):
        client.list_runs()
    shared = (provider_calls() - before) / (runs * polls)
    for rid in ids:
        client.cancel(rid)
    return {"per_run_supervisor": per_run, "shared_list": shared}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--poll-s", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=100)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        with FakeRunPod(
            workdir=tmp / "fake", worker_command=["python", STANDIN], terminate_grace_s=0.5, extra_env={"CHAOS_STEP_S": "0.1"}
        ) as fake:
            rows = [recovery(fake, tmp, args.poll_s, i) for i in range(args.rounds)]
        cold = statistics.median(r["cold_start_s"] for r in rows)
        rec = statistics.median(r["recovery_s"] for r in rows)
        lost = statistics.median(r["steps_lost"] for r in rows)
        print(
            f"preemption -> first new training step (poll every {args.poll_s:g} s, median of {args.rounds}): "
            f"{rec:.2f} s; cold start {cold:.2f} s; ratio {rec / cold:.2f}; steps lost {lost:g} "
            f"(checkpoint every 5 steps, preempted at step 17)"
        )
        with FakeRunPod(workdir=tmp / "fake-many", worker_command=["sleep", "600"], terminate_grace_s=0.1) as fake:
            c = calls_per_poll(fake, tmp, args.runs)
        print(
            f"provider calls per run per poll with {args.runs} runs: {c['per_run_supervisor']:.2f} ticking each run "
            f"(one supervisor per run), {c['shared_list']:.3f} in one `autoslm list` (shared list call)"
        )


if __name__ == "__main__":
    main()
