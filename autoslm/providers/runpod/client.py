"""RunPod's REST v2 API, one method per endpoint autoslm uses: vendor JSON in and out, ``http.py``'s
errors raised. Only ``provider.py`` (and the pod's own end, ``selfterm.py``) talk through it."""

from __future__ import annotations

from typing import Any

from autoslm.providers.http import ApiClient


class RunPodApi:
    """RunPod REST v2, one method per endpoint we use. Returns vendor JSON; raises http.py errors."""

    def __init__(self, client: ApiClient):
        self.client = client

    def list_pods(self, *, cluster_pods: bool = False) -> list[dict]:
        """The account's pods; with ``cluster_pods`` the Instant Clusters' members too (the API leaves them
        out by default), each carrying its ``cluster`` (id and node rank)."""
        params = {"includeClusterPods": "true"} if cluster_pods else None
        resp = self.client.call("GET", "/v2/pods", params=params, what="listing pods")
        return list((resp.json() or {}).get("pods") or [])

    def get_pod(self, pod_id: str) -> dict:
        return self.client.call("GET", f"/v2/pods/{pod_id}", what=f"reading pod {pod_id}").json()

    def create_pod(self, body: dict) -> dict:
        # 403 here means "your account cannot use this pool", not a bad key: the caller tries the next GPU.
        resp = self.client.call(
            "POST",
            "/v2/pods",
            json=body,
            what=f"creating pod {body['name']}",
            ok=(200, 201),
            idempotent=False,
            auth_statuses=(401,),
        )
        return resp.json()

    def delete_pod(self, pod_id: str) -> None:
        self.client.call("DELETE", f"/v2/pods/{pod_id}", what=f"terminating pod {pod_id}")

    # Instant Clusters: K pods of one shape in one data center on a private network, made and ended as one.

    def list_clusters(self) -> list[dict]:
        resp = self.client.call("GET", "/v2/clusters", what="listing clusters")
        return list((resp.json() or {}).get("clusters") or [])

    def get_cluster(self, cluster_id: str) -> dict:
        return self.client.call("GET", f"/v2/clusters/{cluster_id}", what=f"reading cluster {cluster_id}").json()

    def cluster_pods(self, cluster_id: str) -> list[dict]:
        resp = self.client.call("GET", f"/v2/clusters/{cluster_id}/pods", what=f"reading the pods of cluster {cluster_id}")
        return list((resp.json() or {}).get("pods") or [])

    def create_cluster(self, body: dict) -> dict:
        resp = self.client.call(
            "POST",
            "/v2/clusters",
            json=body,
            what=f"creating cluster {body['name']}",
            ok=(200, 201),
            idempotent=False,
            auth_statuses=(401,),
        )
        return resp.json()

    def delete_cluster(self, cluster_id: str) -> None:
        self.client.call("DELETE", f"/v2/clusters/{cluster_id}", what=f"deleting cluster {cluster_id}")

    def gpu_types(
        self,
        *,
        cloud: str | None = None,
        count: int = 1,
        min_cuda: str | None = None,
        lookup: bool = False,
        product: str = "POD",
    ) -> list[dict]:
        """The GPU catalog; with ``cloud``, the availability of ``count`` GPUs for ``product`` (POD, or
        CLUSTER for an Instant Cluster's pods: its stock is its own)."""
        params: dict[str, Any] = {}
        if cloud:
            params = {"include": "AVAILABILITY", "product": product, "cloud": cloud, "count": count}
            if min_cuda:
                # Availability and prices are scoped by it: without it, stock that cannot run the
                # image's CUDA shows up in `plan` and is then refused at create.
                params["minCudaVersion"] = min_cuda
        resp = self.client.call("GET", "/v2/catalog/gpus", params=params, what="reading the GPU catalog", lookup=lookup)
        return list((resp.json() or {}).get("gpus") or [])


def epoch(text) -> float | None:
    """RunPod's createdAt ("2026-01-02T03:04:05.123Z" or "... UTC") as epoch seconds, or None."""
    if not text:
        return None
    from datetime import datetime

    t = str(text).replace(" UTC", "Z").replace("Z", "+00:00")
    try:
        return datetime.fromisoformat(t).timestamp()
    except ValueError:
        return None
