"""The SQLite run registry."""

from __future__ import annotations

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


def test_a_newer_schema_is_refused(tmp_path):
    import sqlite3

    from autoslm.controller.registry import RegistryCorrupt

    db = sqlite3.connect(tmp_path / "registry.db")
    db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(RegistryCorrupt, match="upgrade autoslm"):
        Registry(tmp_path)
