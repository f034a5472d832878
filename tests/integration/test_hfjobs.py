"""HFJobsProvider against the fake Hugging Face Jobs server: the real huggingface_hub Jobs client, real
local job processes.

    .venv/bin/python -m pytest tests/integration/test_hfjobs.py -q
"""

from __future__ import annotations

import json
import time

import pytest

from autoslm.controller.reconcile import Launch, Limits, Seen, SetState, Terminate, reconcile
from autoslm.controller.registry import ReplicaRecord
from autoslm.controller.state import RunState
from autoslm.errors import NoCapacity, ProviderAuthError, ProviderRefused, ProviderUnavailable
from autoslm.providers.base import Billed, PodHandle, PodRequest
from autoslm.providers.hfjobs.provider import HFJobsListPrices, HFJobsProvider
from autoslm.providers.http import RetryPolicy
from autoslm.vendors.hfjobs import data
from tests.conftest import REPO
from tests.fakes.cloud import wait_for, written_json
from tests.fakes.hfjobs import FakeHFJobs, fake_hfjobs  # noqa: F401 - pytest fixture
from tests.fakes.pods import pod_request

SLEEP = ["python", "-c", "import time; time.sleep(60)"]
NAME = "autoslm-run1-s0-a1-habcdef12"


class Sleeps(list):
    """An injected ``sleep`` that records what it was asked to wait and returns at once."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def make(fake: FakeHFJobs, sleeps: Sleeps | None = None, *, timeout_s: float = 5.0, **kw) -> HFJobsProvider:
    return HFJobsProvider(
        fake.api_key,
        base_url=fake.url,
        timeout_s=timeout_s,
        retry=RetryPolicy(attempts=3, backoff_s=0.01, factor=2.0),
        sleep=sleeps if sleeps is not None else Sleeps(),
        **kw,
    )


def spec(name: str = NAME, command=SLEEP, env=None, **kw) -> PodRequest:
    kw.setdefault("gpu_types", ("L4",))
    return pod_request(name, command, env or {"AUTOSLM_RUN_ID": "run1"}, **kw)


def test_offers_are_one_per_flavor_with_the_wished_gpus_priced_per_hour(fake_hfjobs):  # noqa: F811
    p = make(fake_hfjobs)
    offers = p.offers(spec(gpu_types=("H200", "L4", "L40S")).wish)
    assert [(o.gpu, o.offer_id, o.gpu_count, o.vram_gb, o.price_per_hour) for o in offers] == [
        ("L4", "l4x1", 1, 24, 0.8),
        ("L40S", "l40sx1", 1, 48, 1.8),
        ("H200", "h200", 1, 141, 5.0),
    ]
    assert not any(o.interruptible for o in offers) and offers[0].extra["preference"] == 1
    (four,) = p.offers(spec(gpu_types=("L4",), gpu_count=4).wish)
    assert (four.offer_id, four.gpu_count, four.vram_gb, four.price_per_hour) == ("l4x4", 4, 24, 3.8)
    assert [o.offer_id for o in p.offers(spec(gpu_types=("l40sx1", "A100 80GB SXM"), max_price_per_hour=2.0).wish)] == ["l40sx1"]
    assert p.offers(spec(gpu_types=("RTX 4090",)).wish) == []
    # Without a token, `plan` shows the list prices, marked as such.
    listed = HFJobsListPrices().offers(spec(gpu_types=("L4", "RTX PRO 6000")).wish)
    assert [(o.offer_id, o.price_per_hour, o.location) for o in listed] == [
        ("l4x1", 0.8, "catalog"),
        ("rtx-pro-6000", 2.75, "catalog"),
    ]


def test_launch_passes_the_token_as_a_secret_with_labels_and_a_timeout(fake_hfjobs, tmp_path):  # noqa: F811
    out = tmp_path / "env.json"
    dump = ["python", "-c", f"import json, os; json.dump(dict(os.environ), open({str(out)!r}, 'w'))"]
    deadline = time.time() + 3600
    p = make(fake_hfjobs)
    handle = p.launch(
        spec(
            command=dump,
            env={
                "AUTOSLM_RUN_ID": "run1",
                "HF_TOKEN": fake_hfjobs.api_key,
                "WANDB_API_KEY": "wandb-secret-123456",
            },
            deadline=deadline,
        )
    )
    assert (handle.provider, handle.gpu, handle.price_per_hour, handle.name) == ("hfjobs", "L4", 0.8, NAME)
    (body,) = fake_hfjobs.launch_calls
    assert body["secrets"] == {"HF_TOKEN": fake_hfjobs.api_key, "WANDB_API_KEY": "wandb-secret-123456"}
    assert fake_hfjobs.api_key not in json.dumps(body["environment"]) and "WANDB_API_KEY" not in body["environment"]
    assert body["environment"]["AUTOSLM_PRICE_PER_HOUR"] == "0.8000" and body["flavor"] == "l4x1"
    assert body["labels"] == {
        "app": "autoslm",
        "autoslm-pod": NAME,
        "autoslm-run": "run1",
        "autoslm-attempt": "1",
        "autoslm-home": "abcdef12",
        "name": NAME,
    }
    # Always a timeout: the run's time left plus the margin, never the platform's 30-minute default.
    assert 3600 + data.TIMEOUT_MARGIN_S - 60 <= body["timeoutSeconds"] <= 3600 + data.TIMEOUT_MARGIN_S
    make(fake_hfjobs).launch(spec(name="autoslm-run2-s0-a1", env={}))
    assert fake_hfjobs.launch_calls[1]["timeoutSeconds"] >= 24 * 3600
    seen = wait_for(lambda: written_json(out), timeout=30)
    assert seen["HF_TOKEN"] == fake_hfjobs.api_key and seen["AUTOSLM_PRICE_PER_HOUR"] == "0.8000"
    assert p.launch(spec(command=dump)).pod_id == handle.pod_id, "a second launch of the attempt adopts its job"
    assert len(fake_hfjobs.jobs()) == 2


def test_status_follows_the_job_stage_and_cancel_is_idempotent(fake_hfjobs):  # noqa: F811
    p = make(fake_hfjobs)
    ok = p.launch(spec(name="autoslm-ok-s0-a1", command=["python", "-c", "pass"]))
    bad = p.launch(spec(name="autoslm-bad-s0-a1", command=["python", "-c", "raise SystemExit(3)"]))
    live = p.launch(spec(name="autoslm-live-s0-a1"))
    assert wait_for(lambda: p.status(ok).state == "exited", timeout=30)
    st = wait_for(lambda: (s := p.status(bad)).state == "exited" and s, timeout=30)
    assert "error" in st.message and st.exit_code is None and st.price_per_hour is None
    st = p.status(live)
    assert (st.state, st.price_per_hour) == ("running", 0.8)
    assert {h.pod_id for h in p.list_pods()} == {live.pod_id}, "finished jobs bill nothing: not listed"
    assert {k: v.state for k, v in p.statuses().items()} == {ok.pod_id: "exited", bad.pod_id: "exited", live.pod_id: "running"}
    assert p.list_pods("autoslm-live") and not p.list_pods("autoslm-other")
    p.terminate(live)
    p.terminate(live)
    p.terminate(ok)  # a finished job
    p.terminate(PodHandle("hfjobs", "f" * 24))  # one that never existed
    assert p.status(live).state == "terminated" and not fake_hfjobs.running_jobs()
    assert p.status(PodHandle("hfjobs", "f" * 24)).state == "terminated"


def test_a_job_stuck_scheduling_is_pending_then_cancelled_and_relaunched(fake_hfjobs):  # noqa: F811
    p = make(fake_hfjobs)
    fake_hfjobs.stuck_scheduling(True)
    handle = p.launch(spec())
    st = p.status(handle)
    assert (st.state, st.price_per_hour) == ("pending", 0.8), "billed while it waits for a machine"
    now = time.time()
    r = ReplicaRecord(
        run_id="run1",
        seed=0,
        state=RunState.PROVISIONING,
        provider="hfjobs",
        pod_id=handle.pod_id,
        attempt=1,
        pod_started_at=now - 3000,
    )
    limits = Limits(deadline=now + 3600, max_usd=None, max_restarts=3, heartbeat_timeout_s=600, startup_timeout_s=2700)
    actions = reconcile(r, Seen(pod=st), limits, now)
    assert isinstance(actions[0], Terminate) and actions[1] == SetState(RunState.RECOVERING) and actions[2] == Launch(resume=True)
    p.terminate(handle)
    fake_hfjobs.stuck_scheduling(False)
    again = p.launch(spec(name="autoslm-run1-s0-a2-habcdef12"))
    assert p.status(again).state == "running" and p.status(handle).state == "terminated"


def test_the_platform_timeout_ends_a_job_the_watchdog_cannot_end(fake_hfjobs):  # noqa: F811
    stubborn = ["python", "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"]
    p = make(fake_hfjobs, min_timeout_s=1, timeout_margin_s=1)
    handle = p.launch(spec(command=stubborn, deadline=time.time() - 10))
    assert fake_hfjobs.launch_calls[0]["timeoutSeconds"] == 1
    st = wait_for(lambda: (s := p.status(handle)).state == "exited" and s, timeout=20)
    assert "timed out" in st.message
    assert not fake_hfjobs.running_jobs()


@pytest.mark.parametrize("fault", ["no_credits", "no_job_rights"])
def test_account_faults_are_one_line_not_retried_and_leave_nothing(fake_hfjobs, fault):  # noqa: F811
    sleeps = Sleeps()
    p = make(fake_hfjobs, sleeps)
    getattr(fake_hfjobs, fault)(True)
    with pytest.raises(ProviderRefused) as e:  # an answer: nothing was created (ProviderAuthError for the token)
        p.launch(spec())
    text = f"{e.value} {e.value.hint}"
    assert "\n" not in text and fake_hfjobs.api_key not in text
    assert (
        ("prepaid credits" in text and "billing" in text)
        if fault == "no_credits"
        else ("may not run" in text and "Jobs permission" in text)
    )
    assert not sleeps and not fake_hfjobs.jobs()


def test_busy_or_failing_api_is_retried_and_a_lost_create_is_adopted_not_repeated(fake_hfjobs):  # noqa: F811
    sleeps = Sleeps()
    p = make(fake_hfjobs, sleeps, timeout_s=1.0)
    fake_hfjobs.fail_next(2, 503, path="/api/jobs/hardware")
    assert p.offers(spec().wish)
    fake_hfjobs.fail_next(1, 429, retry_after=0.02, method="POST")
    first = p.launch(spec())
    assert len(fake_hfjobs.jobs()) == 1 and 0.02 in sleeps
    # The create lands but its answer is lost: the job is found by its labels, never created twice.
    fake_hfjobs.hang_next(1, seconds=3, method="POST", apply=True)
    second = p.launch(spec(name="autoslm-run1-s0-a2"))
    assert len(fake_hfjobs.jobs()) == 2 and second.pod_id != first.pod_id
    assert [j.labels["autoslm-pod"] for j in fake_hfjobs.jobs()].count("autoslm-run1-s0-a2") == 1
    # A 500 on create: looked up first, then sent again once nothing landed.
    fake_hfjobs.fail_next(1, 500, method="POST")
    p.launch(spec(name="autoslm-run1-s0-a3"))
    assert [j.labels["autoslm-pod"] for j in fake_hfjobs.jobs()].count("autoslm-run1-s0-a3") == 1


def test_launch_refuses_what_a_job_cannot_do(fake_hfjobs):  # noqa: F811
    p = make(fake_hfjobs)
    with pytest.raises(NoCapacity, match="no interruptible"):
        p.launch(spec(interruptible=True))
    with pytest.raises(NoCapacity, match="no usable flavor"):
        p.launch(spec(gpu_types=("RTX 4090",)))
    assert not fake_hfjobs.launch_calls
    from autoslm.spec import JobSpec, unused_fields

    js = JobSpec.model_validate(
        {
            "name": "x",
            "model": "autoslm/tiny",
            "environment": {"id": "autoslm/arith"},
            "compute": {"provider": "hfjobs", "gpu": "L4", "cloud": "community", "disk_gb": 80},
        }
    )
    assert [field for field, _ in unused_fields(js)] == ["compute.cloud", "compute.disk_gb"]


def test_from_env_needs_a_token_and_reads_the_jobs_url(fake_hfjobs, monkeypatch, tmp_path):  # noqa: F811
    for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", data.URL_ENV, "HF_ENDPOINT"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AUTOSLM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no saved login
    with pytest.raises(ProviderAuthError, match="set HF_TOKEN"):
        HFJobsProvider.from_env()
    for k, v in fake_hfjobs.env().items():
        monkeypatch.setenv(k, v)
    assert HFJobsProvider.from_env().offers(spec().wish)[0].offer_id == "l4x1"


def test_validate_refuses_a_gpu_no_flavor_has_naming_the_flavors_cards(tmp_path):
    import subprocess
    import sys

    text = (REPO / "jobspecs" / "quickstart.toml").read_text().replace('provider = "local"', 'provider = "hfjobs"\ngpu = "X100"')
    (tmp_path / "s.toml").write_text(text)
    r = subprocess.run(
        [sys.executable, "-m", "autoslm", "validate", str(tmp_path / "s.toml")], capture_output=True, text=True, cwd=REPO
    )
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: {tmp_path / 's.toml'}: compute: gpu 'X100' is not a GPU Hugging Face Jobs offers: write one of "
        '"L4", "L40S", "A100 80GB SXM", "H200", "T4", "A10G", "RTX PRO 6000"'
    ], r.stderr
    from autoslm.spec import ComputeSpec

    for card in ("l4x1", "L4", "H200", "T4"):  # a flavor's own name is its card; cards the catalog has no row for too
        assert ComputeSpec(provider="hfjobs", gpu=card).gpus == [card]
    assert ComputeSpec(provider=["runpod", "hfjobs"], gpu="RTX 4090").gpus == ["RTX 4090"]  # RunPod has it


def test_a_failing_list_is_retried_by_one_policy_alone(fake_hfjobs):  # noqa: F811
    sleeps = Sleeps()
    p = make(fake_hfjobs, sleeps)  # 3 tries
    p.client.namespace()
    fake_hfjobs.fail_next(1000, 500, method="GET", path="/api/jobs/fake-user")
    before = len(fake_hfjobs.requests)
    with pytest.raises(ProviderUnavailable, match="kept failing"):
        p.list_pods()
    # Three tries, two waits: huggingface_hub's own pagination retries (five more per try) are not added.
    assert [r[1] for r in fake_hfjobs.requests[before:]] == ["/api/jobs/fake-user"] * 3 and sleeps == [0.01, 0.02]


def test_a_job_is_billed_from_when_it_runs_by_its_own_durations_not_while_it_waits(fake_hfjobs):  # noqa: F811
    p = make(fake_hfjobs)
    fake_hfjobs.stuck_scheduling(True)
    env = {"AUTOSLM_RUN_ID": "run1", "AUTOSLM_BILLED_FROM": "1234.000", "AUTOSLM_PRICE_PER_HOUR": "0.8000"}
    handle = p.launch(spec(env=env))
    # The worker's money clock starts with its command, not at the create: no create time reaches the job.
    assert "AUTOSLM_BILLED_FROM" not in fake_hfjobs.launch_calls[0]["environment"]
    waiting = p.status(handle)
    assert (waiting.state, waiting.billed) == ("pending", Billed(None)), "nothing billed while it waits for a machine"
    fake_hfjobs.release_scheduling()
    job = fake_hfjobs.job(handle.pod_id)
    began = job.created_at + int(job.started_at - job.created_at)  # its creation plus its whole seconds scheduling
    running = p.status(handle)
    assert running.state == "running" and running.billed.until is None
    assert running.billed.since == pytest.approx(began, abs=0.002)
    p.terminate(handle)
    ended = wait_for(lambda: (s := p.status(handle)).state == "terminated" and s, timeout=30)
    assert ended.billed.since == pytest.approx(began, abs=0.002)
    assert ended.billed.until == pytest.approx(began + int(job.finished_at - job.started_at), abs=0.002)
    # A job cancelled before it ever ran billed nothing.
    fake_hfjobs.stuck_scheduling(True)
    never = p.launch(spec(name="autoslm-run1-s0-a2-habcdef12"))
    p.terminate(never)
    assert p.statuses()[never.pod_id].billed == Billed(None)
