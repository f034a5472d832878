"""The worker's one background uploader: heartbeats, events, checkpoints and required artifacts.

For: moving everything the worker writes to its artifact store off the training thread, inside the
run's commit budget (the Hub allows ~128 commits an hour per repo, shared by every run in it). It must
never: make training wait on the network (``heartbeat``, ``event`` and ``checkpoint`` return at once);
die on an error (every failure is retried with exponential backoff that honours Retry-After); drop the
final checkpoint; or let a required artifact (adapter, metrics, DONE, error) fail quietly:
``required`` raises when it cannot write in time, so the run fails loudly.

What it writes next, and when, is ``upload_schedule.next_upload``'s decision (its docstring gives the
order): required work first, then checkpoints and progress within the commit budget. ``close``
flushes everything, ignoring the budget, within a bounded wait. The same code runs against a local
directory; it is just fast there.

A directory handed to ``checkpoint`` is snapshotted before the call returns (``upload_jobs``).
"""

from __future__ import annotations

import itertools
import logging
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from autoslm.engine.pod.commit_budget import CommitBudget
from autoslm.engine.pod.upload_jobs import BestJob, CheckpointJob, RequiredJob, snapshot_folder
from autoslm.engine.pod.upload_progress import PendingProgress
from autoslm.engine.pod.upload_schedule import PROGRESS, REQUIRED, next_upload
from autoslm.errors import StoreError, StoreUnavailable
from autoslm.layout import Event, Heartbeat
from autoslm.secrets import redact
from autoslm.store.artifacts import RunArtifacts

_logger = logging.getLogger("autoslm.uploader")

UNLIMITED_COMMITS = 360_000  # a store with no commit limit (a local directory): never wait for budget


def for_run(artifacts: RunArtifacts, spec, *, staging_dir: Path, log: Callable[[str], None]) -> "Uploader":
    """The uploader a run's worker writes through (started): the JobSpec's commit budget on a store
    that counts commits (the Hub's per-repo rate limit), none on a local directory; and a heartbeat
    that takes the next commit once it has waited half of ``limits.heartbeat_timeout_s`` (at most
    300 s), leaving the other half for a commit interval and the upload, so the controller never sees
    a healthy worker go quiet.
    ``spec`` may be None (a JobSpec that did not parse: the error still has to reach the store)."""
    rate_limited = getattr(artifacts.store, "rate_limited", True)
    commits_per_hour = (spec.artifacts.commits_per_hour if spec else 60) if rate_limited else UNLIMITED_COMMITS
    due = min(300.0, spec.limits.heartbeat_timeout_s / 2) if spec else 300.0
    return Uploader(artifacts, commits_per_hour=commits_per_hour, staging_dir=staging_dir, log=log, heartbeat_due_s=due).start()


