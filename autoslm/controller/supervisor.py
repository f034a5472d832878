"""The supervisor: look at each replica, ask ``reconcile`` what to do, do it, record it.

A tick is look -> decide -> apply. In one transaction it takes the run's lease and reads what it
needs of the registry (``Registry.take_and_look``: the run, its replicas, the pods of it ended here);
it looks at the providers and the store, decides with pure functions (``reconcile`` and the bill,
``reconcile.account``), keeping its decisions in memory, and writes them in one transaction
(``Registry.apply``) that checks the lease and lets it go. One exception, by design: a create is
preceded by a write of its intent (and of everything decided before it), since a crash between the
create and its record must leave a name to look up; the create's outcome is the tick's last write.

One process acts on a run at a time: the one holding its lease. The lease is a fencing token: its
generation, taken with it, is checked by every write the tick makes and right before every provider
action (create, terminate), so a holder that stalled (SIGSTOP, a hung call) and was taken over
meanwhile acts on nothing and writes nothing when it resumes (``LeaseLost``; ``lost`` says so). A
process that cannot get the lease within ``wait_s`` only reads what the holder recorded. A holder
whose heartbeat is stale (stopped here for ``LEASE_STALE_S``, or silent anywhere for
``LEASE_HUNG_S``) is taken over by whoever asks next.

Order of a tick: resolve launch intents (a create whose answer was never recorded: adopt the named
pod; while its create may still land, wait; only after that, create it again under the same name),
sweep the providers' lists for this run's pods that no replica records (adopt the attempt's own,
end and bill any other: a duplicate, a late create), look at every replica, bill every replica, and
only then decide (so ``max_usd`` sees this tick's bill). Every pod is billed at a price: the
provider's, else the one it was created at, else the JobSpec's ceiling (``price_source`` says which).
Cancel wins: it is checked again right before a create and right after one, and a pod created while
a cancel arrived is terminated at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from autoslm.catalog.cost import pod_cost_usd
from autoslm.controller.podnames import home_id, parse_pod_name
from autoslm.controller.podspec import WORKER_COMMAND, log_path, pod_spec, store_lag_s  # noqa: F401
from autoslm.controller.reconcile import HandBack, Launch, Limits, SetState, Seen, Terminate, account, bill_to, ends, reconcile
from autoslm.controller.registry import (
    Fence,
    LeaseLost,
    Registry,
    ReplicaRecord,
    RunLook,
    RunRecord,
    lease_owner_id,
)
from autoslm.controller.state import EndReason, RunState
from autoslm.errors import NoCapacity, ProviderError, StoreError
from autoslm.layout import RunPaths
from autoslm.providers import VENDORS
from autoslm.providers.base import POD_LABEL, PodHandle, PodSpec, Provider
from autoslm.store import RunArtifacts, Store

__all__ = ["LEASE_TTL_S", "WORKER_COMMAND", "LeaseLost", "Supervisor", "log_path", "store_lag_s"]

# Longer than one provider call with all its retries (http.RetryPolicy.max_total_s is 300 s): a
# holder that dies on this host frees it at once; one on another machine holds it this long at most.
LEASE_TTL_S = 600.0
LEASE_WAIT_S = 2.0  # how long a reader waits for a busy run before answering from the registry
# A holder on this host that is stopped (SIGSTOP) and has not beaten its lease for this long is taken over.
LEASE_STALE_S = 15.0
# Any holder, on any host, stopped or not, whose lease has not beaten for this long is taken over: a
# tick beats at every write, a background supervisor its own lease (controller/daemon.py) every
# LEASE_BEAT_S. Writes are fenced, so taking over one that was only slow costs it its tick, never a double act.
LEASE_HUNG_S = 120.0
LEASE_BEAT_S = 5.0


class _Tick:
    """One tick's working state: what it read (once), and the writes it decided, not yet applied."""

    def __init__(self, look: RunLook, fence: Fence | None):
        self.run, self.fence, self.cancel, self.cancel_reason = look.run, fence, look.cancel_requested, look.cancel_reason
        self.reps = {r.seed: r for r in look.replicas}
        self.ended = set(look.ended)
        self.changes: dict[int, dict] = {}
        self.marks: list[tuple[str, str, str]] = []

    @property
    def replicas(self) -> list[ReplicaRecord]:
        return [self.reps[s] for s in sorted(self.reps)]

    def set(self, seed: int, **changes) -> ReplicaRecord:
        """Decide changes to a replica: seen at once by the rest of the tick, written at the next apply
        (only what differs from what it holds: a look that changes nothing writes nothing of it)."""
        now = self.reps[seed]
        changes = {k: v for k, v in changes.items() if getattr(now, k) != v}
        if changes:
            self.reps[seed] = dataclasses.replace(now, **changes)
            self.changes.setdefault(seed, {}).update(changes)
        return self.reps[seed]

    def mark_ended(self, provider: str, pod_id: str) -> None:
        self.ended.add((provider, pod_id))
        self.marks.append((provider, pod_id, self.run.run_id))

    def spent(self) -> float:
        return sum(r.cost_usd for r in self.reps.values())


