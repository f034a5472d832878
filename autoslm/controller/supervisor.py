"""The supervisor: look at each replica, ask ``reconcile`` what to do, do it, record it.

There is no daemon: ``launch`` runs ticks until the run ends (or the user detaches), and ``status``,
``list``, ``wait`` and ``cancel`` run one tick before answering, so a detached run still gets its
relaunches and teardown whenever anyone looks at it. Ticks are idempotent: two processes ticking the
same run at once at worst both ask a provider to terminate the same pod.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from autoslm.catalog import default_worker_image
from autoslm.controller.reconcile import Launch, Limits, SetState, Seen, Terminate, reconcile
from autoslm.controller.registry import Registry, ReplicaRecord, RunRecord
from autoslm.errors import NoCapacity, ProviderError, StoreError
from autoslm.layout import RunPaths
from autoslm.providers.base import PodHandle, PodSpec, Provider
from autoslm.store import RunArtifacts, Store

WORKER_COMMAND = ["python", "-m", "autoslm.engine"]
# Environment variables passed through to a pod when set here: endpoints and the Hub token.
PASS_THROUGH = ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_DISABLE_XET")


@dataclass
class Supervisor:
    registry: Registry
    providers: Callable[[str], Provider]  # name -> provider (built lazily: keys are read only when needed)
    store: Callable[[str], Store]  # uri -> store
    home: Path
    clock: Callable[[], float] = time.time
    log: Callable[[str], None] = lambda msg: None

    # -- one look at a run ------------------------------------------------------------------------
    def tick(self, run: RunRecord) -> list[ReplicaRecord]:
        spec = run.spec
        replicas = self.registry.replicas(run.run_id)
        run_cost = sum(r.cost_usd for r in replicas)
        for r in replicas:
            seen, hb = self._observe(run, r)
            r = self._account(r, seen, hb)
            limits = Limits(
                deadline=run.deadline, max_usd=spec.limits.max_usd, max_restarts=spec.limits.max_restarts,
                heartbeat_timeout_s=spec.limits.heartbeat_timeout_s, cancel_requested=bool(run.cancel_requested),
                run_cost_usd=run_cost,
            )
            for action in reconcile(r, seen, limits, self.clock()):
                r = self._apply(run, r, action)
            if r.terminal and r.pod_id and seen.pod is not None and seen.pod.state == "terminated":
                # The run is over and its pod is gone (it ended itself): forget it, so later looks
                # neither show it nor ask the provider about it (nor bill it when the provider is down).
                self.registry.update_replica(r.run_id, r.seed, pod_id=None, cost_at=None)
        return self.registry.replicas(run.run_id)

    def _artifacts(self, run: RunRecord, seed: int) -> RunArtifacts:
        return RunArtifacts(self.store(run.store_uri), RunPaths(run.phase, run.run_id, seed))

    def _observe(self, run: RunRecord, r: ReplicaRecord):
        pod = None
        if r.pod_id and r.provider:
            try:
                pod = self.providers(r.provider).status(PodHandle(r.provider, r.pod_id))
            except ProviderError as e:
                self.log(f"{run.run_id} seed{r.seed}: provider could not tell the pod's status: {e}")
        art = self._artifacts(run, r.seed)
        done, error, hb = None, None, None
        try:
            done = art.is_done()
            error = art.get_error()
            hb = art.get_heartbeat()
        except StoreError as e:
            self.log(f"{run.run_id} seed{r.seed}: store could not tell: {e}")
        except ValueError:
            hb = None  # a heartbeat torn by a crash: the next one will do
        seen = Seen(
            pod=pod, done=done, error=error,
            heartbeat_time=hb.time if hb else None, heartbeat_stage=hb.stage if hb else None,
            heartbeat_attempt=hb.attempt if hb else None,
        )
        return seen, hb

    def _account(self, r: ReplicaRecord, seen: Seen, hb) -> ReplicaRecord:
        """Record progress from the heartbeat and bill the time since we last looked."""
        now = self.clock()
        changes: dict = {}
        if r.pod_id and r.cost_at is not None and r.price_per_hour:
            until = now  # alive, or the provider could not tell: bill to now (never under-bill a live pod)
            if seen.pod is not None and seen.pod.state not in ("pending", "running"):
                # It stopped since we last looked, maybe hours ago for a detached run: bill up to its
                # last heartbeat (its last sign of life), not nothing.
                last = hb.time if hb is not None and hb.attempt == r.attempt else r.cost_at
                until = min(now, last)
            elif seen.pod is None and r.terminal:
                until = r.cost_at  # a finished run's pod the provider cannot tell about: do not guess
            changes["cost_usd"] = r.cost_usd + r.price_per_hour * max(0.0, until - r.cost_at) / 3600
            changes["cost_at"] = now
        if hb is not None:
            changes.update(step=hb.step, total_steps=hb.total_steps or r.total_steps, heartbeat_at=hb.time, stage=hb.stage, loss=hb.loss)
        if changes:
            self.registry.update_replica(r.run_id, r.seed, **changes)
            r = next(x for x in self.registry.replicas(r.run_id) if x.seed == r.seed)
        return r

    # -- doing ------------------------------------------------------------------------------------
    def _apply(self, run: RunRecord, r: ReplicaRecord, action) -> ReplicaRecord:
        if isinstance(action, Terminate):
            if r.pod_id and r.provider:
                self.log(f"{run.run_id} seed{r.seed}: terminating pod {r.pod_id} ({action.reason})")
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
        return next(x for x in self.registry.replicas(r.run_id) if x.seed == r.seed)

    def _launch(self, run: RunRecord, r: ReplicaRecord, resume: bool) -> None:
        spec = run.spec
        attempt = r.attempt + 1
        errors = []
        for name in spec.compute.providers:
            provider = self.providers(name)
            pod_spec = self.pod_spec(run, r.seed, attempt)
            try:
                handle = provider.launch(pod_spec)
            except NoCapacity as e:
                errors.append(f"{name}: {e}")
                continue
            now = self.clock()
            self.registry.update_replica(
                r.run_id, r.seed, provider=name, pod_id=handle.pod_id, gpu=handle.gpu,
                price_per_hour=handle.price_per_hour, attempt=attempt, restarts=r.restarts + (1 if resume else 0),
                pod_started_at=now, cost_at=now, state="recovering" if resume else "provisioning",
            )
            self.log(f"{run.run_id} seed{r.seed}: launched {handle.pod_id} on {name} (attempt {attempt})")
            return
        message = "no capacity: " + "; ".join(errors)
        if not resume:
            self.registry.update_replica(r.run_id, r.seed, state="failed", error=message)
            raise NoCapacity(message, hint="try another gpu type, a higher max_price_per_hour, or another provider")
        self.log(f"{run.run_id} seed{r.seed}: relaunch found {message}; will retry")
        self.registry.update_replica(r.run_id, r.seed, state="recovering", pod_id=None)

    def pod_spec(self, run: RunRecord, seed: int, attempt: int) -> PodSpec:
        spec = run.spec
        env = {
            "AUTOSLM_JOBSPEC": run.spec_json,
            "AUTOSLM_RUN_ID": run.run_id,
            "AUTOSLM_SEED": str(seed),
            "AUTOSLM_STORE": run.store_uri,
            "AUTOSLM_DEADLINE": str(run.deadline),
            "AUTOSLM_ATTEMPT": str(attempt),
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
        from autoslm.trackers import pod_env

        env.update(pod_env(spec.train.report_to))  # tracker keys, by name from this environment
        judge = spec.environment.judge
        if judge is not None and judge.api_key_env and os.environ.get(judge.api_key_env):
            env[judge.api_key_env] = os.environ[judge.api_key_env]
        return PodSpec(
            name=f"autoslm-{run.run_id}-s{seed}-a{attempt}",
            command=list(WORKER_COMMAND),
            env=env,
            image=spec.compute.image or default_worker_image(),
            gpu_types=tuple(spec.compute.gpus),
            gpu_count=spec.compute.gpu_count,
            interruptible=spec.compute.interruptible,
            max_price_per_hour=spec.compute.max_price_per_hour,
            disk_gb=spec.compute.disk_gb,
            cloud=spec.compute.cloud,
            min_reliability=spec.compute.min_reliability,
            log_path=str(log_path(self.home, run.run_id, seed)),
        )


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
        "cost_usd": round(r.cost_usd, 4), "stage": r.stage, "loss": r.loss,
        "last_heartbeat_age_s": None if r.heartbeat_at is None else round(max(0.0, now - r.heartbeat_at), 1),
        "error": r.error,
    }

