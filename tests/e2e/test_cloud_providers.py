"""End to end through the real CLI against the fake RunPod, fake Vast and fake Hugging Face Hub.

`autoslm launch` rents a "pod" on a fake vendor API (the real httpx providers talk to it); the fake
starts the real worker (`python -m autoslm.engine`) as a local process, which trains the tiny model
for real and streams its artifacts to the fake Hub through the real huggingface_hub client. Only the
GPU and the cloud are replaced. These are the product's promises for rented GPUs: a run succeeds on
either vendor with its artifacts in the Hub repo and no pod left behind; a failed or cancelled run
leaves no pod either; a preempted run is relaunched and resumes from its Hub checkpoint; keys never
leak; `plan` and an unconfirmed `launch` rent nothing.

    .venv/bin/python -m pytest -q tests/e2e/test_cloud_providers.py -x

The fakes and one $AUTOSLM_HOME are shared by the whole module (started once); the short runs are
launched at the same time, as several users of one Hub repo would. No test relies on another having
run before it in the same process (pytest-xdist may move tests between workers; `--shuffle SEED`
runs them in any order): what a test checks is what its own commands and the fixtures it asks for did.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from autoslm.controller.podnames import home_id
from tests.conftest import backoff
from tests.fakes.container_registry import FakeContainerRegistry
from tests.fakes.hub import FakeHub
from tests.fakes.runpod import FakeRunPod
from tests.fakes.vast import FakeVast

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]

# Distinctive secrets: none of them may show up anywhere but where they belong.
RUNPOD_KEY = "rpkey-E2eAccountSecret-4f7c1d9a2b6e"
VAST_KEY = "vastkey-E2eAccountSecret-8e3b5a0c6d1f"
HF_TOKEN = "hf_E2eCloudHubSecret9Q4xZ7mW2vK5tR8"
SECRETS = {"RUNPOD_API_KEY": RUNPOD_KEY, "VAST_API_KEY": VAST_KEY, "HF_TOKEN": HF_TOKEN}

HUB_REPO = "someone/runs"
RUN_TIMEOUT = 600  # one training run through the CLI, on a CPU shared with other test runs
TERMINAL = ("succeeded", "failed", "cancelled")
COMMITS_PER_HOUR = 60  # ArtifactsSpec.commits_per_hour default

SPEC = """# autoslm launch {path} --yes
name = "{name}"
model = "autoslm/tiny"
[environment]
id = "{env_id}"
params = {params}
[train]
max_steps = {steps}
batch_size = 8
learning_rate = 3e-3
max_length = 64
save_every = {save_every}
lora_rank = 8
lora_alpha = 16
eval_samples = 16
[compute]
provider = "{provider}"
gpu = "RTX 4090"
interruptible = {interruptible}
[artifacts]
store = "hf"
repo = "{repo}"
commits_per_hour = {commits_per_hour}
[limits]
max_hours = 1
"""


# -- the rig ---------------------------------------------------------------------------------------
@dataclass
class CliResult:
    code: int
    out: str
    err: str


@dataclass
class Cloud:
    hub: FakeHub
    runpod: FakeRunPod
    vast: FakeVast
    home: Path
    tmp: Path
    env: dict[str, str]
    results: list[CliResult] = field(default_factory=list)  # every CLI answer, for the secrets check

    def cli(
        self, *args: str, timeout: float = RUN_TIMEOUT, input: str | None = None, env: dict[str, str] | None = None
    ) -> CliResult:
        p = subprocess.run(
            [sys.executable, "-m", "autoslm", *args],
            capture_output=True,
            text=True,
            env=env or self.env,
            timeout=timeout,
            cwd=str(REPO),
            input=input,
        )
        result = CliResult(p.returncode, p.stdout, p.stderr)
        self.results.append(result)
        return result

    def start(self, name: str, *args: str) -> "Started":
        """Start the CLI in the background (output to files: a full pipe would block it)."""
        out, err = self.tmp / f"{name}.out", self.tmp / f"{name}.err"
        with open(out, "w") as fo, open(err, "w") as fe:
            proc = subprocess.Popen(
                [sys.executable, "-m", "autoslm", *args],
                stdout=fo,
                stderr=fe,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=str(REPO),
            )
        return Started(self, proc, out, err)

    def spec(
        self,
        name: str,
        *,
        provider: str = "runpod",
        steps: int = 24,
        save_every: int = 8,
        interruptible: bool = False,
        env_id: str = "autoslm/arith",
        params: str = "{ n_train = 512, n_eval = 16 }",
        commits_per_hour: int = COMMITS_PER_HOUR,
    ) -> Path:
        path = self.tmp / f"{name}.toml"
        path.write_text(
            SPEC.format(
                path=path,
                name=name,
                provider=provider,
                steps=steps,
                save_every=save_every,
                interruptible=str(interruptible).lower(),
                env_id=env_id,
                params=params,
                repo=HUB_REPO,
                commits_per_hour=commits_per_hour,
            )
        )
        return path

    def status(self, run_id: str) -> dict:
        r = self.cli("status", run_id, "--json", timeout=120)
        assert r.code == 0, r.out + r.err
        return json.loads(r.out)

    def wait_for(self, run_id: str, pred, timeout: float = RUN_TIMEOUT, every: float = 0.5) -> dict:
        deadline = time.monotonic() + timeout
        st = None
        pause = backoff(every)
        while time.monotonic() < deadline:
            st = self.status(run_id)
            if pred(st):
                return st
            time.sleep(next(pause))
        raise AssertionError(f"timed out; last status: {st}")

    def hub_files(self, run_id: str, phase: str = "sft", seed: int = 0) -> dict[str, bytes]:
        prefix = f"{phase}/{run_id}/seed{seed}/"
        return {p[len(prefix) :]: b for p, b in self.hub.files(HUB_REPO).items() if p.startswith(prefix)}

    def all_pods(self) -> list:
        return self.runpod.pods() + self.vast.pods()

    def fresh_home(self, name: str) -> dict[str, str]:
        """The module's environment with an $AUTOSLM_HOME of its own, for a test that checks what its
        commands left there (the shared home holds whatever the module's other tests did)."""
        h = self.tmp / f"home-{name}"
        h.mkdir()
        return {**self.env, "AUTOSLM_HOME": str(h)}

    def created_for(self, name: str) -> list:
        """Every create request and pod of the runs named ``name`` (pod names begin autoslm-<run id>)."""
        mark = f"autoslm-{name}-"
        bodies = [b for b in self.runpod.launch_calls if str(b.get("name", "")).startswith(mark)]
        bodies += [b for b in self.vast.launch_calls if str(b.get("label", "")).startswith(mark)]
        pods = [p for p in self.runpod.pods() if p.name.startswith(mark)] + [
            i for i in self.vast.pods() if i.label.startswith(mark)
        ]
        return bodies + pods


@dataclass
class Started:
    cloud: Cloud
    proc: subprocess.Popen
    out: Path
    err: Path

    def wait(self, timeout: float = RUN_TIMEOUT) -> CliResult:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"the CLI did not end within {timeout}s:\n{self.out.read_text()}\n{self.err.read_text()}"
            ) from None
        result = CliResult(self.proc.returncode, self.out.read_text(), self.err.read_text())
        self.cloud.results.append(result)
        return result


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cloud")
    home = tmp / "home"
    home.mkdir()
    with (
        FakeHub(token=HF_TOKEN) as hub,
        FakeRunPod(api_key=RUNPOD_KEY, workdir=tmp / "fake-runpod") as runpod,
        FakeVast(api_key=VAST_KEY, workdir=tmp / "fake-vast") as vast,
        FakeContainerRegistry(published={"autoslm/worker:0.1.0"}) as registry,
    ):
        # The published worker image exists here, so these runs start it (tests/e2e/test_bootstrap.py
        # covers the pod that installs autoslm itself).
        env = {k: v for k, v in os.environ.items() if k not in ("HUGGING_FACE_HUB_TOKEN", "AUTOSLM_DEBUG")}
        env.update(
            {
                "AUTOSLM_HOME": str(home),
                **hub.env(),
                **runpod.env(),
                **vast.env(),
                **registry.env(),
                "COLUMNS": "200",  # plan tables unsqueezed in captured output
            }
        )
        assert env["HF_TOKEN"] == HF_TOKEN and env["RUNPOD_API_KEY"] == RUNPOD_KEY and env["VAST_API_KEY"] == VAST_KEY
        yield Cloud(hub, runpod, vast, home, tmp, env)
        for pidfile in (home / "supervisors").glob("*.pid"):  # background supervisors these runs started
            try:
                os.kill(int(pidfile.read_text()), 15)
            except (OSError, ValueError):
                pass