@dataclass
class Supervisor:
    registry: Registry
    providers: Callable[[str], Provider]  # name -> provider (built lazily: keys are read only when needed)
    store: Callable[[str], Store]  # uri -> store
    home: Path
    clock: Callable[[], float] = time.time
    log: Callable[[str], None] = lambda msg: None
    owner: str = field(default_factory=lease_owner_id)
    lease_sleep: Callable[[float], None] = time.sleep
    _home_id: str | None = None
    _snapshot: dict | None = None  # provider -> {pod_id: PodStatus}, while ticking many runs
    lease_stale_s: float = LEASE_STALE_S
    lease_hung_s: float = LEASE_HUNG_S
    acted: bool = False  # whether the last tick held the lease (False: it only read what the holder recorded)
    lost: bool = False  # whether the last tick's lease was taken over while it looked (it wrote nothing)

    @contextlib.contextmanager
    def shared_look(self, provider_names) -> Iterator[None]:
        """Tick many runs on one list call per provider (``statuses``) instead of a call per pod."""
        snap: dict = {}
        for name in sorted(set(provider_names)):
            if not VENDORS[name].capabilities.batch_status:
                continue
            try:
                snap[name] = self.providers(name).statuses()
            except ProviderError as e:
                self.log(f"{name}: could not list pods ({e}); asking pod by pod")
        self._snapshot = snap
        try:
            yield
        finally:
            self._snapshot = None

    @property
    def home_id(self) -> str:
        if self._home_id is None:
            self._home_id = home_id(self.home)
        return self._home_id

    # -- the lease ----------------------------------------------------------------------------------
    def tick(self, run: RunRecord, *, wait_s: float = LEASE_WAIT_S) -> list[ReplicaRecord]:
        """Act on the run under its lease; without the lease (another process is acting), only read.
        ``acted``: whether it held the lease; ``lost``: whether the lease was taken over meanwhile
        (what it saw and decided was stale: it wrote nothing of it)."""
        self.acted = self.lost = False
        fence, look = self._acquire(run.run_id, wait_s)
        if fence is None:
            return self.registry.replicas(run.run_id)
        self.acted = True
        try:
            return self._tick(fence, look)
        except LeaseLost:
            self.lost = True
            self.log(f"{run.run_id}: another process took over this run; leaving it to that one")
            return self.registry.replicas(run.run_id)

    def _acquire(self, run_id: str, wait_s: float) -> tuple[Fence | None, RunLook | None]:
        """Take the run's lease (a stale holder's too) and read what a tick needs, waiting up to ``wait_s``."""
        start = time.monotonic()
        while True:
            fence, look = self.registry.take_and_look(
                run_id, self.owner, LEASE_TTL_S, stale_s=self.lease_stale_s, hung_s=self.lease_hung_s
            )
            if fence is not None or time.monotonic() - start >= wait_s:
                return fence, look
            self.lease_sleep(0.05)

    def _check(self, t: _Tick) -> None:
        """Right before a provider action: the lease must still be the one this tick decided under."""
        if t.fence is not None and not self.registry.holds(t.fence):
            raise LeaseLost(t.run.run_id)

    def _apply(self, t: _Tick, *, release: bool = False) -> None:
        """Write what the tick decided so far, in one transaction, fenced by (and renewing) its lease."""
        changes = {(t.run.run_id, seed): c for seed, c in t.changes.items()}
        self.registry.apply(t.fence, changes, t.marks, ttl_s=LEASE_TTL_S, release=release)
        t.changes, t.marks = {}, []

    # -- one tick: look, decide, apply -----------------------------------------------------------------
    def _tick(self, fence: Fence, look: RunLook | None) -> list[ReplicaRecord]:
        if look is None:
            self.registry.release_lease(fence.run_id, self.owner)
            return []
        t = _Tick(look, fence)
        try:
            self._decide_and_act(t)
        except LeaseLost:
            raise  # not ours any more: nothing of this tick is written
        except BaseException as e:
            # A failure midway still records what it decided and did. Interrupted (Ctrl-C), it writes
            # only if the registry is free at once: what it leaves unwritten is the supervisor's to find
            # (a create's intent is already recorded; the lease frees itself when this process ends).
            interrupted = isinstance(e, KeyboardInterrupt)
            try:
                with self.registry.waiting_at_most(0.0) if interrupted else contextlib.nullcontext():
                    self._apply(t, release=True)
            except LeaseLost:
                pass
            except Exception:  # noqa: BLE001 - the registry failed too: the first error says more
                if not interrupted:
                    with contextlib.suppress(Exception):
                        self.registry.release_lease(fence.run_id, self.owner)
            raise
        self._apply(t, release=True)  # the tick's write, which lets the lease go
        return t.replicas

    def _decide_and_act(self, t: _Tick) -> None:
        run, spec = t.run, t.run.spec
        waiting = set()
        for r in t.replicas:
            r, unsure = self._resolve_intent(t, r)
            if unsure:
                waiting.add(r.seed)
                # The create may still land (or the provider could not say): no relaunch until it is
                # known. A cancel ends the replica now; the pod, if it lands, is adopted and ended.
                if t.cancel and not r.terminal:
                    self.log(f"{run.run_id} seed{r.seed}: {r.state} -> cancelled (a create of {r.intent_name} may still land)")
                    t.set(r.seed, state=RunState.CANCELLED, end_reason=t.cancel_reason)
        self._sweep_strays(t)
        looked = []
        for r in t.replicas:
            if r.seed in waiting:
                continue  # its create may still land (or the provider could not say): decided once known
            seen, hb = self._observe(run, r)
            looked.append((r.seed, seen, hb))
        # Bill, then decide: the money limit sees what every replica has cost up to this very tick.
        now = self.clock()
        for seed, seen, hb in looked:
            r = t.reps[seed]
            if r.pod_id and not r.price_per_hour:
                price, source = self._price(None, r, run)
                if price:
                    r = t.set(seed, price_per_hour=price, price_source=source)
            t.set(seed, **account(r, seen, hb, now))
        run_cost = t.spent()
        limits = Limits(
            deadline=run.deadline,
            max_usd=spec.limits.max_usd,
            max_restarts=spec.limits.max_restarts,
            heartbeat_timeout_s=spec.limits.heartbeat_timeout_s,
            startup_timeout_s=getattr(spec.limits, "startup_timeout_s", 2700.0),
            store_lag_s=store_lag_s(spec),
            cancel_requested=t.cancel,
            run_cost_usd=run_cost,
            cancel_reason=t.cancel_reason or EndReason.CANCELLED,
        )
        for seed, seen, _ in looked:
            actions = reconcile(t.reps[seed], seen, limits, self.clock())
            for i, action in enumerate(actions):
                try:
                    self._act(t, seed, action)
                except ProviderError:
                    # A teardown the provider refused: the outcome is known all the same, so record it
                    # (the pod id stays: rule 1 terminates it next tick, and gc reports it). Never a
                    # relaunch after a failed terminate: both pods would train and bill.
                    final = next((a for a in actions[i + 1 :] if ends(a)), None)
                    if isinstance(action, Terminate) and final is not None:
                        self._act(t, seed, final)
                    raise
            r = t.reps[seed]
            if r.terminal and r.pod_id and seen.pod is not None and seen.pod.state == "terminated":
                # The run is over and its pod is gone (it ended itself): forget it, so later looks
                # neither show it nor ask the provider about it (nor bill it when the provider is down).
                t.mark_ended(r.provider or "", r.pod_id)
                t.set(seed, pod_id=None, cost_at=None)

    def _resolve_intent(self, t: _Tick, r: ReplicaRecord) -> tuple[ReplicaRecord, bool]:
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
            found = [h for h in self.providers(r.intent_provider).list_pods(POD_LABEL) if h.name == r.intent_name]
        except ProviderError as e:
            self.log(f"{run.run_id} seed{r.seed}: could not look for pod {r.intent_name} on {r.intent_provider}: {e}")
            return r, True
        now = self.clock()
        if not found:
            if r.intent_until and now < r.intent_until:
                return r, True
            if r.terminal:
                return t.set(r.seed, intent_name=None, intent_provider=None, intent_until=None, cost_at=None), False
            return r, False
        found.sort(key=lambda h: (h.created_at is None, h.created_at or 0.0))
        handle, extra = found[0], found[1:]
        price, source = self._price(handle, r, run)
        r = t.set(
            r.seed,
            provider=r.intent_provider,
            pod_id=handle.pod_id,
            gpu=handle.gpu,
            # Billed from the intent (written right before the create): it has been paid for since then.
            price_per_hour=price,
            price_source=source,
            pod_started_at=now,
            cost_at=r.cost_at or now,
            intent_name=None,
            intent_provider=None,
            intent_until=None,
            state=RunState.RECOVERING
            if r.state == RunState.RECOVERING
            else (RunState.PROVISIONING if r.state == RunState.PENDING else r.state),
        )
        self.log(f"{run.run_id} seed{r.seed}: adopted pod {handle.pod_id} ({handle.name}) left by an interrupted launch")
        for dup in extra:
            self._end_stray(t, r.seed, dup, "a second pod with the same name")
        return t.reps[r.seed], False

    def _price(self, handle: PodHandle | None, r: ReplicaRecord, run: RunRecord) -> tuple[float | None, str | None]:
        """What a pod is billed at, and why: never $0/hour while anything knows better."""
        if handle is not None and handle.price_per_hour:
            return handle.price_per_hour, handle.price_source or "provider"
        if r.price_per_hour:
            return r.price_per_hour, r.price_source or "recorded at launch"
        ceiling = run.spec.compute.max_price_per_hour
        if ceiling:
            return ceiling, "compute.max_price_per_hour (no price known: billed at the ceiling)"
        return None, None

    def _sweep_strays(self, t: _Tick) -> None:
        """Every pod of this run (this home's name pattern) that no replica records: adopt it when it is
        a live replica's current attempt with no pod, else end it and bill it from its create."""
        run = t.run
        recorded = {r.pod_id for r in t.replicas if r.pod_id}
        for pname in run.spec.compute.providers:
            try:
                handles = self.providers(pname).list_pods(POD_LABEL)
            except Exception as e:  # noqa: BLE001 - the next tick looks again
                self.log(f"{run.run_id}: could not list {pname}'s pods: {e}")
                continue
            for h in handles:
                parsed = parse_pod_name(h.name or "")
                if parsed is None or parsed.run_id != run.run_id or h.pod_id in recorded:
                    continue
                if (pname, h.pod_id) in t.ended:
                    continue  # ended and billed already: a provider may list it a while longer
                if VENDORS[pname].rented and parsed.home not in (self.home_id, None):  # an account's list: other homes' too
                    continue
                r = t.reps.get(parsed.seed)
                if r is not None and not r.pod_id and not r.terminal and parsed.attempt == r.attempt and not r.intent_name:
                    price, source = self._price(h, r, run)
                    now = self.clock()
                    t.set(
                        r.seed,
                        provider=pname,
                        pod_id=h.pod_id,
                        gpu=h.gpu,
                        price_per_hour=price,
                        price_source=source,
                        pod_started_at=now,
                        cost_at=h.created_at or r.cost_at or now,
                    )
                    self.log(f"{run.run_id} seed{r.seed}: adopted unrecorded pod {h.pod_id} ({h.name})")
                    recorded.add(h.pod_id)
                    continue
                if r is not None and r.intent_name == h.name and not r.pod_id:
                    continue  # its intent adopts it
                self._end_stray(t, parsed.seed, h, "no record of it")

    def _end_stray(self, t: _Tick, seed: int, h: PodHandle, why: str) -> None:
        """End a pod no replica keeps, and bill it to its seed from its create (else the run's start)."""
        self.log(f"{t.run.run_id} seed{seed}: ending pod {h.pod_id} ({h.name}): {why}")
        self._check(t)
        self.providers(h.provider).terminate(PodHandle(h.provider, h.pod_id))
        self._bill_stray(t, seed, h)

    def bill_ended(self, h: PodHandle, run_id: str) -> None:
        """`gc` ended this pod of a run here that no replica recorded: bill it (once) to its seed."""
        parsed = parse_pod_name(h.name or "")
        look = self.registry.look(run_id)
        if parsed is None or look is None or any(r.pod_id == h.pod_id for r in look.replicas):
            return  # a recorded pod: its replica bills it
        t = _Tick(look, None)  # gc acts outside the run's lease: its bill is a record of what it did
        self._bill_stray(t, parsed.seed, h)
        self.registry.apply(None, {(run_id, s): c for s, c in t.changes.items()}, t.marks)

    def _bill_stray(self, t: _Tick, seed: int, h: PodHandle) -> None:
        if (h.provider, h.pod_id) in t.ended:
            return  # billed when it was ended
        t.mark_ended(h.provider, h.pod_id)
        r = t.reps.get(seed)
        if r is None:
            return
        price, source = self._price(h, r, t.run)
        since = h.created_at or r.cost_at or t.run.created_at
        cost = pod_cost_usd(price, since, self.clock())
        t.set(seed, cost_usd=r.cost_usd + cost)
        self.log(f"{t.run.run_id} seed{seed}: billed pod {h.pod_id} ${cost:.4f} (at ${price or 0:.3f}/h, {source})")

    def _artifacts(self, run: RunRecord, seed: int) -> RunArtifacts:
        return RunArtifacts(self.store(run.store_uri), RunPaths(run.phase, run.run_id, seed))

    def _observe(self, run: RunRecord, r: ReplicaRecord):
        pod = None
        listed = (self._snapshot or {}).get(r.provider or "", {})
        if r.pod_id and r.pod_id in listed:
            pod = listed[r.pod_id]
        elif r.pod_id and r.provider:
            try:
                pod = self.providers(r.provider).status(PodHandle(r.provider, r.pod_id))
            except ProviderError as e:
                self.log(f"{run.run_id} seed{r.seed}: provider could not tell the pod's status: {e}")
        art = self._artifacts(run, r.seed)
        done, error, hb, adapter = None, None, None, None
        try:
            done = art.is_done()
            # Success means an adapter in the store, not only a DONE marker.
            adapter = art.has_adapter() if done else None
            error = art.get_error()
            hb = art.get_heartbeat()
        except StoreError as e:
            self.log(f"{run.run_id} seed{r.seed}: store could not tell: {e}")
        except ValueError:
            hb = None  # a heartbeat torn by a crash: the next one will do
        seen = Seen(
            pod=pod,
            done=done,
            error=error,
            adapter=adapter,
            heartbeat_time=hb.time if hb else None,
            heartbeat_stage=hb.stage if hb else None,
            heartbeat_attempt=hb.attempt if hb else None,
            heartbeat_limit=getattr(hb, "limit", None) if hb else None,
        )
        return seen, hb

    # -- doing ------------------------------------------------------------------------------------
    def _act(self, t: _Tick, seed: int, action) -> None:
        r = t.reps[seed]
        if isinstance(action, Terminate):
            if r.pod_id and r.provider:
                self.log(f"{t.run.run_id} seed{seed}: terminating pod {r.pod_id} ({action.reason})")
                self._end_pod(t, seed)
        elif isinstance(action, SetState):
            changes = {"state": action.state}
            if action.error:
                changes["error"] = action.error
            if action.reason:
                changes["end_reason"] = action.reason
            self.log(f"{t.run.run_id} seed{seed}: {r.state} -> {action.state}" + (f" ({action.error})" if action.error else ""))
            t.set(seed, **changes)
        elif isinstance(action, Launch):
            self._launch(t, seed, resume=action.resume)
        elif isinstance(action, HandBack):  # a limit ended it: what it learned becomes its adapter
            from autoslm.controller.handback import hand_back

            self._act(t, seed, hand_back(self._artifacts(t.run, seed), action, r.step, r.total_steps))

    def _end_pod(self, t: _Tick, seed: int, **then) -> None:
        """Terminate the replica's pod, bill it to when that returned (the provider bills until it ended the
        pod; a terminate that fails bills nothing and is tried again), and forget it (``then``: more changes)."""
        r = t.reps[seed]
        self._check(t)
        self.providers(r.provider).terminate(PodHandle(r.provider, r.pod_id))
        t.set(seed, **bill_to(r, self.clock()))
        t.mark_ended(r.provider, r.pod_id)
        t.set(seed, pod_id=None, cost_at=None, **then)

    def _launch(self, t: _Tick, seed: int, resume: bool) -> None:
        run = t.run
        if self.registry.cancel_requested(run.run_id):  # asked again: a cancel may have come since the look
            self.log(f"{run.run_id} seed{seed}: cancel requested: not launching")
            return  # cancel wins: the next look ends the replica as cancelled
        r = t.reps[seed]
        # An intent still standing means its create may have landed late: same attempt, same name.
        attempt, created = (r.attempt if r.intent_name else r.attempt + 1), r.attempt
        errors, hints = [], []
        for name in run.spec.compute.providers:
            provider = self.providers(name)
            pod_spec, judged = self._planned(
                run,
                name,
                provider,
                self.pod_spec(run, seed, attempt, spent_usd=t.spent()),
                left=self._left(t, seed) if resume else None,
            )
            # Written ahead, with all decided so far: a crash between the create and its record leaves a name.
            now = self.clock()
            t.set(
                seed,
                intent_provider=name,
                intent_name=pod_spec.name,
                attempt=attempt,
                cost_at=now,
                intent_until=now + (float(provider.create_window_s) if VENDORS[name].capabilities.create_window else 0.0),
            )
            self._apply(t)
            try:
                handle = provider.launch(pod_spec)
            except NoCapacity as e:
                why = _unusable(judged) if pod_spec.offers == () else e
                errors.append(f"{name}: {why.message}")
                hints.append(why.hint)
                continue
            if t.fence is not None and not self.registry.holds(t.fence):
                # We stalled past the lease and another process acts on the run now: its writes are its
                # own (we write nothing). Keep our pod only if that process adopted it (same name).
                if not any(x.pod_id == handle.pod_id for x in self.registry.replicas(run.run_id)):
                    self.log(f"{run.run_id} seed{seed}: lost the run's lease during the launch: ending pod {handle.pod_id}")
                    provider.terminate(PodHandle(name, handle.pod_id))
                raise LeaseLost(run.run_id)
            now = self.clock()
            r = t.reps[seed]
            price, source = self._price(handle, r, run)
            t.set(
                seed,
                provider=name,
                pod_id=handle.pod_id,
                gpu=handle.gpu,
                price_per_hour=price,
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
            )
            self.log(
                f"{run.run_id} seed{seed}: launched {handle.pod_id} on {name} (attempt {attempt})"
                + _which_offer(handle, pod_spec.offers)
            )
            reason = self.registry.cancel_reason(run.run_id)
            if reason is not None:
                # The cancel arrived while the create was in flight: this pod must not live on.
                self.log(f"{run.run_id} seed{seed}: cancel arrived during the launch: terminating {handle.pod_id}")
                self._end_pod(t, seed, state=RunState.CANCELLED, end_reason=reason)
            return
        # No pod was created: the attempt number counts pods, so the next look tries this one again.
        t.set(seed, intent_name=None, intent_provider=None, intent_until=None, cost_at=None, attempt=created)
        message = "no capacity: " + "; ".join(errors)
        # A first launch a user waits on is told at once; a relaunch, or a sweep's member (started by the
        # sweep, nobody waiting on it), tries again at the next look until the run's own limits end it.
        if not resume and self.registry.sweep_of_run(run.run_id) is None:
            t.set(seed, state=RunState.FAILED, error=message, end_reason=EndReason.LAUNCH_FAILED)
            raise NoCapacity(message, hint=_one_hint(hints))
        self.log(f"{run.run_id} seed{seed}: {'relaunch' if resume else 'start'} found {message}; will retry")
        if resume:
            t.set(seed, state=RunState.RECOVERING, pod_id=None)

    def _left(self, t: _Tick, seed: int):
        """What a relaunch has left: the money the run has not spent, the hours to its deadline, and the
        steps it resumes after: its newest checkpoint's (``placement.resume_step``)."""
        from autoslm.controller.placement import Left, resume_step

        hours = (t.run.deadline - self.clock()) / 3600 if t.run.deadline else None
        return Left(spent_usd=t.spent(), hours=hours, done_steps=resume_step(self._artifacts(t.run, seed), t.reps[seed].step))

    def _planned(self, run: RunRecord, name: str, provider, pod_spec: PodSpec, left=None):
        """The pod spec with the offers `plan` finds usable on this provider, in its order, and every
        offer as judged (``left``: a relaunch, judged on what the run has left). A vendor with no
        market (``Capabilities.market``: this machine) has none: its pod spec is left as it is."""
        if VENDORS[name].capabilities.market == "none":
            return pod_spec, []
        from autoslm.controller.images import pod_vllm
        from autoslm.controller.placement import launch_offers

        # The image was decided at launch (sdk.prepare); one still undecided starts as bootstrap (pod_spec).
        vllm = pod_vllm(run.spec, name, exists=lambda _ref: False)
        offers, judged = launch_offers(run.spec, provider, has_vllm=vllm, left=left)
        return dataclasses.replace(pod_spec, offers=offers), judged

    def abort_launch(self, run: RunRecord, why: str) -> tuple[list[str], list[str]]:
        """A launch failed (no capacity, a provider error, anything): end every replica as failed,
        terminate and bill what it started, look once more for a pod whose create was in flight.

        Returns (what is still running: pods whose terminate failed, what was torn down), in words.
        """
        left, ended = [], []
        fence, look = self._acquire(run.run_id, 30.0)
        if fence is None:
            look = self.registry.look(run.run_id)
        if look is None:
            return left, ended
        # Without the lease (held past 30 s by a stuck process) the teardown goes on, unfenced: a run
        # whose launch failed must not keep a pod.
        t = _Tick(look, fence)
        try:
            for r in t.replicas:
                if not r.pod_id and r.intent_name and r.intent_provider:
                    r, unsure = self._resolve_intent(t, r)  # a create whose answer never came may have landed
                    if unsure:
                        left.append(
                            f"maybe a {r.intent_provider} pod named {r.intent_name} (seed {r.seed}; its create "
                            "may still land: it is then adopted, billed from its create and ended)"
                        )
                if r.pod_id and r.provider:
                    pod = f"{r.provider} pod {r.pod_id}"
                    try:
                        self._end_pod(t, r.seed)
                        self.log(f"{run.run_id} seed{r.seed}: terminated pod {r.pod_id} (the launch failed)")
                        ended.append(f"seed {r.seed}: {pod}")
                    except ProviderError as e:
                        left.append(f"{pod} (seed {r.seed}): {e}")
                if not t.reps[r.seed].terminal:
                    t.set(r.seed, state=RunState.FAILED, error=f"launch failed: {why}", end_reason=EndReason.LAUNCH_FAILED)
        finally:
            try:
                self._apply(t, release=True)
            finally:
                if fence is not None:
                    self.registry.release_lease(run.run_id, self.owner)  # (already, unless the write failed)
        return left, ended

    def pod_spec(self, run: RunRecord, seed: int, attempt: int, spent_usd: float | None = None) -> PodSpec:
        return pod_spec(self, run, seed, attempt, spent_usd)


def _unusable(judged) -> NoCapacity:
    """Why no offer of a provider may be rented, as `plan` says it, and what to change."""
    from autoslm.controller.placement import choose_offer

    try:
        choose_offer(judged)
    except NoCapacity as e:
        return e
    return NoCapacity("no usable offer")


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
