"""Creating a replica's pod: the attempt's pod request (built once), the offers `plan` finds usable on
each provider (``placement.launch_plan``, which also says why where none is: that provider is not
asked), the intent written before the create, the create on each provider in the JobSpec's order, and
its record (``launch``); and a failed launch's teardown (``abort_launch``).

A create is preceded by a write of its intent (and of everything decided before it), since a crash
between the create and its record must leave a name to look up; the create's outcome is the tick's last
write. Cancel wins: it is checked again right before a create and right after one, and a pod created
while a cancel arrived is terminated at once.

``sup`` is the ``Supervisor`` acting (its providers, registry, clock and log); ``t`` the ``Tick`` it acts in.
"""

from __future__ import annotations

from autoslm.controller.adopt import resolve_intent
from autoslm.controller.billing import end_pod, price
from autoslm.controller.registry import LeaseLost, RunRecord
from autoslm.controller.state import EndReason, RunState
from autoslm.controller.tick import Tick
from autoslm.errors import NoCapacity, ProviderError, ProviderRefused
from autoslm.providers import VENDORS
from autoslm.providers.base import PodHandle


def launch(sup, t: Tick, seed: int, resume: bool) -> None:
    """Create the replica's pod on the first of the JobSpec's providers that has one; none: a first
    launch fails at once (``NoCapacity``), a relaunch or a sweep's member tries again at the next look.
    A provider that refuses outright (``ProviderRefused``: no credit, a key refused) leaves no intent:
    without a pod from another provider, the replica ends failed (``_refused``)."""
    run = t.run
    if sup.registry.cancel_requested(run.run_id):  # asked again: a cancel may have come since the look
        sup.log(f"{run.run_id} seed{seed}: cancel requested: not launching")
        return  # cancel wins: the next look ends the replica as cancelled
    r = t.reps[seed]
    # An intent still standing means its create may have landed late: same attempt, same name.
    attempt, created = (r.attempt if r.intent_name else r.attempt + 1), r.attempt
    from autoslm.controller.placement import launch_plan

    errors, hints, refusals = [], [], []
    request = sup.pod_request(run, seed, attempt, spent_usd=t.spent())  # once: every provider is asked for this pod
    left = _left(sup, t, seed) if resume else None
    for name in run.spec.compute.providers:
        provider = sup.providers(name)
        plan = launch_plan(run.spec, name, provider, left=left)
        if plan.nothing is not None:  # placement judged every offer unusable: this provider is not asked
            errors.append(f"{name}: {plan.nothing.message}")
            hints.append(plan.nothing.hint)
            continue
        # Written ahead, with all decided so far: a crash between the create and its record leaves a name.
        now = sup.clock()
        t.set(
            seed,
            intent_provider=name,
            intent_name=request.name,
            attempt=attempt,
            cost_at=now,
            intent_until=now + (float(provider.create_window_s) if VENDORS[name].capabilities.create_window else 0.0),
        )
        t.apply()
        try:
            handle = provider.launch(request, plan.offers)
        except NoCapacity as e:
            errors.append(f"{name}: {e.message}")
            hints.append(e.hint)
            continue
        except ProviderRefused as e:
            # A definite no (no credit, a key refused): nothing was created, so no create may land.
            errors.append(f"{name}: {e.message}")
            hints.append(e.hint)
            refusals.append(e)
            continue
        _launched(sup, t, seed, (name, provider), handle, plan.offers, attempt, resume)
        return
    # No pod was created: the attempt number counts pods, so the next look tries this one again.
    t.set(seed, intent_name=None, intent_provider=None, intent_until=None, cost_at=None, attempt=created)
    if refusals:
        _refused(sup, t, seed, refusals, errors, hints, resume)
        return
    message = "no capacity: " + "; ".join(errors)
    # A first launch a user waits on is told at once; a relaunch, or a sweep's member (started by the
    # sweep, nobody waiting on it), tries again at the next look until the run's own limits end it.
    if not resume and sup.registry.sweep_of_run(run.run_id) is None:
        t.set(seed, state=RunState.FAILED, error=message, end_reason=EndReason.LAUNCH_FAILED)
        raise NoCapacity(message, hint=_one_hint(hints))
    sup.log(f"{run.run_id} seed{seed}: {'relaunch' if resume else 'start'} found {message}; will retry")
    if resume:
        t.set(seed, state=RunState.RECOVERING, pod_id=None)


def _refused(sup, t: Tick, seed: int, refusals: list, errors: list[str], hints: list, resume: bool) -> None:
    """A provider refused the create outright (and none of the others made a pod): an answer, not a create
    that may still land. The replica ends failed at once, a relaunch's or a sweep member's too (asking
    again changes nothing until the user acts); a first launch a user waits on raises it, in one line."""
    run = t.run
    message = refusals[0].message if len(errors) == 1 else "; ".join(errors)
    t.set(seed, state=RunState.FAILED, error=message, end_reason=EndReason.LAUNCH_FAILED)
    if not resume and sup.registry.sweep_of_run(run.run_id) is None:
        raise type(refusals[0])(message, hint=_one_hint(hints) if len(errors) > 1 else refusals[0].hint)
    sup.log(f"{run.run_id} seed{seed}: {'relaunch' if resume else 'start'} refused: {message}")


