"""The background uploader: coalescing, the commit budget, backoff, checkpoints, required writes, close.

A fake clock drives budget and backoff (the uploader sleeps through it, so an hour passes in a
fraction of a second); the store is a real LocalStore behind a wrapper that can hold or fail commits.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections import deque
from pathlib import Path

import pytest

from autoslm.engine.pod.uploader import Uploader
from autoslm.errors import StoreAuthError, StoreUnavailable
from autoslm.layout import Event, Heartbeat, RunPaths
from autoslm.store.artifacts import RunArtifacts
from autoslm.store.local import LocalStore

pytestmark = pytest.mark.worker  # also runs on the worker image's pins (make test-image)


class FakeClock:
    """Time passes only when the uploader sleeps (at once, however long it asked for). ``frozen()``: none
    passes at all while the test thread sets something up, however slowly a loaded machine runs it."""

    def __init__(self, start: float = 1000.0):
        self.now = start
        self._frozen = False
        self._turn = threading.Event()
        self.paced = False  # each nap waits for the test thread's next ``tick()``

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        if not self._frozen:
            self.now += max(0.0, seconds)
        if self.paced:
            # Time passes no faster than the test thread produces: on a loaded machine the uploader's
            # thread could otherwise nap through minutes of fake time while the producer is not scheduled.
            self._turn.clear()
            self._turn.wait(1.0)
        else:
            time.sleep(0.0002)  # let the test thread run between the uploader's naps

    def tick(self) -> None:
        """The test thread has produced (paced: the uploader's next nap may pass)."""
        self._turn.set()

    @contextlib.contextmanager
    def frozen(self):
        self._frozen = True
        try:
            yield
        finally:
            self._frozen = False


class FlakyStore:
    """A LocalStore whose commits can be held at a gate or made to fail, with a log of what happened."""

    def __init__(self, root: Path, clock):
        self.inner = LocalStore(root)
        self.uri = self.inner.uri
        self.clock = clock
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()  # set when a commit reached the gate
        self.fail: deque[BaseException] = deque()
        self.fail_always: BaseException | None = None
        self.attempts: list[float] = []
        self.log: list[tuple[float, str, list[str]]] = []  # (time, message, paths added)

    def read_bytes(self, path):
        return self.inner.read_bytes(path)

    def list_files(self, prefix):
        return self.inner.list_files(prefix)

    def append_text(self, path, text):
        self.inner.append_text(path, text)

    def download(self, prefix, dest):
        return self.inner.download(prefix, dest)

    def commit(self, add, delete=(), message="autoslm"):
        self.attempts.append(self.clock())
        self.entered.set()
        self.gate.wait()
        if self.fail_always is not None:
            raise self.fail_always
        if self.fail:
            raise self.fail.popleft()
        self.inner.commit(add, delete, message)
        self.log.append((self.clock(), message, sorted(add)))


PATHS = RunPaths("sft", "run-1", 0)


def hb(step: int, **kw) -> Heartbeat:
    return Heartbeat(run_id="run-1", seed=0, phase="sft", stage="training", step=step, **kw)


def wait_until(pred, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.002)


def make_checkpoint(root: Path, step: int) -> Path:
    d = root / "out" / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "adapter_model.safetensors").write_bytes(os.urandom(4096))
    (d / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    return d


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def store(tmp_path, clock):
    return FlakyStore(tmp_path / "store", clock)


@pytest.fixture
def artifacts(store):
    return RunArtifacts(store, PATHS)


@pytest.fixture
def make_uploader(artifacts, clock, tmp_path):
    made = []

    def make(**kw) -> Uploader:
        kw.setdefault("clock", clock)
        kw.setdefault("sleep", clock.sleep)
        kw.setdefault("staging_dir", tmp_path / "staging")
        kw.setdefault("log", lambda msg: None)
        up = Uploader(artifacts, **kw).start()
        made.append(up)
        return up

    yield make
    for up in made:
        up.close(2)


def test_heartbeats_coalesce_newest_wins_and_never_block(make_uploader, store, artifacts):
    store.gate.clear()
    up = make_uploader()
    up.heartbeat(hb(0))
    wait_until(store.entered.is_set)  # the first commit is stuck in the store

    t0 = time.monotonic()
    for step in range(1, 51):
        up.heartbeat(hb(step))
    assert time.monotonic() - t0 < 0.5  # training never waits on the store

    store.gate.set()
    wait_until(lambda: not up.pending)
    assert artifacts.get_heartbeat().step == 50
    assert len(store.log) == 2  # the stuck one, then only the newest


def test_events_batch_into_one_commit_with_the_heartbeat_and_a_resumed_run_appends(make_uploader, store, artifacts):
    artifacts.append_events([Event(kind="from_last_attempt", step=3)])
    store.gate.clear()
    up = make_uploader()
    up.event(Event(kind="first", step=0))
    wait_until(store.entered.is_set)
    for i in range(20):
        up.event(Event(kind="step", step=i))
    up.heartbeat(hb(19))
    store.gate.set()
    wait_until(lambda: not up.pending)

    kinds = [e.kind for e in artifacts.read_events()]
    assert kinds == ["from_last_attempt", "first"] + ["step"] * 20
    assert [e.step for e in artifacts.read_events()][2:] == list(range(20))
    assert len(store.log) == 2
    assert store.log[-1][2] == sorted([PATHS.heartbeat, PATHS.events])  # one commit, both files


def test_budget_is_honoured_over_a_simulated_hour(make_uploader, store, clock):
    up = make_uploader(commits_per_hour=60, burst=3)
    start = clock()
    step = 0
    while clock() - start < 3600:
        up.heartbeat(hb(step))
        up.event(Event(kind="step", step=step))
        step += 1
        time.sleep(0.0005)
    times = [t for t, _, _ in store.log if t - start < 3600]
    assert 50 <= len(times) <= 3 + 60 + 1
    # No ten-minute window holds more than the burst plus ten minutes' worth.
    for t in times:
        assert sum(1 for u in times if t <= u < t + 600) <= 3 + 10 + 1
    assert up.commits == len(store.log)


def test_backoff_grows_exponentially_and_the_thread_survives(make_uploader, store, artifacts):
    store.fail.extend([StoreUnavailable("down")] * 4 + [RuntimeError("a bug somewhere below")])
    up = make_uploader()
    up.heartbeat(hb(1))
    wait_until(lambda: not up.pending)
    gaps = [b - a for a, b in zip(store.attempts, store.attempts[1:])]
    for gap, expected in zip(gaps, [2, 4, 8, 16, 32]):
        assert expected - 1e-6 <= gap <= expected + 1.01
    assert up.failures == 5
    assert artifacts.get_heartbeat().step == 1
    assert up._thread.is_alive()


def test_retry_after_is_honoured(make_uploader, store, artifacts):
    err = StoreUnavailable("429 Too Many Requests")
    err.retry_after = 120.0
    store.fail.append(err)
    up = make_uploader()
    up.heartbeat(hb(1))
    wait_until(lambda: not up.pending)
    assert store.attempts[1] - store.attempts[0] >= 120


def test_final_checkpoint_is_always_uploaded_and_older_waiting_ones_are_skipped(make_uploader, store, artifacts, tmp_path):
    store.gate.clear()
    up = make_uploader()
    first = make_checkpoint(tmp_path, 1)
    up.checkpoint(1, first, keep=2)
    shutil.rmtree(first)  # the trainer may delete its copy as soon as checkpoint() returns
    wait_until(store.entered.is_set)
    for step in (2, 3, 4, 5):
        d = make_checkpoint(tmp_path, step)
        up.checkpoint(step, d, keep=2, final=(step == 5))
        shutil.rmtree(d)
    # The stuck upload of 1 fails; with 5 waiting it is let go. The final one fails twice, and is retried.
    store.fail.extend([StoreUnavailable("down")] * 3)
    store.gate.set()

    assert up.close(10)
    assert artifacts.list_checkpoints() == [5]
    assert up.skipped_checkpoints == [2, 3, 4, 1]
    assert up.uploaded_checkpoints == [5]
    step, path = artifacts.fetch_latest_checkpoint(tmp_path / "resume")
    assert step == 5 and (path / "trainer_state.json").read_text() == '{"global_step": 5}'
    assert not any((tmp_path / "staging").iterdir())  # staged copies are cleaned up


def test_the_best_adapter_lands_before_a_later_checkpoint_and_only_the_newest_goes_up(make_uploader, store, artifacts, tmp_path):
    from tests.unit.test_layout_store import lora_folder

    store.gate.clear()
    up = make_uploader()
    up.heartbeat(hb(0))
    wait_until(store.entered.is_set)  # the store holds the first commit: what follows waits in the queue
    for step in (2, 4):
        best = lora_folder(tmp_path / f"best-{step}", fill=bytes([step]))
        up.best(step, best, {"step": step, "when": "during", "metric": "loss", "value": 1.0, "attempt": 1})
        shutil.rmtree(best)  # snapshotted before best() returns
    ckpt = make_checkpoint(tmp_path, 4)
    up.checkpoint(4, ckpt, keep=2)
    shutil.rmtree(ckpt)
    store.gate.set()

    assert up.close(10)
    messages = [m for _, m, _ in store.log]
    assert messages.count("best evaluation") == 1 and messages.index("best evaluation") < messages.index("checkpoint 4")
    assert up.uploaded_best == [4] and up.uploaded_checkpoints == [4] and up.skipped_checkpoints == []
    record, folder = artifacts.fetch_best(tmp_path / "back")
    assert record["step"] == 4 and (folder / "adapter_model.safetensors").read_bytes().endswith(bytes([4]) * 8)
    assert not any((tmp_path / "staging").iterdir())


def test_checkpoints_keep_the_newest_in_the_store(make_uploader, artifacts, tmp_path):
    up = make_uploader()
    for step in (1, 2, 3):
        up.checkpoint(step, make_checkpoint(tmp_path, step), keep=2, final=(step == 3))
        wait_until(lambda: not up.pending)
    assert artifacts.list_checkpoints() == [2, 3]


def test_required_runs_after_queued_work_and_after_pending_progress(make_uploader, store, artifacts, tmp_path):
    up = make_uploader(commits_per_hour=2, burst=1)
    up.heartbeat(hb(1))
    wait_until(lambda: not up.pending)  # the only token is spent
    up.heartbeat(hb(7))
    up.event(Event(kind="train_end", step=7))
    d = make_checkpoint(tmp_path, 6)
    up.checkpoint(6, d, keep=2)  # non-final: would wait half an hour for a token on its own
    up.required(artifacts.mark_done, "DONE", timeout=30)

    messages = [m for _, m, _ in store.log]
    assert messages[-1] == "DONE"
    assert "checkpoint 6" in messages
    assert artifacts.get_heartbeat().step == 7
    assert [e.kind for e in artifacts.read_events()] == ["train_end"]


def test_required_retries_then_succeeds(make_uploader, store, artifacts):
    store.fail.extend([StoreUnavailable("down")] * 2)
    up = make_uploader()
    up.required(artifacts.mark_done, "DONE", timeout=60)
    assert artifacts.is_done()


def test_required_raises_after_its_timeout(make_uploader, store, artifacts):
    store.fail_always = StoreUnavailable("the Hub is down")
    up = make_uploader()
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailable, match="down"):
        up.required(artifacts.mark_done, "DONE", timeout=60)
    assert time.monotonic() - t0 < 5
    assert len(store.attempts) >= 3
    assert artifacts.store.inner.read_bytes(PATHS.done) is None
    assert up._thread.is_alive()


