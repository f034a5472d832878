"""Inside a rented pod, terminate that pod through the vendor's API once the worker is done.

RunPod restarts a pod's container when it exits and Vast keeps a stopped instance (billing its disk),
so a finished worker ends its own pod rather than rely on the controller's next poll. This uses only
the credentials the vendor injects into the pod: RunPod's RUNPOD_POD_ID with the pod-scoped
RUNPOD_API_KEY, Vast's CONTAINER_ID with the instance-scoped CONTAINER_API_KEY.

It must never: use (or ask for) the user's account key -- the controller never puts it into a pod's
environment, and the providers refuse to; terminate anything but the pod it runs in; print a key.
Base URLs follow AUTOSLM_RUNPOD_URL / AUTOSLM_VAST_URL like the providers, so the fakes work too.

It checks what the vendor answers instead of trusting a 2xx: Vast answers some refusals with HTTP 200
and ``{"success": false}``, and whether RunPod's pod-scoped key may DELETE its pod over REST v2 is not
documented. So: RunPod DELETE, then a read-back of the pod; if it is not gone, the ``terminate``
action, then the ``stop`` action (a stopped pod bills only its disk). Vast DELETE; on a refusal,
``PUT state=stopped`` (what public code does with CONTAINER_API_KEY), its answer checked too. The
last fallback, which provably works, is the controller's: the worker exits with its error recorded,
and the supervisor terminates the pod with the account key.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

import httpx

from autoslm.errors import ProviderAuthError, ProviderError
from autoslm.providers.http import ApiClient, ApiStatusError, RetryPolicy

RUNPOD_URL = "https://api.runpod.io"
VAST_URL = "https://console.vast.ai"

# A finished worker should not hang around for minutes on a flaky API: the controller's teardown
# (and gc) terminate the pod anyway if this fails.
SELFTERM_RETRY = RetryPolicy(attempts=4, backoff_s=1.0, factor=2.0, max_backoff_s=8.0, max_retry_after_s=15.0, max_total_s=60.0)


def terminate_own_pod(
    environ: Mapping[str, str] = os.environ,
    *,
    timeout_s: float = 10.0,
    retry: RetryPolicy = SELFTERM_RETRY,
    sleep: Callable[[float], None] = time.sleep,
    transport: httpx.BaseTransport | None = None,
) -> str | None:
    """Terminate the pod this process runs in. Returns what was done, or None when not in a pod.

    Raises ProviderAuthError when the pod's id is there but its scoped key is not (or is refused),
    and ProviderError subclasses when the API keeps failing; a missing pod counts as done.
    """
    pod_id = environ.get("RUNPOD_POD_ID")
    if pod_id:
        key = environ.get("RUNPOD_API_KEY")
        if not key:
            raise ProviderAuthError(
                f"inside RunPod pod {pod_id} but RUNPOD_API_KEY (the pod-scoped key RunPod injects) is not set",
                hint="the controller will terminate the pod",
            )
        base = environ.get("AUTOSLM_RUNPOD_URL") or RUNPOD_URL
        with _client(base, key, "RunPod", "RUNPOD_API_KEY", timeout_s, retry, sleep, transport) as api:
            return _runpod_end(api, pod_id)

    instance_id = environ.get("CONTAINER_ID")
    if instance_id and (environ.get("CONTAINER_API_KEY") or environ.get("VAST_CONTAINERLABEL")):
        key = environ.get("CONTAINER_API_KEY")
        if not key:
            raise ProviderAuthError(
                f"inside Vast instance {instance_id} but CONTAINER_API_KEY (the key Vast injects) is not set",
                hint="the controller will destroy the instance",
            )
        base = environ.get("AUTOSLM_VAST_URL") or VAST_URL
        with _client(base, key, "Vast", "CONTAINER_API_KEY", timeout_s, retry, sleep, transport) as api:
            refusal = None
            try:
                answer = _json(api.call("DELETE", f"/api/v0/instances/{instance_id}/", what=f"destroying its own instance {instance_id}"))
                if answer.get("success") is not False:
                    return f"destroyed Vast instance {instance_id}"
                if _vast_missing(answer):
                    return f"Vast instance {instance_id} was already gone"
                refusal = str(answer.get("msg") or answer.get("error") or "success: false")[:200]
            except ApiStatusError as e:
                if e.status == 404:
                    return f"Vast instance {instance_id} was already gone"
                raise
            except ProviderAuthError as e:
                refusal = e.message
            # If the scoped key may not destroy, stopping at least ends the GPU charge; the
            # controller destroys the stopped instance (and its disk) on its next pass.
            answer = _json(api.call("PUT", f"/api/v0/instances/{instance_id}/", json={"state": "stopped"}, what=f"stopping its own instance {instance_id}"))
            if answer.get("success") is False:
                raise ProviderError(f"Vast refused both destroying and stopping instance {instance_id}: {refusal}; "
                                    f"{str(answer.get('msg') or answer.get('error') or 'success: false')[:200]}",
                                    hint="the controller will destroy it")
            return f"stopped Vast instance {instance_id} (destroy was refused: {refusal}; the controller destroys it)"
    return None


def _runpod_end(api: ApiClient, pod_id: str) -> str:
    path = f"/v2/pods/{pod_id}"
    tried = []
    try:
        api.call("DELETE", path, what=f"terminating its own pod {pod_id}")
    except ApiStatusError as e:
        if e.status == 404:
            return f"RunPod pod {pod_id} was already gone"
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


def _vast_missing(answer: dict) -> bool:
    reason = f"{answer.get('error', '')} {answer.get('msg', '')}".lower()
    return "no_such" in reason or "not found" in reason or "does not exist" in reason


def _client(base, key, provider, key_env, timeout_s, retry, sleep, transport) -> ApiClient:
    return ApiClient(base, key, provider=provider, key_env=key_env, timeout=timeout_s, retry=retry, sleep=sleep, transport=transport)



def end_own_pod(environ: Mapping[str, str], log: Callable[[str], None], who: str = "[autoslm]") -> bool:
    """``terminate_own_pod``, saying in ``log`` what it did or why it could not; never raises (the
    controller's teardown is the backstop). True when the pod was ended (or there is none to end)."""
    try:
        what = terminate_own_pod(environ)
        if what:
            log(f"{who} {what}")
        return True
    except Exception as e:  # noqa: BLE001
        from autoslm.secrets import redact

        log(f"{who} could not end its own pod: {redact(str(e))}")
        return False