class Uploader:
    def __init__(
        self,
        artifacts: RunArtifacts,
        *,
        commits_per_hour: int = 60,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        staging_dir: Path | None = None,
        log: Callable[[str], None] | None = None,
        burst: int | None = None,
        backoff_s: float = 2.0,
        max_backoff_s: float = 300.0,
        tick_s: float = 1.0,
        heartbeat_due_s: float = 300.0,
    ):
        """``commits_per_hour``, ``burst``, ``backoff_s``, ``max_backoff_s``: the commit budget
        (``CommitBudget``). ``tick_s``: the longest the thread sleeps before looking at new work again.
        ``heartbeat_due_s``: how long a heartbeat may wait behind checkpoints before it takes the next
        commit (the runner sets it from limits.heartbeat_timeout_s)."""
        self.heartbeat_due_s = heartbeat_due_s
        self.artifacts = artifacts
        self.budget = CommitBudget(commits_per_hour, clock=clock, burst=burst, backoff_s=backoff_s, max_backoff_s=max_backoff_s)
        self._clock, self._sleep = clock, sleep
        self._log_fn = log
        self._tick = tick_s
        self._staging_root = Path(staging_dir) if staging_dir is not None else None
        self._own_staging = staging_dir is None
        self._seq = itertools.count()

        self._cond = threading.Condition()
        self._progress = PendingProgress(self._cond, clock)  # the heartbeat and events not yet written
        self._queue: deque[CheckpointJob | RequiredJob] = deque()
        self._busy = False
        self._closing = False
        self._abort = False
        self._thread: threading.Thread | None = None

        # What happened, for the worker's log and for tests.
        self.commits = 0
        self.failures = 0
        self.skipped_checkpoints: list[int] = []
        self.uploaded_checkpoints: list[int] = []
        self.uploaded_best: list[int] = []  # the steps of the best evaluations written
        self.lost: list[str] = []  # things that were to be written and never will be
        self.last_error: BaseException | None = None

    # -- the training thread's side: none of these wait on the store ------------------------------
    def start(self) -> "Uploader":
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="autoslm-uploader", daemon=True)
                self._thread.start()
        return self

    def heartbeat(self, hb: Heartbeat) -> None:
        with self._cond:
            self._progress.beat(hb)
            self._cond.notify_all()

    def event(self, ev: Event) -> None:
        line = redact(ev.model_dump_json()) + "\n"
        with self._cond:
            self._progress.add(line)
            self._cond.notify_all()

    def checkpoint(self, step: int, local_dir: Path, keep: int = 2, *, final: bool = False) -> None:
        """Snapshot ``local_dir`` now and upload it later as checkpoint-<step>, keeping ``keep`` in the store."""
        try:
            staged = self._stage(Path(local_dir), step)
        except OSError as e:
            self._log(f"[autoslm] uploader: could not snapshot checkpoint {step} from {local_dir}: {e}")
            if final:
                with self._cond:
                    self.lost.append(f"checkpoint {step}")
            return
        self._enqueue(CheckpointJob(step, staged, max(1, keep), final))

    def best(self, step: int, local_dir: Path, record: dict) -> None:
        """Snapshot ``local_dir``, the adapter of the best evaluation so far, now and upload it later with
        ``record`` (``RunArtifacts.put_best``). It queues with the checkpoints, so a checkpoint saved after
        this evaluation never lands before it: an attempt resuming from that checkpoint finds it."""
        try:
            staged = self._stage(Path(local_dir), step)
        except OSError as e:
            self._log(f"[autoslm] uploader: could not snapshot the best adapter (step {step}) from {local_dir}: {e}")
            return
        self._enqueue(BestJob(step, staged, 1, False, record=record))

    def _enqueue(self, job: CheckpointJob) -> None:
        with self._cond:
            # Only the newest of a kind matters: drop older ones still waiting (never a final checkpoint).
            for old in [j for j in self._queue if type(j) is type(job) and not j.final]:
                self._queue.remove(old)
                self._discard(old)
            self._queue.append(job)
            self._cond.notify_all()

    def required(self, fn: Callable[[], None], what: str, timeout: float) -> None:
        """Run ``fn`` (one store write) on the uploader thread after everything queued before it,
        retrying until it succeeds or ``timeout`` seconds pass; then raise its last error
        (StoreUnavailable when it never got a chance to run)."""
        job = RequiredJob(fn, what, self._clock() + timeout)
        with self._cond:
            inline = self._closing or self._abort
            if not inline:
                if self._thread is None:
                    self.start()
                self._queue.append(job)
                self._cond.notify_all()
        if inline:  # the thread is gone or going: do it here, with the same retries
            self._run_required_inline(job)
        else:
            # The thread enforces the deadline between attempts; this bounds an attempt that hangs.
            grace = min(max(timeout, 1.0), 60.0)
            if not job.done.wait(timeout + grace):
                with self._cond:
                    job.cancelled = True
                    if job in self._queue:
                        self._queue.remove(job)
                    job.error = job.error or StoreUnavailable(
                        f"could not write {what} to {self.artifacts.store.uri} within {timeout:g}s"
                        + (f": {job.last_error}" if job.last_error else ""),
                        hint="the store is unreachable or slow; the run cannot be marked complete without it",
                    )
        if job.error is not None:
            raise job.error

    def close(self, timeout: float) -> bool:
        """Write everything pending (ignoring the budget) and stop the thread, waiting at most
        ``timeout`` seconds. True when everything handed over was written."""
        with self._cond:
            if self._thread is None and self._pending():
                self.start()
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(max(timeout, 0.0))
        with self._cond:
            alive = thread is not None and thread.is_alive()
            if alive:
                self._abort = True
                self._cond.notify_all()
            ok = not alive and not self._pending() and not self.lost
        if not ok:
            self._log(
                f"[autoslm] uploader: closed with work unwritten (commits={self.commits}, "
                f"lost={self.lost}, last error: {self.last_error})"
            )
        return ok

    @property
    def dropped_events(self) -> int:
        """Events let go, oldest first, while the store was down (``upload_progress.MAX_PENDING_EVENTS``)."""
        with self._cond:
            return self._progress.dropped

    @property
    def pending(self) -> bool:
        with self._cond:
            return self._pending()

    # -- the uploader thread -------------------------------------------------------------------------
    def _pending(self) -> bool:
        return self._progress.waiting or bool(self._queue) or self._busy

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._abort:
                    self._fail_waiting_required("the uploader was stopped before it could run")
                    self._cleanup()
                    return
                now = self._clock()
                self.budget.refill(now)
                self._expire_required(now)
                action, wait = self._pick(now)
                if action is None:
                    if self._closing and not self._queue and not self._progress.waiting:
                        self._cleanup()
                        return
                    if wait is None:
                        self._cond.wait()  # idle: new work or close() wakes us
                        continue
                else:
                    self._busy = True
            if action is None:
                self._sleep(min(wait, self._tick))
                continue
            try:
                action()
            except BaseException as e:  # noqa: BLE001 - the thread must survive anything
                self._log(f"[autoslm] uploader: internal error: {type(e).__name__}: {e}")
            finally:
                with self._cond:
                    self._busy = False

    def _pick(self, now: float):
        """(action, None) to act now; (None, seconds) to wait; (None, None) when there is nothing to do.
        What comes next is ``next_upload``'s decision; this takes it off the queue."""
        what, wait = next_upload(
            self._queue,
            self.budget,
            now,
            progress=self._progress.waiting,
            progress_since=self._progress.since,
            heartbeat_due_s=self.heartbeat_due_s,
            closing=self._closing,
        )
        if what is None:
            return None, wait
        if what == PROGRESS:
            return self._do_progress, None
        job = self._queue.popleft()
        if what == REQUIRED:
            job.running = True
            return (lambda: self._do_required(job)), None
        return (lambda: self._do_checkpoint(job)), None

    def _spend(self) -> None:
        with self._cond:
            self.budget.spend()

    def _succeeded(self, commits: int = 1) -> None:
        with self._cond:
            self.commits += commits
            self.budget.succeeded()

    def _failed(self, what: str, e: BaseException) -> None:
        with self._cond:
            self.failures += 1
            self.last_error = e
            delay = self.budget.failed(getattr(e, "retry_after", None))
        self._log(f"[autoslm] uploader: {what} failed, retrying in {delay:.0f}s: {type(e).__name__}: {e}")

    # -- heartbeat + events ------------------------------------------------------------------------------
    def _do_progress(self) -> None:
        self._spend()
        try:
            self._progress.write(self.artifacts)
        except Exception as e:  # noqa: BLE001
            self._failed("heartbeat/events upload", e)
        else:
            self._succeeded()

    # -- checkpoints -------------------------------------------------------------------------------
    def _do_checkpoint(self, job: CheckpointJob) -> None:
        self._spend()
        job.attempts += 1
        try:
            job.put(self.artifacts)
        except Exception as e:  # noqa: BLE001
            self._failed(f"{job.what} {job.step} upload", e)
            with self._cond:
                local_problem = not isinstance(e, (StoreError, OSError)) or isinstance(e, FileNotFoundError)
                superseded = not job.final and any(type(j) is type(job) for j in self._queue)
                if superseded or (local_problem and job.attempts >= 3):
                    # A newer checkpoint is waiting, or this one cannot be read: let it go.
                    self._discard(job)
                else:
                    self._queue.appendleft(job)
            return
        self._succeeded()
        with self._cond:
            job.landed(self)
        shutil.rmtree(job.staged, ignore_errors=True)

    def _stage(self, local_dir: Path, step: int) -> Path:
        return snapshot_folder(Path(local_dir), self._staging() / f"checkpoint-{step}-{next(self._seq)}")

    def _staging(self) -> Path:
        with self._cond:
            if self._staging_root is None:
                self._staging_root = Path(tempfile.mkdtemp(prefix="autoslm-upload-"))
            self._staging_root.mkdir(parents=True, exist_ok=True)
            return self._staging_root

    def _discard(self, job: CheckpointJob) -> None:
        job.let_go(self)
        shutil.rmtree(job.staged, ignore_errors=True)

    # -- required work -------------------------------------------------------------------------------
    def _do_required(self, job: RequiredJob) -> None:
        if job.cancelled:
            return
        with self._cond:
            flush = self._progress.waiting
        if flush:  # what the worker said before this must be visible first (best effort)
            self._spend()
            try:
                self._progress.write(self.artifacts)
                self._succeeded()
            except Exception as e:  # noqa: BLE001 - the required write decides the outcome
                self._failed("heartbeat/events upload", e)
        self._spend()
        job.attempts += 1
        try:
            job.fn()
        except Exception as e:  # noqa: BLE001
            self._required_failed(job, e)
            return
        self._succeeded()
        job.running = False
        job.done.set()

    def _required_failed(self, job: RequiredJob, e: BaseException) -> None:
        job.last_error = e
        with self._cond:
            self.failures += 1
            self.last_error = e
        now = self._clock()
        delay = self.budget.retry_delay(job.attempts, getattr(e, "retry_after", None))
        if not RequiredJob.retryable(e) or now + delay > job.deadline or job.cancelled:
            job.give_up(e)
            return
        self._log(f"[autoslm] uploader: writing {job.what} failed, retrying in {delay:.0f}s: {e}")
        job.next_attempt = now + delay
        with self._cond:
            # Back to the front: what was queued after it stays after it.
            self._queue.appendleft(job)
            job.running = False
            self._cond.notify_all()

    def _expire_required(self, now: float) -> None:
        for job in [j for j in self._queue if isinstance(j, RequiredJob)]:
            if job.cancelled:
                self._queue.remove(job)
            elif now > job.deadline:
                self._queue.remove(job)
                job.give_up(
                    StoreUnavailable(
                        f"could not write {job.what} to {self.artifacts.store.uri}: earlier uploads "
                        "did not finish in time" + (f" ({self.last_error})" if self.last_error else ""),
                        hint="the store is unreachable or slow",
                    )
                )

    def _fail_waiting_required(self, why: str) -> None:
        for job in [j for j in self._queue if isinstance(j, RequiredJob)]:
            self._queue.remove(job)
            job.give_up(StoreUnavailable(f"could not write {job.what}: {why}"))

    def _run_required_inline(self, job: RequiredJob) -> None:
        while True:
            job.attempts += 1
            try:
                job.fn()
                with self._cond:
                    self.commits += 1
                return
            except Exception as e:  # noqa: BLE001
                job.last_error = e
                delay = self.budget.retry_delay(job.attempts, getattr(e, "retry_after", None))
                if not RequiredJob.retryable(e) or self._clock() + delay > job.deadline:
                    job.error = e
                    return
                self._sleep(delay)

    # -- housekeeping --------------------------------------------------------------------------------
    def _cleanup(self) -> None:
        # Called with the lock held, as the thread ends.
        for job in [j for j in self._queue if isinstance(j, CheckpointJob)]:
            if job.final:
                self.lost.append(f"checkpoint {job.step}")
            shutil.rmtree(job.staged, ignore_errors=True)
        self._queue = deque(j for j in self._queue if not isinstance(j, CheckpointJob))
        if self._own_staging and self._staging_root is not None:
            shutil.rmtree(self._staging_root, ignore_errors=True)

    def _log(self, message: str) -> None:
        message = redact(message)
        if self._log_fn is not None:
            try:
                self._log_fn(message)
                return
            except Exception:  # noqa: BLE001 - logging must never break uploads
                pass
        _logger.warning(message)
