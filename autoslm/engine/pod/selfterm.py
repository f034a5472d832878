"""Inside a rented pod, terminate that pod through the vendor's API once the worker is done.

Some vendors keep a finished pod (RunPod restarts an exited container, Vast keeps a stopped instance
billing its disk), so a finished worker ends its own pod rather than rely on the controller's next
poll. Which vendor's pod this is, and with which key, is worker_image/boot_rules.py's POD_VENDORS
table (``pod_vendor``), the same one the stdlib boot reads; how the vendor's pod ends, with its
fallbacks, is the vendor's own (``Vendor.self_end``: autoslm/providers/<vendor>/selfterm.py). It
uses only the pod-scoped credentials the vendor injects.

It must never: use (or ask for) the user's account key -- the controller never puts it into a pod's
environment, and the providers refuse to; terminate anything but the pod it runs in; print a key.
Base URLs follow each row's URL variable like the providers, so the fakes work too. The last
fallback, which provably works, is the controller's: the worker exits with its error recorded, and
the supervisor terminates the pod with the account key.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

import httpx

from autoslm._image.boot_rules import pod_vendor
from autoslm.errors import ProviderAuthError
from autoslm.providers import VENDORS
from autoslm.providers.http import ApiClient, RetryPolicy

# A finished worker should not hang around for minutes on a flaky API: the controller's teardown
# (and gc) terminate the pod anyway if this fails.
SELFTERM_RETRY = RetryPolicy(attempts=4, backoff_s=1.0, factor=2.0, max_backoff_s=8.0, max_retry_after_s=15.0, max_total_s=60.0)


def in_vendor_pod(environ: Mapping[str, str]) -> bool:
    """Whether this process runs in a vendor's pod (``boot_rules.pod_vendor``), not on this machine."""
    return pod_vendor(environ) is not None


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
    pod = pod_vendor(environ)
    if pod is None:
        return None
    if not pod["key"]:
        raise ProviderAuthError(
            f"inside {pod['title']} {pod['noun']} {pod['id']} but {pod['key_env']} (the {pod['noun']}-scoped key "
            f"{pod['title']} injects) is not set",
            hint=f"the controller will terminate the {pod['noun']}",
        )
    end = VENDORS[pod["vendor"]].self_end_function()
    with ApiClient(
        pod["base"],
        pod["key"],
        provider=pod["title"],
        key_env=pod["key_env"],
        timeout=timeout_s,
        retry=retry,
        sleep=sleep,
        transport=transport,
    ) as api:
        return end(api, pod)


def try_terminate_own_pod(environ: Mapping[str, str], log: Callable[[str], None], who: str = "[autoslm]") -> bool:
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
