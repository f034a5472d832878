"""A Vast instance ends itself (autoslm/engine/pod/selfterm.py calls ``end_from_inside`` with a client holding the
instance-scoped CONTAINER_API_KEY that Vast injects; worker_image/boot_rules.py's POD_VENDORS says when).

Vast answers some refusals with HTTP 200 and ``{"success": false}``, so the answer is read: DELETE; on
a refusal, ``PUT state=stopped`` (what public code does with CONTAINER_API_KEY), its answer checked
too. The last fallback is the controller's.
"""

from __future__ import annotations

from autoslm.errors import ProviderAuthError, ProviderError
from autoslm.providers.http import ApiClient, ApiStatusError


def end_from_inside(api: ApiClient, pod: dict) -> str:
    """End the instance ``pod`` (a ``boot_rules.pod_vendor`` row) names. Returns what was done."""
    instance_id = pod["id"]
    refusal = None
    try:
        method, path = pod["end"]  # the table's request, as boot.py sends it
        answer = _json(api.call(method, path.format(id=instance_id), what=f"destroying its own instance {instance_id}"))
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
    answer = _json(
        api.call(
            "PUT", f"/api/v0/instances/{instance_id}/", json={"state": "stopped"}, what=f"stopping its own instance {instance_id}"
        )
    )
    if answer.get("success") is False:
        raise ProviderError(
            f"Vast refused both destroying and stopping instance {instance_id}: {refusal}; "
            f"{str(answer.get('msg') or answer.get('error') or 'success: false')[:200]}",
            hint="the controller will destroy it",
        )
    return f"stopped Vast instance {instance_id} (destroy was refused: {refusal}; the controller destroys it)"


def _json(resp) -> dict:
    try:
        body = resp.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _vast_missing(answer: dict) -> bool:
    reason = f"{answer.get('error', '')} {answer.get('msg', '')}".lower()
    return "no_such" in reason or "not found" in reason or "does not exist" in reason
