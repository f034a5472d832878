"""Pods no replica records: a create whose answer was never recorded, found by its name and adopted
(``resolve_intent``), and every pod of the run in the providers' lists that no replica keeps, adopted
when it is the replica's own attempt, else ended and billed (``sweep_strays``: a duplicate, a late create).

``sup`` is the ``Supervisor`` acting (its providers, registry, clock and log); ``t`` the ``Tick`` it acts in.
"""

from __future__ import annotations

from autoslm.controller.billing import bill_stray, price
from autoslm.controller.podnames import parse_pod_name
from autoslm.controller.registry import ReplicaRecord
from autoslm.controller.state import RunState
from autoslm.controller.tick import Tick
from autoslm.errors import ProviderError
from autoslm.providers import VENDORS
from autoslm.providers.base import POD_LABEL, PodHandle


def resolve_intent(sup, t: Tick, r: ReplicaRecord) -> tuple[ReplicaRecord, bool]:
    """A create was (maybe) sent and its pod id never recorded: find the pod by its name.

    Found: adopt the oldest (reconcile then keeps it, or terminates it when the run is over or
    cancelled); end and bill any other with that name. Not found while the create may still land
    (``intent_until``): unsure, so nobody creates that name again. Not found after that: nothing
    is there; a live replica keeps the intent (the next launch reuses the same attempt and name),
    an ended one forgets it. Returns (the replica, unsure).
    """
    run = t.run
    if r.pod_id or not r.intent_name or not r.intent_provider:
        return r, False
    try:
        found = [h for h in sup.providers(r.intent_provider).list_pods(POD_LABEL) if h.name == r.intent_name]
    except ProviderError as e:
        sup.log(f"{run.run_id} seed{r.seed}: could not look for pod {r.intent_name} on {r.intent_provider}: {e}")
        return r, True
    now = sup.clock()
    if not found:
        if r.intent_until and now < r.intent_until:
            return r, True
        if r.terminal:
            return t.set(r.seed, intent_name=None, intent_provider=None, intent_until=None, cost_at=None), False
        return r, False
    found.sort(key=lambda h: (h.created_at is None, h.created_at or 0.0))
    handle, extra = found[0], found[1:]
    rate, source = price(handle, r, run)
    r = t.set(
        r.seed,
        provider=r.intent_provider,
        pod_id=handle.pod_id,
        gpu=handle.gpu,
        # Billed from the intent (written right before the create): it has been paid for since then.
        price_per_hour=rate,
        price_source=source,
        pod_started_at=now,
        cost_at=r.cost_at or now,
        intent_name=None,
        intent_provider=None,
        intent_until=None,
        nodes=None,  # its nodes are what the next look sees
        state=RunState.RECOVERING
        if r.state == RunState.RECOVERING
        else (RunState.PROVISIONING if r.state == RunState.PENDING else r.state),
    )
    sup.log(f"{run.run_id} seed{r.seed}: adopted pod {handle.pod_id} ({handle.name}) left by an interrupted launch")
    for dup in extra:
        end_stray(sup, t, r.seed, dup, "a second pod with the same name")
    return t.reps[r.seed], False


def sweep_strays(sup, t: Tick) -> None:
    """Every pod of this run (this home's name pattern) that no replica records: adopt it when it is
    a live replica's current attempt with no pod, else end it and bill it from its create."""
    run = t.run
    recorded = {r.pod_id for r in t.replicas if r.pod_id}
    for pname in run.spec.compute.providers:
        try:
            handles = sup.providers(pname).list_pods(POD_LABEL)
        except Exception as e:  # noqa: BLE001 - the next tick looks again
            sup.log(f"{run.run_id}: could not list {pname}'s pods: {e}")
            continue
        for h in handles:
            parsed = parse_pod_name(h.name or "")
            if parsed is None or not parsed.of_run(run.run_id) or h.pod_id in recorded:
                continue
            if (pname, h.pod_id) in t.ended:
                continue  # ended and billed already: a provider may list it a while longer
            if VENDORS[pname].rented and parsed.home not in (sup.home_id, None):  # an account's list: other homes' too
                continue
            r = t.reps.get(parsed.seed)
            if r is not None and not r.pod_id and not r.terminal and parsed.attempt == r.attempt and not r.intent_name:
                rate, source = price(h, r, run)
                now = sup.clock()
                t.set(
                    r.seed,
                    provider=pname,
                    pod_id=h.pod_id,
                    gpu=h.gpu,
                    price_per_hour=rate,
                    price_source=source,
                    pod_started_at=now,
                    cost_at=h.created_at or r.cost_at or now,
                    nodes=None,
                )
                sup.log(f"{run.run_id} seed{r.seed}: adopted unrecorded pod {h.pod_id} ({h.name})")
                recorded.add(h.pod_id)
                continue
            if r is not None and r.intent_name == h.name and not r.pod_id:
                continue  # its intent adopts it
            end_stray(sup, t, parsed.seed, h, "no record of it")


def end_stray(sup, t: Tick, seed: int, h: PodHandle, why: str) -> None:
    """End a pod no replica keeps, and bill it to its seed from its create (else the run's start)."""
    sup.log(f"{t.run.run_id} seed{seed}: ending pod {h.pod_id} ({h.name}): {why}")
    t.check()
    sup.providers(h.provider).terminate(PodHandle(h.provider, h.pod_id))
    bill_stray(sup, t, seed, h)
