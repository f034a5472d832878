"""The in-pod watchdog: a thread that ends its own pod when the run's time or money is up.

The controller enforces limits.max_hours and limits.max_usd too, but only while its supervisor
runs; this thread enforces them from inside the pod even when the laptop is closed and even while
the worker's main thread hangs in a step, an evaluation, a download or generation. When a limit
passes it saves what it can (a non-retryable error record in the store, so nobody relaunches; the
checkpoints already uploaded stay), then ends its pod (``selfterm``, which checks the vendor's
answer and falls back), and if it is still alive then, stops its own process.

It also counts how many times a worker has started inside this one pod, on the pod's disk: RunPod
restarts a container whose worker exits, so a worker that keeps failing would bill until max_hours.
After ``MAX_STARTS_IN_POD`` starts it ends the pod, and the controller replaces it (within
limits.max_restarts) or fails the run.

The pod's price comes from the provider in AUTOSLM_PRICE_PER_HOUR, the run's earlier spend from the
controller in AUTOSLM_SPENT_USD, and when the controller began billing this pod in AUTOSLM_BILLED_FROM
(``layout.PodEnv``); a replica of ``compute.nodes`` pods counts them all (each pod's watchdog ends its
own pod at the limit); with several seeds each pod keeps to its share of what is left
(``limits.pod_budget_usd``, which the worker's own stop uses too). The worker stops before a limit by
itself and hands back its adapter (``limits.py``); this thread is the backstop for a worker that
cannot. Its error record names the limit (``ErrorRecord.limit``), so the controller hands back the
newest checkpoint's adapter as the run's. A ``max_usd`` with no price to count it by is an error at start (``require_price``):
the worker refuses to train rather than run unguarded.

It must never: end a pod for any other reason; raise into the worker; use the user's account key.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from autoslm.engine.pod.limits import pod_budget_usd, replica_price
from autoslm.layout import LIMIT_HOURS, LIMIT_USD
from autoslm.vendors.billing import pod_cost_usd

MAX_STARTS_IN_POD = 3
CHECK_EVERY_S = 5.0
EXIT_GRACE_S = 60.0
ERROR_RECORD_WAIT_S = 10.0  # a limit passed: the pod bills while we wait on the store, so not long
DEADLINE_GRACE_S = 120.0  # after asking its own process to stop, how long before it exits hard


def _log_default(msg: str) -> None:
    print(msg, flush=True)


def pod_state_dir(environ: Mapping[str, str]) -> Path:
    """Somewhere on the pod's own disk that outlives a container restart (RunPod keeps /workspace)."""
    ws = Path("/workspace")
    if ws.is_dir() and os.access(ws, os.W_OK):
        return ws / ".autoslm"
    return Path(environ.get("HOME") or Path.home()) / ".autoslm-pod"


class Watchdog:
    def __init__(
        self,
        *,
        deadline: float | None,
        budget_usd: float | None,
        price_per_hour: float | None,
        pod_started_at: float,
        on_limit: Callable[[str], None],
        clock: Callable[[], float] = time.time,
        every_s: float = CHECK_EVERY_S,
    ):
        self.deadline = deadline
        self.budget_usd = budget_usd
        self.price_per_hour = price_per_hour
        self.pod_started_at = pod_started_at
        self.on_limit = on_limit
        self.clock = clock
        self.every_s = every_s
        self.fired: str | None = None
        self.fired_limit: str | None = None  # layout.LIMIT_HOURS | LIMIT_USD, once fired
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="autoslm-watchdog", daemon=True)

    def check(self, now: float) -> str | None:
        """Why the pod must end now, or None."""
        return (self.check_limit(now) or (None, None))[1]

    def check_limit(self, now: float) -> tuple[str, str] | None:
        """(the limit, why in words) when the pod must end now, or None."""
        # A grace past the deadline: the worker's own deadline stop (checkpoint, then a clean exit) goes first.
        if self.deadline is not None and now >= self.deadline + DEADLINE_GRACE_S:
            return LIMIT_HOURS, "time limit (limits.max_hours) reached"
        if self.budget_usd is not None and self.price_per_hour:
            spent = pod_cost_usd(self.price_per_hour, self.pod_started_at, now)
            if spent >= self.budget_usd:
                return (
                    LIMIT_USD,
                    f"money limit (limits.max_usd) reached: this pod spent ${spent:.2f} of its ${self.budget_usd:.2f}",
                )
        return None

    def start(self) -> "Watchdog":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            hit = self.check_limit(self.clock())
            if hit:
                self.fired_limit, self.fired = hit
                try:
                    self.on_limit(self.fired)
                except Exception:  # noqa: BLE001 - the watchdog must never take the worker down by accident
                    pass
                return


def count_start(
    environ: Mapping[str, str], run_id: str, seed: int, attempt: int, clock=time.time, state_dir: Path | None = None
) -> tuple[int, float]:
    """Record one more worker start in this pod; returns (starts so far, when the first one was)."""
    path = (state_dir or pod_state_dir(environ)) / f"starts-{run_id}-s{seed}-a{attempt}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        state = {"starts": 0, "first": clock()}
    state["starts"] = int(state.get("starts", 0)) + 1
    path.write_text(json.dumps(state))
    return state["starts"], float(state.get("first") or clock())


