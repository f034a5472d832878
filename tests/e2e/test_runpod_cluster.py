"""compute.nodes = 2 on the fake RunPod: one Instant Cluster of two pods, each a real worker process with
its own home and temporary directory (no shared disk) and RunPod's node variables, through the real CLI,
the real RunPod provider and the fake Hub as the store.

The promises: the SFT quickstart on a 2-pod cluster succeeds with world_size 2 in its metrics and the
final loss of the same spec on one pod (within 1e-3), with one create for both pods and no pod left;
`cancel` mid-run leaves no pod of the cluster.

    .venv/bin/python -m pytest -q tests/e2e/test_runpod_cluster.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import edited_spec
from tests.e2e.test_cloud_providers import HUB_REPO, TERMINAL, Cloud, assert_no_pod_left, cloud, run_id_from  # noqa: F401
from tests.fakes.cloud import wait_for

pytestmark = pytest.mark.e2e

QUICKSTART = Path(__file__).resolve().parents[2] / "jobspecs" / "quickstart.toml"
STEPS = 8  # short: two ranks on a CPU shared with other runs


def quickstart(cloud: Cloud, name: str, nodes: int, steps: int = STEPS, save_every: int = 4) -> Path:
    """The SFT quickstart, shortened, on ``nodes`` RunPod pods with the fake Hub as its store."""
    edits = [
        ('name = "quickstart"', f'name = "{name}"'),
        ("n_eval = 64", "n_eval = 8"),
        ("max_steps = 150", f"max_steps = {steps}"),
        ("save_every = 100", f"save_every = {save_every}"),
        ('provider = "local"', f'provider = "runpod"\ngpu = "RTX 4090"\nnodes = {nodes}'),
        ('store = "local"', f'store = "hf"\nrepo = "{HUB_REPO}"'),
    ]
    return edited_spec(QUICKSTART, edits, cloud.tmp / f"{name}.toml")


def cluster_of(cloud: Cloud, run_id: str):
    """The run's one cluster (its name carries the run id)."""
    (cluster,) = [c for c in cloud.runpod.clusters() if run_id in c.name]
    return cluster


def test_sft_on_a_two_pod_cluster_trains_as_one_pod_and_leaves_no_pod(cloud):  # noqa: F811
    one = cloud.start("nodes-one", "launch", str(quickstart(cloud, "nodes-one", 1)), "--yes")
    two = cloud.start("nodes-two", "launch", str(quickstart(cloud, "nodes-two", 2)), "--yes")
    r1, r2 = one.wait(), two.wait()
    assert r1.code == 0, r1.out + r1.err
    assert r2.code == 0, r2.out + r2.err
    m1 = cloud.status(run_id_from(r1.out))["metrics"]["seed0"]
    run_id = run_id_from(r2.out)
    st = cloud.status(run_id)
    assert st["state"] == "succeeded" and st["step"] == st["total_steps"] == STEPS, st
    m2 = st["metrics"]["seed0"]
    assert m2["world_size"] == 2 and m1["world_size"] == 1
    assert m2["final_loss"] == pytest.approx(m1["final_loss"], abs=1e-3)

    # One create for both pods, each a worker of its own node; none left, none billing.
    cluster = cluster_of(cloud, run_id)
    creates = [b for b in cloud.runpod.launch_calls if run_id in str(b.get("name", ""))]
    assert [b["compute"]["podCount"] for b in creates] == [2]
    members = cloud.runpod.members(cluster.id)
    assert [p.rank for p in members] == [0, 1] and len({p.injected["RUNPOD_POD_ID"] for p in members}) == 2
    assert cluster.deleted and st["pod_id"] is None and st["cost_usd"] > 0
    assert_no_pod_left(cloud, run_id)


def test_cancel_mid_run_leaves_no_pod_of_the_cluster(cloud):  # noqa: F811
    r = cloud.cli("launch", str(quickstart(cloud, "nodes-cancel", 2, steps=100_000, save_every=100_000)), "--detach", "--yes")
    assert r.code == 0, r.out + r.err
    run_id = run_id_from(r.out)
    # Mid-run: node 0's worker says training began (the store sees it only at its next commit).
    cluster = wait_for(
        lambda: [c for c in cloud.runpod.clusters() if run_id in c.name] and cluster_of(cloud, run_id), timeout=120
    )
    node0 = wait_for(lambda: (m := cloud.runpod.members(cluster.id)) and m[0], timeout=60)
    wait_for(lambda: "[autoslm] train_begin" in cloud.runpod.log(node0.id), timeout=300, interval=0.5)
    assert all(p.process.alive() for p in cloud.runpod.members(cluster.id))
    assert cloud.status(run_id)["state"] not in TERMINAL

    c = cloud.cli("cancel", run_id, timeout=120)
    assert c.code == 0 and "cancelled" in c.out, c.out + c.err
    assert cloud.status(run_id)["state"] == "cancelled"
    wait_for(lambda: cluster.deleted, timeout=60)
    assert_no_pod_left(cloud, run_id)
    assert len([c for c in cloud.runpod.clusters() if run_id in c.name]) == 1  # nothing relaunched it
