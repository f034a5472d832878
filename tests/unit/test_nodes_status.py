"""A replica of several pods (``compute.nodes``) through the controller: one lost node ends the group
and relaunches all of it with resume, each node's state is kept on the replica's record (migrated onto
an older registry), `status --json` lists the nodes (which holds rank 0, each one's state) only for a
run of several, and `status`, `watch` and the report say them; an unknown price bills every pod."""

from __future__ import annotations

import json
import sqlite3

import pytest

from autoslm.controller.billing import price
from autoslm.controller.nodes import ended, node_rows, recorded
from autoslm.controller.reconcile import Launch, Limits, Seen, SetState, Terminate, account, reconcile
from autoslm.controller.registry import Registry, ReplicaRecord, RunRecord
from autoslm.controller.registry.schema import _SCHEMA, MIGRATIONS, SCHEMA_VERSION
from autoslm.controller.state import RunState
from autoslm.providers.base import NodeStatus, group_status
from autoslm.sdk import Client
from autoslm.spec import validate_dict
from autoslm.store.local import LocalStore

NOW = 1_800_000_000.0
A, B = "local-101-5+local-102-5".split("+")
GROUP = f"{A}+{B}"


def group(*states, codes=(None, None)) -> object:
    return group_status(
        [NodeStatus(i, pod, st, "exit code 137" if c else "", c) for i, (pod, st, c) in enumerate(zip((A, B), states, codes))],
        price_per_hour=0.0,
    )


def replica(**kw) -> ReplicaRecord:
    base = dict(provider="local", pod_id=GROUP, attempt=1, pod_started_at=NOW - 100, price_per_hour=2.0, cost_at=NOW - 10)
    return ReplicaRecord("r", 0, "running", **{**base, **kw})


def limits(**kw) -> Limits:
    return Limits(**{**dict(deadline=NOW + 3600, max_usd=None, max_restarts=2, heartbeat_timeout_s=600), **kw})


HB = dict(heartbeat_time=NOW - 5, heartbeat_stage="training", heartbeat_attempt=1)


def test_one_lost_node_ends_the_group_and_relaunches_all_of_it_resuming():
    lost = group("running", "exited", codes=(None, 137))
    assert lost.state == "exited" and "node 1 of 2" in lost.message
    actions = reconcile(replica(), Seen(pod=lost, done=False, **HB), limits(), NOW)
    assert [type(a) for a in actions] == [Terminate, SetState, Launch]
    assert "node 1 of 2" in actions[0].reason and actions[1].state == RunState.RECOVERING and actions[2].resume
    # Out of restarts: failed, naming the node that was lost.
    actions = reconcile(replica(restarts=2), Seen(pod=lost, done=False, **HB), limits(), NOW)
    assert isinstance(actions[0], Terminate) and actions[-1].state == RunState.FAILED and "node 1 of 2" in actions[-1].error
    # Both alive: nothing to do; every node done and DONE in the store: succeeded, the group ended.
    assert reconcile(replica(), Seen(pod=group("running", "running"), done=False, **HB), limits(), NOW) == []
    finished = group("exited", "exited", codes=(0, 0))
    actions = reconcile(replica(), Seen(pod=finished, done=True, adapter=True, **HB), limits(), NOW)
    assert isinstance(actions[0], Terminate) and actions[-1].state == RunState.SUCCEEDED
    # A cancel ends all of it through the one handle.
    actions = reconcile(replica(), Seen(pod=group("running", "running"), **HB), limits(cancel_requested=True), NOW)
    assert isinstance(actions[0], Terminate) and actions[-1].state == RunState.CANCELLED


def test_each_look_keeps_the_nodes_on_the_record_and_bills_the_group_s_price():
    r = replica()
    changes = account(r, Seen(pod=group("running", "pending"), **HB), None, NOW)
    assert json.loads(changes["nodes"]) == [
        {"node": 0, "pod_id": A, "state": "running", "message": None, "exit_code": None},
        {"node": 1, "pod_id": B, "state": "pending", "message": None, "exit_code": None},
    ]
    assert changes["cost_usd"] == pytest.approx(2.0 * 10 / 3600)  # the handle's price: every pod of the group
    r.nodes = changes["nodes"]
    assert "nodes" not in account(r, Seen(pod=group("running", "pending"), **HB), None, NOW)  # unchanged: no write
    from autoslm.providers.base import PodStatus

    assert "nodes" not in account(replica(pod_id="local-1-2"), Seen(pod=PodStatus("running")), None, NOW)  # one pod


def test_a_group_ended_here_keeps_its_last_look_with_its_live_nodes_terminated():
    text = recorded(group("running", "exited", codes=(None, 137)).nodes)
    after = json.loads(ended(text))
    assert [(n["state"], n["exit_code"]) for n in after] == [("terminated", None), ("exited", 137)]
    assert ended(None) is None


