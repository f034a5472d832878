"""The supervisor: look at each replica, ask ``reconcile`` what to do, do it, record it.

A tick runs under the run's lease (``Registry.acquire_lease``): one process acts on a run at a time,
and a process that cannot get the lease within ``wait_s`` only reads what the holder recorded. The
lease is renewed before every action, and an action whose lease was taken over is not done (a
process stalled past the lease's expiry must not launch beside the new holder). ``launch`` runs
ticks until the run ends, a detached run has its own supervisor process (``controller/daemon.py``),
and ``status``, ``list``, ``wait`` and ``cancel`` still tick before answering.

Order of a tick: resolve launch intents (a create whose answer was never recorded: adopt the named
pod, or create it again under the same name), look at every replica, bill every replica, and only
then decide (so ``max_usd`` sees this tick's bill). Cancel wins: it is checked again right before a
create and right after one, and a pod created while a cancel arrived is terminated at once.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from autoslm.catalog import default_worker_image
from autoslm.controller.podnames import home_id, pod_name
from autoslm.controller.reconcile import TRAINING_STAGES, Launch, Limits, SetState, Seen, Terminate, reconcile
from autoslm.controller.registry import TERMINAL, Registry, ReplicaRecord, RunRecord, lease_owner_id
from autoslm.errors import NoCapacity, ProviderError, StoreError
from autoslm.layout import RunPaths
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
        if not self._acquire(run.run_id, wait_s):
            return self.registry.replicas(run.run_id)
        try:
            return self._tick(self.registry.get_run(run.run_id) or run)
        except LeaseLost:
            self.log(f"{run.run_id}: another process took over this run; leaving it to that one")
            return self.registry.replicas(run.run_id)
        finally:
            self.registry.release_lease(run.run_id, self.owner)

    def _acquire(self, run_id: str, wait_s: float) -> bool:
        start = time.monotonic()
        while not self.registry.acquire_lease(run_id, self.owner, LEASE_TTL_S):
            if time.monotonic() - start >= wait_s:
                return False
            self.lease_sleep(0.05)
        return True

    def _renew(self, run_id: str) -> None:
        if not self.registry.acquire_lease(run_id, self.owner, LEASE_TTL_S):
            raise LeaseLost(run_id)

    def _tick(self, run: RunRecord) -> list[ReplicaRecord]:
        spec = run.spec
        looked = []
        for r in self.registry.replicas(run.run_id):
            r, unsure = self._resolve_intent(run, r)
            if unsure:
                continue  # the provider could not say whether the interrupted create made a pod: next tick
            seen, hb = self._observe(run, r)
            looked.append((self._account(r, seen, hb), seen))
        # Bill, then decide: the money limit sees what every replica has cost up to this very tick.
        run_cost = sum(x.cost_usd for x in self.registry.replicas(run.run_id))
        for r, seen in looked:
            limits = Limits(
                deadline=run.deadline, max_usd=spec.limits.max_usd, max_restarts=spec.limits.max_restarts,
                heartbeat_timeout_s=spec.limits.heartbeat_timeout_s,
                startup_timeout_s=getattr(spec.limits, "startup_timeout_s", 2700.0),
                store_lag_s=store_lag_s(spec),
                cancel_requested=self.registry.cancel_requested(run.run_id), run_cost_usd=run_cost,
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
                    final = next((a for a in actions[i + 1:] if isinstance(a, SetState) and a.state in TERMINAL), None)
                    if isinstance(action, Terminate) and final is not None:
                        self._apply(run, r, final)
                    raise
            if r.terminal and r.pod_id and seen.pod is not None and seen.pod.state == "terminated":
                # The run is over and its pod is gone (it ended itself): forget it, so later looks
                # neither show it nor ask the provider about it (nor bill it when the provider is down).
                self.registry.update_replica(r.run_id, r.seed, pod_id=None, cost_at=None)
        return self.registry.replicas(run.run_id)

    def _resolve_intent(self, run: RunRecord, r: ReplicaRecord) -> tuple[ReplicaRecord, bool]:
        """A create was (maybe) sent and its pod id never recorded: find the pod by its name.

        Found: adopt it (reconcile then keeps it, or terminates it when the run is over or cancelled).
        Not found: keep the intent, so the next launch reuses the same attempt and name -- a create
        that lands late is then adopted by the provider's launch-by-name, never doubled.
        """
        if r.pod_id or not r.intent_name or not r.intent_provider:
            return r, False
        try:
            found = [h for h in self.providers(r.intent_provider).list_pods(POD_LABEL) if h.name == r.intent_name]
        except ProviderError as e:
            self.log(f"{run.run_id} seed{r.seed}: could not look for pod {r.intent_name} on {r.intent_provider}: {e}")
            return r, True
        if not found:
            return r, False
        handle = found[0]
        now = self.clock()
        self.registry.update_replica(
            r.run_id, r.seed, provider=r.intent_provider, pod_id=handle.pod_id, gpu=handle.gpu,
            # Billed from the intent (written right before the create): it has been paid for since then.
            price_per_hour=handle.price_per_hour, pod_started_at=now, cost_at=r.cost_at or now, intent_name=None, intent_provider=None,
            state="recovering" if r.state == "recovering" else ("provisioning" if r.state == "pending" else r.state),
        )
        self.log(f"{run.run_id} seed{r.seed}: adopted pod {handle.pod_id} ({r.intent_name}) left by an interrupted launch")
        return self._replica(r), False

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

    def _account(self, r: ReplicaRecord, seen: Seen, hb) -> ReplicaRecord:
        """Record progress from the heartbeat and bill the time since we last looked."""
        now = self.clock()
        changes: dict = {}
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
                self.registry.update_replica(r.run_id, r.seed, pod_id=None, cost_at=None)
        elif isinstance(action, SetState):
            changes = {"state": action.state}
            if action.error:
                changes["error"] = action.error
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
            self.registry.set_intent(r.run_id, r.seed, provider=name, name=pod_spec.name, attempt=attempt)
            try:
                handle = provider.launch(pod_spec)
            except NoCapacity as e:
                errors.append(f"{name}: {e}")
                continue
            if not self.registry.acquire_lease(run.run_id, self.owner, LEASE_TTL_S):
                # We stalled past the lease and another process acts on the run now: keep our pod only
                # if that process adopted it (same name), or it would run beside the other's.
                if self._replica(r).pod_id != handle.pod_id:
                    self.log(f"{run.run_id} seed{r.seed}: lost the run's lease during the launch: terminating {handle.pod_id}")
                    provider.terminate(PodHandle(name, handle.pod_id))
                raise LeaseLost(run.run_id)
            now = self.clock()
            billed_from = self._replica(r).cost_at or now  # the intent: the create was sent then
            self.registry.update_replica(
                r.run_id, r.seed, provider=name, pod_id=handle.pod_id, gpu=handle.gpu,
                price_per_hour=handle.price_per_hour, attempt=attempt, restarts=r.restarts + (1 if resume else 0),
                pod_started_at=now, cost_at=billed_from, state="recovering" if resume else "provisioning",
                intent_name=None, intent_provider=None, error_beats=0,
            )
            self.log(f"{run.run_id} seed{r.seed}: launched {handle.pod_id} on {name} (attempt {attempt})")
            if self.registry.cancel_requested(run.run_id):
                # The cancel arrived while the create was in flight: this pod must not live on.
                self.log(f"{run.run_id} seed{r.seed}: cancel arrived during the launch: terminating {handle.pod_id}")
                self._bill_to_now(r)
                provider.terminate(PodHandle(name, handle.pod_id))
                self.registry.update_replica(r.run_id, r.seed, pod_id=None, cost_at=None, state="cancelled")
            return
        self.registry.update_replica(r.run_id, r.seed, intent_name=None, intent_provider=None, cost_at=None)
        message = "no capacity: " + "; ".join(errors)
        if not resume:
            self.registry.update_replica(r.run_id, r.seed, state="failed", error=message)
            raise NoCapacity(message, hint="try another gpu type, a higher max_price_per_hour, or another provider")
        self.log(f"{run.run_id} seed{r.seed}: relaunch found {message}; will retry")
        self.registry.update_replica(r.run_id, r.seed, state="recovering", pod_id=None)

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
                        left.append(f"maybe a {r.intent_provider} pod named {r.intent_name} (seed {r.seed}; "
                                    "the provider could not say whether its create landed)")
                if r.pod_id and r.provider:
                    self._bill_to_now(r)
                    try:
                        self.providers(r.provider).terminate(PodHandle(r.provider, r.pod_id))
                        self.log(f"{run.run_id} seed{r.seed}: terminated pod {r.pod_id} (the launch failed)")
                        self.registry.update_replica(r.run_id, r.seed, pod_id=None, cost_at=None)
                        ended.append(f"seed {r.seed}: {r.provider} pod {r.pod_id}")
                    except ProviderError as e:
                        left.append(f"{r.provider} pod {r.pod_id} (seed {r.seed}): {e}")
                if not r.terminal:
                    self.registry.update_replica(r.run_id, r.seed, state="failed", error=f"launch failed: {why}")
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
        env = {
            "AUTOSLM_JOBSPEC": run.spec_json,
            "AUTOSLM_RUN_ID": run.run_id,
            "AUTOSLM_SEED": str(seed),
            "AUTOSLM_STORE": run.store_uri,
            "AUTOSLM_DEADLINE": str(run.deadline),
            "AUTOSLM_ATTEMPT": str(attempt),
            # What the run cost before this pod: the in-pod watchdog keeps the rest under limits.max_usd.
            "AUTOSLM_SPENT_USD": f"{sum(x.cost_usd for x in self.registry.replicas(run.run_id)):.4f}",
            "PYTHONUNBUFFERED": "1",
        }
        if spec.compute.providers == ["local"]:
            env["AUTOSLM_HOME"] = str(self.home)
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
        if spec.compute.providers != ["local"] and image in ("auto", "bootstrap", None):
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


def replica_json(r: ReplicaRecord, now: float) -> dict:
    return {
        "seed": r.seed, "state": r.state, "step": r.step, "total_steps": r.total_steps, "provider": r.provider,
        "pod_id": r.pod_id, "gpu": r.gpu, "restarts": r.restarts, "attempt": r.attempt,
        "cost_usd": round(r.cost_usd, 4), "stage": r.stage, "message": r.message, "loss": r.loss,
        "last_heartbeat_age_s": None if r.heartbeat_at is None else round(max(0.0, now - r.heartbeat_at), 1),
        "error": r.error,
    }