def run_id_from(output: str) -> str:
    for line in output.splitlines():
        if line.startswith("run ") and " launched" in line:
            return line.split()[1]
    raise AssertionError(f"no run id in output:\n{output}")


def pods_of_run(cloud: Cloud, run_id: str) -> list:
    """Every pod (any vendor, any attempt) started for this run: pod names carry the run id."""
    return [p for p in cloud.runpod.pods() if run_id in p.name] + [i for i in cloud.vast.pods() if run_id in i.label]


def assert_no_pod_left(cloud: Cloud, run_id: str) -> None:
    pods = pods_of_run(cloud, run_id)
    assert pods, f"no pod was ever started for {run_id}"
    alive = [p for p in pods if p.process is not None and p.process.alive()]
    assert not alive, f"worker processes still running for {run_id}: {alive}"
    kept = [p for p in pods if not getattr(p, "deleted", getattr(p, "destroyed", False))]
    assert not kept, f"pods not terminated (still billing) for {run_id}: {[(p.id, getattr(p, 'status', None)) for p in kept]}"
    assert not [p for p in cloud.runpod.running_pods() + cloud.vast.running_pods() if p in pods]


def commits_of(cloud: Cloud, run_id: str) -> list:
    prefix = f"sft/{run_id}/"
    return [c for c in cloud.hub.commits(HUB_REPO) if any(p.startswith(prefix) for p in c.added + c.deleted)]


