"""The fake RunPod's Instant Clusters (tests/fakes/runpod.py mixes these routes in), in the shapes of
reference/runpod/openapi-v2.json: POST/GET /v2/clusters, GET/DELETE /v2/clusters/{id},
GET /v2/clusters/{id}/pods, GET /v2/billing/clusters.

A create makes ``compute.podCount`` member pods, each a real local process (as the fake's pods are) with
its own private HOME, TMPDIR and working directory (members share no disk), the create's container
settings, and what RunPod sets in every container of a cluster (its "configuration reference"):
PRIMARY_ADDR / MASTER_ADDR (127.0.0.1 here: the members share this machine's loopback in place of the
cluster's private network), PRIMARY_PORT / MASTER_PORT (a port free on this machine), HOST_NODE_ADDR,
NODE_ADDR, NODE_RANK, NUM_NODES, NUM_TRAINERS (GPUs per pod) and WORLD_SIZE (all GPUs). Members are
left out of GET /v2/pods unless ``includeClusterPods=true``, carry ``cluster`` {id, rank, ip}, and are
refused (409) by the pod endpoints' DELETE and actions: a cluster ends only as a whole (DELETE).

Test API: ``clusters()``, ``cluster(id)``, ``members(id)`` (by rank), ``preempt(pod_id)`` of one member
(the fake's own: its process killed, the pod EXITED, or gone with ``terminate=True``), and ``fail_next`` /
``hang_next`` with a ``/v2/clusters`` path.

Fidelity gaps: whether a member's pod-scoped key may read and delete its own cluster is not documented;
this fake allows it (a member's worker ends its cluster that way) and nothing else of the cluster API.
Only TRAINING and APPLICATION clusters are made (no Slurm or Ray roles); one data center, US-FAKE-1;
billing counts each member's GPUs at the secure price from its create to its end (no disk or networking
amounts, an exited member still counted), in hour, day or week buckets aligned to the epoch.
"""

from __future__ import annotations

import secrets
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from tests.fakes.cloud import LABEL_RULE, Request, Response, label_ok

if TYPE_CHECKING:
    from tests.fakes.runpod import FakePod

NODE_IP = "127.0.0.1"  # every member's address on the "private network": this machine's loopback
DATA_CENTER = "US-FAKE-1"
_CREATE_KEYS = {
    "args",
    "disk",
    "env",
    "image",
    "ports",
    "compute",
    "name",
    "type",
    "dataCenterIds",
    "mounts",
    "startJupyter",
    "startSsh",
}
_COMPUTE_KEYS = {"gpuTypeId", "gpuCountPerPod", "podCount"}
_TYPES = ("APPLICATION", "TRAINING", "SLURM", "RAY")
_BUCKETS = {"hour": 3600, "day": 86400, "week": 7 * 86400}


@dataclass
class FakeCluster:
    id: str
    name: str
    type: str
    gpu_id: str
    gpu_count: int  # per pod
    pod_count: int
    port: int  # PRIMARY_PORT
    created_at: float = field(default_factory=time.time)
    member_ids: list[str] = field(default_factory=list)  # by node rank
    deleted: bool = False
    deleted_at: float | None = None


