"""Chaos: the real CLI, as separate processes, against the fake RunPod, while things go wrong.

Every scenario ends with no pod left. The fake cloud runs a light stand-in worker
(tests/chaos/standin_worker.py: the real artifact layout, heartbeats, watchdog and self-termination,
with sleeps for steps), so the whole suite takes a few minutes on two cores.

    .venv/bin/python -m pytest -q tests/chaos

Scenarios: concurrent `status` after preemptions; `launch` SIGKILLed (and Ctrl-C'd) during the create
call; `gc` from a second home; a crash-looping worker; a deadline and a money limit passing on
detached runs while no command runs; `cancel` during a relaunch; a corrupt registry; provider 5xx
during teardown.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from autoslm.controller.podnames import home_id, pod_name
from autoslm.providers.http import RetryPolicy
from autoslm.providers.runpod.provider import RunPodProvider
from tests.conftest import backoff
from tests.fakes.hub import FakeHub
from tests.fakes.pods import pod_request
from tests.fakes.runpod import FakeRunPod

REPO = Path(__file__).resolve().parents[2]
STANDIN = str(Path(__file__).with_name("standin_worker.py"))
KEY = "rpkey-ChaosAccount-7d1e"
HF_TOKEN = "hf_ChaosStoreToken0123456789abcdefgh"
TERMINAL = ("succeeded", "failed", "cancelled")
# A model the catalog does not know: `plan` cannot estimate its run, so no money limit refuses it before
# it starts, which tests of the limits enforced while a run lives need (the stand-in worker loads no model).
UNPRICED = "chaos/unpriced-model"

SPEC = """# autoslm launch {path} --yes
name = "chaos"
model = "autoslm/tiny"
[environment]
id = "autoslm/arith"
[train]
max_steps = {steps}
save_every = {save_every}
[compute]
provider = "runpod"
gpu = "RTX 4090"
image = "ghcr.io/autoslm/worker:0.1.0"
[artifacts]
store = "hf"
repo = "{repo}"
[limits]
max_hours = {max_hours}
max_restarts = {max_restarts}
{extra}
"""


@pytest.fixture(scope="module")
def hub():
    """The artifact store: a cloud pod can only reach a Hub repo (a local store is refused by validate)."""
    with FakeHub(token=HF_TOKEN) as h:
        yield h


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chaos-cloud")
    with FakeRunPod(
        api_key=KEY,
        workdir=tmp / "fake-runpod",
        worker_command=["python", STANDIN],
        restart_containers=True,
        terminate_grace_s=0.5,
        extra_env={"CHAOS_STEP_S": "0.1"},
    ) as f:
        yield f


class Home:
    """One $AUTOSLM_HOME and the CLI run in it, as a user would."""

    def __init__(self, fake: FakeRunPod, hub: FakeHub, root: Path):
        self.fake = fake
        self.hub = hub
        self.root = root
        self.path = root / "home"
        self.path.mkdir(parents=True, exist_ok=True)
        self.repo = f"chaos/{root.parent.name[-40:]}-{root.name}"  # one dataset repo per home
        env = {k: v for k, v in os.environ.items() if k not in ("VAST_API_KEY", "AUTOSLM_DEBUG", "RUNPOD_API_KEY")}
        env.update({"AUTOSLM_HOME": str(self.path), **fake.env(), **hub.env(), "COLUMNS": "200"})
        self.env = env
        self.started: list[subprocess.Popen] = []

    def spec(self, *, steps=40, save_every=5, max_hours=1, max_restarts=3, extra="", model="autoslm/tiny") -> Path:
        path = self.root / f"spec-{len(list(self.root.glob('spec-*')))}.toml"
        text = SPEC.format(
            path=path,
            steps=steps,
            save_every=save_every,
            repo=self.repo,
            max_hours=max_hours,
            max_restarts=max_restarts,
            extra=extra,
        )
        path.write_text(text.replace('model = "autoslm/tiny"', f'model = "{model}"'))
        return path

    def cli(self, *args, timeout=120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "autoslm", *args], capture_output=True, text=True, env=self.env, cwd=str(REPO), timeout=timeout
        )

    def start(self, *args) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-m", "autoslm", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=str(REPO),
            stdin=subprocess.DEVNULL,
        )
        self.started.append(proc)
        return proc

    def launch_detached(self, spec: Path, poll_s: float = 0.3) -> str:
        r = self.cli("launch", str(spec), "--yes", "--detach", "--poll-s", str(poll_s))
        assert r.returncode == 0, r.stdout + r.stderr
        return next(line.split()[1] for line in r.stdout.splitlines() if line.startswith("run ") and " launched" in line)

    def status(self, run_id: str) -> dict:
        r = self.cli("status", run_id, "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        return json.loads(r.stdout)

    def wait_state(self, run_id: str, states=TERMINAL, timeout=90) -> dict:
        deadline = time.monotonic() + timeout
        pause = backoff(cap=2.0)
        while True:
            st = self.status(run_id)
            if st["state"] in states:
                return st
            assert time.monotonic() < deadline, f"still {st['state']}: {st}"
            time.sleep(next(pause))

    def heartbeat(self, run_id: str) -> dict | None:
        try:
            return json.loads(self.hub.files(self.repo)[f"sft/{run_id}/seed0/heartbeat.json"])
        except (KeyError, ValueError):
            return None

    def wait_training(self, run_id: str, attempt: int, min_step: int = 3, timeout=300) -> None:
        """Until the store shows attempt ``attempt`` training past ``min_step``. A loaded machine may take
        long to start a pod's process, so the wait is on that meaning, bounded only by a generous cap; it
        fails at once where it can no longer come true (the attempt ended, or a later one began)."""

        def ok():
            hb = self.heartbeat(run_id)
            if hb and (hb["attempt"] > attempt or (hb["attempt"] == attempt and hb["stage"] in ("done", "error"))):
                raise AssertionError(f"attempt {attempt} ended before it was seen training past step {min_step}: {hb}")
            return hb and hb["attempt"] == attempt and hb["stage"] == "training" and hb["step"] >= min_step

        wait(ok, timeout, f"attempt {attempt} training past step {min_step}")

    def daemon_pid(self, run_id: str) -> int | None:
        try:
            return int((self.path / "supervisors" / f"{run_id}.pid").read_text())
        except (OSError, ValueError):
            return None

    def supervisor_log(self, run_id: str) -> str:
        """What the run's supervisors said (for a failing assertion's message)."""
        try:
            return (self.path / "supervisors" / f"{run_id}.log").read_text()[-4000:]
        except OSError:
            return "(no supervisor log)"

    def close(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
        for pidfile in (self.path / "supervisors").glob("*.pid") if (self.path / "supervisors").is_dir() else []:
            try:
                os.kill(int(pidfile.read_text()), signal.SIGTERM)  # a supervisor this test started
            except (OSError, ValueError):
                pass


@pytest.fixture
def homes(fake, hub, tmp_path):
    made = []

    def make(name="a") -> Home:
        h = Home(fake, hub, tmp_path / name)
        made.append(h)
        return h

    yield make
    fake.clear_faults()
    fake.extra_env.pop("CHAOS_MODE", None)
    for h in made:
        h.close()


# How long a command may take from Ctrl-C to its exit: it acts on the signal within a lock slice and
# says what it can at once (about a second); the rest is room for a loaded machine, not for a hang.
PROMPT_EXIT_S = 5.0


def interrupt(proc: subprocess.Popen, sig=signal.SIGINT) -> tuple[str, str, float]:
    """Send ``sig`` and wait for the process to end: its output, and the seconds from the signal to its exit."""
    sent = time.monotonic()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)  # (a process that did not end is killed by the fixture)
    return out, err, time.monotonic() - sent


def wait(pred, timeout: float, what: str, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


def pods_of(fake: FakeRunPod, run_id: str) -> list:
    return [p for p in fake.pods() if run_id in p.name]


def live_pods(fake: FakeRunPod, run_id: str) -> list:
    return [p for p in pods_of(fake, run_id) if not p.deleted]


def assert_no_pod_left(fake: FakeRunPod, run_id: str, timeout: float = 20) -> None:
    assert pods_of(fake, run_id), f"no pod was ever started for {run_id}"
    wait(lambda: not live_pods(fake, run_id), timeout, f"every pod of {run_id} to be terminated")
    wait(lambda: not [p for p in pods_of(fake, run_id) if p.process and p.process.alive()], 10, "pod processes to end")


# -- 1. concurrent commands --------------------------------------------------------------------------
def _kill_daemon(h: Home, run_id: str) -> None:
    """SIGKILL the run's background supervisor (the one this test's commands started), and wait for its end."""
    pid = wait(lambda: h.daemon_pid(run_id), 30, "the run's supervisor")
    os.kill(pid, signal.SIGKILL)

    def gone() -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except (OSError, IndexError):
            return True

    wait(gone, 30, "the supervisor to die")


def test_three_status_at_once_after_each_of_three_preemptions_never_duplicate_a_pod(fake, homes):
    h = homes()
    # 120 steps of 0.1 s: no attempt can finish between being seen training and being preempted.
    run_id = h.launch_detached(h.spec(steps=120, save_every=5), poll_s=60)  # the statuses, not the supervisor, act
    most = [0]
    watching = threading.Event()

    def watch():  # never more than one pod on the bill for this (single) replica
        while not watching.is_set():
            most[0] = max(most[0], len(live_pods(fake, run_id)))
            time.sleep(0.005)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        for n in range(1, 4):
            h.wait_training(run_id, attempt=n, min_step=3 if n == 1 else 1)
            (pod,) = live_pods(fake, run_id)
            fake.preempt(pod.id)
            # With its supervisor gone, each status acts on the run (a live supervisor would, and they
            # would only read): three commands at once, and each may start a supervisor of its own.
            _kill_daemon(h, run_id)
            procs = [h.start("status", run_id, "--json") for _ in range(3)]
            for p in procs:
                out, err = p.communicate(timeout=120)
                assert p.returncode == 0, out + err
            wait(lambda: len(pods_of(fake, run_id)) == n + 1, 120, f"relaunch {n}")  # noqa: B023 - waited on here
        st = h.wait_state(run_id, timeout=300)
    finally:
        watching.set()
        t.join()
    assert st["state"] == "succeeded" and st["restarts"] == 3, st
    assert len(pods_of(fake, run_id)) == 4 and most[0] == 1, (len(pods_of(fake, run_id)), most[0])
    assert st["adapter"] and f"sft/{run_id}/seed0/adapter/adapter_config.json" in h.hub.files(h.repo)
    assert_no_pod_left(fake, run_id)


# -- 2. interrupted launches ---------------------------------------------------------------------------
def _launch_caught_in_create(fake: FakeRunPod, h: Home) -> tuple[subprocess.Popen, str]:
    """A launch whose create landed and whose answer is held (until ``fake.release_holds()``): when this
    returns, the launch is waiting inside its create."""
    before = len(fake.pods())
    mine = home_id(h.path)
    # This home's create (never another test's relaunch): created, and its answer held.
    held = fake.hang_next(1, seconds=300, method="POST", path="/v2/pods", apply=True, body_has=f"-h{mine}")
    proc = h.start("launch", str(h.spec(steps=400)), "--yes")
    fake.wait_held(held, timeout=120)
    (pod,) = [p for p in fake.pods()[before:] if p.name.endswith(f"-h{mine}")]
    return proc, pod.name


def test_launch_sigkilled_during_create_then_cancel_and_gc_leave_nothing(fake, homes):
    h = homes()
    proc, name = _launch_caught_in_create(fake, h)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    fake.release_holds()
    runs = json.loads(h.cli("list", "--json").stdout)
    (run,) = runs
    assert run["run_id"] in name
    r = h.cli("cancel", run["run_id"])
    assert r.returncode == 0 and "cancelled" in r.stdout, r.stdout + r.stderr
    r = h.cli("gc")
    assert r.returncode == 0 and "nothing to terminate" in r.stdout, r.stdout + r.stderr
    assert len(pods_of(fake, run["run_id"])) == 1  # adopted by its name, never created twice
    assert_no_pod_left(fake, run["run_id"])


def test_ctrl_c_during_create_says_which_run_and_how_to_cancel(fake, homes):
    h = homes()
    proc, name = _launch_caught_in_create(fake, h)
    out, err, took = interrupt(proc, signal.SIGINT)
    fake.release_holds()
    assert proc.returncode == 130, out + err
    assert took < PROMPT_EXIT_S, f"{took:.1f}s from Ctrl-C to exit: {out + err}"
    assert "launched" not in out, out + err  # it was interrupted inside its create, not while following
    run_id = name.split("autoslm-", 1)[1].rsplit("-s0-a1", 1)[0]
    assert f"autoslm cancel {run_id}" in out and name in out, out + err
    # The run lives on (its pod may land): a background supervisor keeps it, and the message says so.
    pid = h.daemon_pid(run_id)
    assert pid and f"supervisor (pid {pid})" in out, out + err
    assert h.cli("cancel", run_id).returncode == 0
    assert_no_pod_left(fake, run_id)


def test_a_two_seed_launch_that_fails_part_way_tears_down_what_it_started(fake, homes):
    h = homes()
    spec = h.spec(steps=400, extra="")
    spec.write_text(spec.read_text().replace('name = "chaos"', 'name = "chaos"\nseed = [0, 1]'))
    before = len(fake.pods())
    fake.hang_next(1, seconds=1.5, method="POST", path="/v2/pods", apply=True)  # seed 0's create: slow, but it lands
    proc = h.start("launch", str(spec), "--yes", "--detach")
    wait(lambda: len(fake.pods()) > before, 30, "seed 0's pod")
    # Seed 1 then finds no capacity.
    fake.fail_next(
        5,
        400,
        method="POST",
        path="/v2/pods",
        body={"title": "Bad Request", "status": 400, "detail": "There are no longer any instances available"},
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3 and "nothing it started is left running" in err, out + err
    run_id = fake.pods()[before].name.split("autoslm-", 1)[1].rsplit("-s0-a1", 1)[0]
    assert_no_pod_left(fake, run_id)


# -- 3. gc -------------------------------------------------------------------------------------------
def test_gc_from_a_second_home_spares_the_first_homes_live_pod(fake, homes):
    a, b = homes("a"), homes("b")
    run_id = a.launch_detached(a.spec(steps=400))
    wait(lambda: live_pods(fake, run_id), 30, "a's pod")
    # A pod of home a that no run of a knows (a launch that crashed before it recorded the run).
    rp = RunPodProvider(KEY, base_url=fake.url, retry=RetryPolicy(attempts=2, backoff_s=0.01))
    ghost = rp.launch(pod_request(pod_name(home_id(a.path), "ghost-run", 0, 1), ["sleep", "60"], gpu_types=("RTX 4090",)))

    r = b.cli("gc")
    assert r.returncode == 0 and "another home" in r.stdout, r.stdout + r.stderr
    assert live_pods(fake, run_id) and not fake.pod(ghost.pod_id).deleted
    r = b.cli("gc", "--all-homes", "--dry-run")
    assert r.returncode == 0 and "would terminate" in r.stdout and not fake.pod(ghost.pod_id).deleted, r.stdout

    r = a.cli("gc")  # its own home: the unknown pod goes, the live run's pod stays
    assert r.returncode == 0, r.stdout + r.stderr
    assert fake.pod(ghost.pod_id).deleted and live_pods(fake, run_id), r.stdout
    assert a.cli("cancel", run_id).returncode == 0
    assert_no_pod_left(fake, run_id)


# -- 4. liveness ---------------------------------------------------------------------------------------
def test_a_crash_looping_worker_is_replaced_then_failed(fake, homes):
    h = homes()
    fake.extra_env["CHAOS_MODE"] = "crash"
    run_id = h.launch_detached(h.spec(max_restarts=1))
    st = h.wait_state(run_id, timeout=120)
    assert st["state"] == "failed" and st["restarts"] == 1, st
    assert len(pods_of(fake, run_id)) == 2, "replaced once (max_restarts = 1), then failed"
    assert "gave up after 1 restarts" in st["error"], st["error"]
    assert_no_pod_left(fake, run_id)


# -- 5. limits on detached runs, with no command running ---------------------------------------------
def _wait_unattended(fake: FakeRunPod, h: Home, run_id: str, timeout: float) -> None:
    """Watch only the cloud and the supervisor's pidfile: no CLI command runs meanwhile."""
    wait(lambda: live_pods(fake, run_id), 30, "the pod")
    wait(lambda: not live_pods(fake, run_id), timeout, "the supervisor to end the pod", every=0.2)
    wait(lambda: h.daemon_pid(run_id) is None, 30, "the supervisor to exit", every=0.2)


