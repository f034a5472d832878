"""Chaos, third part: one create per intent, every pod billed, no process killed by the registry.

The real CLI as separate processes against the fake RunPod and fake Hub (the rig of test_chaos.py):
a launch interrupted (SIGINT, SIGHUP, SIGTERM) while its create is held leaves at most one pod and a
supervisor; a create that answered 500 and landed later is found, billed and ended; a registry made
immutable while a run is live kills nothing and is caught up with once writable; a frozen
supervisor's run is taken over by `cancel`; a worker with max_usd and no price refuses to train; a
worker that checkpoints thirty times faster than its commit budget keeps its heartbeat fresh.

    .venv/bin/python -m pytest -q tests/chaos/test_gaps.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from autoslm.controller.podnames import home_id
from tests.chaos.test_chaos import (  # noqa: F401 - fixtures
    PROMPT_EXIT_S,
    REPO,
    assert_no_pod_left,
    fake,
    homes,
    hub,
    interrupt,
    live_pods,
    pods_of,
    wait,
)
from tests.chaos.test_supervision import PRICE, alive, freeze_mid_look, observe_end, run_id_of

CREATE = {"method": "POST", "path": "/v2/pods"}


def creates(fake) -> int:
    return sum(1 for m, p, _ in fake.requests if m == "POST" and p == "/v2/pods")


class MostLive:
    """Watch the cloud: the most live pods one run ever had at once."""

    def __init__(self, fake, run_id_part: str):
        self.fake, self.part, self.most = fake, run_id_part, 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._watch, daemon=True)
        self._t.start()

    def _watch(self):
        while not self._stop.is_set():
            self.most = max(self.most, len([p for p in self.fake.pods() if self.part in p.name and not p.deleted]))
            time.sleep(0.01)

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return self.most


# -- 1. an interrupted launch: one create per intent ----------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP, signal.SIGTERM], ids=["SIGINT", "SIGHUP", "SIGTERM"])
def test_a_launch_interrupted_while_its_create_is_held_leaves_one_pod_and_a_supervisor(fake, homes, sig):
    h = homes()
    mine = f"-h{home_id(h.path)}"
    # This home's create: held, and the vendor acts on it only once released.
    held = fake.hang_next(1, seconds=300, apply="late", body_has=mine, **CREATE)
    proc = h.start("launch", str(h.spec(steps=400)), "--yes", "--poll-s", "0.3")
    fake.wait_held(held, timeout=120)  # the launch waits inside its create
    watch = MostLive(fake, mine)
    out, err, took = interrupt(proc, sig)  # Ctrl-C, a closed terminal, a `kill`
    assert took < PROMPT_EXIT_S, f"{took:.1f}s from {sig.name} to exit: {out + err}"
    assert "launched" not in out, out + err  # interrupted inside the create, not while following
    run_id = run_id_of(out + err)
    pid = h.daemon_pid(run_id)
    assert pid and alive(pid), out + err  # a supervisor keeps the run
    # While the create is still held, the supervisor looks again and again and must not create the
    # name again; then the held create lands, and it adopts that pod.
    looked = len(fake.requests)
    wait(lambda: sum(1 for m, *_ in fake.requests[looked:] if m == "GET") >= 6, 120, "the supervisor to look several times")
    assert not [r for r in fake.requests[looked:] if r[:2] == ("POST", "/v2/pods")], fake.requests[looked:]  # no second create
    fake.release_holds()
    (pod,) = wait(lambda: pods_of(fake, run_id), 60, "the held create to land")
    wait(lambda: h.status(run_id)["seeds"][0]["pod_id"] == pod.id, 120, "the supervisor to adopt the pod that landed")
    assert watch.stop() == 1 and len(pods_of(fake, run_id)) == 1, [p.name for p in pods_of(fake, run_id)]
    r = h.cli("cancel", run_id)
    assert r.returncode == 0, r.stdout + r.stderr
    assert_no_pod_left(fake, run_id)


# -- 2. a create that answered 500 and landed later -------------------------------------------------------
def test_a_create_that_answered_500_and_landed_10s_later_is_found_billed_and_ended(fake, homes):
    h = homes()
    fake.fail_next(1, 500, land_after_s=10, **CREATE)  # the first create: 500, but the vendor makes it
    fake.fail_next(1000, 500, **CREATE)  # every retry: 500, nothing made
    r = h.cli("launch", str(h.spec(steps=400)), "--yes", "--detach", "--poll-s", "0.3")
    assert r.returncode == 3, r.stdout + r.stderr
    run_id = run_id_of(r.stderr)
    assert "may still land" in r.stderr and "supervisor" in r.stderr, r.stderr
    # Each wait ends when what it names happens; its bound is room for a loaded machine, not a pace.
    (pod,) = wait(lambda: pods_of(fake, run_id), 90, "the late pod")
    fake.clear_faults()
    observe_end(fake, pod.id, 90)
    ended = fake.pod(pod.id).deleted_at  # when the DELETE reached the vendor (the test sees it later)
    # The supervisor writes the bill when its look ends, after the DELETE returned: read once it is done.
    wait(lambda: h.daemon_pid(run_id) is None or not alive(h.daemon_pid(run_id)), 90, "the supervisor to finish")
    st = h.status(run_id)
    assert st["state"] == "failed" and "launch failed" in st["error"], st
    # Billed from its create (the intent, written before the first create was sent) to its end.
    billed = PRICE * (ended - pod.created_at + 10) / 3600
    assert st["cost_usd"] + 0.00005 >= billed, (billed, st, r.stderr, h.supervisor_log(run_id))
    assert len(pods_of(fake, run_id)) == 1
    assert_no_pod_left(fake, run_id)


# -- 3. a registry made immutable while a run is live -------------------------------------------------------
def test_an_immutable_registry_kills_no_process_and_the_run_catches_up_once_writable(fake, homes):
    h = homes()
    run_id = h.launch_detached(h.spec(steps=400), poll_s=0.3)
    h.wait_training(run_id, attempt=1)
    daemon = h.daemon_pid(run_id)
    db = h.path / "registry.db"
    if subprocess.run(["chattr", "+i", str(db)], capture_output=True).returncode != 0:
        pytest.skip("cannot make a file immutable here (chattr +i)")
    try:
        (pod,) = live_pods(fake, run_id)
        fake.preempt(pod.id)
        for args in (("status", run_id, "--json"), ("list",), ("gc",)):
            r = h.cli(*args)
            # An error (or an answer from what was recorded), never a death by a signal.
            assert r.returncode >= 0 and "Fatal Python error" not in r.stderr, (args, r.returncode, r.stderr)
            assert "internal error" not in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
            assert "damaged" not in r.stderr and "move it aside" not in r.stderr, (args, r.stderr)  # it is not
        time.sleep(2)
        assert alive(daemon), "the supervisor died while the registry was read-only"
        assert len(pods_of(fake, run_id)) == 1  # nothing created while nothing could be recorded
    finally:
        subprocess.run(["chattr", "-i", str(db)], check=True)
    t0 = time.time()
    wait(lambda: len(pods_of(fake, run_id)) == 2, 10, "the relaunch once the registry is writable", every=0.1)
    assert time.time() - t0 < 5, "not relaunched within a few polls"
    new = next(p for p in pods_of(fake, run_id) if not p.deleted)
    wait(lambda: h.status(run_id)["seeds"][0]["pod_id"] == new.id, 10, "the new pod to be recorded")
    assert alive(daemon)
    log = (h.path / "supervisors" / f"{run_id}.log").read_text()
    assert "damaged" not in log and "read-only" in log and "written again" in log, log
    assert h.cli("cancel", run_id).returncode == 0
    assert_no_pod_left(fake, run_id)


# -- 4. a frozen supervisor ---------------------------------------------------------------------------------
def test_cancel_takes_over_from_a_supervisor_frozen_mid_tick(fake, homes):
    h = homes()
    run_id = h.launch_detached(h.spec(steps=400), poll_s=0.3)
    h.wait_training(run_id, attempt=1)
    (pod,) = live_pods(fake, run_id)
    daemon = h.daemon_pid(run_id)
    freeze_mid_look(fake, daemon)  # stopped mid-tick
    try:
        t0 = time.time()
        r = h.cli("cancel", run_id)
        took = time.time() - t0
        assert r.returncode == 0 and "running" not in r.stdout.split("cancelled", 1)[0][-40:], r.stdout + r.stderr
        assert "cancelled" in r.stdout, r.stdout + r.stderr
        assert took < 40, f"cancel took {took:.0f}s to take over"
        observe_end(fake, pod.id, 15)
    finally:
        os.kill(daemon, signal.SIGCONT)
    assert h.status(run_id)["state"] == "cancelled"
    assert_no_pod_left(fake, run_id)


# -- 5. the in-pod money guard needs a price ----------------------------------------------------------------
def test_a_worker_with_max_usd_and_no_price_refuses_to_train_naming_the_variable(homes, tmp_path):
    h = homes()
    spec = h.spec(steps=10, extra="max_usd = 1.0")
    from autoslm.spec import load_spec

    store = tmp_path / "store"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOSLM_")}
    env.update(
        {
            "AUTOSLM_JOBSPEC": load_spec(spec).to_json(),
            "AUTOSLM_RUN_ID": "chaos-20260101-000000-abcd",
            "AUTOSLM_STORE": f"file://{store}",
            "AUTOSLM_SEED": "0",
            "AUTOSLM_ATTEMPT": "1",
            "AUTOSLM_WORKDIR": str(tmp_path / "work"),
            "PYTHONPATH": str(REPO),
        }
    )
    r = subprocess.run(
        [sys.executable, "-m", "autoslm.engine"], capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=120
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "AUTOSLM_PRICE_PER_HOUR" in r.stdout + r.stderr and "max_usd" in r.stdout + r.stderr, r.stdout + r.stderr
    hb = json.loads((store / "sft" / "chaos-20260101-000000-abcd" / "seed0" / "heartbeat.json").read_text())
    assert hb["stage"] == "error" and hb["step"] == 0 and "AUTOSLM_PRICE_PER_HOUR" in hb["error"], hb


# -- 6. a second pod under a live run's name ------------------------------------------------------------------
def test_plain_gc_ends_and_bills_a_second_pod_under_a_live_runs_name_and_keeps_the_run(fake, homes):
    from autoslm.providers.http import RetryPolicy
    from autoslm.providers.runpod.provider import RunPodProvider
    from tests.chaos.test_chaos import KEY
    from tests.fakes.pods import pod_request

    h = homes()
    run_id = h.launch_detached(h.spec(steps=400), poll_s=30)  # a slow supervisor: gc is the one that looks
    (pod,) = wait(lambda: live_pods(fake, run_id), 30, "the pod")
    cost0 = h.status(run_id)["cost_usd"]
    # A create that landed beside it under the same name (a relaunch's, while the first was in flight).
    rp = RunPodProvider(KEY, base_url=fake.url, retry=RetryPolicy(attempts=2, backoff_s=0.01))
    spec = pod_request(pod.name, ["sleep", "60"], gpu_types=("RTX 4090",))
    offer = rp.offers(spec.wish)[0]
    dup = rp.api.create_pod(rp._create_body(spec, offer))["id"]
    time.sleep(2)
    r = h.cli("gc")
    assert r.returncode == 0, r.stdout + r.stderr
    ended = observe_end(fake, dup, 10)
    assert not fake.pod(pod.id).deleted, "the run's own pod stays"
    st = h.status(run_id)
    assert st["state"] in ("provisioning", "running") and st["seeds"][0]["pod_id"] == pod.id, st
    # Billed from its create: the run's bill grew by at least the duplicate's life.
    assert st["cost_usd"] - cost0 + 0.0001 >= PRICE * (ended - fake.pod(dup).created_at) / 3600, (st["cost_usd"], cost0)
    assert h.cli("cancel", run_id).returncode == 0
    assert_no_pod_left(fake, run_id)


# -- 7. checkpoints cannot starve the heartbeat ---------------------------------------------------------------
# `long` (make test-long): two and a half minutes of a worker checkpointing every second, watched.
@pytest.mark.long
def test_a_checkpoint_every_second_keeps_the_stores_heartbeat_within_its_timeout(fake, homes):
    # The Hub store's fastest budget (120 commits an hour: one every 30 s) and the shortest heartbeat
    # timeout it allows (90 s), with a checkpoint every second: thirty times what the budget carries.
    # Heartbeats and checkpoints go through the worker's own uploader. Were every commit a checkpoint's,
    # the store's heartbeat would age past 90 s within about two minutes and the supervisor would
    # replace a healthy worker.
    fake.extra_env["CHAOS_MODE"] = "uploader"
    h = homes()
    spec = h.spec(steps=2000, save_every=10, extra="heartbeat_timeout_s = 90")
    spec.write_text(spec.read_text().replace('store = "hf"', 'store = "hf"\ncommits_per_hour = 120'))
    run_id = h.launch_detached(spec, poll_s=1.0)
    wait(lambda: (h.heartbeat(run_id) or {}).get("stage") == "training", 60, "the first training heartbeat")
    start, oldest, steps = time.time(), 0.0, []
    while time.time() - start < 150:
        hb = h.heartbeat(run_id)
        oldest = max(oldest, time.time() - hb["time"])
        steps.append(hb["step"])
        assert oldest <= 90, f"the store's heartbeat is {oldest:.0f}s old (timeout 90 s) at step {hb['step']}"
        time.sleep(1.0)
    assert steps[-1] > steps[0] + 500, (steps[0], steps[-1])  # training went on, heartbeats followed it
    assert len(pods_of(fake, run_id)) == 1, "a healthy worker was replaced"
    checkpoints = [p for p in h.hub.files(h.repo) if "/checkpoint-" in p]
    assert checkpoints, "no checkpoint reached the store"
    st = h.status(run_id)
    assert st["state"] == "running", st
    assert h.cli("cancel", run_id).returncode == 0
    assert_no_pod_left(fake, run_id)


# -- launch rents what `plan` printed --------------------------------------------------------------------
@pytest.mark.parametrize(
    "model, gpus, train",
    [
        # 14B in bf16 does not fit a 4090 at any micro-batch: `plan` marks it no-fit, so the L40S is rented
        # although the 4090 comes first in compute.gpu.
        ("Qwen/Qwen3-14B", '["RTX 4090", "L40S"]', 'quantization = "none"'),
        # Both fit: `plan` chooses the cheaper 4090, listed second, and the launch rents that one.
        ("Qwen/Qwen3-0.6B", '["L40S", "RTX 4090"]', ""),
    ],
)
def test_launch_rents_the_offer_plan_chose(fake, homes, model, gpus, train):
    h = homes()
    spec = h.spec(steps=400, max_hours=100)  # limits with room: what decides here is the fit and the price
    text = spec.read_text().replace('model = "autoslm/tiny"', f'model = "{model}"').replace('gpu = "RTX 4090"', f"gpu = {gpus}")
    spec.write_text(text.replace("[train]\n", f"[train]\n{train}\n"))
    planned = h.cli("plan", str(spec), "--json")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    best = next(r for r in json.loads(planned.stdout) if r["usable"])
    before = len(fake.launch_calls)
    r = h.cli("launch", str(spec), "--yes", "--detach", "--poll-s", "0.3")
    assert r.returncode == 0, r.stdout + r.stderr
    run_id = next(line.split()[1] for line in r.stdout.splitlines() if line.startswith("run ") and " launched" in line)
    created = [c for c in fake.launch_calls[before:] if run_id in c.get("name", "")]
    assert [fake.gpus[c["gpu"]["id"]]["name"] for c in created] == [best["gpu"]], (best, created)
    assert f"{best['gpu']} at ${best['price_per_hour']:.3f}/hour, the offer `autoslm plan` chose" in r.stdout, r.stdout
    assert h.cli("cancel", run_id).returncode == 0
    assert_no_pod_left(fake, run_id)
