"""The SQLite run registry."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from autoslm.controller.registry import Registry, RunRecord, lease_owner_id, run_state


def make_run(run_id="quick-1", created=1.0):
    return RunRecord(run_id, "quick", "sft", "{}", None, "file:///tmp/x", created, created + 3600)


def test_create_and_read_back(tmp_path):
    reg = Registry(tmp_path, clock=lambda: 42.0)
    reg.create_run(make_run(), seeds=[0, 1])
    assert reg.get_run("quick-1").deadline == 3601.0
    reps = reg.replicas("quick-1")
    assert [(r.seed, r.state, r.updated_at) for r in reps] == [(0, "pending", 42.0), (1, "pending", 42.0)]


def test_update_replica_checks_fields_and_states(tmp_path):
    reg = Registry(tmp_path)
    reg.create_run(make_run(), seeds=[0])
    reg.update_replica("quick-1", 0, state="running", pod_id="p", step=3, total_steps=10)
    r = reg.replicas("quick-1")[0]
    assert (r.state, r.pod_id, r.step, r.total_steps) == ("running", "p", 3, 10)
    with pytest.raises(ValueError):
        reg.update_replica("quick-1", 0, state="exploded")
    with pytest.raises(ValueError):
        reg.update_replica("quick-1", 0, colour="red")


def test_prefix_lookup_and_listing_order(tmp_path):
    reg = Registry(tmp_path)
    reg.create_run(make_run("quick-20260101-a", 1.0), [0])
    reg.create_run(make_run("quick-20260102-b", 2.0), [0])
    assert [r.run_id for r in reg.find_runs("quick-20260102")] == ["quick-20260102-b"]
    assert len(reg.find_runs("quick-")) == 2
    assert reg.find_runs("quick_") == []  # LIKE wildcards are escaped
    assert [r.run_id for r in reg.list_runs()] == ["quick-20260102-b", "quick-20260101-a"]


def test_survives_reopen_and_cancel_flag(tmp_path):
    reg = Registry(tmp_path)
    reg.create_run(make_run(), [0])
    reg.request_cancel("quick-1")
    reg.close()
    assert Registry(tmp_path).get_run("quick-1").cancel_requested == 1


@pytest.mark.parametrize(
    "states, expected",
    [
        (["succeeded", "succeeded"], "succeeded"),
        (["succeeded", "failed"], "failed"),
        (["cancelled", "failed"], "cancelled"),
        (["running", "succeeded"], "running"),
        (["recovering", "provisioning"], "recovering"),
        (["pending"], "pending"),
    ],
)
def test_run_state_from_replicas(states, expected):
    from autoslm.controller.registry import ReplicaRecord

    assert run_state([ReplicaRecord("r", i, s) for i, s in enumerate(states)]) == expected


# -- the per-run lease, schema versions, a damaged file ------------------------------------------------
def test_one_lease_holder_at_a_time_and_release(tmp_path):
    now = [100.0]
    reg = Registry(tmp_path, clock=lambda: now[0])
    assert reg.acquire_lease("r", "host:1:a", ttl_s=10) is True
    assert reg.acquire_lease("r", "otherhost:2:b", ttl_s=10) is False  # a live holder elsewhere
    assert reg.acquire_lease("r", "host:1:a", ttl_s=10) is True  # renewing is fine
    now[0] = 111.0  # expired
    assert reg.acquire_lease("r", "otherhost:2:b", ttl_s=10) is True
    reg.release_lease("r", "otherhost:2:b")
    assert reg.lease_owner("r") is None


def test_a_lease_of_a_dead_process_on_this_host_is_free_at_once(tmp_path):
    import socket
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # a pid that is gone
    reg = Registry(tmp_path)
    assert reg.acquire_lease("r", f"{socket.gethostname()}:{proc.pid}:x", ttl_s=3600)
    assert reg.acquire_lease("r", lease_owner_id(), ttl_s=10)


def test_an_old_file_is_migrated_and_keeps_its_runs(tmp_path):
    import sqlite3

    from autoslm.controller.registry import _SCHEMA, SCHEMA_VERSION

    db = sqlite3.connect(tmp_path / "registry.db")
    db.executescript(_SCHEMA)  # a file from before schema versions: user_version 0
    db.execute("INSERT INTO runs VALUES ('old-1', 'old', 'sft', '{}', NULL, 'file:///x', 1, 2, 0)")
    db.execute("INSERT INTO replicas (run_id, seed, state, updated_at) VALUES ('old-1', 0, 'running', 1)")
    db.commit()
    db.close()
    reg = Registry(tmp_path)
    assert reg.schema_version == SCHEMA_VERSION
    (r,) = reg.replicas("old-1")
    assert r.state == "running" and r.intent_name is None and r.error_beats == 0
    reg.set_intent("old-1", 0, provider="runpod", name="autoslm-old-1-s0-a1-h00000000", attempt=1)
    assert Registry(tmp_path).replicas("old-1")[0].intent_name == "autoslm-old-1-s0-a1-h00000000"
    reg.update_replica("old-1", 0, message="downloading Qwen/Qwen3-8B: 6.1 of 16.4 GB")  # added by migration 2
    assert Registry(tmp_path).replicas("old-1")[0].message.startswith("downloading")


def test_a_damaged_file_is_named_in_one_clear_error(tmp_path):
    from autoslm.controller.registry import RegistryCorrupt

    (tmp_path / "registry.db").write_bytes(b"garbage" * 500)
    with pytest.raises(RegistryCorrupt) as info:
        Registry(tmp_path)
    assert str(tmp_path / "registry.db") in str(info.value) and "gc" in str(info.value)


def test_a_newer_schema_is_read_only_and_reads_the_columns_it_knows(tmp_path):
    import sqlite3

    from autoslm.controller.registry import SCHEMA_VERSION, RegistryNewer

    reg = Registry(tmp_path)
    reg.create_run(make_run(), [0])
    reg.close()
    db = sqlite3.connect(tmp_path / "registry.db")
    db.execute("ALTER TABLE replicas ADD COLUMN x TEXT")
    db.execute("ALTER TABLE runs ADD COLUMN y TEXT")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    reg = Registry(tmp_path)
    assert reg.read_only and reg.get_run("quick-1").name == "quick"
    assert [r.state for r in reg.replicas("quick-1")] == ["pending"]
    with pytest.raises(RegistryNewer, match="upgrade autoslm"):
        reg.update_replica("quick-1", 0, state="failed")
    with pytest.raises(RegistryNewer):
        reg.acquire_lease("quick-1", lease_owner_id(), 10)


def test_a_version_0_file_of_another_shape_is_refused_untouched(tmp_path):
    import sqlite3

    from autoslm.controller.registry import RegistryCorrupt

    db = sqlite3.connect(tmp_path / "registry.db")
    db.execute("CREATE TABLE replicas (run_id TEXT, seed INTEGER, status TEXT)")
    db.commit()
    db.close()
    with pytest.raises(RegistryCorrupt, match="columns") as info:
        Registry(tmp_path)
    assert "status" in str(info.value) and "state" in str(info.value)
    db = sqlite3.connect(tmp_path / "registry.db")
    assert db.execute("PRAGMA user_version").fetchone()[0] == 0
    assert [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["replicas"]


def test_sqlite_errors_are_said_as_what_they_are(tmp_path):
    import sqlite3

    from autoslm.controller.registry import RegistryCorrupt, RegistryLocked, RegistryReadOnly, registry_error

    Registry(tmp_path).close()
    path = tmp_path / "registry.db"
    ro = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    with pytest.raises(sqlite3.OperationalError) as info:
        ro.execute("CREATE TABLE t (x)")
    err = registry_error(info.value, path)
    assert (
        isinstance(err, RegistryReadOnly) and "read-only" in str(err) and "move it" not in str(err).replace("do not move it", "")
    )
    locked = registry_error(sqlite3.OperationalError("database is locked"), path)
    assert isinstance(locked, RegistryLocked) and "locked by" in str(locked) and "do not move it" in str(locked)
    assert isinstance(registry_error(sqlite3.DatabaseError("file is not a database"), path), RegistryCorrupt)


def test_a_lock_holder_is_named(tmp_path):
    import subprocess
    import sys

    from autoslm.controller.registry import RegistryLocked, lock_holder

    Registry(tmp_path).close()
    path = tmp_path / "registry.db"
    hold = (
        "import sqlite3, sys, time; db = sqlite3.connect(sys.argv[1], isolation_level=None); "
        "db.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(30)"
    )
    p = subprocess.Popen([sys.executable, "-c", hold, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "locked"
        assert lock_holder(path) == p.pid
        import autoslm.controller.registry as registry_module

        # A rollback journal: an exclusive holder blocks readers too (briefly: transactions last
        # milliseconds), so even the open waits, then names the holder.
        with pytest.raises(RegistryLocked, match=f"locked by pid {p.pid}"):
            Registry(tmp_path, lock_wait_s=0.2)  # do not wait the whole bound in a unit test
        assert registry_module.LOCK_WAIT_S <= 30
        os.kill(p.pid, signal.SIGSTOP)  # stopped holding it: said, with how to let it go
        try:
            with pytest.raises(RegistryLocked, match=f"locked by pid {p.pid}, which is stopped") as e:
                Registry(tmp_path, lock_wait_s=0.2)
            assert e.value.hint.startswith(f"`kill -CONT {p.pid}`")
        finally:
            os.kill(p.pid, signal.SIGCONT)
    finally:
        p.kill()
        p.communicate()


def test_no_memory_map_so_a_file_truncated_under_a_process_is_an_error_not_sigbus(tmp_path):
    # WAL's -shm index is an mmap: truncating it under a reader killed the reader with SIGBUS (exit
    # -7). The registry keeps a rollback journal and mmap_size 0, so a truncated file is an error.
    import subprocess
    import sys

    reg = Registry(tmp_path)
    reg.create_run(make_run(), [0])
    assert reg._db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal"
    assert reg._db.execute("PRAGMA mmap_size").fetchone()[0] == 0
    reg.close()
    code = (
        "import sys, time; from autoslm.controller.registry import Registry\n"
        "reg = Registry(sys.argv[1]); print('open', flush=True); sys.stdin.readline()\n"
        "for _ in range(20):\n"
        "    try: reg.list_runs(); reg.read_only; reg.request_cancel('x')\n"
        "    except Exception as e: print(type(e).__name__, flush=True)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "open"
    for f in tmp_path.glob("registry.db*"):
        f.write_bytes(b"")  # truncated under it
    out, _ = p.communicate("go\n", timeout=60)
    assert p.returncode == 0, (p.returncode, out)  # -7 would be SIGBUS


def test_a_lease_taken_over_meanwhile_is_not_renewed_even_once_released(tmp_path):
    reg = Registry(tmp_path)
    assert reg.acquire_lease("r", "host:1:a", ttl_s=600)
    assert reg.acquire_lease("r", "host:1:a", ttl_s=600, renew=True)
    reg.release_lease("r", "host:1:a")
    reg.acquire_lease("r", "otherhost:2:b", ttl_s=600)  # someone took over (a+b: a froze)...
    reg.release_lease("r", "otherhost:2:b")  # ...acted, and let go
    assert not reg.acquire_lease("r", "host:1:a", ttl_s=600, renew=True)  # a's decisions are stale
    assert reg.acquire_lease("r", "host:1:a", ttl_s=600)  # a fresh take is fine


# -- the lease's fencing token and stale holders ------------------------------------------------------
def test_a_write_fenced_by_a_lease_taken_over_since_is_refused_whole(tmp_path):
    from autoslm.controller.registry import LeaseLost

    now = [100.0]
    reg = Registry(tmp_path, clock=lambda: now[0])
    reg.create_run(make_run(), [0, 1])
    a = reg.take_lease("quick-1", "otherhost:1:a", ttl_s=600)
    reg.apply(a, {("quick-1", 0): {"cost_usd": 1.0}})  # a still holds it: written
    now[0] += 200  # a went silent (frozen, hung) past hung_s: b takes over
    b = reg.take_lease("quick-1", "otherhost:2:b", ttl_s=600, hung_s=120)
    assert b is not None and b.generation == a.generation + 1
    with pytest.raises(LeaseLost):
        reg.apply(a, {("quick-1", 0): {"cost_usd": 5.0}, ("quick-1", 1): {"state": "failed"}}, [("runpod", "p1", "quick-1")])
    (r0, r1) = reg.replicas("quick-1")
    assert (r0.cost_usd, r1.state) == (1.0, "pending") and not reg.was_ended("runpod", "p1")  # nothing of it landed
    reg.release_lease("quick-1", "otherhost:2:b")
    with pytest.raises(LeaseLost):  # released since, not retaken: still not a's
        reg.apply(a, {("quick-1", 0): {"cost_usd": 5.0}})
    assert reg.take_lease("quick-1", "otherhost:1:a", ttl_s=600).generation == b.generation + 1  # a fresh take


def test_a_fresh_holder_elsewhere_keeps_its_lease_and_a_silent_one_loses_it(tmp_path):
    now = [100.0]
    reg = Registry(tmp_path, clock=lambda: now[0])
    assert reg.take_lease("r", "otherhost:1:a", ttl_s=600, standing=True)
    now[0] += 60
    assert reg.take_lease("r", "otherhost:2:b", ttl_s=600, stale_s=15, hung_s=120) is None  # another host: only silence tells
    assert reg.lease_info("r")["standing"] and not reg.lease_is_stale("r", 600, 15, 120)
    now[0] += 61
    assert reg.lease_is_stale("r", 600, 15, 120)
    assert reg.take_lease("r", "otherhost:2:b", ttl_s=600, stale_s=15, hung_s=120) is not None


def test_a_stopped_holder_here_is_taken_over_once_its_heartbeat_is_stale(tmp_path):
    import signal
    import subprocess

    from autoslm.controller.registry import pid_state

    proc = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(proc.pid, signal.SIGSTOP)  # a process this test started
        wait_for = time.monotonic() + 5
        while pid_state(proc.pid) != "stopped" and time.monotonic() < wait_for:
            time.sleep(0.01)
        assert pid_state(proc.pid) == "stopped"
        now = [100.0]
        reg = Registry(tmp_path, clock=lambda: now[0])
        assert reg.take_lease("r", f"{socket.gethostname()}:{proc.pid}:x", ttl_s=600, standing=True)
        now[0] += 5
        assert reg.take_lease("r", lease_owner_id(), ttl_s=600, stale_s=15) is None  # stopped, but only just
        assert reg.lease_info("r")["stopped"]
        now[0] += 11
        assert reg.take_lease("r", lease_owner_id(), ttl_s=600, stale_s=15) is not None
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()
        assert pid_state(proc.pid) == "gone"
    finally:
        proc.kill()
        proc.wait()


def test_one_pid_liveness_check_a_zombie_is_dead(tmp_path):
    import subprocess

    from autoslm.controller.registry import pid_state

    proc = subprocess.Popen(["true"])
    deadline = time.monotonic() + 5
    while pid_state(proc.pid) != "dead" and time.monotonic() < deadline:  # exited, not yet reaped: a zombie
        time.sleep(0.01)
    assert pid_state(proc.pid) == "dead"
    proc.wait()
    assert pid_state(proc.pid) == "gone" and pid_state(os.getpid()) == "alive"


def test_replicas_of_many_runs_in_one_query(tmp_path):
    from autoslm.controller.registry import Registry, RunRecord

    reg = Registry(tmp_path)
    for i, seeds in enumerate(([0], [0, 1], [2])):
        reg.create_run(RunRecord(f"r{i}", "n", "sft", "{}", None, "file:///x", float(i), 9e9), seeds)
    reg.update_replica("r1", 1, state="running", cost_usd=0.5)
    got = reg.replicas_of(["r1", "r2", "nope"])
    assert got["r1"] == reg.replicas("r1") and got["r2"] == reg.replicas("r2") and got["nope"] == []
    assert reg.replicas_of([]) == {}