class ClusterRoutes:
    """Instant Clusters for ``FakeRunPod`` (which holds ``_pods``, ``_clusters``, ``lock``, ``gpus``)."""

    # -- test API ----------------------------------------------------------------------------------

    def clusters(self) -> list[FakeCluster]:
        with self.lock:
            return list(self._clusters.values())

    def cluster(self, cluster_id: str) -> FakeCluster:
        return self._clusters[cluster_id]

    def members(self, cluster_id: str) -> list[FakePod]:
        """The member pods, by node rank (ended ones too)."""
        return [self._pods[i] for i in self._clusters[cluster_id].member_ids]

    # -- vendor API --------------------------------------------------------------------------------

    def own_cluster(self, req: Request, pod_id: str) -> bool:
        """Whether a pod-scoped key (of ``pod_id``) may make this request: read or delete its own cluster."""
        pod = self._pods.get(pod_id)
        return (
            pod is not None
            and pod.cluster_id is not None
            and req.path == f"/v2/clusters/{pod.cluster_id}"
            and req.method in ("GET", "DELETE")
        )

    def handle_clusters(self, req: Request) -> Response:
        if req.path == "/v2/billing/clusters" and req.method == "GET":
            return self._billing(req)
        if req.path == "/v2/clusters" and req.method == "POST":
            return self._create_cluster(req.body)
        if req.path == "/v2/clusters" and req.method == "GET":
            with self.lock:
                return Response(200, {"clusters": [self._cluster_json(c) for c in self._clusters.values() if not c.deleted]})
        parts = req.path.split("/")  # "", "v2", "clusters", id[, "pods"]
        cluster = self._clusters.get(parts[3]) if len(parts) in (4, 5) else None
        if cluster is None or cluster.deleted or (len(parts) == 5 and parts[4] != "pods"):
            return self._problem(404, "cluster not found")
        if len(parts) == 5 and req.method == "GET":
            with self.lock:
                pods = [self._pods[i] for i in cluster.member_ids if not self._pods[i].deleted]
                return Response(200, {"pods": [self._pod_json(p) for p in pods]})
        if req.method == "GET":
            return Response(200, self._cluster_json(cluster))
        if req.method == "DELETE":
            members, now = self.members(cluster.id), time.time()
            with self.lock:  # every member gone with the cluster, at once; then their processes end
                for pod in members:
                    pod.deleted_at = pod.deleted_at if pod.deleted else now
                    pod.deleted, pod.status = True, "TERMINATED"
                cluster.deleted, cluster.deleted_at = True, now
            for pod in members:
                if pod.process:
                    pod.process.kill(self.terminate_grace_s)
            return Response(204)
        return self._problem(404, "resource not found")

    def _create_cluster(self, body) -> Response:
        with self.lock:
            self.launch_calls.append(body if isinstance(body, dict) else {"__body__": body})
        if not isinstance(body, dict) or body.get("__invalid_json__"):
            return self._problem(400, "request body is not valid JSON")
        errors = _cluster_errors(body)
        if errors:
            return self._problem(422, "Request validation failed.", errors)
        compute = body["compute"]
        gid, per_pod, count = compute["gpuTypeId"], compute["gpuCountPerPod"], compute["podCount"]
        if body["type"] not in ("TRAINING", "APPLICATION"):
            return self._problem(400, f"this fake makes TRAINING and APPLICATION clusters, not {body['type']}")
        if gid not in self.gpus:
            return self._problem(400, f"GPU type {gid!r} not found")
        if per_pod > 8:
            return self._problem(400, f"gpuCountPerPod {per_pod} is over {gid}'s maxCount (8)")
        wanted = body.get("dataCenterIds") or [DATA_CENTER]
        if not self.has_capacity(gid) or DATA_CENTER not in wanted:
            from tests.fakes.runpod import CAPACITY_DETAIL

            return self._problem(400, CAPACITY_DETAIL)
        cluster = FakeCluster(secrets.token_hex(6), body["name"], body["type"], gid, per_pod, count, _free_port())
        members = [self.new_pod(body, gid, per_pod, "SECURE", cluster_id=cluster.id, rank=r) for r in range(count)]
        cluster.member_ids = [p.id for p in members]
        with self.lock:
            self._clusters[cluster.id] = cluster
        for pod in members:
            self.start_pod(pod, _cluster_env(cluster, pod.rank))
        return Response(201, self._cluster_json(cluster))

    def _cluster_json(self, c: FakeCluster) -> dict:
        live = [self._pods[i] for i in c.member_ids if not self._pods[i].deleted]
        by_status: dict[str, int] = {}
        for p in live:
            by_status[self.state(p)] = by_status.get(self.state(p), 0) + 1
        primary = self._pods[c.member_ids[0]] if c.member_ids else None
        out = {
            "id": c.id,
            "name": c.name,
            "type": c.type,
            "compute": {"gpuTypeId": c.gpu_id, "gpuCountPerPod": c.gpu_count, "podCount": c.pod_count},
            "dataCenterId": DATA_CENTER,
            "pods": {"total": len(live), "byStatus": by_status},
            "network": {"cidr": "10.65.0.0/16", "vxlanId": 42, "vxlanPort": 4789},
            "createdAt": iso(c.created_at),
        }
        if primary is not None and not primary.deleted:
            out["primary"] = {"podId": primary.id, "status": self.state(primary)}
        return out

    def _billing(self, req: Request) -> Response:
        size_name = req.q("bucketSize") or "day"
        if size_name not in _BUCKETS:
            return self._problem(400, f"bucketSize {size_name!r}: this fake serves hour, day and week")
        size = _BUCKETS[size_name]
        window = _window(req, size)
        if isinstance(window, str):
            return self._problem(400, window)
        start, end = window
        wanted = req.q("clusterId")
        records = []
        with self.lock:
            clusters = [c for c in self._clusters.values() if wanted in (None, c.id)]
            for c in clusters:
                for b in range(int(start), int(end), size):
                    amount = sum(self._gpu_usd(p, b, b + size) for p in self.members(c.id))
                    if amount > 0:
                        records.append(_record(b, b + size, c.id, amount))
        total = sum(r["totalAmount"] for r in records)
        query = {"startTime": iso0(start), "endTime": iso0(end), "bucketSize": size_name, "clusterId": wanted}
        metadata = {
            "query": query,
            "recordCount": len(records),
            "uniqueClusterCount": len({r["clusterId"] for r in records}),
            "totals": {"totalAmount": total, "gpuAmount": total, "diskAmount": 0.0, "networkingAmount": 0.0},
        }
        return Response(200, {"records": records, "metadata": metadata})

    def _gpu_usd(self, pod: FakePod, lo: float, hi: float) -> float:
        """What a member's GPUs cost within [lo, hi): its price over its life (create to end) there."""
        until = pod.deleted_at if pod.deleted_at is not None else time.time()
        seconds = max(0.0, min(hi, until) - max(lo, pod.created_at))
        return pod.unit_price * pod.gpu_count * seconds / 3600


