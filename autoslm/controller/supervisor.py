"""The supervisor: look at each replica, ask ``reconcile`` what to do, do it, record it.

A tick runs under the run's lease (``Registry.acquire_lease``): one process acts on a run at a time,
and a process that cannot get the lease within ``wait_s`` only reads what the holder recorded. The
lease is renewed before every action, and an action whose lease was taken over is not done (a
process stalled past the lease's expiry must not launch beside the new holder). ``launch`` runs
ticks until the run ends, a detached run has its own supervisor process (``controller/daemon.py``),
and ``status``, ``list``, ``wait`` and ``cancel`` still tick before answering.

Order of a tick: resolve launch intents (a create whose answer was never recorded: adopt the named
pod; while its create may still land, wait; only after that, create it again under the same name),
sweep the providers' lists for this run's pods that no replica records (adopt the attempt's own,
end and bill any other: a duplicate, a late create), look at every replica, bill every replica, and
only then decide (so ``max_usd`` sees this tick's bill). Every pod is billed at a price: the
provider's, else the one it was created at, else the JobSpec's ceiling (``price_source`` says which). Cancel wins: it is checked again right before a
create and right after one, and a pod created while a cancel arrived is terminated at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from autoslm.catalog import default_worker_image
from autoslm.controller.podnames import home_id, parse_pod_name, pod_name
from autoslm.controller.reconcile import TRAINING_STAGES, Launch, Limits, SetState, Seen, Terminate, reconcile
from autoslm.controller.registry import Registry, ReplicaRecord, RunRecord, lease_owner_id
from autoslm.controller.state import EndReason, RunState
from autoslm.errors import NoCapacity, ProviderError, StoreError
from autoslm.layout import ENV_HOME, PodEnv, RunPaths
from autoslm.providers.base import POD_LABEL, PodHandle, PodSpec, Provider
from autoslm.store import RunArtifacts, Store

WORKER_COMMAND = ["python", "-m", "autoslm.engine"]
# Environment variables passed through to a pod when set here: endpoints and the Hub token.
PASS_THROUGH = ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_DISABLE_XET")
# Longer than one provider call with all its retries (http.RetryPolicy.max_total_s is 300 s), since
# the lease is renewed before every action. A holder that dies on this host frees it at once; one on
# another machine holds it this long at most.
LEASE_TTL_S = 600.0
LEASE_WAIT_S = 2.0  # how long a reader waits for a busy run before answering from the registry
# A holder that is stopped (SIGSTOP) and has not renewed its lease for this long is taken over.
LEASE_STALE_S = 15.0


class LeaseLost(Exception):
    """Another process took this run's lease (ours expired while we stalled): stop acting."""


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
    acted: bool = False  # whether the last tick held the lease (False: it only read what the holder recorded)

    @contextlib.contextmanager
    def shared_look(self, provider_names) -> Iterator[None]:
        """Tick many runs on one list call per provider (``statuses``) instead of a call per pod."""
        snap: dict = {}
        for name in sorted(set(provider_names)):
            try:
                statuses = getattr(self.providers(name), "statuses", None)
                if callable(statuses):
                    snap[name] = statuses()
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

    # -- one look at a run ------------------------------------------------------------------------
    def tick(self, run: RunRecord, *, wait_s: float = LEASE_WAIT_S) -> list[ReplicaRecord]:
        """Act on the run under its lease; without the lease (another process is acting), only read."""
        self.acted = False
        if not self._acquire(run.run_id, wait_s):
            return self.registry.replicas(run.run_id)
        self.acted = True
        try:
            return self._tick(self.registry.get_run(run.run_id) or run)
        except LeaseLost:
            self.log(f"{run.run_id}: another process took over this run; leaving it to that one")
            return self.registry.replicas(run.run_id)
        finally:
            self.registry.release_lease(run.run_id, self.owner)

    def _acquire(self, run_id: str, wait_s: float) -> bool:
        start = time.monotonic()
        while not self.registry.acquire_lease(run_id, self.owner, LEASE_TTL_S, stale_s=self.lease_stale_s):
            if time.monotonic() - start >= wait_s:
                return False
            self.lease_sleep(0.05)
        return True

    def _renew(self, run_id: str) -> None:
        if not self.registry.acquire_lease(run_id, self.owner, LEASE_TTL_S, renew=True):
            raise LeaseLost(run_id)

    def _tick(self, run: RunRecord) -> list[ReplicaRecord]:
        spec = run.spec
        looked = []
        cancel = self.registry.cancel_requested(run.run_id)
        waiting = set()
        for r in self.registry.replicas(run.run_id):
            r, unsure = self._resolve_intent(run, r)
            if unsure:
                waiting.add(r.seed)
                # The create may still land (or the provider could not say): no relaunch until it is
                # known. A cancel ends the replica now; the pod, if it lands, is adopted and ended.
                if cancel and not r.terminal:
                    self.log(f"{run.run_id} seed{r.seed}: {r.state} -> cancelled (a create of {r.intent_name} may still land)")
                    self.registry.update_replica(r.run_id, r.seed, state=RunState.CANCELLED,
                                                 end_reason=self.registry.cancel_reason(run.run_id))
                continue
        self._sweep_strays(run)
        for r in self.registry.replicas(run.run_id):
            if r.seed in waiting:
                continue  # its create may still land (or the provider could not say): decided once known
            seen, hb = self._observe(run, r)
            looked.append((self._account(r, seen, hb, run), seen))
        # Bill, then decide: the money limit sees what every replica has cost up to this very tick.
        run_cost = sum(x.cost_usd for x in self.registry.replicas(run.run_id))
        for r, seen in looked:
            limits = Limits(
                deadline=run.deadline, max_usd=spec.limits.max_usd, max_restarts=spec.limits.max_restarts,
                heartbeat_timeout_s=spec.limits.heartbeat_timeout_s,
                startup_timeout_s=getattr(spec.limits, "startup_timeout_s", 2700.0),
                store_lag_s=store_lag_s(spec),
                cancel_requested=self.registry.cancel_requested(run.run_id), run_cost_usd=run_cost,
                cancel_reason=self.registry.cancel_reason(run.run_id) or EndReason.CANCELLED,
            )
            actions = reconcile(r, seen, limits, self.clock())
            for i, action in enumerate(actions):
                self._renew(run.run_id)
                try:
                    r = self._apply(run, r, action)
                except ProviderError:
                    # A teardown the provider refused: the outcome is known all the same, so record it
                    # (the pod id stays: rule 1 terminates it next tick, and gc reports it). Never a
                    # relaunch after a failed terminate: both pods would train and bill.
                    final = next((a for a in actions[i + 1:] if isinstance(a, SetState) and a.state.terminal), None)
                    if isinstance(action, Terminate) and final is not None:
                        self._apply(run, r, final)
                    raise
            if r.terminal and r.pod_id and seen.pod is not None and seen.pod.state == "terminated":
                # The run is over and its pod is gone (it ended itself): forget it, so later looks
                # neither show it nor ask the provider about it (nor bill it when the provider is down).
                self.registry.mark_ended(r.provider or "", r.pod_id, r.run_id)
                self.registry.update_replica(r.run_id, r.seed, pod_id=None, cost_at=None)
        return self.registry.replicas(run.run_id)

    def _resolve_intent(self, run: RunRecord, r: ReplicaRecord) -> tuple[ReplicaRecord, bool]:
        """A create was (maybe) sent and its pod id never recorded: find the pod by its name.

        Found: adopt the oldest (reconcile then keeps it, or terminates it when the run is over or
        cancelled); end and bill any other with that name. Not found while the create may still land
        (``intent_until``): unsure, so nobody creates that name again. Not found after that: nothing
        is there; a live replica keeps the intent (the next launch reuses the same attempt and name),
        an ended one forgets it. Returns (the replica, unsure).
        """
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
                self.registry.update_replica(r.run_id, r.seed, intent_name=None, intent_provider=None, intent_until=None, cost_at=None)
                return self._replica(r), False
            return r, False
        found.sort(key=lambda h: (h.created_at is None, h.created_at or 0.0))
        handle, extra = found[0], found[1:]
        price, source = self._price(handle, r, run)
        self.registry.update_replica(
            r.run_id, r.seed, provider=r.intent_provider, pod_id=handle.pod_id, gpu=handle.gpu,
            # Billed from the intent (written right before the create): it has been paid for since then.
            price_per_hour=price, price_source=source, pod_started_at=now, cost_at=r.cost_at or now,
            intent_name=None, intent_provider=None, intent_until=None,
            state=RunState.RECOVERING if r.state == RunState.RECOVERING else (
                RunState.PROVISIONING if r.state == RunState.PENDING else r.state),
        )
        self.log(f"{run.run_id} seed{r.seed}: adopted pod {handle.pod_id} ({r.intent_name}) left by an interrupted launch")
        for dup in extra:
            self._end_stray(run, r.seed, dup, "a second pod with the same name")
        return self._replica(r), False

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

    def _sweep_strays(self, run: RunRecord) -> None:
        """Every pod of this run (this home's name pattern) that no replica records: adopt it when it is
        a live replica's current attempt with no pod, else end it and bill it from its create."""
        replicas = {r.seed: r for r in self.registry.replicas(run.run_id)}
        recorded = {r.pod_id for r in replicas.values() if r.pod_id}
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
                if self.registry.was_ended(pname, h.pod_id):
                    continue  # ended and billed already: a provider may list it a while longer
                if pname != "local" and parsed.home not in (self.home_id, None):
                    continue
                r = replicas.get(parsed.seed)
                if r is not None and not r.pod_id and not r.terminal and parsed.attempt == r.attempt and not r.intent_name:
                    price, source = self._price(h, r, run)
                    now = self.clock()
                    self.registry.update_replica(r.run_id, r.seed, provider=pname, pod_id=h.pod_id, gpu=h.gpu,
                                                 price_per_hour=price, price_source=source, pod_started_at=now,
                                                 cost_at=h.created_at or r.cost_at or now)
                    self.log(f"{run.run_id} seed{r.seed}: adopted unrecorded pod {h.pod_id} ({h.name})")
                    recorded.add(h.pod_id)
                    replicas[r.seed] = self._replica(r)
                    continue
                if r is not None and r.intent_name == h.name and not r.pod_id:
                    continue  # its intent adopts it
                self._end_stray(run, parsed.seed, h, "no record of it")

    def _end_stray(self, run: RunRecord, seed: int, h: PodHandle, why: str) -> None:
        """End a pod no replica keeps, and bill it to its seed from its create (else the run's start)."""
        self.log(f"{run.run_id} seed{seed}: ending pod {h.pod_id} ({h.name}): {why}")
        self.providers(h.provider).terminate(PodHandle(h.provider, h.pod_id))
        self._bill_stray(run, seed, h)

    def bill_ended(self, h: PodHandle, run_id: str) -> None:
        """`gc` ended this pod of a run here that no replica recorded: bill it (once) to its seed."""
        parsed = parse_pod_name(h.name or "")
        run = self.registry.get_run(run_id)
        if parsed is None or run is None or any(r.pod_id == h.pod_id for r in self.registry.replicas(run_id)):
            return  # a recorded pod: its replica bills it
        self._bill_stray(run, parsed.seed, h)

    def _bill_stray(self, run: RunRecord, seed: int, h: PodHandle) -> None:
        if self.registry.was_ended(h.provider, h.pod_id):
            return  # billed when it was ended
        self.registry.mark_ended(h.provider, h.pod_id, run.run_id)
        r = next((x for x in self.registry.replicas(run.run_id) if x.seed == seed), None)
        if r is None:
            return
        price, source = self._price(h, r, run)
        since = h.created_at or r.cost_at or run.created_at
        cost = (price or 0.0) * max(0.0, self.clock() - since) / 3600
        self.registry.update_replica(r.run_id, r.seed, cost_usd=r.cost_usd + cost)
        self.log(f"{run.run_id} seed{seed}: billed pod {h.pod_id} ${cost:.4f} (at ${price or 0:.3f}/h, {source})")

    def _replica(self, r: ReplicaRecord) -> ReplicaRecord:
        return next(x for x in self.registry.replicas(r.run_id) if x.seed == r.seed)

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
            pod=pod, done=done, error=error, adapter=adapter,
            heartbeat_time=hb.time if hb else None, heartbeat_stage=hb.stage if hb else None,
            heartbeat_attempt=hb.attempt if hb else None,
        )
        return seen, hb

    def _account(self, r: ReplicaRecord, seen: Seen, hb, run: RunRecord | None = None) -> ReplicaRecord:
        """Record progress from the heartbeat and bill the time since we last looked."""
        now = self.clock()
        changes: dict = {}
        if r.pod_id and not r.price_per_hour and run is not None:
            price, source = self._price(None, r, run)
            if price:
                changes.update(price_per_hour=price, price_source=source)
                r = dataclasses.replace(r, price_per_hour=price)
        if r.pod_id and r.cost_at is not None and r.price_per_hour:
            # Alive, stopped, or the provider could not tell: bill to now, when its end was observed. A
            # pod bills until it is gone, not until its last heartbeat (a hung worker sends none), and
            # an exited pod still exists. Never under-bill: a run under max_usd on paper is relaunched.
            until = now
            if seen.pod is None and r.terminal:
                until = r.cost_at  # a finished run's pod the provider cannot tell about: do not guess
            changes["cost_usd"] = r.cost_usd + r.price_per_hour * max(0.0, until - r.cost_at) / 3600
            changes["cost_at"] = now
        if hb is not None:
            changes.update(step=hb.step, total_steps=hb.total_steps or r.total_steps, heartbeat_at=hb.time, stage=hb.stage,
                           loss=hb.loss, message=hb.message)
            if hb.attempt == r.attempt and hb.stage == "error" and hb.time != r.last_error_beat:
                # A worker failing again inside a live pod (RunPod restarts the container): count it.
                changes.update(error_beats=r.error_beats + 1, last_error_beat=hb.time)
            elif hb.attempt == r.attempt and hb.stage in TRAINING_STAGES and hb.step > r.step:
                changes["error_beats"] = 0  # training progress: whatever failed before is not a loop
        if changes:
            self.registry.update_replica(r.run_id, r.seed, **changes)
            r = self._replica(r)
        return r

    # -- doing ------------------------------------------------------------------------------------
    def _apply(self, run: RunRecord, r: ReplicaRecord, action) -> ReplicaRecord:
        if isinstance(action, Terminate):
            if r.pod_id and r.provider:
                self.log(f"{run.run_id} seed{r.seed}: terminating pod {r.pod_id} ({action.reason})")
                self._bill_to_now(r)
                self.providers(r.provider).terminate(PodHandle(r.provider, r.pod_id))
                self.registry.mark_ended(r.provider, r.pod_id, r.run_id)
                self.registry.update_replica(r.run_id, r.seed, pod_id=None, cost_at=None)
        elif isinstance(action, SetState):
            changes = {"state": action.state}
            if action.error:
                changes["error"] = action.error
            if action.reason:
                changes["end_reason"] = action.reason
            self.log(f"{run.run_id} seed{r.seed}: {r.state} -> {action.state}" + (f" ({action.error})" if action.error else ""))
            self.registry.update_replica(r.run_id, r.seed, **changes)
        elif isinstance(action, Launch):
            self._launch(run, r, resume=action.resume)
        return self._replica(r)

    def _launch(self, run: RunRecord, r: ReplicaRecord, resume: bool) -> None:
        if self.registry.cancel_requested(run.run_id):
            self.log(f"{run.run_id} seed{r.seed}: cancel requested: not launching")
            return  # cancel wins: the next look ends the replica as cancelled
        spec = run.spec
        # An intent still standing means its create may have landed late: same attempt, same name.
        attempt = r.attempt if r.intent_name else r.attempt + 1
        errors = []
        for name in spec.compute.providers:
            provider = self.providers(name)
            pod_spec = self.pod_spec(run, r.seed, attempt)
            # Written ahead: a crash between the create and the record below leaves a name to look up.
            self.registry.set_intent(r.run_id, r.seed, provider=name, name=pod_spec.name, attempt=attempt,
                                     window_s=float(getattr(provider, "create_window_s", 0.0)))
            try:
                handle = provider.launch(pod_spec)
            except NoCapacity as e:
                errors.append(f"{name}: {e}")
                continue
            if not self.registry.acquire_lease(run.run_id, self.owner, LEASE_TTL_S, renew=True):
                # We stalled past the lease and another process acts on the run now: keep our pod only
                # if that process adopted it (same name), or it would run beside the other's.
                if self._replica(r).pod_id != handle.pod_id:
                    self._end_stray(run, r.seed, dataclasses.replace(handle, provider=name), "lost the run's lease during the launch")
                raise LeaseLost(run.run_id)
            now = self.clock()
            billed_from = self._replica(r).cost_at or now  # the intent: the create was sent then
            price, source = self._price(handle, self._replica(r), run)
            self.registry.update_replica(
                r.run_id, r.seed, provider=name, pod_id=handle.pod_id, gpu=handle.gpu,
                price_per_hour=price, price_source=source, attempt=attempt, intent_until=None, restarts=r.restarts + (1 if resume else 0),
                pod_started_at=now, cost_at=billed_from, state=RunState.RECOVERING if resume else RunState.PROVISIONING,
                intent_name=None, intent_provider=None, error_beats=0,
            )
            self.log(f"{run.run_id} seed{r.seed}: launched {handle.pod_id} on {name} (attempt {attempt})")
            if self.registry.cancel_requested(run.run_id):
                # The cancel arrived while the create was in flight: this pod must not live on.
                self.log(f"{run.run_id} seed{r.seed}: cancel arrived during the launch: terminating {handle.pod_id}")
                self._bill_to_now(r)
                provider.terminate(PodHandle(name, handle.pod_id))
                self.registry.mark_ended(name, handle.pod_id, r.run_id)
                self.registry.update_replica(r.run_id, r.seed, pod_id=None, cost_at=None, state=RunState.CANCELLED,
                                             end_reason=self.registry.cancel_reason(run.run_id))
            return
        self.registry.update_replica(r.run_id, r.seed, intent_name=None, intent_provider=None, intent_until=None, cost_at=None)
        message = "no capacity: " + "; ".join(errors)
        if not resume:
            self.registry.update_replica(r.run_id, r.seed, state=RunState.FAILED, error=message, end_reason=EndReason.LAUNCH_FAILED)
            raise NoCapacity(message, hint="try another gpu type, a higher max_price_per_hour, or another provider")
        self.log(f"{run.run_id} seed{r.seed}: relaunch found {message}; will retry")
        self.registry.update_replica(r.run_id, r.seed, state=RunState.RECOVERING, pod_id=None)

    def abort_launch(self, run: RunRecord, why: str) -> tuple[list[str], list[str]]:
        """A launch failed (no capacity, a provider error, anything): end every replica as failed,
        terminate and bill what it started, look once more for a pod whose create was in flight.

        Returns (what is still running: pods whose terminate failed, what was torn down), in words.
        """
        left, ended = [], []
        with_lease = self._acquire(run.run_id, 30.0)
        try:
            for r in self.registry.replicas(run.run_id):
                if not r.pod_id and r.intent_name and r.intent_provider:
                    r, unsure = self._resolve_intent(run, r)  # a create whose answer never came may have landed
                    if unsure:
                        left.append(f"maybe a {r.intent_provider} pod named {r.intent_name} (seed {r.seed}; its create "
                                    "may still land: it is then adopted, billed from its create and ended)")
                if r.pod_id and r.provider:
                    self._bill_to_now(r)
                    try:
                        self.providers(r.provider).terminate(PodHandle(r.provider, r.pod_id))
                        self.log(f"{run.run_id} seed{r.seed}: terminated pod {r.pod_id} (the launch failed)")
                        self.registry.mark_ended(r.provider, r.pod_id, r.run_id)
                        self.registry.update_replica(r.run_id, r.seed, pod_id=None, cost_at=None)
                        ended.append(f"seed {r.seed}: {r.provider} pod {r.pod_id}")
                    except ProviderError as e:
                        left.append(f"{r.provider} pod {r.pod_id} (seed {r.seed}): {e}")
                if not r.terminal:
                    self.registry.update_replica(r.run_id, r.seed, state=RunState.FAILED, error=f"launch failed: {why}",
                                                 end_reason=EndReason.LAUNCH_FAILED)
        finally:
            if with_lease:
                self.registry.release_lease(run.run_id, self.owner)
        return left, ended

    def _bill_to_now(self, r: ReplicaRecord) -> None:
        """Bill a pod we are about to end for its time since the last bill (from its create, at first)."""
        r = self._replica(r)
        if r.pod_id and r.cost_at is not None and r.price_per_hour:
            now = self.clock()
            self.registry.update_replica(r.run_id, r.seed, cost_usd=r.cost_usd + r.price_per_hour * max(0.0, now - r.cost_at) / 3600,
                                         cost_at=now)

    def pod_spec(self, run: RunRecord, seed: int, attempt: int) -> PodSpec:
        spec = run.spec
        env = PodEnv(
            run_id=run.run_id, store_uri=run.store_uri, spec_json=run.spec_json, seed=seed, attempt=attempt,
            deadline=run.deadline,
            # What the run cost before this pod: the in-pod watchdog keeps the rest under limits.max_usd.
            spent_usd=sum(x.cost_usd for x in self.registry.replicas(run.run_id)),
        ).to_env()  # the provider adds the price (AUTOSLM_PRICE_PER_HOUR): only it knows the offer
        env["PYTHONUNBUFFERED"] = "1"
        if spec.compute.is_local:
            env[ENV_HOME] = str(self.home)
        for name in PASS_THROUGH:
            if os.environ.get(name):
                env[name] = os.environ[name]
        if run.store_uri.startswith("hf://") and "HF_TOKEN" not in env:
            token = _hub_login_token()
            if token:
                env["HF_TOKEN"] = token
        from autoslm.controller.tracker_env import pod_env

        env.update(pod_env(spec.train.report_to))  # tracker keys, by name from this environment
        judge = spec.environment.judge
        if judge is not None and judge.api_key_env and os.environ.get(judge.api_key_env):
            env[judge.api_key_env] = os.environ[judge.api_key_env]
        command, image, bootstrap = list(WORKER_COMMAND), spec.compute.image, False
        if not spec.compute.is_local and image in ("auto", "bootstrap", None):
            # "auto" is decided at launch (sdk.prepare); an undecided one (a run recorded before
            # bootstrap existed, whose published image may not exist) starts the way that works anyway.
            command, image, bootstrap = self._bootstrap_command(run), None, True
        return PodSpec(
            name=pod_name(self.home_id, run.run_id, seed, attempt),
            command=command,
            bootstrap=bootstrap,
            env=env,
            image=image or default_worker_image(),
            gpu_types=tuple(spec.compute.gpus),
            gpu_count=spec.compute.gpu_count,
            interruptible=spec.compute.interruptible,
            max_price_per_hour=spec.compute.max_price_per_hour,
            disk_gb=spec.compute.disk_gb,
            cloud=spec.compute.cloud,
            min_reliability=spec.compute.min_reliability,
            log_path=str(log_path(self.home, run.run_id, seed)),
        )


    def _bootstrap_command(self, run: RunRecord) -> list[str]:
        """worker_image/boot.sh with autoslm's wheel, shipped into the run's store once per content."""
        from autoslm.controller.images import boot_command, wants_vllm
        from autoslm.controller.wheel import ship_wheel

        ref = ship_wheel(self.store(run.store_uri), self.home / "wheels")
        return boot_command(ref, list(WORKER_COMMAND), vllm=wants_vllm(run.spec))


def store_lag_s(spec) -> float:
    """How late a heartbeat may reach the store: the worker commits at most ``commits_per_hour`` times
    an hour to a Hub repo, so a fresh heartbeat may wait one commit interval before anyone can read it."""
    if spec.artifacts.store != "hf":
        return 0.0
    return 3600.0 / spec.artifacts.commits_per_hour


def log_path(home: Path, run_id: str, seed: int) -> Path:
    return Path(home) / "logs" / run_id / f"seed{seed}.log"


def _hub_login_token() -> str | None:
    try:
        from huggingface_hub import get_token

        return get_token()
    except Exception:  # noqa: BLE001 - no login is fine: the store will say what is missing
        return None
