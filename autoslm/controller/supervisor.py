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

Here: the lease, the tick's order, looking at a replica and acting on ``reconcile``'s answer. The tick's
working state and the lease's timings are in ``tick.py``; adopting a create's pod by its name and the
stray pods of the providers' lists in ``adopt.py``; prices and bills in ``billing.py``; creating a pod
(the offers, the intent, the create, its record) and a failed launch's teardown in ``launch.py``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from autoslm.controller import adopt, billing
from autoslm.controller import launch as launching
from autoslm.controller.podnames import home_id
from autoslm.controller.podspec import WORKER_COMMAND, log_path, pod_request, store_lag_s
from autoslm.controller.reconcile import HandBack, Launch, Limits, Seen, SetState, Terminate, account, ends, reconcile
from autoslm.controller.registry import Fence, LeaseLost, Registry, ReplicaRecord, RunLook, RunRecord, lease_owner_id
from autoslm.controller.state import EndReason, RunState
from autoslm.controller.tick import LEASE_BEAT_S, LEASE_HUNG_S, LEASE_STALE_S, LEASE_TTL_S, LEASE_WAIT_S, Tick
from autoslm.errors import ProviderError, StoreError
from autoslm.layout import RunPaths
from autoslm.providers import VENDORS
from autoslm.providers.base import PodHandle, PodRequest, Provider
from autoslm.store import RunArtifacts, Store

__all__ = [
    "LEASE_BEAT_S",
    "LEASE_HUNG_S",
    "LEASE_STALE_S",
    "LEASE_TTL_S",
    "WORKER_COMMAND",
    "LeaseLost",
    "Supervisor",
    "log_path",
    "store_lag_s",
]


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
        fence, look = self.acquire(run, wait_s)
        if fence is None:
            return self.registry.replicas(run.run_id)
        self.acted = True
        try:
            return self._tick(fence, look)
        except LeaseLost:
            self.lost = True
            self.log(f"{run.run_id}: another process took over this run; leaving it to that one")
            return self.registry.replicas(run.run_id)

    def acquire(self, run: RunRecord, wait_s: float) -> tuple[Fence | None, RunLook | None]:
        """Take the run's lease (a stale holder's too) and read what a tick needs, waiting up to ``wait_s``.
        The run read again keeps ``run``'s parsed JobSpec: a run is parsed once per record its caller holds."""
        start = time.monotonic()
        while True:
            fence, look = self.registry.take_and_look(
                run.run_id, self.owner, LEASE_TTL_S, stale_s=self.lease_stale_s, hung_s=self.lease_hung_s
            )
            if fence is not None or time.monotonic() - start >= wait_s:
                if look is not None:
                    look.run.share_spec(run)
                return fence, look
            self.lease_sleep(0.05)

    # -- one tick: look, decide, apply -----------------------------------------------------------------
    def _tick(self, fence: Fence, look: RunLook | None) -> list[ReplicaRecord]:
        if look is None:
            self.registry.release_lease(fence.run_id, self.owner)
            return []
        t = Tick(look, fence, self.registry)
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
                    t.apply(release=True)
            except LeaseLost:
                pass
            except Exception:  # noqa: BLE001 - the registry failed too: the first error says more
                if not interrupted:
                    with contextlib.suppress(Exception):
                        self.registry.release_lease(fence.run_id, self.owner)
            raise
        t.apply(release=True)  # the tick's write, which lets the lease go
        return t.replicas

    def _decide_and_act(self, t: Tick) -> None:
        run, spec = t.run, t.run.spec
        waiting = set()
        for r in t.replicas:
            r, unsure = adopt.resolve_intent(self, t, r)
            if unsure:
                waiting.add(r.seed)
                # The create may still land (or the provider could not say): no relaunch until it is
                # known. A cancel ends the replica now; the pod, if it lands, is adopted and ended.
                if t.cancel and not r.terminal:
                    self.log(f"{run.run_id} seed{r.seed}: {r.state} -> cancelled (a create of {r.intent_name} may still land)")
                    t.set(r.seed, state=RunState.CANCELLED, end_reason=t.cancel_reason)
        adopt.sweep_strays(self, t)
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
                rate, source = billing.price(None, r, run)
                if rate:
                    r = t.set(seed, price_per_hour=rate, price_source=source)
            t.set(seed, **account(r, seen, hb, now))
        run_cost = t.spent()
        limits = Limits(
            deadline=run.deadline,
            max_usd=spec.limits.max_usd,
            max_restarts=spec.limits.max_restarts,
            heartbeat_timeout_s=spec.limits.heartbeat_timeout_s,
            startup_timeout_s=spec.limits.startup_timeout_s,
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
                t.set(seed, pod_id=None, cost_at=None, **billing.NO_TEARDOWN_TROUBLE)

    def artifacts(self, run: RunRecord, seed: int) -> RunArtifacts:
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
        art = self.artifacts(run, r.seed)
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
            heartbeat_activity=getattr(hb, "activity", None) if hb else None,
        )
        return seen, hb

    # -- doing ------------------------------------------------------------------------------------
    def _act(self, t: Tick, seed: int, action) -> None:
        r = t.reps[seed]
        if isinstance(action, Terminate):
            if r.pod_id and r.provider:
                self.log(f"{t.run.run_id} seed{seed}: terminating pod {r.pod_id} ({action.reason})")
                billing.end_pod(self, t, seed)
        elif isinstance(action, SetState):
            changes = {"state": action.state}
            if action.error:
                changes["error"] = action.error
            if action.reason:
                changes["end_reason"] = action.reason
            self.log(f"{t.run.run_id} seed{seed}: {r.state} -> {action.state}" + (f" ({action.error})" if action.error else ""))
            t.set(seed, **changes)
        elif isinstance(action, Launch):
            launching.launch(self, t, seed, resume=action.resume)
        elif isinstance(action, HandBack):  # a limit ended it: what it learned becomes its adapter
            from autoslm.controller.handback import hand_back
            from autoslm.recipes.evaluation import hands_back_best

            spec = t.run.spec
            best = spec.kind == "train" and hands_back_best(spec.eval, spec.train)
            self._act(t, seed, hand_back(self.artifacts(t.run, seed), action, r.step, r.total_steps, keep_best=best))

    # -- what others ask of it ------------------------------------------------------------------------
    def bill_ended(self, h: PodHandle, run_id: str) -> None:
        """`gc` ended this pod of a run here that no replica recorded: bill it (once) to its seed."""
        billing.bill_ended(self, h, run_id)

    def abort_launch(self, run: RunRecord, why: str) -> tuple[list[str], list[str]]:
        """A launch failed: end every replica as failed and tear down what it started (``launch.abort_launch``).
        Returns (what is still running, what was torn down), in words."""
        return launching.abort_launch(self, run, why)

    def pod_request(self, run: RunRecord, seed: int, attempt: int, spent_usd: float | None = None) -> PodRequest:
        """The attempt's pod, as every provider of the run is asked for it (``podspec.pod_request``)."""
        return pod_request(self, run, seed, attempt, spent_usd)
