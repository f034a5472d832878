"""RunPodProvider's replicas of several pods (Instant Clusters) against the fake RunPod: one create for K
pods, one handle, the members' status as one pod's, one DELETE for all, a lost create adopted by name,
gc and the pod's own end, each member a real local process.

.venv/bin/python -m pytest tests/integration/test_runpod_clusters.py -q
"""

from __future__ import annotations

import json

import httpx
import pytest

from autoslm.controller.gc import sweep
from autoslm.errors import ProviderError
from autoslm.providers.base import PodHandle
from tests.fakes.cloud import wait_for
from tests.fakes.runpod import fake_runpod  # noqa: F401 - pytest fixture
from tests.integration.test_runpod import SLEEP, make, runpod, sleeps, spec  # noqa: F401 - pytest fixtures

NAME = "autoslm-run1-s0-a1"
# Each member says what RunPod set in its container, and where its home is.
SHOW = [
    "python",
    "-c",
    "import json, os, time; keys = ('PRIMARY_ADDR', 'MASTER_ADDR', 'PRIMARY_PORT', 'MASTER_PORT', 'HOST_NODE_ADDR', "
    "'NODE_ADDR', 'NODE_RANK', 'NUM_NODES', 'NUM_TRAINERS', 'WORLD_SIZE', 'RUNPOD_POD_ID', 'HOME', 'TMPDIR', 'AUTOSLM_PRICE_PER_HOUR'); "
    "print(json.dumps({k: os.environ.get(k) for k in keys}), flush=True); time.sleep(60)",
]


def two(command=SLEEP, name: str = NAME, **kw):
    return spec(name, command=command, nodes=2, **kw)