def test_an_unknown_price_bills_the_ceiling_of_every_pod():
    spec = validate_dict(
        {
            "name": "n",
            "model": "autoslm/tiny",
            "environment": {"id": "autoslm/arith"},
            "train": {"max_steps": 10},
            "compute": {"nodes": 2, "provider": "runpod", "gpu": "RTX 4090", "max_price_per_hour": 0.75},
            "artifacts": {"store": "hf", "repo": "someone/runs"},
        }
    )
    run = RunRecord("r", "n", "sft", spec.to_json(), None, "file:///x", NOW, NOW + 3600)
    rate, source = price(None, replica(price_per_hour=None), run)
    assert rate == 1.5 and "x 2 pods" in source


def test_an_older_registry_gains_the_nodes_column_and_keeps_its_rows(tmp_path):
    db = sqlite3.connect(tmp_path / "registry.db")
    db.executescript(_SCHEMA)
    for version in range(1, SCHEMA_VERSION - 1):  # the file as the version before this one left it
        db.executescript(MIGRATIONS[version])
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION - 1}")
    db.execute("INSERT INTO runs VALUES ('old-1', 'old', 'sft', '{}', NULL, 'file:///x', 1, 2, 0, NULL)")
    db.execute("INSERT INTO replicas (run_id, seed, state, updated_at) VALUES ('old-1', 0, 'running', 1)")
    db.commit()
    db.close()
    reg = Registry(tmp_path)
    assert reg.schema_version == SCHEMA_VERSION
    assert reg.replicas("old-1")[0].nodes is None
    reg.update_replica("old-1", 0, nodes=recorded(group("running", "running").nodes))
    assert [n.state for n in node_rows(Registry(tmp_path).replicas("old-1")[0].nodes, 2, 1)] == ["running", "running"]


def _spec(nodes: int, gpu_count: int = 1):
    return validate_dict(
        {
            "name": f"nodes{nodes}",
            "model": "autoslm/tiny",
            "environment": {"id": "autoslm/arith"},
            "train": {"max_steps": 10, "batch_size": 8, "micro_batch_size": 2},
            "compute": {"nodes": nodes, "gpu_count": gpu_count},
        }
    )


def _client_with(tmp_path, run_id: str, spec, **fields) -> Client:
    c = Client(tmp_path / "home", stores=lambda uri: LocalStore(tmp_path / "artifacts"), clock=lambda: NOW)
    run = RunRecord(run_id, spec.name, "sft", spec.to_json(), None, "file:///artifacts", NOW - 100, NOW + 3600)
    c.registry.create_run(run, [0])
    c.registry.update_replica(run_id, 0, **fields)
    return c


def test_status_json_lists_each_node_only_for_a_run_of_several(tmp_path):
    c = _client_with(tmp_path, "two-1", _spec(2, gpu_count=2), state="provisioning", provider="local", pod_id=GROUP)
    (seed,) = c.status("two-1", tick=False).to_json()["seeds"]
    # Before any look: every node, which ranks it holds (node 0 holds rank 0), nothing seen yet.
    assert seed["nodes"] == [
        {"node": 0, "ranks": [0, 1], "pod_id": None, "state": None, "message": None, "exit_code": None},
        {"node": 1, "ranks": [2, 3], "pod_id": None, "state": None, "message": None, "exit_code": None},
    ]
    c.registry.update_replica("two-1", 0, nodes=recorded(group("running", "exited", codes=(None, 137)).nodes))
    (seed,) = c.status("two-1", tick=False).to_json()["seeds"]
    assert [(n["node"], n["pod_id"], n["state"], n["exit_code"]) for n in seed["nodes"]] == [
        (0, A, "running", None),
        (1, B, "exited", 137),
    ]
    one = _client_with(tmp_path / "one", "one-1", _spec(1), state="running", provider="local", pod_id="local-1-2")
    assert "nodes" not in one.status("one-1", tick=False).to_json()["seeds"][0]  # one pod: as it always was


def test_status_watch_and_the_report_say_each_node_and_which_holds_rank_0(tmp_path):
    from autoslm.views.report import _nodes_section
    from autoslm.views.runview import RunData, seed_lines
    from autoslm.views.watch import lines

    c = _client_with(tmp_path, "two-1", _spec(2), state="running", provider="local", pod_id=GROUP, gpu="2 nodes of 1 CPU process")
    c.registry.update_replica("two-1", 0, nodes=recorded(group("running", "exited", codes=(None, 137)).nodes))
    st = c.status("two-1", tick=False)
    said = seed_lines(st.seeds[0], live=True)
    assert f"    node 0 (rank 0): running pod {A}" in said and f"    node 1 (rank 1): exited 137 pod {B}" in said
    view = "\n".join(lines(RunData("two-1", st, {"model": "m", "train": {"method": "sft"}}, [])))
    assert "nodes node 0 (rank 0): running   node 1 (rank 1): exited 137" in view
    html = _nodes_section(st)
    assert "<td>node 0</td><td>0</td>" in html and "exited 137" in html and B in html
    one = _client_with(tmp_path / "one", "one-1", _spec(1), state="running", provider="local", pod_id="local-1-2")
    st1 = one.status("one-1", tick=False)
    assert _nodes_section(st1) == "" and not any("node " in line for line in seed_lines(st1.seeds[0], live=True))
