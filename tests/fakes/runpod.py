"""A fake RunPod REST v2 API on 127.0.0.1, whose pods are local processes running the pod's command.

    with FakeRunPod(workdir=tmp_path) as fake:          # or the ``fake_runpod`` pytest fixture
        provider = RunPodProvider(fake.api_key, base_url=fake.url, sleep=...)
        env_for_cli = fake.env()                        # RUNPOD_API_KEY + AUTOSLM_RUNPOD_URL

Speaks the shapes of reference/runpod/openapi-v2.json: ``{"pods": [...]}`` lists, the Pod object,
RFC 9457 problem JSON errors, 201 on create, 204 on delete, ``Retry-After`` on 429. Endpoints:
GET/POST /v2/pods, GET/DELETE /v2/pods/{id}, POST /v2/pods/{id}/action, GET /v2/catalog/gpus, and
Instant Clusters' (tests/fakes/runpod_clusters.py: /v2/clusters, its pods, /v2/billing/clusters).

Creating a pod starts ``PodRequest.command`` (the create body's ``args``, split like a shell) as a local
process with the pod's env plus what RunPod injects: RUNPOD_POD_ID and a pod-scoped RUNPOD_API_KEY
that this fake accepts only for that pod's own read/terminate. Deleting it kills the process group.

Test API: ``preempt(pod_id)`` (kill the process; the pod shows EXITED, or is gone with
``terminate=True``), ``no_capacity(True)`` (catalog shows NONE, creates answer 400), ``fail_next``,
``hang_next`` (see tests/fakes/cloud.py), ``pods()`` / ``running_pods()`` / ``existing_pods()``,
``pod(id)``, ``log(id)``, ``launch_calls`` (create bodies), ``requests`` (method, path, query).

Fidelity gaps: a container that exits is restarted only with ``restart_containers=True`` (real RunPod
always restarts it, which is why the worker terminates its own pod), and then when the pod is next
looked at rather than at once; status goes straight to RUNNING (``boot_s`` delays it); the catalog
is a fixed table; no data centers, volumes, ports, SSH, logs endpoint or billing; PATCH is not served;
cost is the catalog price, never per-second billing.
"""

from __future__ import annotations

import re
import secrets
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.cloud import LABEL_RULE, FakeCloud, PodProcess, Request, Response, label_ok, reason_phrase
from tests.fakes.runpod_clusters import NODE_IP, ClusterRoutes, FakeCluster
from tests.fakes.runpod_clusters import iso as _iso

CAPACITY_DETAIL = "There are no longer any instances available with the requested specifications. Please refresh and try again."

DEFAULT_GPUS = [
    # id, name, memory GB, secure $/h, community $/h
    ("NVIDIA GeForce RTX 4090", "RTX 4090", 24, 0.69, 0.34),
    ("NVIDIA RTX A5000", "RTX A5000", 24, 0.27, 0.16),
    ("NVIDIA L40S", "L40S", 48, 0.86, 0.79),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe", 80, 1.64, 1.19),
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 80, 2.99, 2.69),
]

_CREATE_KEYS = {
    "name",
    "image",
    "gpu",
    "cpu",
    "cloud",
    "disk",
    "env",
    "args",
    "ports",
    "mounts",
    "dataCenterIds",
    "templateId",
    "startSsh",
    "startJupyter",
    "registry",
    "globalNetworking",
}
_GPU_KEYS = {"id", "count", "allowedCudaVersions", "minCudaVersion"}
_ACTIONS = {
    "PROVISIONING": ["stop", "terminate"],
    "STARTING": ["stop", "terminate"],
    "RUNNING": ["stop", "restart", "terminate"],
    "EXITED": ["start", "terminate"],
    "ERROR": ["start", "terminate"],
    "TERMINATED": [],
}


@dataclass
class FakePod:
    id: str
    name: str
    image: str
    args: str
    gpu_id: str
    gpu_count: int
    cloud: str
    disk: int
    env: dict[str, str]  # as sent by the client (what RunPod stores), without the injected variables
    unit_price: float
    pod_key: str
    created_at: float = field(default_factory=time.time)
    process: PodProcess | None = None
    status: str = "PROVISIONING"  # the stored status; ``FakeRunPod.state`` derives the live one
    deleted: bool = False
    deleted_at: float | None = None  # when the DELETE (or a preemption that terminates) arrived
    preempted: bool = False
    min_cuda: str | None = None
    injected: dict[str, str] = field(default_factory=dict)
    container_starts: int = 0
    cluster_id: str | None = None  # a member of an Instant Cluster (tests/fakes/runpod_clusters.py)
    rank: int | None = None  # its node rank there