def test_required_raises_an_auth_error_at_once(make_uploader, store, artifacts):
    store.fail_always = StoreAuthError("token refused")
    up = make_uploader()
    with pytest.raises(StoreAuthError):
        up.required(artifacts.mark_done, "DONE", timeout=600)
    assert len(store.attempts) == 1


def test_close_is_bounded_when_the_store_hangs(artifacts, store, tmp_path):
    store.gate.clear()
    up = Uploader(artifacts, staging_dir=tmp_path / "staging", log=lambda m: None).start()
    up.heartbeat(hb(1))
    wait_until(store.entered.is_set)
    t0 = time.monotonic()
    assert up.close(timeout=0.5) is False
    assert time.monotonic() - t0 < 1.5
    store.gate.set()  # let the stuck thread end


def test_close_flushes_everything_outside_the_budget(make_uploader, store, artifacts):
    up = make_uploader(commits_per_hour=1, burst=1)
    up.heartbeat(hb(1))
    wait_until(lambda: not up.pending)
    up.heartbeat(hb(2))
    for i in range(5):
        up.event(Event(kind="step", step=i))
    time.sleep(0.05)
    assert up.pending  # no token for an hour
    assert up.close(5) is True
    assert artifacts.get_heartbeat().step == 2
    assert len(artifacts.read_events()) == 5


