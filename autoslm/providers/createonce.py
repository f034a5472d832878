"""One attempt is one paid pod: the create-once rule every rented-GPU provider keeps, written once.

A create call is not idempotent, and an answer can be lost after the vendor acted on it (a timeout, a
5xx from a gateway: ``http.MaybeApplied``). So, for one pod name:

1. Before a create: a live pod with that name already exists (an earlier call's create landed, its
   answer lost) -> that pod is the attempt's; nothing is sent.
2. After a maybe-applied create: look the name up before sending it again; found -> that is the pod.
3. After a create that was (maybe) sent twice: end every other pod with that name (a late create can
   land after a retry's), keeping the one returned.
4. A create can land after its caller gave up (the caller was killed, or every try failed): for
   ``window_s`` after the first send, "no pod by that name" means "not yet", never "nothing there"
   (the supervisor keeps the launch intent that long: ``Registry.set_intent``).
5. A definite refusal (``errors.ProviderRefused``: no credit, a key refused) means nothing was created,
   so the caller drops the intent at once; but only when no earlier send of this create may have
   landed: after a lost answer, a refusal is no proof, and it is raised as a create still unsure.

``providers/runpod/provider.py`` and ``providers/vast/provider.py`` pass what is vendor-specific: how to list the live
pods of a name (oldest first), a pod's id, how to end one. tests/integration/test_create_once.py runs
one contract against both fakes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autoslm.errors import ProviderError, ProviderRefused, ProviderUnavailable
from autoslm.providers.http import MaybeApplied, RetryPolicy

# How long after its last send a create may still land at the vendor (a request queued behind a
# slow control plane). Chosen, not documented by either vendor: observed lags are seconds.
LANDING_S = 120.0


def window_s(retry: RetryPolicy, call_timeout_s: float) -> float:
    """How long after an intent is written its pod may still appear: every try of the create (the
    whole retry budget, each call up to its timeout), then the vendor's landing lag."""
    return retry.max_total_s + call_timeout_s + LANDING_S


@dataclass
class CreateOnce:
    vendor: str  # for messages: "RunPod", "Vast"
    retry: RetryPolicy
    sleep: Callable[[float], None]
    find: Callable[[str], list[dict]]  # the live pods with this name, oldest first (vendor JSON, opaque here)
    pod_id: Callable[[dict], str]
    terminate: Callable[[str], None]  # raises ProviderError when the vendor refuses

    def existing(self, name: str) -> dict | None:
        """Rule 1: the attempt's pod, when an earlier create of this name landed."""
        found = self.find(name)
        return found[0] if found else None

    def create(
        self, name: str, send: Callable[[], Any], what: str, refusal: Callable[[Exception], ProviderRefused | None] | None = None
    ) -> tuple[Any, dict | None, bool]:
        """Rule 2: send the create, never twice for one pod while an answer may be lost.

        Returns (the create's answer or None, the pod found by name instead or None, whether an
        answer was lost on the way: then call ``drop_duplicates`` with the id kept). ``refusal``: the
        vendor's definite no for an error ``send`` raised (rule 5), None where it is not one; a
        ``ProviderRefused`` is one without it."""
        unsure = False
        for attempt in range(self.retry.attempts):
            try:
                return send(), None, unsure
            except ProviderRefused as e:
                raise self._refused(e, name, unsure) from None
            except MaybeApplied:
                unsure = True
                found = self.existing(name)
                if found is not None:
                    return None, found, True
                if attempt + 1 < self.retry.attempts:
                    self.sleep(self.retry.backoff(attempt))
            except Exception as e:
                refused = refusal(e) if refusal is not None else None
                if refused is None:
                    raise
                raise self._refused(refused, name, unsure) from None
        raise ProviderUnavailable(
            f"{self.vendor} did not confirm {what} after {self.retry.attempts} tries, and no such pod exists yet",
            hint="a create can still land late: the run's supervisor adopts and ends it; `autoslm gc` removes any left",
        )

    def _refused(self, e: ProviderRefused, name: str, unsure: bool) -> ProviderError:
        """Rule 5: the refusal itself, or, after a send whose answer was lost, a create still unsure."""
        if not unsure:
            return e
        return ProviderUnavailable(
            f"{e.message}, after an earlier try of {name} whose answer was lost",
            hint="that try can still land: the run's supervisor adopts and ends it; `autoslm gc` removes any left",
        )

    def drop_duplicates(self, name: str, keep: str) -> list[str]:
        """Rule 3: end every other live pod with this name. Returns the ids ended (a refusal is left to gc)."""
        dropped = []
        for pod in self.find(name):
            pid = self.pod_id(pod)
            if pid == keep:
                continue
            try:
                self.terminate(pid)
                dropped.append(pid)
            except ProviderError:
                pass  # gc and the supervisor's sweep find it by name later; the launch must not fail for it
        return dropped