def _cluster_errors(body: dict) -> list[str]:
    errors = [f"$: additional properties '{k}' not allowed" for k in body if k not in _CREATE_KEYS]
    if not body.get("name"):
        errors.append("$.name: is required")
    elif not label_ok(str(body["name"])):
        errors.append(f"$.name: must be {LABEL_RULE} (the rule autoslm keeps for the names a vendor stores)")
    if body.get("type") not in _TYPES:
        errors.append(f"$.type: must be one of {', '.join(_TYPES)}")
    if not body.get("image"):
        errors.append("$.image: is required (this fake has no templates)")
    compute = body.get("compute")
    if not isinstance(compute, dict):
        return errors + ["$.compute: is required"]
    errors += [f"$.compute: additional properties '{k}' not allowed" for k in compute if k not in _COMPUTE_KEYS]
    errors += [f"$.compute.{k}: is required" for k in sorted(_COMPUTE_KEYS) if k not in compute]
    if not isinstance(compute.get("gpuCountPerPod", 1), int) or compute.get("gpuCountPerPod", 1) < 1:
        errors.append("$.compute.gpuCountPerPod: must be an integer of at least 1")
    count = compute.get("podCount", 2)
    if not isinstance(count, int) or not 2 <= count <= 250:
        errors.append("$.compute.podCount: must be an integer from 2 to 250")
    if not isinstance(body.get("args", ""), str):
        errors.append("$.args: must be a string")
    env = body.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        errors.append("$.env: values must be strings")
    return errors


def _cluster_env(c: FakeCluster, rank: int) -> dict[str, str]:
    """What RunPod sets in every container of a cluster (docs: Instant Clusters, configuration reference)."""
    port = str(c.port)
    return {
        "PRIMARY_ADDR": NODE_IP,
        "MASTER_ADDR": NODE_IP,
        "PRIMARY_PORT": port,
        "MASTER_PORT": port,
        "HOST_NODE_ADDR": f"{NODE_IP}:{port}",
        "NODE_ADDR": NODE_IP,
        "NODE_RANK": str(rank),
        "NUM_NODES": str(c.pod_count),
        "NUM_TRAINERS": str(c.gpu_count),
        "WORLD_SIZE": str(c.pod_count * c.gpu_count),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((NODE_IP, 0))
        return s.getsockname()[1]


def _window(req: Request, size: int) -> tuple[float, float] | str:
    """The billing query's [start, end), snapped to its buckets as the reference says; or what is wrong."""
    last_n, start, end = req.q("lastN"), req.q("startTime"), req.q("endTime")
    if last_n and (start or end):
        return "lastN and startTime/endTime are mutually exclusive"
    now = time.time()
    if last_n:
        hi = (now // size + 1) * size
        return hi - int(last_n) * size, hi
    try:
        lo = _parse(start) if start else now - 30 * 86400
        hi = _parse(end) if end else now
    except ValueError as e:
        return f"startTime/endTime: {e}"
    return (lo // size) * size, -(-hi // size) * size


def _record(lo: float, hi: float, cluster_id: str, amount: float) -> dict:
    return {
        "startTime": iso0(lo),
        "endTime": iso0(hi),
        "clusterId": cluster_id,
        "totalAmount": amount,
        "gpuAmount": amount,
        "diskAmount": 0.0,
        "networkingAmount": 0.0,
    }


def _parse(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def iso0(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