def _launched(sup, t: Tick, seed: int, on, handle: PodHandle, offers, attempt: int, resume: bool) -> None:
    """Record the pod a create returned, unless the lease was lost meanwhile (then keep it only if the
    new holder adopted it) or a cancel arrived (then end it at once). ``on``: (provider name, provider)."""
    run, (name, provider) = t.run, on
    if not t.holds():
        # We stalled past the lease and another process acts on the run now: its writes are its
        # own (we write nothing). Keep our pod only if that process adopted it (same name).
        if not any(x.pod_id == handle.pod_id for x in sup.registry.replicas(run.run_id)):
            sup.log(f"{run.run_id} seed{seed}: lost the run's lease during the launch: ending pod {handle.pod_id}")
            provider.terminate(PodHandle(name, handle.pod_id))
        raise LeaseLost(run.run_id)
    now = sup.clock()
    r = t.reps[seed]
    rate, source = price(handle, r, run)
    t.set(
        seed,
        provider=name,
        pod_id=handle.pod_id,
        gpu=handle.gpu,
        price_per_hour=rate,
        price_source=source,
        attempt=attempt,
        intent_until=None,
        restarts=r.restarts + (1 if resume else 0),
        pod_started_at=now,
        cost_at=r.cost_at or now,  # billed from the intent: the create was sent then
        state=RunState.RECOVERING if resume else RunState.PROVISIONING,
        intent_name=None,
        intent_provider=None,
        error_beats=0,
        nodes=None,  # a new group: its nodes are what the next look sees
    )
    sup.log(f"{run.run_id} seed{seed}: launched {handle.pod_id} on {name} (attempt {attempt})" + _which_offer(handle, offers))
    reason = sup.registry.cancel_reason(run.run_id)
    if reason is not None:
        # The cancel arrived while the create was in flight: this pod must not live on.
        sup.log(f"{run.run_id} seed{seed}: cancel arrived during the launch: terminating {handle.pod_id}")
        end_pod(sup, t, seed, state=RunState.CANCELLED, end_reason=reason)


def _left(sup, t: Tick, seed: int):
    """What a relaunch has left: the money the run has not spent, the hours to its deadline, and the
    steps it resumes after: its newest checkpoint's (``placement.resume_step``)."""
    from autoslm.controller.placement import Left, resume_step

    hours = (t.run.deadline - sup.clock()) / 3600 if t.run.deadline else None
    return Left(spent_usd=t.spent(), hours=hours, done_steps=resume_step(sup.artifacts(t.run, seed), t.reps[seed].step))


def abort_launch(sup, run: RunRecord, why: str) -> tuple[list[str], list[str]]:
    """A launch failed (no capacity, a provider error, anything): end every replica as failed,
    terminate and bill what it started, look once more for a pod whose create was in flight.

    Returns (what is still running: pods whose terminate failed, what was torn down), in words.
    """
    left, ended = [], []
    fence, look = sup.acquire(run, 30.0)
    if fence is None:
        look = sup.registry.look(run.run_id)
    if look is None:
        return left, ended
    # Without the lease (held past 30 s by a stuck process) the teardown goes on, unfenced: a run
    # whose launch failed must not keep a pod.
    t = Tick(look, fence, sup.registry)
    try:
        for r in t.replicas:
            if not r.pod_id and r.intent_name and r.intent_provider:
                r, unsure = resolve_intent(sup, t, r)  # a create whose answer never came may have landed
                if unsure:
                    left.append(
                        f"maybe a {r.intent_provider} pod named {r.intent_name} (seed {r.seed}; its create "
                        "may still land: it is then adopted, billed from its create and ended)"
                    )
            if r.pod_id and r.provider:
                pod = f"{r.provider} pod {r.pod_id}"
                try:
                    end_pod(sup, t, r.seed)
                    sup.log(f"{run.run_id} seed{r.seed}: terminated pod {r.pod_id} (the launch failed)")
                    ended.append(f"seed {r.seed}: {pod}")
                except ProviderError as e:
                    left.append(f"{pod} (seed {r.seed}): {e}")
            if not t.reps[r.seed].terminal:
                t.set(r.seed, state=RunState.FAILED, error=f"launch failed: {why}", end_reason=EndReason.LAUNCH_FAILED)
    finally:
        try:
            t.apply(release=True)
        finally:
            if fence is not None:
                sup.registry.release_lease(run.run_id, sup.owner)  # (already, unless the write failed)
    return left, ended


def _one_hint(hints: list[str | None]) -> str:
    """The one hint of a launch that found nothing: the providers' own when they agree, else the general one."""
    from autoslm.controller.placement import NO_OFFER_HINT

    found = {h for h in hints if h}
    return found.pop() if len(found) == 1 else NO_OFFER_HINT


def _which_offer(handle: PodHandle, offers) -> str:
    """Which of the planned offers the pod is: `plan`'s best, or the next that fits after refusals."""
    if not offers:
        return ""
    rank = next((i for i, o in enumerate(offers) if o.gpu == handle.gpu), None)
    first = offers[0]
    if rank is None:
        return ""
    if rank == 0:
        return f": {first.gpu} at ${first.price_per_hour:.3f}/hour, the offer `autoslm plan` chose"
    return (
        f": {handle.gpu} at ${handle.price_per_hour or 0:.3f}/hour, the next usable offer in `autoslm plan`'s order "
        f"(its first, {first.gpu} at ${first.price_per_hour:.3f}/hour, was refused)"
    )
