"""A RunPod pod ends itself (autoslm/engine/pod/selfterm.py calls ``end_from_inside`` with a client holding the
pod-scoped RUNPOD_API_KEY that RunPod injects; worker_image/boot_rules.py's POD_VENDORS says when).

Whether RunPod's pod-scoped key may DELETE its pod over REST v2 is not documented, so a 2xx is not
trusted: DELETE, then a read-back of the pod; if it is not gone, the ``terminate`` action, then the
``stop`` action (a stopped pod bills only its disk). The last fallback is the controller's.

A pod of an Instant Cluster (a replica of several pods) cannot be ended alone: the pod endpoints answer
409, and ending one would leave the others billing. RunPod sets no variable with the cluster's id, so
the pod reads it from its own record (``cluster.id``) and deletes the whole cluster, then reads it back.
Whichever node calls ends every node: the worker decides when (node 0 once its uploads are done, or
any node's watchdog at a limit).
"""

from __future__ import annotations

from autoslm.errors import ProviderAuthError, ProviderError
from autoslm.providers.http import ApiClient, ApiStatusError


def end_from_inside(api: ApiClient, pod: dict) -> str:
    """End the pod ``pod`` (a ``boot_rules.pod_vendor`` row) names. Returns what was done."""
    return _runpod_end(api, pod["id"], pod["end"])


def _runpod_end(api: ApiClient, pod_id: str, end: tuple[str, str]) -> str:
    path = f"/v2/pods/{pod_id}"
    tried = []
    try:
        api.call(
            end[0], end[1].format(id=pod_id), what=f"terminating its own pod {pod_id}"
        )  # the table's request, as boot.py sends it
    except ApiStatusError as e:
        if e.status == 404:
            return f"RunPod pod {pod_id} was already gone"
        if e.status == 409:  # a member of a cluster: ended only with it
            return _end_cluster(api, pod_id)
        tried.append(f"DELETE: HTTP {e.status}")
    except ProviderAuthError as e:
        tried.append(f"DELETE: {e.message}")
    else:
        if _runpod_gone(api, pod_id, ("TERMINATED",)):
            return f"terminated RunPod pod {pod_id}"
        tried.append("DELETE answered but the pod is still there")
    for action, done in (("terminate", ("TERMINATED",)), ("stop", ("TERMINATED", "EXITED"))):
        try:
            api.call("POST", f"{path}/action", json={"action": action}, what=f"{action} its own pod {pod_id}")
        except (ApiStatusError, ProviderAuthError) as e:
            tried.append(f"{action}: {getattr(e, 'status', None) or e.message}")
            continue
        if _runpod_gone(api, pod_id, done):
            return f"{'terminated' if action == 'terminate' else 'stopped'} RunPod pod {pod_id} (after: {'; '.join(tried)})"
        tried.append(f"{action} answered but the pod is still there")
    raise ProviderError(f"RunPod pod {pod_id} could not end itself ({'; '.join(tried)})", hint="the controller will terminate it")


def _end_cluster(api: ApiClient, pod_id: str) -> str:
    """Delete the cluster this pod is a member of (from its own record), and read the cluster back."""
    try:
        own = _json(api.call("GET", f"/v2/pods/{pod_id}", what=f"reading its own pod {pod_id}"))
    except ApiStatusError as e:
        if e.status == 404:
            return f"RunPod pod {pod_id} was already gone"
        raise ProviderError(f"RunPod pod {pod_id} could not read its own cluster (HTTP {e.status})", hint=_HINT) from None
    cluster = str((own.get("cluster") or {}).get("id") or "")
    if not cluster:
        raise ProviderError(f"RunPod refused to end pod {pod_id} (HTTP 409) and names no cluster of it", hint=_HINT)
    path = f"/v2/clusters/{cluster}"
    try:
        api.call("DELETE", path, what=f"deleting its own cluster {cluster}")
        api.call("GET", path, what=f"reading its own cluster {cluster}")
    except ApiStatusError as e:
        if e.status == 404:
            return f"deleted RunPod cluster {cluster} (every pod of it, {pod_id} among them)"
        raise ProviderError(
            f"RunPod cluster {cluster} of pod {pod_id} could not be deleted (HTTP {e.status})", hint=_HINT
        ) from None
    raise ProviderError(f"RunPod cluster {cluster} of pod {pod_id} is still there after its DELETE", hint=_HINT)


_HINT = "the controller will delete the cluster"


def _runpod_gone(api: ApiClient, pod_id: str, states: tuple[str, ...]) -> bool:
    """Read the pod back: a 2xx alone proves nothing about a key whose scope is not documented."""
    try:
        pod = _json(api.call("GET", f"/v2/pods/{pod_id}", what=f"reading its own pod {pod_id}"))
    except ApiStatusError as e:
        return e.status == 404
    except ProviderError:
        return False
    return str(pod.get("status") or "") in states


def _json(resp) -> dict:
    try:
        body = resp.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
