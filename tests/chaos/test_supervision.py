"""Chaos, second part: every live pod supervised and billed, whatever goes wrong.

The real CLI as separate processes against the fake RunPod and fake Hub (the rig of test_chaos.py):
failed launches leave nothing, a dead supervisor is restarted by the next command, a registry from a
newer autoslm (or one that is locked, read-only or of an unknown shape) never ends a live pod, limits
hold with the supervisor dead and the store frozen, the startup timeout bounds the time to the first
training step, and `gc` says FAILED when a teardown fails.

    .venv/bin/python -m pytest -q tests/chaos/test_supervision.py
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoslm.controller.podnames import home_id
from autoslm.controller.registry import _SCHEMA, SCHEMA_VERSION, Registry
from tests.chaos.test_chaos import (  # noqa: F401 - fixtures
    PROMPT_EXIT_S,
    REPO,
    UNPRICED,
    _launch_caught_in_create,
    assert_no_pod_left,
    fake,
    homes,
    hub,
    interrupt,
    live_pods,
    pods_of,
    wait,
)

PRICE = 0.69  # RTX 4090 (secure) in the fake's catalog, $/hour


def alive(pid: int | None) -> bool:
    """A process that runs (a zombie does not)."""
    if not pid:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def run_id_of(text: str) -> str:
    """The run id an error or a message names ("run <id> ...")."""
    for word in text.replace(";", " ").replace(",", " ").split():
        if word.startswith("chaos-2") and word.count("-") >= 3:
            return word.rstrip(".:")
    raise AssertionError(f"no run id in: {text}")


def sdk_launch(h, spec: Path) -> str:
    """Launch detached through the SDK, in its own process (as a notebook does)."""
    code = (
        "import sys; from autoslm.sdk import Client; "
        "print('run', Client().launch(sys.argv[1], detach=True, poll_s=0.3).run_id, 'launched')"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(spec)], capture_output=True, text=True, env=h.env, cwd=str(REPO), timeout=60
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.split()[1]


def kill_supervisor(h, run_id: str) -> int:
    pid = wait(lambda: h.daemon_pid(run_id), 10, "the supervisor's pidfile")
    os.kill(pid, signal.SIGKILL)  # the supervisor this test started
    wait(lambda: not alive(pid), 10, "the supervisor to die")
    return pid


def freeze_mid_look(fake, pid: int) -> None:
    """Stop the supervisor ``pid`` (SIGSTOP) in the middle of a look: its next GET /v2/pods is held
    5 s by the fake vendor, and the stop lands once that request has reached it."""
    fake.hang_next(1, seconds=5, method="GET", path="/v2/pods")
    wait(lambda: fake.faults_left() == 0, 30, "the supervisor's next look to reach the provider", every=0.02)
    os.kill(pid, signal.SIGSTOP)  # the supervisor this test started


def freeze_between_looks(h, pid: int) -> None:
    """Stop the supervisor ``pid`` (SIGSTOP) while it holds nothing of the registry: a stop that lands
    inside one of its transactions is taken back (SIGCONT) and tried again, so the commands the test
    types next meet a stopped supervisor, not a lock it can never release."""
    db = h.path / "registry.db"

    def stopped_holding_nothing() -> bool:
        os.kill(pid, signal.SIGSTOP)  # the supervisor this test started
        probe = sqlite3.connect(db, timeout=0, isolation_level=None)
        try:
            probe.execute("BEGIN EXCLUSIVE")  # fails at once while any transaction of another process is open
            probe.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            os.kill(pid, signal.SIGCONT)
            return False
        finally:
            probe.close()

    wait(stopped_holding_nothing, 30, "a stop that lands between two of the supervisor's transactions", every=0.05)


def observe_end(fake, pod_id: str, timeout: float) -> float:
    """Wait for the pod to be gone; returns when the vendor ended it (the fake's ``deleted_at``: when the
    DELETE, or a preemption that terminates, arrived), the end of what it bills. Not when this test saw
    it: a test that looks after a command returned (a `cancel`'s exit on a loaded machine) would count
    seconds the pod never lived."""
    wait(lambda: fake.pod(pod_id).deleted, timeout, f"pod {pod_id} to end", every=0.05)
    return fake.pod(pod_id).deleted_at or time.time()


# -- 1. a failed launch ends its run and leaves nothing ------------------------------------------------
def test_a_launch_whose_creates_all_fail_ends_the_run_and_no_later_command_creates_its_pod(fake, homes):
    h = homes()
    fake.fail_next(1000, 500, method="POST", path="/v2/pods")
    r = h.cli("launch", str(h.spec(steps=400)), "--yes", "--detach", "--poll-s", "0.3")
    assert r.returncode == 3, r.stdout + r.stderr
    run_id = run_id_of(r.stderr)
    # A 500 may still have made the pod: the run is failed, and a supervisor watches for a late one.
    assert "may still land" in r.stderr and "supervisor" in r.stderr, r.stderr
    fake.clear_faults()  # the provider is back: nothing may bring the failed launch back to life
    for args in (("gc",), ("list",), ("status", run_id)):
        r = h.cli(*args)
        assert r.returncode == 0, r.stdout + r.stderr
    time.sleep(1.5)  # a few of the supervisor's polls: it looks for the name, it never creates it
    assert not pods_of(fake, run_id), [p.name for p in pods_of(fake, run_id)]
    st = h.status(run_id)
    assert st["state"] == "failed" and "launch failed" in st["error"], st


def test_a_two_seed_launch_whose_second_create_errors_ends_and_bills_the_first_pod(fake, homes):
    h = homes()
    spec = h.spec(steps=400)
    spec.write_text(spec.read_text().replace('name = "chaos"', 'name = "chaos"\nseed = [0, 1]'))
    before = len(fake.pods())
    fake.hang_next(1, seconds=2.0, method="POST", path="/v2/pods", apply=True)  # seed 0's create: slow, it lands
    proc = h.start("launch", str(spec), "--yes", "--detach", "--poll-s", "0.3")
    wait(lambda: len(fake.pods()) > before, 30, "seed 0's pod")
    fake.fail_next(1000, 500, method="POST", path="/v2/pods")  # seed 1's create errors (not "no capacity")
    out, err = proc.communicate(timeout=90)
    fake.clear_faults()
    assert proc.returncode == 3, out + err
    run_id = fake.pods()[before].name.split("autoslm-", 1)[1].rsplit("-s0-a1", 1)[0]
    assert f"tore down seed 0: runpod pod {fake.pods()[before].id}" in err and "may still land" in err, out + err
    assert_no_pod_left(fake, run_id)
    h.cli("gc")
    st = h.status(run_id)
    assert st["state"] == "failed" and len(pods_of(fake, run_id)) == 1, st
    # Seed 0's pod lived at least the 2 s its create took: billed from its create to its end.
    assert st["seeds"][0]["cost_usd"] >= PRICE * 1.5 / 3600, st


# -- 2. every live run has a supervisor ---------------------------------------------------------------
def test_a_supervisor_killed_by_sigkill_is_restarted_by_the_next_command_and_handles_a_preemption(fake, homes):
    h = homes()
    run_id = h.launch_detached(h.spec(steps=400), poll_s=0.3)
    h.wait_training(run_id, attempt=1)
    old = kill_supervisor(h, run_id)
    r = h.cli("status", run_id, "--json")
    assert r.returncode == 0 and "started a background supervisor" in r.stderr, r.stdout + r.stderr
    json.loads(r.stdout)  # stdout stays JSON: the notice goes to stderr
    new = h.daemon_pid(run_id)
    assert new != old and alive(new), (old, new)
    # No command runs now: the new supervisor alone relaunches after a preemption.
    (pod,) = live_pods(fake, run_id)
    fake.preempt(pod.id)
    wait(lambda: len(pods_of(fake, run_id)) == 2, 30, "the supervisor's relaunch", every=0.2)
    assert h.cli("cancel", run_id).returncode == 0
    assert_no_pod_left(fake, run_id)


def test_a_pod_left_by_a_killed_launch_is_adopted_under_a_supervisor_by_list(fake, homes):
    h = homes()
    proc, name = _launch_caught_in_create(fake, h)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    run_id = name.split("autoslm-", 1)[1].rsplit("-s0-a1", 1)[0]
    r = h.cli("list", "--json")
    assert r.returncode == 0 and "started a background supervisor" in r.stderr, r.stdout + r.stderr
    (row,) = json.loads(r.stdout)
    assert row["run_id"] == run_id and row["state"] in ("provisioning", "running"), row
    assert alive(h.daemon_pid(run_id))
    assert len(pods_of(fake, run_id)) == 1  # adopted by its name, never created twice
    assert h.cli("cancel", run_id).returncode == 0
    assert_no_pod_left(fake, run_id)


def test_a_followed_launch_restarts_its_dead_supervisor_and_ctrl_c_names_a_live_one(fake, homes):
    h = homes()
    proc = h.start("launch", str(h.spec(steps=400)), "--yes", "--poll-s", "0.3")
    mine = home_id(h.path)
    pod = wait(lambda: next((p for p in fake.pods() if p.name.endswith(f"-h{mine}")), None), 30, "the pod")
    run_id = pod.name.split("autoslm-", 1)[1].rsplit("-s0-a1", 1)[0]
    # The launch started the supervisor, so the dead one stays a zombie of the launch: not a live daemon.
    old = kill_supervisor(h, run_id)
    new = wait(lambda: (p := h.daemon_pid(run_id)) != old and alive(p) and p, 60, "a new supervisor")
    out, err, took = interrupt(proc, signal.SIGINT)
    assert f"pid {new}" in out and "detached" in out, out + err
    assert took < PROMPT_EXIT_S, f"{took:.1f}s from Ctrl-C to exit: {out + err}"
    assert alive(new)
    assert h.cli("cancel", run_id).returncode == 0
    assert_no_pod_left(fake, run_id)


class Lines:
    """A process's stdout, read line by line as it comes (a test waits on what the process said)."""

    def __init__(self, proc: subprocess.Popen):
        import threading

        self.proc, self.lines = proc, []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)

    def close(self) -> str:
        self._t.join(timeout=30)
        return self.text()