def test_secrets_never_reach_the_store(make_uploader, store, artifacts):
    secret = "hf_" + "S3cretTokenValue" * 2
    up = make_uploader()
    up.event(Event(kind="error", data={"message": f"auth failed with {secret}"}))
    up.heartbeat(hb(1, error=f"token {secret} refused"))
    assert up.close(5)
    for path in (PATHS.events, PATHS.heartbeat):
        assert secret not in store.inner.read_bytes(path).decode()


def test_local_store_with_the_real_clock(tmp_path):
    artifacts = RunArtifacts(LocalStore(tmp_path / "store"), PATHS)
    up = Uploader(artifacts, staging_dir=tmp_path / "staging", log=lambda m: None).start()
    for step in range(1, 4):
        up.heartbeat(hb(step))
        up.event(Event(kind="step", step=step))
    d = make_checkpoint(tmp_path, 3)
    up.checkpoint(3, d, keep=2, final=True)
    up.required(lambda: artifacts.put_metrics({"loss": 1.0}), "metrics", timeout=10)
    up.required(artifacts.mark_done, "DONE", timeout=10)
    assert up.close(5)
    assert artifacts.is_done() and artifacts.get_metrics() == {"loss": 1.0}
    assert artifacts.list_checkpoints() == [3]
    assert artifacts.get_heartbeat().step == 3
    assert [e.step for e in artifacts.read_events()] == [1, 2, 3]