def test_deadline_passes_on_a_detached_run_while_no_command_runs(fake, homes):
    h = homes()
    # 10.8 s. A model the catalog cannot price: no estimate for `launch` to refuse against so short a
    # limit (a known model's set-up alone is estimated over it).
    run_id = h.launch_detached(h.spec(steps=1000, max_hours=0.003, model=UNPRICED))
    _wait_unattended(fake, h, run_id, timeout=40)
    st = h.status(run_id)
    assert st["state"] == "failed" and "time limit" in st["error"], st
    assert_no_pod_left(fake, run_id)


def test_max_usd_passes_on_a_detached_run_while_no_command_runs(fake, homes):
    h = homes()
    fake.extra_env["CHAOS_STEP_S"] = "1.0"
    try:
        # A model the catalog cannot price: no estimate for `launch` to refuse against so small a limit
        # (a known model's set-up alone is estimated over it); RTX 4090 at $0.69/h spends $0.002 in ~10 s.
        run_id = h.launch_detached(h.spec(steps=40, extra="max_usd = 0.002", model=UNPRICED))
        _wait_unattended(fake, h, run_id, timeout=40)
    finally:
        fake.extra_env["CHAOS_STEP_S"] = "0.1"
    st = h.status(run_id)
    assert st["state"] == "failed" and "money limit" in st["error"] and st["end_reason"] == "money_limit", st
    assert 0.0015 <= st["cost_usd"] < 0.004, st  # billed, then decided: at most a poll or two over
    assert_no_pod_left(fake, run_id)