def hold_registry_lock(h, seconds: float) -> subprocess.Popen:
    """Another process that holds the home's registry locked (BEGIN EXCLUSIVE: no reads, no writes)
    for ``seconds``; returns once it holds it."""
    code = (
        "import sqlite3, sys, time; db = sqlite3.connect(sys.argv[1], isolation_level=None); "
        "db.execute('BEGIN EXCLUSIVE'); print('held', flush=True); time.sleep(float(sys.argv[2]))"
    )
    locker = subprocess.Popen(
        [sys.executable, "-c", code, str(h.path / "registry.db"), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert locker.stdout.readline().strip() == "held"
    return locker


def test_ctrl_c_on_a_followed_launch_exits_at_once_while_another_process_holds_the_registry(fake, homes):
    h = homes()
    proc = h.start("launch", str(h.spec(steps=400)), "--yes", "--poll-s", "0.3")
    said = Lines(proc)
    wait(lambda: " launched" in said.text(), 120, "the launch to follow its run")
    run_id = run_id_of(said.text())
    supervisor = wait(lambda: (p := h.daemon_pid(run_id)) and alive(p) and p, 60, "the run's supervisor")
    locker = hold_registry_lock(h, 20)
    try:
        time.sleep(1.0)  # the follower's next look (every 0.3 s) is now waiting on the lock
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        took = time.monotonic() - sent
        assert locker.poll() is None, "the lock was let go before the launch exited"
    finally:
        locker.kill()
        locker.wait()
    out = said.close()
    err = proc.stderr.read()
    assert took < 2.0, f"{took:.1f}s from Ctrl-C to exit: {out + err}"
    assert f"supervisor (pid {supervisor})" in out and run_id in out and "detached" in out, out + err
    assert "locked" not in out + err, out + err  # Ctrl-C is said as Ctrl-C, not as a lock it waited on
    assert alive(supervisor)
    assert h.cli("cancel", run_id).returncode == 0
    assert_no_pod_left(fake, run_id)


def test_ctrl_c_on_watch_in_a_terminal_stops_watching_at_once_and_the_run_keeps_going(fake, homes):
    """`watch` on a terminal (its live view drawn) ends at once on Ctrl-C, with 0: watching is what
    stopped, not the run, whose supervisor goes on."""
    import select

    from tests.conftest import spawn_in_pty

    h = homes()
    run_id = h.launch_detached(h.spec(steps=400), poll_s=0.3)
    h.wait_training(run_id, attempt=1)
    supervisor = h.daemon_pid(run_id)
    pid, fd = spawn_in_pty(["watch", run_id, "--poll-s", "0.3"], h.env)
    seen = b""

    def read(until) -> bool:
        nonlocal seen
        deadline = time.monotonic() + 120
        while not until() and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.5)[0]:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # EIO: the child closed its terminal
                    chunk = b""
                if not chunk:
                    return True
                seen += chunk
        return False

    try:
        read(lambda: run_id.encode() in seen)  # the live view is drawn: the watch is in its loop
        assert run_id.encode() in seen, seen.decode(errors="replace")
        sent = time.monotonic()
        os.kill(pid, signal.SIGINT)
        assert read(lambda: False), "the watch did not close its terminal"
        _, status = os.waitpid(pid, 0)
        took = time.monotonic() - sent
    finally:
        os.close(fd)
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    text = seen.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, text[-2000:]
    assert "stopped watching: the run keeps going" in text, text[-2000:]
    assert took < PROMPT_EXIT_S, f"{took:.1f}s from Ctrl-C to exit: {text[-2000:]}"
    assert alive(supervisor) and h.status(run_id)["state"] == "running"
    assert h.cli("cancel", run_id).returncode == 0
    assert_no_pod_left(fake, run_id)


def test_status_of_a_supervised_run_writes_nothing(fake, homes, monkeypatch):
    """`status` of a run whose supervisor is alive reads what it records: while another process holds
    the registry's write lock (readers still read), it answers at once, and a client's statements
    (traced by SQLite) hold no write."""
    from autoslm.sdk import Client

    h = homes()
    run_id = h.launch_detached(h.spec(steps=400), poll_s=0.3)
    h.wait_training(run_id, attempt=1)
    # The supervisor has recorded it running (the heartbeat says training before its next look writes so).
    h.wait_state(run_id, states=("running",), timeout=120)
    code = (
        "import sqlite3, sys, time; db = sqlite3.connect(sys.argv[1], isolation_level=None); "
        "db.execute('BEGIN IMMEDIATE'); print('held', flush=True); time.sleep(60)"
    )
    writer = subprocess.Popen([sys.executable, "-c", code, str(h.path / "registry.db")], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "held"
        r = h.cli("status", run_id, "--json")
        assert r.returncode == 0 and "locked" not in r.stderr, r.stdout + r.stderr
        assert json.loads(r.stdout)["state"] == "running", r.stdout
    finally:
        writer.kill()
        writer.wait()
    statements: list[str] = []
    for name, value in h.env.items():  # the CLI's environment: this home, the fake vendor and Hub
        monkeypatch.setenv(name, value)
    client = Client(home=h.path)
    client.registry._db.set_trace_callback(statements.append)
    for _ in range(3):
        assert client.status(run_id).state == "running"
    writes = [
        s
        for s in statements
        if s.split(None, 1)[0].upper() in ("INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE")
        or s.upper().startswith("BEGIN IMMEDIATE")
    ]
    assert statements and not writes, writes
    assert h.cli("cancel", run_id).returncode == 0
    assert_no_pod_left(fake, run_id)


# -- 3. registries this version cannot fully own --------------------------------------------------------
def test_a_registry_from_a_newer_version_is_read_only_and_gc_ends_no_live_pod(fake, homes):
    h = homes()
    run_id = h.launch_detached(h.spec(steps=400), poll_s=0.3)
    h.wait_training(run_id, attempt=1)
    kill_supervisor(h, run_id)
    db = sqlite3.connect(h.path / "registry.db", isolation_level=None)
    db.execute("ALTER TABLE replicas ADD COLUMN x TEXT")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    (pod,) = live_pods(fake, run_id)
    r = h.cli("gc")
    assert "newer" in r.stdout + r.stderr and "terminated" not in r.stdout, r.stdout + r.stderr
    assert not fake.pod(pod.id).deleted
    r = h.cli("status", run_id, "--json")  # it reads what it knows
    assert r.returncode == 0 and json.loads(r.stdout)["state"] in ("provisioning", "running"), r.stdout + r.stderr
    assert "read-only" in r.stderr, r.stderr
    before = len(fake.pods())
    r = h.cli("launch", str(h.spec(steps=10)), "--yes", "--detach")
    assert r.returncode != 0 and "newer" in r.stderr and len(fake.pods()) == before, r.stdout + r.stderr
    assert not fake.pod(pod.id).deleted
    r = h.cli("gc", pod.id)  # named: the user says so
    assert r.returncode == 0 and f"terminated runpod pod {pod.id}" in r.stdout, r.stdout + r.stderr
    assert_no_pod_left(fake, run_id)


def test_a_version_0_registry_with_other_columns_is_refused_before_any_pod(fake, homes):
    h = homes()
    # Schema 1 but for one column of replicas: every insert works, the pod's record would not.
    db = sqlite3.connect(h.path / "registry.db", isolation_level=None)
    db.executescript(_SCHEMA.replace("    gpu TEXT,\n", ""))
    db.close()
    before = len(fake.pods())
    r = h.cli("launch", str(h.spec(steps=10)), "--yes", "--detach")
    assert r.returncode == 1 and str(h.path / "registry.db") in r.stderr, r.stdout + r.stderr
    assert "columns" in r.stderr and "internal error" not in r.stderr, r.stderr
    assert len(fake.pods()) == before


# -- 4. locked or read-only is not damaged -------------------------------------------------------------
def test_a_locked_registry_is_waited_for_then_named_with_its_holder(fake, homes):
    h = homes()
    Registry(h.path).close()
    hold = (
        "import sqlite3, sys, time; db = sqlite3.connect(sys.argv[1], isolation_level=None); "
        "db.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(float(sys.argv[2]))"
    )

    holders: list[subprocess.Popen] = []

    def holder(seconds: float) -> subprocess.Popen:
        p = subprocess.Popen(
            [sys.executable, "-c", hold, str(h.path / "registry.db"), str(seconds)], stdout=subprocess.PIPE, text=True
        )
        holders.append(p)
        assert p.stdout.readline().strip() == "locked"
        return p

    try:
        before = len(fake.pods())
        p = holder(60)
        r = h.cli("launch", str(h.spec(steps=10)), "--yes", "--detach")
        assert r.returncode == 1 and f"locked by pid {p.pid}" in r.stderr, r.stdout + r.stderr
        assert "move it aside" not in r.stderr and "damaged" not in r.stderr, r.stderr
        assert len(fake.pods()) == before
        p.kill()
        p.communicate()
        holder(2)  # a short lock is waited out
        run_id = h.launch_detached(h.spec(steps=10))
    finally:
        for p in holders:
            if p.returncode is None:  # one this test started and has not reaped yet
                p.kill()
                p.communicate()
    wait(lambda: live_pods(fake, run_id), 30, "the pod")
    assert h.cli("cancel", run_id).returncode == 0
    assert_no_pod_left(fake, run_id)


def test_a_read_only_registry_is_reported_as_read_only(fake, homes):
    h = homes()
    Registry(h.path).close()
    db = h.path / "registry.db"
    if subprocess.run(["chattr", "+i", str(db)], capture_output=True).returncode != 0:
        pytest.skip("cannot make a file read-only for this user here (chattr +i)")
    try:
        if os.access(db, os.W_OK) and os.geteuid() != 0:
            pytest.skip("the registry stays writable")
        before = len(fake.pods())
        r = h.cli("launch", str(h.spec(steps=10)), "--yes", "--detach")
        assert r.returncode == 1 and "read-only" in r.stderr and str(db) in r.stderr, r.stdout + r.stderr
        assert "move it aside" not in r.stderr and "damaged" not in r.stderr, r.stderr
        assert len(fake.pods()) == before
    finally:
        subprocess.run(["chattr", "-i", str(db)], check=True)


# -- 5. money and time ---------------------------------------------------------------------------------
def test_a_hung_worker_past_max_usd_with_no_supervisor_and_a_frozen_store_is_billed_to_its_end_and_never_relaunched(
    fake, hub, homes
):
    h = homes()
    fake.extra_env["CHAOS_MODE"] = "hang"
    run_id = sdk_launch(h, h.spec(steps=40, extra="max_usd = 0.001", model=UNPRICED))  # ~5 s of an RTX 4090
    (pod,) = wait(lambda: live_pods(fake, run_id), 30, "the pod")
    h.wait_training(run_id, attempt=1, min_step=0)
    kill_supervisor(h, run_id)
    hub.hang_next(10_000, seconds=5, match=lambda method, path: method == "POST" and "/commit/" in path)
    try:
        ended = observe_end(fake, pod.id, 60)  # the in-pod watchdog ends it
    finally:
        hub.clear_faults()
    lived = ended - pod.created_at
    st = h.status(run_id)
    assert st["state"] == "failed" and "money limit" in (st["error"] or ""), st
    assert len(pods_of(fake, run_id)) == 1, "a run past max_usd is never relaunched"
    assert st["cost_usd"] >= 0.001 and st["cost_usd"] >= 0.8 * PRICE * lived / 3600, (st["cost_usd"], lived)
    assert lived < 25, f"the watchdog let the pod live {lived:.0f}s (max_usd lasts ~5 s)"
    assert_no_pod_left(fake, run_id)


def test_a_pod_adopted_after_a_killed_launch_is_billed_from_its_create(fake, homes):
    h = homes()
    proc, name = _launch_caught_in_create(fake, h)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    run_id = name.split("autoslm-", 1)[1].rsplit("-s0-a1", 1)[0]
    (pod,) = pods_of(fake, run_id)
    time.sleep(3)
    lived = time.time() - pod.created_at  # at least this long: the cancel below ends it
    r = h.cli("cancel", run_id)
    assert r.returncode == 0, r.stdout + r.stderr
    observe_end(fake, pod.id, 20)
    st = h.status(run_id)
    # status rounds to 4 places: half a unit of slack
    assert st["state"] == "cancelled" and st["cost_usd"] + 0.00005 >= PRICE * lived / 3600, (st, lived)
    assert_no_pod_left(fake, run_id)


# -- 6. a heartbeat timeout the store can meet ------------------------------------------------------------
def test_validate_refuses_a_heartbeat_timeout_the_commit_budget_cannot_meet(fake, homes):
    h = homes()
    spec = h.spec(steps=10, extra="heartbeat_timeout_s = 30")
    before = len(fake.pods())
    r = h.cli("validate", str(spec))
    assert r.returncode == 2 and "limits.heartbeat_timeout_s" in r.stderr and "180" in r.stderr, r.stdout + r.stderr
    r = h.cli("launch", str(spec), "--yes", "--detach")
    assert r.returncode == 2 and len(fake.pods()) == before, r.stdout + r.stderr
    r = h.cli("validate", str(h.spec(steps=10, extra="heartbeat_timeout_s = 180")))
    assert r.returncode == 0, r.stdout + r.stderr


# -- 7. the startup timeout bounds the time to the first training step ---------------------------------
def test_a_prefetch_stuck_in_setup_is_lost_after_startup_timeout_s(fake, homes):
    h = homes()
    fake.extra_env["CHAOS_MODE"] = "stuck-setup"
    run_id = h.launch_detached(h.spec(steps=10, max_restarts=0, extra="startup_timeout_s = 30"), poll_s=0.3)
    wait(lambda: (hb := h.heartbeat(run_id)) and hb["stage"] == "setup", 30, "setup heartbeats")
    st = h.wait_state(run_id, timeout=60)
    assert st["state"] == "failed" and "no training heartbeat" in st["error"], st
    # The pod's life as the vendor saw it (its create to its DELETE): the timeout counts from the create.
    # Not the test's own clock, which adds the launch command's start and the status polls' lag (on a
    # loaded machine, 45.1 s for a pod that the timeout ended in time).
    (pod,) = pods_of(fake, run_id)
    lived = observe_end(fake, pod.id, 20) - pod.created_at
    assert 30 <= lived < 45, f"a 30 s startup timeout ended the pod {lived:.1f}s after its create"
    assert_no_pod_left(fake, run_id)


# -- 8. gc reports a teardown that failed --------------------------------------------------------------
def test_gc_says_failed_and_exits_nonzero_when_a_finished_runs_pod_cannot_be_deleted(fake, homes):
    h = homes()
    fake.extra_env["CHAOS_MODE"] = "stay"
    # Long enough (6 s) that the supervisor is killed before it sees the run end, on a loaded machine too.
    run_id = h.launch_detached(h.spec(steps=60), poll_s=0.3)
    kill_supervisor(h, run_id)
    assert live_pods(fake, run_id), "the supervisor ended the run before it was killed"
    wait(lambda: (hb := h.heartbeat(run_id)) and hb["stage"] == "done", 60, "the run to finish")
    fake.fail_next(1000, 503, method="DELETE")
    r = h.cli("gc")
    fake.clear_faults()
    assert r.returncode == 3 and "FAILED" in r.stdout and "is live" not in r.stdout, r.stdout + r.stderr
    assert live_pods(fake, run_id)
    r = h.cli("gc")
    assert r.returncode == 0, r.stdout + r.stderr
    assert h.status(run_id)["state"] == "succeeded"
    assert_no_pod_left(fake, run_id)