def test_one_create_makes_k_pods_with_runpods_node_variables_and_one_handle(runpod, fake_runpod):  # noqa: F811
    handle = runpod.launch(two(SHOW))
    (body,) = fake_runpod.launch_calls
    assert body["type"] == "TRAINING" and body["name"] == NAME
    assert body["compute"] == {"gpuTypeId": "NVIDIA GeForce RTX 4090", "gpuCountPerPod": 1, "podCount": 2}
    assert "gpu" not in body and "cloud" not in body and body["dataCenterIds"] == ["US-FAKE-1"]
    assert [r for r in fake_runpod.requests if r[1] == "/v2/catalog/gpus"][-1][2].count("product=CLUSTER") == 1
    (cluster,) = fake_runpod.clusters()
    assert handle.pod_id == cluster.id and handle.name == NAME and handle.gpu == "RTX 4090"
    assert handle.price_per_hour == pytest.approx(2 * 0.69)

    members = fake_runpod.members(cluster.id)
    said = [wait_for(lambda p=p: fake_runpod.log(p.id).strip() and json.loads(fake_runpod.log(p.id))) for p in members]
    for rank, (pod, env) in enumerate(zip(members, said)):
        assert env["NODE_RANK"] == str(rank) and env["RUNPOD_POD_ID"] == pod.id
        assert env["NUM_NODES"] == "2" and env["NUM_TRAINERS"] == "1" and env["WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == env["PRIMARY_ADDR"] == env["NODE_ADDR"] == "127.0.0.1"
        assert env["MASTER_PORT"] == env["PRIMARY_PORT"] == str(cluster.port)
        assert env["HOST_NODE_ADDR"] == f"127.0.0.1:{cluster.port}"
        assert env["AUTOSLM_PRICE_PER_HOUR"] == "0.6900"  # one pod's, as a single pod's: the worker counts the nodes
    assert said[0]["HOME"] != said[1]["HOME"] and said[0]["TMPDIR"] != said[1]["TMPDIR"]  # no shared disk

    st = runpod.status(handle)
    assert st.state == "running" and [(n.node, n.pod_id, n.state) for n in st.nodes] == [
        (0, members[0].id, "running"),
        (1, members[1].id, "running"),
    ]
    assert st.price_per_hour == pytest.approx(2 * 0.69)


def test_a_cluster_is_listed_as_one_handle_and_one_delete_ends_every_pod(runpod, fake_runpod, sleeps):  # noqa: F811
    single = runpod.launch(spec("autoslm-run2-s0-a1"))
    handle = runpod.launch(two())
    listed = {h.pod_id: h for h in runpod.list_pods()}
    assert set(listed) == {single.pod_id, handle.pod_id}
    assert listed[handle.pod_id].name == NAME and listed[handle.pod_id].price_per_hour == pytest.approx(1.38)
    assert {k: s.state for k, s in runpod.statuses().items()} == {single.pod_id: "running", handle.pod_id: "running"}
    assert len(runpod.statuses()[handle.pod_id].nodes) == 2

    # A provider that did not make it (another process: `autoslm cancel`) finds it by its id alone.
    other = make(fake_runpod, sleeps)
    assert other.status(PodHandle("runpod", handle.pod_id)).state == "running"
    other.terminate(PodHandle("runpod", handle.pod_id))
    assert all(p.deleted and not p.process.alive() for p in fake_runpod.members(handle.pod_id))
    assert fake_runpod.cluster(handle.pod_id).deleted
    other.terminate(PodHandle("runpod", handle.pod_id))  # idempotent
    runpod.terminate(handle)
    assert runpod.status(handle).state == "terminated"
    assert [h.pod_id for h in runpod.list_pods()] == [single.pod_id]
    other.close()


def test_members_are_not_single_pods_to_the_pod_api(runpod, fake_runpod):  # noqa: F811
    handle = runpod.launch(two())
    member = fake_runpod.members(handle.pod_id)[0]
    auth = {"Authorization": f"Bearer {fake_runpod.api_key}"}
    assert httpx.get(f"{fake_runpod.url}/v2/pods", headers=auth).json() == {"pods": []}
    assert httpx.delete(f"{fake_runpod.url}/v2/pods/{member.id}", headers=auth).status_code == 409
    assert fake_runpod.running_pods() and not member.deleted


def test_a_lost_node_ends_the_replica_naming_that_node(runpod, fake_runpod):  # noqa: F811
    handle = runpod.launch(two())
    first, second = fake_runpod.members(handle.pod_id)
    # RunPod says no exit code: a member that exited may have finished its share, and ends nothing alone
    # (node 0 loses its peer and exits too, or finishes).
    fake_runpod.preempt(second.id)
    st = runpod.status(handle)
    assert st.state == "running" and [n.state for n in st.nodes] == ["running", "exited"]

    fake_runpod.preempt(first.id)
    assert runpod.status(handle).state == "exited"
    (listed,) = runpod.list_pods()  # stopped members quote no price: the one written at the create, times 2
    assert (listed.price_per_hour, listed.price_source) == (pytest.approx(1.38), "offer at launch")

    fake_runpod.preempt(second.id, terminate=True)  # gone from the cluster's list of pods: lost
    st = runpod.statuses()[handle.pod_id]
    assert st.state == "exited" and st.message.startswith("node 1 of 2") and "no pod of rank 1" in st.message
    assert [n.state for n in st.nodes] == ["exited", "terminated"]
    runpod.terminate(handle)
    assert first.deleted and fake_runpod.existing_pods() == []


def test_a_create_whose_answer_is_lost_is_adopted_never_doubled(fake_runpod, sleeps):  # noqa: F811
    # The create's answer is held past the client's timeout; the lookups by name after it get the same
    # timeout, which must hold on a loaded machine (at 0.5 s, three of them in a row once timed out).
    p = make(fake_runpod, sleeps, timeout=2.0)
    fake_runpod.hang_next(1, seconds=6.0, method="POST", path="/v2/clusters", apply=True)
    handle = p.launch(two())
    assert len(fake_runpod.launch_calls) == 1 and [c.id for c in fake_runpod.clusters()] == [handle.pod_id]
    assert p.launch(two()).pod_id == handle.pod_id  # the same attempt again: the same cluster
    assert len(fake_runpod.launch_calls) == 1 and len(fake_runpod.existing_pods()) == 2
    p.close()


def test_a_5xx_create_looks_by_name_before_creating_again(runpod, fake_runpod):  # noqa: F811
    fake_runpod.fail_next(1, 500, method="POST", path="/v2/clusters")
    handle = runpod.launch(two())
    assert len(fake_runpod.launch_calls) == 1  # the 500 came from the gateway, before the vendor saw it
    assert [c.id for c in fake_runpod.clusters()] == [handle.pod_id]
    assert ("GET", "/v2/clusters", "") in fake_runpod.requests  # looked for it by name first


def test_gc_ends_a_stray_cluster_whole(runpod, fake_runpod):  # noqa: F811
    handle = runpod.launch(two(name="autoslm-gone-s0-a1"))
    report = sweep(lambda name: runpod, "home1", None, all_homes=True, names=("runpod",))
    assert report.terminated == [f"runpod pod {handle.pod_id} (autoslm-gone-s0-a1)"], report.lines()
    assert fake_runpod.existing_pods() == [] and fake_runpod.running_pods() == []


def test_a_member_ends_its_whole_cluster_with_its_own_key(runpod, fake_runpod):  # noqa: F811
    other = runpod.launch(two(name="autoslm-other-s0-a1"))
    ender = [
        "python",
        "-c",
        "import os, time; from autoslm.engine.pod.selfterm import terminate_own_pod\n"
        "if os.environ['NODE_RANK'] == '1': print(terminate_own_pod(), flush=True)\n"
        "time.sleep(60)",
    ]
    handle = runpod.launch(two(ender))
    wait_for(lambda: fake_runpod.cluster(handle.pod_id).deleted, timeout=30)
    assert all(p.deleted for p in fake_runpod.members(handle.pod_id))
    # Its DELETE of its pod was refused (409: a member), so it read its cluster from its own record.
    member = fake_runpod.members(handle.pod_id)[1].id
    sent = [(m, p) for m, p, _ in fake_runpod.requests]
    assert sent.index(("DELETE", f"/v2/pods/{member}")) < sent.index(("GET", f"/v2/pods/{member}"))
    assert sent.index(("GET", f"/v2/pods/{member}")) < sent.index(("DELETE", f"/v2/clusters/{handle.pod_id}"))
    assert runpod.status(handle).state == "terminated" and runpod.status(other).state == "running"

    # The member's key reaches its own cluster only.
    key = fake_runpod.members(other.pod_id)[0].pod_key
    auth = {"Authorization": f"Bearer {key}"}
    assert httpx.get(f"{fake_runpod.url}/v2/clusters", headers=auth).status_code == 403
    assert httpx.delete(f"{fake_runpod.url}/v2/clusters/{handle.pod_id}", headers=auth).status_code == 403


def test_billing_records_are_the_members_time_at_the_handles_price(runpod, fake_runpod):  # noqa: F811
    handle = runpod.launch(two())
    runpod.terminate(handle)
    c = fake_runpod.cluster(handle.pod_id)
    auth = {"Authorization": f"Bearer {fake_runpod.api_key}"}
    r = httpx.get(f"{fake_runpod.url}/v2/billing/clusters", params={"clusterId": c.id, "bucketSize": "hour"}, headers=auth)
    body = r.json()
    assert r.status_code == 200 and {x["clusterId"] for x in body["records"]} == {c.id}
    lived = sum(p.deleted_at - p.created_at for p in fake_runpod.members(c.id)) / 2
    assert body["metadata"]["totals"]["totalAmount"] == pytest.approx(handle.price_per_hour * lived / 3600, rel=1e-3)
    assert body["metadata"]["uniqueClusterCount"] == 1 and body["metadata"]["query"]["bucketSize"] == "hour"
    both = httpx.get(
        f"{fake_runpod.url}/v2/billing/clusters", params={"lastN": 1, "startTime": "2026-01-01T00:00:00Z"}, headers=auth
    )
    assert both.status_code == 400


def test_the_community_cloud_is_refused_for_a_cluster_before_any_create(runpod, fake_runpod):  # noqa: F811
    with pytest.raises(ProviderError, match="secure cloud only"):
        runpod.launch(two(cloud="community"))
    assert runpod.offers(two(cloud="community").wish) == [] and fake_runpod.launch_calls == []


def test_no_stock_for_a_cluster_is_no_capacity_naming_the_shape(runpod, fake_runpod):  # noqa: F811
    from autoslm.errors import NoCapacity

    handle_offers = runpod.offers(two().wish)
    assert [o.price_per_hour for o in handle_offers] == [0.69] and handle_offers[0].extra["data_centers"] == ["US-FAKE-1"]
    fake_runpod.no_capacity(True)
    with pytest.raises(NoCapacity):
        runpod.launch(two(), tuple(handle_offers))
    assert fake_runpod.clusters() == []