# Writes the uploader makes outside the commit budget, per worker attempt (engine/pod/uploader.py):
# train_meta, adapter, metrics, DONE or the error file (each may flush heartbeat/events first), the
# final checkpoint, and the flush at close.
EXEMPT_PER_ATTEMPT = 10


def assert_within_commit_budget(cloud: Cloud, run_id: str, attempts: int, commits_per_hour: int = COMMITS_PER_HOUR) -> None:
    commits = commits_of(cloud, run_id)
    assert commits, f"no commit touched {run_id}"
    hours = (commits[-1].monotonic - commits[0].monotonic) / 3600
    burst = min(6, max(2, commits_per_hour // 10))  # the uploader's token bucket
    allowed = attempts * (burst + EXEMPT_PER_ATTEMPT) + commits_per_hour * hours
    assert len(commits) <= allowed, (
        f"{len(commits)} commits for {run_id} in {hours * 3600:.0f}s, budget allows {allowed:.1f}: "
        + ", ".join(c.message for c in commits)
    )
    assert hours < 1 and len(commits) <= commits_per_hour, "over the hourly budget"


def assert_hub_layout(cloud: Cloud, run_id: str) -> dict[str, bytes]:
    files = cloud.hub_files(run_id)
    for name in (
        "heartbeat.json",
        "events.jsonl",
        "metrics.json",
        "train_meta.json",
        "DONE",
        "adapter/adapter_config.json",
        "adapter/adapter_model.safetensors",
    ):
        assert name in files, f"{name} missing from the Hub; have {sorted(files)}"
    ckpts = {p.split("/")[1] for p in files if p.startswith("checkpoint/")}
    assert ckpts, "no checkpoint kept in the Hub"
    for c in ckpts:
        assert f"checkpoint/{c}/autoslm_manifest.json" in files, f"{c} has no manifest"
    assert not any(p.startswith("error_") for p in files), "a succeeded run has an error file"
    return files


def events_of(files: dict[str, bytes]) -> list[dict]:
    return [json.loads(line) for line in files.get("events.jsonl", b"").decode().splitlines() if line.strip()]


# -- 6. plan and unconfirmed launch create nothing ------------------------------------------------------
def test_plan_prints_offers_and_cost_and_creates_nothing(cloud):
    env = cloud.fresh_home("plan")
    for provider, interruptible in (("runpod", False), ("vast", True)):
        spec = cloud.spec(f"plan-{provider}", provider=provider, interruptible=interruptible)
        r = cloud.cli("plan", str(spec), timeout=120, env=env)
        assert r.code == 0, r.out + r.err
        assert "RTX 4090" in r.out and provider in r.out
        assert "est. cost" in r.out and "$/hour" in r.out, r.out  # the table's headers
        assert "best offer: " + provider in r.out and "estimated cost $" in r.out, r.out
        assert "on the pod: " in r.out, r.out  # the recipe line: quantization tier, how rollouts are generated
        rows = json.loads(cloud.cli("plan", str(spec), "--json", timeout=120, env=env).out)
        assert rows and all(row["provider"] == provider and row["estimated_cost_usd"] is not None for row in rows)
        assert any(row["usable"] for row in rows)
        if provider == "vast":
            assert all(row["interruptible"] for row in rows)
    assert cloud.created_for("plan-runpod") == [] and cloud.created_for("plan-vast") == []
    assert not (Path(env["AUTOSLM_HOME"]) / "registry.db").exists()


def test_launch_without_yes_and_no_terminal_refuses_and_creates_nothing(cloud):
    env = cloud.fresh_home("noyes")
    for provider in ("runpod", "vast"):
        spec = cloud.spec(f"noyes-{provider}", provider=provider)
        r = cloud.cli("launch", str(spec), input="y\n", timeout=120, env=env)  # stdin is a pipe, not a terminal
        assert r.code == 2, r.out + r.err
        assert "--yes" in r.err and "Traceback" not in r.out + r.err
        assert "launched" not in r.out
    assert cloud.created_for("noyes-runpod") == [] and cloud.created_for("noyes-vast") == []
    assert json.loads(cloud.cli("list", "--json", timeout=120, env=env).out) == []


# -- 1, 2, 3a. short runs at once: RunPod, Vast (a bid), one the worker fails, one nobody watches ----
@dataclass
class Finished:
    run_id: str
    result: CliResult
    seconds: float


@pytest.fixture(scope="module")
def finished(cloud) -> dict[str, Finished]:
    bad = cloud.tmp / "bad.jsonl"
    rows = [json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) for i in range(40)]
    rows.insert(25, json.dumps({"question": "a row the worker refuses: no prompt, no messages"}))
    bad.write_text("\n".join(rows) + "\n")
    specs = {
        "runpod": cloud.spec("ok-runpod", provider="runpod", steps=24, save_every=8),
        "vast": cloud.spec("ok-vast", provider="vast", steps=24, save_every=8, interruptible=True),
        "failing": cloud.spec("bad-rows", provider="runpod", steps=24, env_id=f"jsonl:{bad}", params="{}"),
    }
    t0 = time.monotonic()
    started = {k: cloud.start(k, "launch", str(p), "--yes") for k, p in specs.items()}
    started["detached"] = cloud.start("detached", "launch", str(cloud.spec("unwatched", steps=16)), "--yes", "--detach")
    out = {}
    try:
        for k, s in started.items():
            r = s.wait()
            out[k] = Finished(run_id_from(r.out), r, time.monotonic() - t0)
    finally:
        for s in started.values():  # one that timed out must not leave the others polling forever
            if s.proc.poll() is None:
                s.proc.kill()
                s.proc.wait()
    return out


def check_succeeded_run(cloud: Cloud, f: Finished, provider: str) -> dict:
    r = f.result
    assert r.code == 0, r.out + r.err
    assert "succeeded" in r.out and f"adapter: hf://{HUB_REPO}/sft/{f.run_id}/seed0/adapter" in r.out, r.out
    st = cloud.status(f.run_id)
    assert st["state"] == "succeeded", st
    assert st["step"] == st["total_steps"] == 24
    assert st["provider"] == provider and st["restarts"] == 0 and st["error"] is None
    assert st["adapter"] == f"hf://{HUB_REPO}/sft/{f.run_id}/seed0/adapter"
    assert st["pod_id"] is None, "a finished run still points at a pod that is gone"
    assert st["cost_usd"] > 0, "the pod's time was not billed"
    assert st["metrics"]["seed0"]["steps"] == 24

    assert_no_pod_left(cloud, f.run_id)
    files = assert_hub_layout(cloud, f.run_id)
    kinds = [e["kind"] for e in events_of(files)]
    assert kinds.count("train_begin") == 1 and "done" in kinds
    assert_within_commit_budget(cloud, f.run_id, attempts=1)

    dest = cloud.tmp / f"dl-{f.run_id}"
    d = cloud.cli("download", f.run_id, "--to", str(dest), timeout=120)
    assert d.code == 0, d.out + d.err
    assert (dest / "adapter_config.json").exists() and (dest / "adapter_model.safetensors").exists()
    assert (dest / "adapter_model.safetensors").read_bytes() == files["adapter/adapter_model.safetensors"]
    return st


def test_runpod_run_with_hub_store_succeeds_and_leaves_no_pod(cloud, finished):
    f = finished["runpod"]
    check_succeeded_run(cloud, f, "runpod")
    (pod,) = pods_of_run(cloud, f.run_id)
    # The name says whose pod it is: this home's id, the run, seed and attempt (gc reads it).
    assert pod.gpu_id == "NVIDIA GeForce RTX 4090" and pod.name == f"autoslm-{f.run_id}-s0-a1-h{home_id(cloud.home)}"


def test_vast_interruptible_run_succeeds_and_leaves_no_instance(cloud, finished):
    f = finished["vast"]
    check_succeeded_run(cloud, f, "vast")
    (inst,) = pods_of_run(cloud, f.run_id)
    assert inst.is_bid, "interruptible = true must rent a bid instance"
    assert inst.price >= inst.offer["min_bid"] and inst.offer["gpu_name"] == "RTX 4090"
    assert inst.runtype == "args" and inst.label == f"autoslm-{f.run_id}-s0-a1-h{home_id(cloud.home)}"


def test_worker_failure_ends_the_run_failed_with_exit_1_and_no_pod(cloud, finished):
    f = finished["failing"]
    r = f.result
    assert r.code == 1, r.out + r.err
    assert "failed" in r.out and "Traceback" not in r.out + r.err
    st = cloud.status(f.run_id)
    assert st["state"] == "failed", st
    assert "bad.jsonl:26" in (st["error"] or ""), st["error"]
    assert st["restarts"] == 0, "a non-retryable error must not be relaunched"
    assert st["adapter"] is None and st["pod_id"] is None
    assert_no_pod_left(cloud, f.run_id)
    files = cloud.hub_files(f.run_id)
    assert "error_sft.txt" in files and "DONE" not in files
    assert b"retryable: false" in files["error_sft.txt"]
    assert_within_commit_budget(cloud, f.run_id, attempts=1)
    d = cloud.cli("download", f.run_id, "--to", str(cloud.tmp / "nothing"), timeout=120)
    assert d.code == 2 and "failed" in d.err


def test_detached_run_nobody_watched_is_billed_for_its_pod_time(cloud, finished):
    f = finished["detached"]
    assert f.result.code == 0, f.result.out + f.result.err
    (pod,) = pods_of_run(cloud, f.run_id)
    # Nobody looks at the run while it trains: the worker finishes and ends its own pod.
    deadline = time.monotonic() + RUN_TIMEOUT
    while not pod.deleted:
        assert time.monotonic() < deadline, "the worker did not end its own pod"
        time.sleep(0.2)
    hb = json.loads(cloud.hub_files(f.run_id)["heartbeat.json"])
    assert hb["stage"] == "done"

    st = cloud.status(f.run_id)
    looked = time.time()
    assert st["state"] == "succeeded" and st["step"] == st["total_steps"] == 16, st
    assert st["pod_id"] is None, "a finished run still points at a pod that is gone"
    # Billed from the create (its intent, a moment before) to the look that saw the pod gone, though no
    # one looked in between: never less than its life up to the last heartbeat, never past that look.
    # (`status` says dollars to 4 places: the bill may be said up to half that last place below or above.)
    at_least = pod.unit_price * (hb["time"] - pod.created_at) / 3600
    at_most = pod.unit_price * (looked - pod.created_at + 5.0) / 3600
    said = 0.00005
    assert at_least > 0 and at_least - said <= st["cost_usd"] <= at_most + said, (st["cost_usd"], at_least, at_most)

    # Later looks never bill a finished run again, even while the provider cannot be asked.
    cloud.runpod.fail_next(5, status=503)
    try:
        time.sleep(3)
        again = cloud.status(f.run_id)
    finally:
        cloud.runpod.clear_faults()
    assert again["state"] == "succeeded" and again["cost_usd"] == st["cost_usd"]


# -- 3b. cancel a detached run ----------------------------------------------------------------------
def test_cancel_detached_run_tears_its_pod_down(cloud):
    # Long enough never to finish here; checkpoints only at the end, so the training heartbeat is
    # the next commit the budget allows (commits_per_hour = 120: one token every 30 s).
    spec = cloud.spec("cancel-me", provider="runpod", steps=200_000, save_every=200_000, commits_per_hour=120)
    r = cloud.cli("launch", str(spec), "--detach", "--yes", timeout=120)
    assert r.code == 0, r.out + r.err
    run_id = run_id_from(r.out)
    st = cloud.wait_for(run_id, lambda s: s["state"] in ("running",) + TERMINAL, every=2.0)
    assert st["state"] == "running", st
    pod_id = st["pod_id"]
    assert cloud.runpod.pod(pod_id).process.alive()

    c = cloud.cli("cancel", run_id, timeout=120)
    assert c.code == 0, c.out + c.err
    assert "cancelled" in c.out
    st = cloud.status(run_id)
    assert st["state"] == "cancelled" and st["pod_id"] is None, st
    assert_no_pod_left(cloud, run_id)
    # A later look does not bring it back.
    assert cloud.status(run_id)["state"] == "cancelled"
    assert len(pods_of_run(cloud, run_id)) == 1


# -- 4. preemption: relaunch and resume from the Hub checkpoint ------------------------------------
def test_preempted_bid_is_relaunched_and_resumes_from_the_hub_checkpoint(cloud):
    steps = 200
    spec = cloud.spec("preempt-me", provider="vast", interruptible=True, steps=steps, save_every=5, commits_per_hour=120)
    # Every commit spends a token of the run's commit budget (120/hour: one token every 30 s, 6 saved
    # up). Left alone, setup and the first training heartbeats spend them all and the first
    # checkpoint waits ~30 s for one, by which time a fast machine has finished training. So the Hub
    # answers commits slowly while the worker sets up (fewer, fuller commits; tokens refill), and a
    # little slowly from the evaluation before training until the first checkpoint is in (a
    # heartbeat cannot take every token before a checkpoint is queued; queued checkpoints go first).
    cloud.hub.delay_commits(8.0)
    try:
        r = cloud.cli("launch", str(spec), "--detach", "--yes", timeout=120)
        assert r.code == 0, r.out + r.err
        run_id = run_id_from(r.out)
        deadline = time.monotonic() + RUN_TIMEOUT
        (first_pod,) = pods_of_run(cloud, run_id)
        while not any(e["kind"] == "eval" for e in events_of(cloud.hub_files(run_id))):
            assert time.monotonic() < deadline, "the worker never got to its first evaluation"
            assert first_pod.process.alive(), cloud.vast.log(first_pod.id)[-3000:]
            time.sleep(0.05)
        cloud.hub.delay_commits(0.5)  # before train_meta lands, so training's first commits see it

        def checkpoints() -> list[int]:
            files = cloud.hub_files(run_id)
            return sorted(
                int(p.split("/")[1].split("-")[1])
                for p in files
                if p.startswith("checkpoint/") and p.endswith("/autoslm_manifest.json")
            )

        while not (seen := checkpoints()):
            assert time.monotonic() < deadline, "no checkpoint appeared in the Hub"
            assert first_pod.process.alive(), cloud.vast.log(first_pod.id)[-3000:]
            time.sleep(0.05)
    finally:
        cloud.hub.delay_commits(0)
    cloud.vast.preempt(first_pod.id)  # outbid: the worker dies at once, the instance shows stopped
    first_ckpt = seen[0]
    assert "DONE" not in cloud.hub_files(run_id), "the run finished before it could be preempted"
    assert first_ckpt < steps

    st = cloud.wait_for(run_id, lambda s: s["state"] in TERMINAL, every=1.0)
    assert st["state"] == "succeeded", st
    assert st["restarts"] == 1, st
    assert st["step"] == st["total_steps"] == steps
    files = assert_hub_layout(cloud, run_id)
    events = events_of(files)
    resumes = [e for e in events if e["kind"] == "resume"]
    assert len(resumes) == 1 and first_ckpt <= resumes[0]["data"]["from_step"] < steps, resumes
    starts = [e["data"]["attempt"] for e in events if e["kind"] == "worker_start"]
    assert starts == [1, 2], starts
    assert (
        st["metrics"]["seed0"]["attempt"] == 2 and st["metrics"]["seed0"]["resumed_from_step"] == resumes[0]["data"]["from_step"]
    )

    pods = pods_of_run(cloud, run_id)
    assert [p.label for p in pods] == [f"autoslm-{run_id}-s0-a{n}-h{home_id(cloud.home)}" for n in (1, 2)]
    assert all(p.is_bid for p in pods)
    assert_no_pod_left(cloud, run_id)  # the outbid (stopped) instance was destroyed too
    assert_within_commit_budget(cloud, run_id, attempts=2, commits_per_hour=120)


# -- 5. secrets ----------------------------------------------------------------------------------------
def test_no_secret_leaks_anywhere(cloud, finished):
    """Looks at everything the module's runs have left so far: at least the four runs of ``finished``
    (their launches, pods, Hub files, logs), and the answers of the commands a user runs on them here,
    whichever other tests ran before it in this process."""
    for f in finished.values():
        for args in (("status", f.run_id), ("status", f.run_id, "--json"), ("logs", f.run_id, "--events")):
            cloud.cli(*args, timeout=120)
    cloud.cli("list", timeout=120)
    cloud.cli("download", finished["runpod"].run_id, "--to", str(cloud.tmp / "dl-secrets"), timeout=120)
    pods = cloud.all_pods()
    assert len(pods) >= 4 and len(cloud.results) >= 4 + 3 * 4 + 2
    secrets = list(SECRETS.values())

    def leaks(text: str) -> list[str]:
        return [name for name, value in SECRETS.items() if value in text]

    # The CLI's stdout and stderr, every call.
    for r in cloud.results:
        assert not leaks(r.out + r.err), (leaks(r.out + r.err), r.out[-2000:], r.err[-2000:])
    # Every file in the Hub repo, at every commit.
    repo = cloud.hub.repo(HUB_REPO)
    for commit in repo.history:
        for path, blob in commit.files.items():
            assert not any(s.encode() in blob.content for s in secrets), f"secret in the Hub: {path}"
        assert not leaks(commit.message)
    # Everything under $AUTOSLM_HOME (registry.db, logs, ...).
    home_files = [p for p in cloud.home.rglob("*") if p.is_file()]
    assert any(p.name == "registry.db" for p in home_files)
    for p in home_files:
        data = p.read_bytes()
        assert not any(s.encode() in data for s in secrets), f"secret in {p}"
    # Every pod's log (the worker's whole output), on both vendors.
    logs = [p for p in (cloud.tmp / "fake-runpod").rglob("*.log")] + [p for p in (cloud.tmp / "fake-vast").rglob("*.log")]
    assert len(logs) >= len(pods)
    for p in logs:
        data = p.read_bytes()
        assert not any(s.encode() in data for s in secrets), f"secret in pod log {p}"

    # A pod gets the Hub token (it writes the artifacts) but never the user's provider key: it ends
    # itself with the pod-scoped key the vendor injects.
    for pod in pods:
        env = pod.env
        assert env.get("HF_TOKEN") == HF_TOKEN, sorted(env)
        assert "RUNPOD_API_KEY" not in env and "VAST_API_KEY" not in env, sorted(env)
        assert not any(RUNPOD_KEY in v or VAST_KEY in v for v in env.values())
    for pod in cloud.runpod.pods():
        assert pod.pod_key != RUNPOD_KEY
    for inst in cloud.vast.pods():
        assert inst.container_key != VAST_KEY
    # What went over the wire to create them, too (RunPod stores the create body's env as sent).
    for body in cloud.runpod.launch_calls + cloud.vast.launch_calls:
        text = json.dumps(body)
        assert RUNPOD_KEY not in text and VAST_KEY not in text
        assert HF_TOKEN in text