class FakeRunPod(ClusterRoutes, FakeCloud):
    vendor = "runpod"

    def __init__(
        self,
        *,
        gpus: list[tuple] | None = None,
        boot_s: float = 0.0,
        cuda_version: str = "13.0",
        restart_containers: bool = False,
        **kw,
    ):
        super().__init__(**kw)
        # As RunPod does: a container whose main process exits is started again (checked whenever the
        # pod is looked at, not on a timer: a fidelity gap that only delays a restart by one poll).
        self.restart_containers = restart_containers
        self.gpus = {
            g[0]: {"id": g[0], "name": g[1], "memory": g[2], "secure": g[3], "community": g[4]} for g in (gpus or DEFAULT_GPUS)
        }
        self.boot_s = boot_s
        self.cuda_version = cuda_version
        self._pods: dict[str, FakePod] = {}
        self._no_stock: set[str] = set()
        self._no_stock_all = False
        self._clusters: dict[str, FakeCluster] = {}

    def env(self) -> dict[str, str]:
        return {"RUNPOD_API_KEY": self.api_key, "AUTOSLM_RUNPOD_URL": self.url}

    # -- test API ----------------------------------------------------------------------------------

    def no_capacity(self, flag: bool = True, gpus: list[str] | None = None) -> None:
        """No stock (for the ``gpus`` ids, or everywhere): the catalog says NONE and creates answer 400."""
        with self.lock:
            if gpus is None:
                self._no_stock_all = flag
                if not flag:
                    self._no_stock.clear()
            elif flag:
                self._no_stock.update(gpus)
            else:
                self._no_stock.difference_update(gpus)

    def has_capacity(self, gpu_id: str) -> bool:
        with self.lock:
            return not self._no_stock_all and gpu_id not in self._no_stock

    def preempt(self, pod_id: str, *, terminate: bool = False) -> None:
        """The host is lost: kill the process at once; the pod shows EXITED (or is gone with ``terminate``)."""
        with self.lock:
            pod = self._pods[pod_id]
            pod.preempted = True
            pod.status = "TERMINATED" if terminate else "EXITED"
            if terminate and not pod.deleted:
                pod.deleted, pod.deleted_at = True, time.time()
        if pod.process:
            pod.process.kill()

    def pods(self) -> list[FakePod]:
        with self.lock:
            return list(self._pods.values())

    def pod(self, pod_id: str) -> FakePod:
        return self._pods[pod_id]

    def running_pods(self) -> list[FakePod]:
        """Pods whose process is alive (the worker is running)."""
        return [p for p in self.pods() if not p.deleted and p.process is not None and p.process.alive()]

    def existing_pods(self) -> list[FakePod]:
        """Pods not terminated: still on the bill in some form."""
        return [p for p in self.pods() if not p.deleted]

    def log(self, pod_id: str) -> str:
        p = self._pods[pod_id]
        return p.process.output() if p.process else ""

    def state(self, pod: FakePod) -> str:
        """The live RunPod status of a pod."""
        if pod.deleted:
            return "TERMINATED"
        if pod.status in ("EXITED", "ERROR", "TERMINATED"):
            return pod.status
        if pod.process is not None and not pod.process.alive():
            if self.restart_containers and not pod.preempted:
                with self.lock:
                    if not pod.process.alive() and not pod.deleted:
                        pod.process = self.start_pod_process(pod.id, shlex.split(pod.args), pod.env, pod.injected)
                        pod.container_starts += 1
                return "RUNNING"
            return "EXITED"
        if time.time() - pod.created_at < self.boot_s:
            return "PROVISIONING"
        return "RUNNING"

    def kill_all(self) -> None:
        for p in self.pods():
            if p.process:
                p.process.kill()

    # -- vendor API --------------------------------------------------------------------------------

    def error_body(self, status: int, message: str) -> Any:
        return {"title": reason_phrase(status), "status": status, "detail": message}

    def _problem(self, status: int, detail: str, errors: list[str] | None = None) -> Response:
        body = self.error_body(status, detail)
        if errors:
            body["errors"] = errors
        headers = {"Retry-After": "1"} if status == 429 else {}
        return Response(status, body, headers, content_type="application/problem+json")

    def handle(self, req: Request) -> Response:
        scope = self._auth(req)
        if isinstance(scope, Response):
            return scope
        m = re.fullmatch(r"/v2/pods/([^/]+)(/action)?", req.path)
        if scope != "account":
            # A pod-scoped key may read and terminate its own pod (a cluster's member: its own cluster), nothing else.
            own = m is not None and m.group(1) == scope
            allowed = own and (
                req.method in ("GET", "DELETE") or (m.group(2) and (req.body or {}).get("action") in ("stop", "terminate"))
            )
            if not allowed and not self.own_cluster(req, scope):
                return self._problem(403, "access denied")
        if req.path.startswith(("/v2/clusters", "/v2/billing/clusters")):
            return self.handle_clusters(req)
        if req.path == "/v2/pods" and req.method == "GET":
            members = req.q("includeClusterPods") == "true"
            with self.lock:
                pods = [p for p in self._pods.values() if not p.deleted and (members or p.cluster_id is None)]
                return Response(200, {"pods": [self._pod_json(p) for p in pods]})
        if req.path == "/v2/pods" and req.method == "POST":
            return self._create(req.body)
        if req.path == "/v2/catalog/gpus" and req.method == "GET":
            return self._catalog(req)
        if m and not m.group(2):
            pod = self._pods.get(m.group(1))
            if pod is None or pod.deleted:
                return self._problem(404, "pod not found")
            if req.method == "GET":
                return Response(200, self._pod_json(pod))
            if req.method == "DELETE":
                if pod.cluster_id is not None:
                    return self._problem(409, f"pod {pod.id} belongs to cluster {pod.cluster_id}: delete the cluster")
                self._terminate(pod)
                return Response(204)
        if m and m.group(2) and req.method == "POST":
            pod = self._pods.get(m.group(1))
            if pod is None or pod.deleted:
                return self._problem(404, "pod not found")
            if pod.cluster_id is not None:
                return self._problem(409, f"pod {pod.id} belongs to cluster {pod.cluster_id}: manage it through the cluster")
            action = (req.body or {}).get("action")
            if action not in ("start", "stop", "restart", "terminate"):
                return self._problem(
                    422, "Request validation failed.", [f"$.action: {action!r} is not one of start, stop, restart, terminate"]
                )
            if action not in _ACTIONS[self.state(pod)]:
                return self._problem(409, f"action {action} is not valid for a pod that is {self.state(pod)}")
            if action == "terminate":
                self._terminate(pod)
                return Response(204)
            if action == "stop":
                if pod.process:
                    pod.process.kill(self.terminate_grace_s)
                pod.status = "EXITED"
                return Response(200, self._pod_json(pod))
            return self._problem(400, f"the fake does not implement {action}")
        return self._problem(404, "resource not found")

    def _auth(self, req: Request) -> str | Response:
        if not req.token:
            return self._problem(401, "missing bearer token")
        if secrets.compare_digest(req.token, self.api_key):
            return "account"
        with self.lock:
            for p in self._pods.values():
                if secrets.compare_digest(req.token, p.pod_key):
                    return p.id
        return self._problem(401, "invalid bearer token")

    def _catalog(self, req: Request) -> Response:
        include = req.q("include")
        product = req.q("product")
        if bool(include) != bool(product):
            return self._problem(400, "product is required with include=AVAILABILITY, and valid only with it")
        if product and not set(product.split(",")) <= {"POD", "CLUSTER", "SERVERLESS"}:
            return self._problem(400, f"product {product!r}: one or more of POD, CLUSTER, SERVERLESS")
        cloud = (req.q("cloud") or "SECURE").lower()
        count = int(req.q("count") or 1)
        out = []
        for g in self.gpus.values():
            item = {
                "id": g["id"],
                "name": g["name"],
                "pool": None,
                "manufacturer": "NVIDIA",
                "memory": g["memory"],
                "secure": True,
                "community": True,
                "price": {"secure": g["secure"], "community": g["community"]},
                "maxCount": {"secure": 8, "community": 4},
            }
            if include == "AVAILABILITY":
                min_cuda = req.q("minCudaVersion")
                ok = self.has_capacity(g["id"]) and count <= item["maxCount"][cloud]
                ok = ok and not (min_cuda and _version(min_cuda) > _version(self.cuda_version))
                item["availability"] = "HIGH" if ok else "NONE"
                if ok:
                    item["dataCenters"] = [{"id": "US-FAKE-1", "name": "Fake 1", "availability": "HIGH"}]
                    item["cudaVersions"] = [{"version": self.cuda_version, "availability": "HIGH"}]
            out.append(item)
        return Response(200, {"gpus": out})

    def _create(self, body: Any) -> Response:
        with self.lock:
            self.launch_calls.append(body if isinstance(body, dict) else {"__body__": body})
        if not isinstance(body, dict) or body.get("__invalid_json__"):
            return self._problem(400, "request body is not valid JSON")
        errors = [f"$: additional properties '{k}' not allowed" for k in body if k not in _CREATE_KEYS]
        gpu = body.get("gpu")
        if not body.get("name"):
            errors.append("$.name: is required")
        elif not label_ok(str(body["name"])):
            errors.append(f"$.name: must be {LABEL_RULE} (the rule autoslm keeps for the names a vendor stores)")
        if not body.get("image") and not body.get("templateId"):
            errors.append("$.image: is required")
        if not isinstance(gpu, dict) or not gpu.get("id"):
            errors.append("$.gpu.id: is required (this fake has no CPU pods)")
        else:
            errors += [f"$.gpu: additional properties '{k}' not allowed" for k in gpu if k not in _GPU_KEYS]
        if body.get("cloud", "SECURE") not in ("SECURE", "COMMUNITY"):
            errors.append("$.cloud: must be SECURE or COMMUNITY")
        if not isinstance(body.get("args", ""), str):
            errors.append("$.args: must be a string")
        env = body.get("env") or {}
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            errors.append("$.env: values must be strings")
        if errors:
            return self._problem(422, "Request validation failed.", errors)
        g = self.gpus.get(gpu["id"])
        if g is None:
            return self._problem(400, f"GPU type {gpu['id']!r} not found")
        if not self.has_capacity(gpu["id"]):
            return self._problem(400, CAPACITY_DETAIL)
        min_cuda = gpu.get("minCudaVersion")
        if min_cuda and _version(min_cuda) > _version(self.cuda_version):
            return self._problem(400, CAPACITY_DETAIL)
        cloud = body.get("cloud", "SECURE")
        pod = self.new_pod(body, gpu["id"], int(gpu.get("count") or 1), cloud, min_cuda=min_cuda)
        self.start_pod(pod)
        return Response(201, self._pod_json(pod))

    def new_pod(self, body: dict, gpu_id: str, gpu_count: int, cloud: str, **fields) -> FakePod:
        """A pod of a create body (a pod's or a cluster's container settings), stored, not started."""
        pod = FakePod(
            id=secrets.token_hex(7),
            name=body["name"],
            image=body.get("image") or "",
            args=body.get("args") or "",
            gpu_id=gpu_id,
            gpu_count=gpu_count,
            cloud=cloud,
            disk=int(body.get("disk") or 50),
            env=dict(body.get("env") or {}),
            unit_price=self.gpus[gpu_id][cloud.lower()],
            pod_key="rpa_pod" + secrets.token_hex(16),
            **fields,
        )
        with self.lock:
            self._pods[pod.id] = pod
        return pod

    def start_pod(self, pod: FakePod, more: dict[str, str] | None = None) -> None:
        """Run the pod's command with what RunPod injects (and ``more``: a cluster's variables)."""
        command = shlex.split(pod.args)
        if command:
            injected = {
                "RUNPOD_POD_ID": pod.id,
                "RUNPOD_API_KEY": pod.pod_key,
                "RUNPOD_GPU_COUNT": str(pod.gpu_count),
                "AUTOSLM_RUNPOD_URL": self.url,
                **(more or {}),
            }
            pod.injected = injected
            pod.process = self.start_pod_process(pod.id, command, pod.env, injected)
            pod.container_starts = 1

    def _terminate(self, pod: FakePod) -> None:
        with self.lock:
            if not pod.deleted:
                pod.deleted_at = time.time()
            pod.deleted = True
            pod.status = "TERMINATED"
        if pod.process:
            pod.process.kill(self.terminate_grace_s)

    def _pod_json(self, pod: FakePod) -> dict:
        state = self.state(pod)
        running = state == "RUNNING"
        return {
            "id": pod.id,
            "name": pod.name,
            "status": state,
            "actions": _ACTIONS[state],
            "image": pod.image,
            "args": pod.args,
            "disk": pod.disk,
            "mounts": {},
            "ports": [],
            "env": dict(pod.env),  # RunPod echoes the environment: a client must never print a pod
            "registry": None,
            "gpu": {"id": pod.gpu_id, "count": pod.gpu_count},
            "cloud": pod.cloud,
            "dataCenterId": "US-FAKE-1",
            "cudaVersion": self.cuda_version,
            "ssh": {"proxy": None, "direct": None},
            "template": None,
            "cost": round(pod.unit_price * pod.gpu_count, 4) if state in ("PROVISIONING", "STARTING", "RUNNING") else 0.0,
            "locked": False,
            "globalNetworking": {"enabled": False},
            "runtime": {"uptime": int(time.time() - pod.created_at)} if running else None,
            "createdAt": _iso(pod.created_at),
            "startedAt": _iso(pod.created_at) if running else None,
            **({"cluster": {"id": pod.cluster_id, "rank": pod.rank, "ip": NODE_IP}} if pod.cluster_id else {}),
        }


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


@pytest.fixture
def fake_runpod(tmp_path: Path):
    """A started FakeRunPod; every pod process is killed at teardown."""
    with FakeRunPod(workdir=tmp_path / "fake-runpod") as fake:
        yield fake
