"""What a pod is billed at and what it cost: a replica's pod ended and billed to its end, a pod no
replica keeps billed from its create to its seed.

Every pod is billed at a price: the provider's, else the one it was created at, else the JobSpec's
ceiling (``price_source`` says which): never $0/hour while anything knows better.

``sup`` is the ``Supervisor`` acting (its providers, registry, clock and log); ``t`` the ``Tick`` it acts in.
"""

from __future__ import annotations

from autoslm.controller.nodes import ended
from autoslm.controller.podnames import parse_pod_name
from autoslm.controller.reconcile import bill_to
from autoslm.controller.registry import ReplicaRecord, RunRecord
from autoslm.controller.tick import Tick
from autoslm.errors import ProviderError
from autoslm.providers.base import PodHandle
from autoslm.secrets import redact
from autoslm.vendors.billing import pod_cost_usd


def price(handle: PodHandle | None, r: ReplicaRecord, run: RunRecord) -> tuple[float | None, str | None]:
    """What a pod is billed at, and why: never $0/hour while anything knows better."""
    if handle is not None and handle.price_per_hour:
        return handle.price_per_hour, handle.price_source or "provider"
    if r.price_per_hour:
        return r.price_per_hour, r.price_source or "recorded at launch"
    ceiling, nodes = run.spec.compute.max_price_per_hour, run.spec.compute.nodes
    if ceiling and nodes > 1:  # the ceiling is one pod's; a replica of several pods bills them all
        return ceiling * nodes, f"compute.max_price_per_hour x {nodes} pods (no price known: billed at the ceiling)"
    if ceiling:
        return ceiling, "compute.max_price_per_hour (no price known: billed at the ceiling)"
    return None, None


def end_pod(sup, t: Tick, seed: int, **then) -> None:
    """Terminate the replica's pod, bill it to when that returned (the provider bills until it ended the
    pod; a terminate that fails bills nothing and is tried again), and forget it (``then``: more changes).
    A refused terminate is recorded (``teardown_*``: `status` says it keeps failing, with what to do) and raised."""
    r = t.reps[seed]
    t.check()
    try:
        sup.providers(r.provider).terminate(PodHandle(r.provider, r.pod_id))
    except ProviderError as e:
        t.set(
            seed,
            teardown_error=redact(str(e))[:500],  # a record a person reads: no secret in it
            teardown_failures=r.teardown_failures + 1,
            teardown_since=r.teardown_since or sup.clock(),
        )
        raise
    t.set(seed, **bill_to(r, sup.clock()))
    t.mark_ended(r.provider, r.pod_id)
    t.set(seed, pod_id=None, cost_at=None, nodes=ended(r.nodes), **NO_TEARDOWN_TROUBLE, **then)


# A replica whose pod is gone (ended here, or found ended) has no teardown left to fail.
NO_TEARDOWN_TROUBLE = {"teardown_error": None, "teardown_failures": 0, "teardown_since": None}


def bill_stray(sup, t: Tick, seed: int, h: PodHandle) -> None:
    """Bill a pod no replica keeps (ended now, or by `gc`) to its seed, once: from its create, else from
    when its replica's bill stands, else from the run's start."""
    if (h.provider, h.pod_id) in t.ended:
        return  # billed when it was ended
    t.mark_ended(h.provider, h.pod_id)
    r = t.reps.get(seed)
    if r is None:
        return
    rate, source = price(h, r, t.run)
    since = h.created_at or r.cost_at or t.run.created_at
    cost = pod_cost_usd(rate, since, sup.clock())
    t.set(seed, cost_usd=r.cost_usd + cost)
    sup.log(f"{t.run.run_id} seed{seed}: billed pod {h.pod_id} ${cost:.4f} (at ${rate or 0:.3f}/h, {source})")


def bill_ended(sup, h: PodHandle, run_id: str) -> None:
    """`gc` ended this pod of a run here that no replica recorded: bill it (once) to its seed."""
    parsed = parse_pod_name(h.name or "")
    look = sup.registry.look(run_id)
    if parsed is None or look is None or any(r.pod_id == h.pod_id for r in look.replicas):
        return  # a recorded pod: its replica bills it
    t = Tick(look, None, sup.registry)  # gc acts outside the run's lease: its bill is a record of what it did
    bill_stray(sup, t, parsed.seed, h)
    t.apply()