# -- 6. cancel during a relaunch -----------------------------------------------------------------------
def test_cancel_during_a_relaunch_wins(fake, homes):
    h = homes()
    run_id = h.launch_detached(h.spec(steps=400))
    h.wait_training(run_id, attempt=1)
    (pod,) = live_pods(fake, run_id)
    fake.hang_next(1, seconds=4, method="POST", path="/v2/pods", apply=True)  # the relaunch's create is slow
    fake.preempt(pod.id)
    wait(lambda: len(pods_of(fake, run_id)) == 2, 30, "the relaunch's create to land")
    r = h.cli("cancel", run_id)
    assert r.returncode == 0 and "cancelled" in r.stdout, r.stdout + r.stderr
    assert_no_pod_left(fake, run_id)
    assert h.status(run_id)["state"] == "cancelled"


# -- 7. a corrupt registry -----------------------------------------------------------------------------
def test_a_corrupt_registry_names_the_file_and_gc_still_ends_the_pods(fake, homes):
    h = homes()
    run_id = h.launch_detached(h.spec(steps=400), poll_s=0.3)
    wait(lambda: live_pods(fake, run_id), 30, "the pod")
    pid = wait(lambda: h.daemon_pid(run_id), 10, "the supervisor's pidfile")
    os.kill(pid, signal.SIGKILL)  # the supervisor this test started
    time.sleep(0.3)
    db = h.path / "registry.db"
    for extra in (Path(f"{db}-wal"), Path(f"{db}-shm")):
        extra.unlink(missing_ok=True)
    db.write_bytes(b"this is not a database" * 100)
    for args in (("status", run_id), ("list",)):
        r = h.cli(*args)
        assert r.returncode == 1 and str(db) in r.stderr and "internal error" not in r.stderr, r.stderr
    # Without a readable registry, plain gc ends nothing (the pods may be supervised runs): it says
    # how to end them, by name or with --all-homes.
    r = h.cli("gc")
    assert r.returncode == 0 and "terminated" not in r.stdout and str(db) in r.stderr, r.stdout + r.stderr
    (pod,) = live_pods(fake, run_id)
    assert f"autoslm gc {pod.id}" in r.stdout + r.stderr, r.stdout + r.stderr
    r = h.cli("gc", pod.id)
    assert r.returncode == 0 and f"terminated runpod pod {pod.id}" in r.stdout, r.stdout + r.stderr
    assert_no_pod_left(fake, run_id)


