"""Inside a rented pod, terminate that pod through the vendor's API once the worker is done.

RunPod restarts a pod's container when it exits and Vast keeps a stopped instance (billing its disk),
so a finished worker ends its own pod rather than rely on the controller's next poll. This uses only
the credentials the vendor injects into the pod: RunPod's RUNPOD_POD_ID with the pod-scoped
RUNPOD_API_KEY, Vast's CONTAINER_ID with the instance-scoped CONTAINER_API_KEY.

It must never: use (or ask for) the user's account key -- the controller never puts it into a pod's
environment, and the providers refuse to; terminate anything but the pod it runs in; print a key.
Base URLs follow AUTOSLM_RUNPOD_URL / AUTOSLM_VAST_URL like the providers, so the fakes work too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

import httpx

from autoslm.errors import ProviderAuthError
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
            try:
                api.call("DELETE", f"/v2/pods/{pod_id}", what=f"terminating its own pod {pod_id}")
            except ApiStatusError as e:
                if e.status != 404:
                    raise
                return f"RunPod pod {pod_id} was already gone"
        return f"terminated RunPod pod {pod_id}"

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
            try:
                api.call("DELETE", f"/api/v0/instances/{instance_id}/", what=f"destroying its own instance {instance_id}")
            except ApiStatusError as e:
                if e.status == 404:
                    return f"Vast instance {instance_id} was already gone"
                raise
            except ProviderAuthError:
                # If the scoped key may not destroy, stopping at least ends the GPU charge; the
                # controller destroys the stopped instance (and its disk) on its next pass.
                api.call("PUT", f"/api/v0/instances/{instance_id}/", json={"state": "stopped"}, what=f"stopping its own instance {instance_id}")
                return f"stopped Vast instance {instance_id} (its key may not destroy it; the controller will)"
        return f"destroyed Vast instance {instance_id}"
    return None


def _client(base, key, provider, key_env, timeout_s, retry, sleep, transport) -> ApiClient:
    return ApiClient(base, key, provider=provider, key_env=key_env, timeout=timeout_s, retry=retry, sleep=sleep, transport=transport)

