"""Sweeps against the fake RunPod (the stand-in worker, so a run takes seconds): the budget starts only
the members it covers and the sweep ends within it with no pod left; a sweep whose supervisor was
SIGKILLed is resumed by `status`, its remaining members started, none twice.

    .venv/bin/python -m pytest -q tests/chaos/test_sweeps.py
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

from autoslm.controller import sweeps
from autoslm.controller.registry import Registry
from autoslm.controller.sweeps import SweepBook
from tests.chaos.test_chaos import fake, homes, hub, live_pods, pods_of, wait  # noqa: F401 - fixtures
from tests.chaos.test_supervision import alive, freeze_between_looks, kill_supervisor


def sweep_spec(h, *, steps: int, sweep: str) -> str:
    return str(h.spec(steps=steps, extra=f"[sweep]\n{sweep}\n"))


def launch(h, spec: str) -> str:
    r = h.cli("launch", spec, "--yes", "--detach", "--poll-s", "0.3")
    assert r.returncode == 0, r.stdout + r.stderr
    return re.search(r"^sweep (\S+) launched", r.stdout, re.M).group(1)


def sweep_status(h, sweep_id: str) -> dict:
    r = h.cli("status", sweep_id, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def wait_done(h, sweep_id: str, timeout: float = 90) -> dict:
    return wait(
        lambda: (st := sweep_status(h, sweep_id))["state"] not in ("running", "pending") and st,
        timeout,
        f"sweep {sweep_id} to end",
        every=0.5,
    )


def test_a_sweep_whose_cap_covers_two_of_four_points_starts_only_those_and_ends_within_it(fake, homes):
    h = homes()
    lrs = '"train.learning_rate" = [1e-4, 2e-4, 3e-4, 4e-4]\nmax_parallel = 4'
    r = h.cli("plan", sweep_spec(h, steps=30, sweep=lrs), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    plan = json.loads(r.stdout)
    each = plan["points"][0]["estimated_cost_usd"]
    assert each > 0 and plan["sweep"]["runs"] == 4 and plan["sweep"]["runs_covered"] == 4, plan
    cap = round(each * 2.6, 4)  # two runs at their estimate, not three
    spec = sweep_spec(h, steps=30, sweep=f"{lrs}\nmax_usd = {cap}")
    r = h.cli("plan", spec)
    assert r.returncode == 0 and "covers 2 of the 4 runs" in r.stdout, r.stdout + r.stderr
    # A cap under the cheapest run is refused, before anything is created.
    r = h.cli("launch", sweep_spec(h, steps=30, sweep=f"{lrs}\nmax_usd = {each / 2:.6f}"), "--yes")
    assert r.returncode == 2 and "does not cover even the cheapest run" in r.stderr, r.stdout + r.stderr
    before = len(fake.pods())
    sweep_id = launch(h, spec)
    st = wait_done(h, sweep_id)
    started = [x for x in st["runs"] if not x["skipped"]]
    assert len(started) == 2 and all(x["state"] == "succeeded" for x in started), st["runs"]
    assert [x["skipped"].split(":")[0] for x in st["runs"] if x["skipped"]] == ["budget", "budget"], st["runs"]
    assert [x["end_reason"] for x in st["runs"]] == ["succeeded", "succeeded", "sweep_budget", "sweep_budget"], st["runs"]
    assert st["end_reason"] == "all_members_ended"
    assert len(fake.pods()) - before == 2  # one pod per started run, none for the others
    assert st["spent_usd"] <= cap, st
    for x in started:
        assert pods_of(fake, x["run_id"]) and not live_pods(fake, x["run_id"])
    r = h.cli("status", sweep_id)
    assert "2 run(s) not started: budget" in r.stdout, r.stdout
    r = h.cli("list")
    assert r.returncode == 0 and f"{sweep_id}  succeeded  4 runs" in r.stdout, r.stdout


def member_runs(h, sweep_id: str) -> list[tuple[str, bool]]:
    """(run id, started) of each member, read from the registry as it is (a `status` would take a step)."""
    reg = Registry(h.path)
    try:
        return [(m.run_id, m.started_at is not None) for m in SweepBook(reg).members(sweep_id)]
    finally:
        reg.close()


def test_a_sweep_whose_supervisor_is_killed_is_resumed_by_status_and_starts_no_member_twice(fake, homes):
    h = homes()
    sweep_id = launch(h, sweep_spec(h, steps=25, sweep='"train.learning_rate" = [1e-4, 2e-4, 3e-4]\nmax_parallel = 2'))
    first = [run_id for run_id, _ in member_runs(h, sweep_id)[:2]]
    wait(lambda: all(pods_of(fake, run_id) for run_id in first), 10, "the first two members' pods")
    kill_supervisor(h, sweep_id)
    # Their runs end alone (each pod ends itself); with no supervisor, nothing starts the third member.
    wait(lambda: not any(live_pods(fake, run_id) for run_id in first), 30, "the first runs' pods to end")
    assert [started for _, started in member_runs(h, sweep_id)] == [True, True, False]
    r = h.cli("status", sweep_id, "--json")
    assert r.returncode == 0 and f"started a background supervisor for sweep {sweep_id}" in r.stderr, r.stdout + r.stderr
    restarted = h.daemon_pid(sweep_id)
    assert alive(restarted)
    log = h.path / "supervisors" / f"{sweep_id}.log"
    line = wait(
        lambda: re.search(rf"supervising the sweep \(pid {restarted}, every (\S+)s\)", log.read_text()),
        60,
        "the restarted supervisor's first line",
    )
    assert line.group(1) == "0.3", log.read_text()  # it polls as the first one did, not at the default
    st = wait_done(h, sweep_id)
    assert st["state"] == "succeeded" and len(st["runs"]) == 3, st
    for x in st["runs"]:
        assert x["state"] == "succeeded"
        assert len(pods_of(fake, x["run_id"])) == 1, [p.name for p in pods_of(fake, x["run_id"])]  # never started twice
        assert not live_pods(fake, x["run_id"])
    r = h.cli("gc")
    assert r.returncode == 0 and "terminated" not in r.stdout, r.stdout + r.stderr


def test_cancel_ends_every_run_of_a_sweep_and_starts_nothing_more(fake, homes):
    h = homes()
    sweep_id = launch(h, sweep_spec(h, steps=400, sweep='"train.learning_rate" = [1e-4, 2e-4, 3e-4]\nmax_parallel = 2'))
    runs = [run_id for run_id, _ in member_runs(h, sweep_id)]
    wait(lambda: all(live_pods(fake, run_id) for run_id in runs[:2]), 10, "two members' pods")
    r = h.cli("cancel", sweep_id)
    assert r.returncode == 0 and f"sweep {sweep_id}: cancelled" in r.stdout, r.stdout + r.stderr
    st = sweep_status(h, sweep_id)
    assert st["state"] == "cancelled" and [x["state"] for x in st["runs"]] == ["cancelled", "cancelled", "skipped"], st["runs"]
    assert st["runs"][2]["skipped"] == "cancelled"
    assert st["end_reason"] == "cancelled" and [x["end_reason"] for x in st["runs"]] == ["cancelled"] * 3, st["runs"]
    for run_id in runs[:2]:
        wait(lambda: not live_pods(fake, run_id), 20, f"the pods of {run_id} to end")  # noqa: B023 - waited on here
    assert not pods_of(fake, runs[2])


def sweep_as_recorded(h, sweep_id: str) -> tuple[bool, list[str]]:
    """(done, each member's state) from the registry as it is: no command, so no step of the scheduler."""
    reg = Registry(h.path)
    try:
        return sweeps.done(reg, sweep_id), [v.state for v in sweeps.views(reg, sweep_id)]
    finally:
        reg.close()


def test_a_sweep_whose_registry_turns_read_only_and_back_finishes_every_member_with_no_command_typed(fake, homes):
    h = homes()
    sweep_id = launch(h, sweep_spec(h, steps=40, sweep='"train.learning_rate" = [1e-4, 2e-4, 3e-4]\nmax_parallel = 1'))
    runs = [run_id for run_id, _ in member_runs(h, sweep_id)]
    (pod,) = wait(lambda: live_pods(fake, runs[0]), 10, "the first member's pod")
    daemon = h.daemon_pid(sweep_id)
    db = h.path / "registry.db"
    if subprocess.run(["chattr", "+i", str(db)], capture_output=True).returncode != 0:
        pytest.skip("cannot make a file immutable here (chattr +i)")
    try:
        fake.preempt(pod.id)  # the member needs a new pod while nothing can be recorded
        time.sleep(3)
        assert alive(daemon), "the sweep's supervisor died while the registry was read-only"
        assert len(pods_of(fake, runs[0])) == 1  # nothing created while nothing could be recorded
    finally:
        subprocess.run(["chattr", "-i", str(db)], check=True)
    # No command from here on: the supervisor alone relaunches the member and starts the queued ones.
    wait(lambda: sweep_as_recorded(h, sweep_id)[0], 90, "the sweep to finish with no command typed", every=0.5)
    done, states = sweep_as_recorded(h, sweep_id)
    assert states == ["succeeded"] * 3, states
    assert len(pods_of(fake, runs[0])) == 2  # preempted, relaunched once the registry could be written
    for run_id in runs:
        assert not live_pods(fake, run_id)
    log = (h.path / "supervisors" / f"{sweep_id}.log").read_text()
    assert "read-only" in log and "written again" in log and "damaged" not in log, log
    wait(lambda: not alive(daemon), 20, "the sweep's supervisor to exit once done")


def test_a_stopped_sweep_supervisor_is_replaced_by_the_next_command_and_the_sweep_finishes_with_no_other(fake, homes):
    h = homes()
    sweep_id = launch(h, sweep_spec(h, steps=25, sweep='"train.learning_rate" = [1e-4, 2e-4, 3e-4]\nmax_parallel = 1'))
    runs = [run_id for run_id, _ in member_runs(h, sweep_id)]
    wait(lambda: live_pods(fake, runs[0]), 10, "the first member's pod")
    frozen = h.daemon_pid(sweep_id)
    log = h.path / "supervisors" / f"{sweep_id}.log"
    freeze_between_looks(h, frozen)  # the sweep's supervisor, stopped with its pidfile in place
    try:
        # The first member ends alone (its pod ends itself); nothing starts the second.
        wait(lambda: not live_pods(fake, runs[0]), 30, "the first member's pod to end")
        assert [started for _, started in member_runs(h, sweep_id)] == [True, False, False]
        r = h.cli("status", sweep_id)
        assert r.returncode == 0, r.stdout + r.stderr
        assert (
            f"started a background supervisor for sweep {sweep_id}" in r.stderr and f"supervisor {frozen} is stopped" in r.stderr
        ), r.stderr
        replacement = wait(lambda: (pid := h.daemon_pid(sweep_id)) != frozen and pid, 40, "the replacement's pidfile")
        # No command from here on: the replacement starts the queued members and sees them end.
        wait(lambda: sweep_as_recorded(h, sweep_id)[0], 90, "the sweep to finish with no command typed", every=0.5)
    finally:
        os.kill(frozen, signal.SIGCONT)
    assert sweep_as_recorded(h, sweep_id)[1] == ["succeeded"] * 3
    for run_id in runs:
        assert len(pods_of(fake, run_id)) == 1, [p.name for p in pods_of(fake, run_id)]  # none started twice
        assert not live_pods(fake, run_id)
    # The stopped one, resumed, acts on nothing it saw (its lease moved on) and exits.
    wait(lambda: not alive(frozen), 30, "the resumed stale supervisor to exit")
    wait(lambda: not alive(replacement), 30, "the replacement to exit once the sweep is done")
    assert "succeeded (every member ended); supervisor exits" in log.read_text()