# -- 8. the provider failing during teardown ---------------------------------------------------------
def test_provider_5xx_during_teardown_still_ends_with_no_pod(fake, homes):
    h = homes()
    run_id = h.launch_detached(h.spec(steps=400))
    h.wait_training(run_id, attempt=1)
    fake.fail_next(6, 503, method="DELETE")  # more than one call's retries
    r = h.cli("cancel", run_id)
    assert r.returncode in (0, 3), r.stdout + r.stderr  # 3: it says the provider failed; the supervisor goes on
    assert_no_pod_left(fake, run_id, timeout=40)
    assert h.wait_state(run_id)["state"] == "cancelled"


def test_status_says_a_teardown_that_keeps_failing_with_the_pod_and_where_to_end_it(fake, homes):
    """Every terminate refused: while the run's supervisor tries again, `status` (exit 0) says the pod's
    teardown keeps failing, which pod, and the vendor's console to end it by hand (text and --json);
    once the provider answers again, the pod is ended and `status` says nothing of it."""
    h = homes()
    run_id = h.launch_detached(h.spec(steps=400))
    h.wait_training(run_id, attempt=1)
    fake.fail_next(100_000, 503, method="DELETE")
    h.cli("cancel", run_id)  # 0, or 3 where it tried the terminate itself: either way the supervisor goes on
    st = wait(lambda: (s := h.status(run_id))["seeds"][0]["teardown"] and s, 120, "a refused terminate recorded", every=0.5)
    (pod,) = live_pods(fake, run_id)
    td = st["seeds"][0]["teardown"]
    assert st["state"] == "cancelled" and td["pod_id"] == pod.id and td["provider"] == "runpod" and td["failures"] >= 1, st
    assert td["pods_page"] == "https://console.runpod.io/pods" and "503" in td["error"] and KEY not in json.dumps(st), td
    r = h.cli("status", run_id)
    assert r.returncode == 0 and f"teardown failing: ending runpod pod {pod.id} was refused" in r.stdout, r.stdout + r.stderr
    assert f"end pod {pod.id} in RunPod's console (https://console.runpod.io/pods)" in r.stdout, r.stdout
    fake.clear_faults()
    assert_no_pod_left(fake, run_id, timeout=90)
    wait(lambda: h.status(run_id)["seeds"][0]["teardown"] is None, 60, "the teardown's trouble to be forgotten", every=0.5)
    assert "teardown" not in h.cli("status", run_id).stdout