def start(
    environ: Mapping[str, str],
    spec,
    artifacts,
    log: Callable[[str], None] = _log_default,
    *,
    clock: Callable[[], float] = time.time,
    every_s: float = CHECK_EVERY_S,
    end_process: bool = True,
    state_dir: Path | None = None,
) -> Watchdog | None:
    """Start the watchdog for this worker (one call from the runner). Never raises."""
    try:
        return _start(environ, spec, artifacts, log, clock, every_s, end_process, state_dir)
    except Exception as e:  # noqa: BLE001
        log(f"[autoslm] watchdog not started: {type(e).__name__}: {e}")
        return None


def require_price(environ: Mapping[str, str], spec) -> None:
    """Raise FatalWorkerError when limits.max_usd is set and this pod was given no price to count it by."""
    from autoslm.errors import FatalWorkerError
    from autoslm.layout import ENV_PRICE_PER_HOUR, PodEnv

    if spec.limits.max_usd is None:
        return
    try:
        pod = PodEnv.from_env(environ, partial=True)
    except ValueError as e:
        raise FatalWorkerError(f"limits.max_usd is set, but {e}") from None
    if pod.price_per_hour is None:
        raise FatalWorkerError(
            f"limits.max_usd is set, but {ENV_PRICE_PER_HOUR} is not in this pod's environment: the money limit "
            "cannot be kept from inside the pod, so the worker will not train",
            hint="the provider that placed the pod writes it; launch with `autoslm launch`, or set it by hand",
        )


def _start(environ, spec, artifacts, log, clock, every_s, end_process, state_dir) -> Watchdog | None:
    from autoslm.layout import PodEnv

    pod = PodEnv.from_env(environ, partial=True)
    run_id, seed, attempt = pod.run_id, pod.seed, pod.attempt
    from autoslm.engine.pod.selfterm import in_vendor_pod

    if in_vendor_pod(environ):
        starts, first = count_start(environ, run_id, seed, attempt, clock, state_dir)
    else:
        starts, first = 1, clock()  # a local process: no container restarts it, no pod disk to count on

    def end(reason: str, retryable: bool, limit: str | None = None) -> None:
        log(f"[autoslm] watchdog: {reason}: ending this pod")
        _save_error(artifacts, reason, retryable, log, limit)
        _try_terminate_own_pod(environ, log)
        if end_process:
            _stop_self(log)

    if starts > MAX_STARTS_IN_POD:
        # The pod restarted its worker MAX_STARTS_IN_POD times already: end it, the controller replaces it.
        reason = f"the worker failed {starts - 1} times in this pod"
        log(f"[autoslm] watchdog: {reason}: ending this pod")
        _save_error(artifacts, reason, True, log)
        _try_terminate_own_pod(environ, log)
        if end_process:
            os._exit(1)  # nothing has run yet: no upload to wait for
        return None
    deadline, price = pod.deadline, replica_price(pod.price_per_hour, spec)  # all the replica's pods bill
    max_usd, seeds = (None, 1) if spec is None else (spec.limits.max_usd, len(spec.seeds))  # None: the spec could not be read
    budget = pod_budget_usd(max_usd, pod.spent_usd, seeds)
    # Counted from when the controller began billing this pod, as its bill is (a pod set up for minutes
    # before the worker started has spent that too).
    started = min(first, pod.billed_from) if pod.billed_from is not None else first
    dog = Watchdog(
        deadline=deadline,
        budget_usd=budget,
        price_per_hour=price,
        pod_started_at=started,
        on_limit=lambda reason: end(reason, retryable=False, limit=dog.fired_limit),
        clock=clock,
        every_s=every_s,
    )
    return dog.start()


def _save_error(artifacts, reason: str, retryable: bool, log, limit: str | None = None) -> None:
    """Best effort, bounded: a hung store must not keep the pod (and its bill) alive."""
    if artifacts is None:
        return
    from autoslm.store.artifacts import ErrorRecord

    record = ErrorRecord(reason, retryable, "ended by the in-pod watchdog", limit=limit)
    t = threading.Thread(target=lambda: artifacts.put_error(record), daemon=True)
    t.start()
    t.join(ERROR_RECORD_WAIT_S)
    if t.is_alive():
        log("[autoslm] watchdog: could not write the error record in time")


def _try_terminate_own_pod(environ, log) -> None:
    from autoslm.engine.pod.selfterm import try_terminate_own_pod

    try_terminate_own_pod(environ, log, "[autoslm] watchdog:")


def _stop_self(log) -> None:
    """Ask the worker to stop (SIGTERM: it uploads what it can), then exit hard if it does not."""
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(EXIT_GRACE_S)
    log("[autoslm] watchdog: the worker did not stop: exiting")
    os._exit(2)