def test_progress_leaves_a_token_for_the_first_checkpoint(make_uploader, store, artifacts, clock, tmp_path):
    up = make_uploader(commits_per_hour=60, burst=6)
    # Setup: heartbeats and events arrive one by one and use up what the burst allows progress.
    for step in range(5):
        up.heartbeat(hb(step))
        up.event(Event(kind="setup", step=step))
        wait_until(lambda: up.commits == step + 1)  # noqa: B023
    with clock.frozen():
        up.heartbeat(hb(5))  # this one waits for budget
        queued = clock()
        up.checkpoint(5, make_checkpoint(tmp_path, 5), keep=2)
    wait_until(lambda: up.uploaded_checkpoints == [5])
    # Seen once on a loaded machine (48 s): what the uploader did is in the message, to tell why.
    assert clock() - queued < 30, (
        "the checkpoint waited a budget interval (60 s) behind progress commits: "
        f"commits {store.log}, failures {up.failures} (last: {up.last_error!r})"
    )


def test_a_checkpoint_every_20_s_never_starves_the_heartbeat(make_uploader, store, clock, tmp_path):
    # 60 commits an hour, a checkpoint every 20 s (three a minute: more than the budget) and a heartbeat
    # every second, for half a simulated hour: a heartbeat reaches the store at least every
    # heartbeat_due_s plus one budget interval, and checkpoints still go up.
    due = 90.0  # what the runner sets for limits.heartbeat_timeout_s = 180
    up = make_uploader(commits_per_hour=60, heartbeat_due_s=due)
    start, step, next_ckpt = clock(), 0, clock() + 20
    clock.paced = True
    while clock() - start < 1800:
        up.heartbeat(hb(step))
        if clock() >= next_ckpt:
            up.checkpoint(step, make_checkpoint(tmp_path / f"c{step}", step), keep=2)
            next_ckpt += 20
        step += 1
        clock.tick()
        time.sleep(0.0005)
    clock.paced = False
    clock.tick()
    beats = [t for t, _, added in store.log if PATHS.heartbeat in added]
    gaps = [b - a for a, b in zip([start, *beats], beats)]
    assert beats and max(gaps) <= due + 60 + 5, f"a heartbeat waited {max(gaps):.0f}s behind checkpoints"
    assert len(up.uploaded_checkpoints) >= 10, up.uploaded_checkpoints