def test_gc_goes_on_past_a_failed_terminate_and_reports_it(fake, homes):
    h = homes()
    rp = RunPodProvider(KEY, base_url=fake.url, retry=RetryPolicy(attempts=2, backoff_s=0.01))
    mine = home_id(h.path)
    ghosts = [
        rp.launch(pod_request(pod_name(mine, f"lost-{i}", 0, 1), ["sleep", "60"], gpu_types=("RTX 4090",))) for i in range(2)
    ]
    fake.fail_next(10, 503, method="DELETE", path=f"/v2/pods/{ghosts[0].pod_id}")
    r = h.cli("gc")
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"FAILED runpod pod {ghosts[0].pod_id}" in r.stdout and f"terminated runpod pod {ghosts[1].pod_id}" in r.stdout, (
        r.stdout
    )
    assert not fake.pod(ghosts[0].pod_id).deleted and fake.pod(ghosts[1].pod_id).deleted
    fake.clear_faults()
    assert h.cli("gc").returncode == 0 and fake.pod(ghosts[0].pod_id).deleted


def test_done_without_an_adapter_is_not_success(fake, homes):
    h = homes()
    fake.extra_env["CHAOS_MODE"] = "no-adapter"
    run_id = h.launch_detached(h.spec(steps=10))
    st = h.wait_state(run_id)
    assert st["state"] == "failed" and "no adapter" in st["error"] and st["adapter"] is None, st
    assert_no_pod_left(fake, run_id)


def test_a_followed_launch_whose_terminal_closes_still_finishes_and_ends_its_pod(fake, homes):
    h = homes()
    proc = h.start("launch", str(h.spec(steps=30)), "--yes", "--poll-s", "0.3")
    mine = home_id(h.path)
    pod = wait(lambda: next((p for p in fake.pods() if p.name.endswith(f"-h{mine}")), None), 30, "the pod")
    run_id = pod.name.split("autoslm-", 1)[1].rsplit("-s0-a1", 1)[0]
    assert wait(lambda: h.daemon_pid(run_id), 10, "the background supervisor")
    proc.send_signal(signal.SIGKILL)  # the terminal (and the command following the run) is gone
    proc.communicate()
    wait(lambda: h.daemon_pid(run_id) is None, 60, "the supervisor to see the run through", every=0.2)
    st = h.status(run_id)
    assert st["state"] == "succeeded" and st["adapter"], st
    assert_no_pod_left(fake, run_id)
