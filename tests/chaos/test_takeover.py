"""Chaos, fourth part: a frozen supervisor neither stalls its run nor rewrites its bill.

The real CLI as separate processes against the fake RunPod and fake Hub (the rig of test_chaos.py).
A supervisor stopped (SIGSTOP) between two looks keeps its supervisor lease; after its pod is
preempted, one `autoslm status` relaunches it and starts a supervisor in its place, which takes the
stale lease over and handles the next preemption with no command typed. A supervisor stopped in the middle of a look, taken over by `cancel` and resumed
100 s later finds its lease moved on (the fencing token) and exits having written nothing: the
run's bill stays the pod's real life.

    .venv/bin/python -m pytest -q tests/chaos/test_takeover.py
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time

from tests.chaos.test_chaos import (  # noqa: F401 - fixtures
    assert_no_pod_left,
    fake,
    homes,
    hub,
    live_pods,
    pods_of,
    wait,
)
from tests.chaos.test_supervision import PRICE, alive, freeze_between_looks, freeze_mid_look, observe_end

# How long the frozen supervisor stays stopped (the cancel takes over after 15 s): long enough that a bill
# it wrote on resuming (the pod's life up to then) would be far past the 10% the bill check allows.
RESUME_AFTER_S = 45.0


def rows(h) -> dict:
    """What the registry holds of the run's replicas and ended pods (read-only, as another process would)."""
    db = sqlite3.connect(f"file:{h.path / 'registry.db'}?mode=ro", uri=True)
    try:
        return {
            "replicas": db.execute("SELECT * FROM replicas ORDER BY run_id, seed").fetchall(),
            "ended": db.execute("SELECT * FROM ended_pods ORDER BY pod_id").fetchall(),
        }
    finally:
        db.close()


def test_a_supervisor_frozen_between_looks_is_replaced_by_the_next_command_and_the_preempted_run_relaunched(fake, homes):
    h = homes()
    run_id = h.launch_detached(h.spec(steps=4000), poll_s=2.0)  # long sleeps: a stop lands between looks
    h.wait_training(run_id, attempt=1)
    (pod,) = live_pods(fake, run_id)
    frozen = h.daemon_pid(run_id)
    log = h.path / "supervisors" / f"{run_id}.log"
    freeze_between_looks(h, frozen)
    try:
        fake.preempt(pod.id)
        preempted = time.monotonic()
        r = h.cli("status", run_id)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "started a background supervisor" in r.stderr + r.stdout, r.stdout + r.stderr
        (second,) = wait(lambda: [p for p in live_pods(fake, run_id) if p.id != pod.id], 60, "a new pod", every=0.2)
        assert time.monotonic() - preempted < 60
        # The supervisor started in its place takes the stale supervisor lease over...
        wait(lambda: "in place of a stopped or silent supervisor" in log.read_text(), 40, "the takeover", every=0.2)
        replacement = h.daemon_pid(run_id)
        assert replacement != frozen and alive(replacement)
        # ...and keeps the run with no command typed: the next preemption is relaunched by it alone.
        h.wait_training(run_id, attempt=2, timeout=60)
        fake.preempt(second.id)
        preempted = time.monotonic()
        wait(
            lambda: [p for p in live_pods(fake, run_id) if p.id not in (pod.id, second.id)],
            60,
            "a third pod with no command typed",
            every=0.2,
        )
        assert time.monotonic() - preempted < 60
    finally:
        os.kill(frozen, signal.SIGCONT)
    # The frozen one, resumed, finds its supervisor lease taken over and exits; the replacement stays.
    wait(lambda: not alive(frozen), 30, "the resumed stale supervisor to exit")
    assert h.daemon_pid(run_id) == replacement and alive(replacement)
    assert len(pods_of(fake, run_id)) == 3, [p.name for p in pods_of(fake, run_id)]  # the resumed one created nothing
    assert "took it over while this supervisor was stalled" in log.read_text()
    assert h.cli("cancel", run_id).returncode == 0
    assert_no_pod_left(fake, run_id)


def test_a_supervisor_frozen_mid_look_and_resumed_after_cancel_writes_nothing_and_the_bill_is_the_pods_life(fake, homes):
    h = homes()
    run_id = h.launch_detached(h.spec(steps=2000), poll_s=0.3)
    h.wait_training(run_id, attempt=1)
    (pod,) = live_pods(fake, run_id)
    frozen = h.daemon_pid(run_id)
    freeze_mid_look(fake, frozen)
    stopped = time.monotonic()
    try:
        r = h.cli("cancel", run_id)
        assert r.returncode == 0 and "cancelled" in r.stdout, r.stdout + r.stderr
        ended = observe_end(fake, pod.id, 15)
        life = ended - pod.created_at
        st = h.status(run_id)
        assert st["state"] == "cancelled", st
        before = rows(h)
        time.sleep(max(0.0, RESUME_AFTER_S - (time.monotonic() - stopped)))
    finally:
        os.kill(frozen, signal.SIGCONT)
    wait(lambda: not alive(frozen), 60, "the resumed stale supervisor to exit")
    assert rows(h) == before, "the stale supervisor wrote to the registry after it was taken over"
    st = h.status(run_id)
    billed = st["cost_usd"]
    real = PRICE * life / 3600
    assert abs(billed - real) <= 0.10 * real, f"billed ${billed:.5f} for a pod that lived {life:.1f}s (${real:.5f})"
    log = (h.path / "supervisors" / f"{run_id}.log").read_text()
    assert "took it over while this supervisor was stalled" in log, log
    assert_no_pod_left(fake, run_id)
