"""RunPod's REST v2 API, one method per endpoint autoslm uses: vendor JSON in and out, ``http.py``'s
errors raised. Only ``provider.py`` (and the pod's own end, ``selfterm.py``) talk through it."""

from __future__ import annotations

from typing import Any

from autoslm.providers.http import ApiClient


class RunPodApi:
    """RunPod REST v2, one method per endpoint we use. Returns vendor JSON; raises http.py errors."""

    def __init__(self, client: ApiClient):
        self.client = client

    def list_pods(self) -> list[dict]:
        resp = self.client.call("GET", "/v2/pods", what="listing pods")
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

    def gpu_types(
        self, *, cloud: str | None = None, count: int = 1, min_cuda: str | None = None, lookup: bool = False
    ) -> list[dict]:
        params: dict[str, Any] = {}
        if cloud:
            params = {"include": "AVAILABILITY", "product": "POD", "cloud": cloud, "count": count}
            if min_cuda:
                # Availability and prices are scoped by it: without it, stock that cannot run the
                # image's CUDA shows up in `plan` and is then refused at create.
                params["minCudaVersion"] = min_cuda
        resp = self.client.call("GET", "/v2/catalog/gpus", params=params, what="reading the GPU catalog", lookup=lookup)
        return list((resp.json() or {}).get("gpus") or [])
