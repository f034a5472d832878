"""The SQLite run registry."""

from __future__ import annotations

import pytest

from autoslm.controller.registry import Registry, RunRecord, run_state


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
