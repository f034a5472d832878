"""RunPodProvider against the fake RunPod v2 server: real httpx client, real local pod processes.

.venv/bin/python -m pytest tests/integration/test_runpod.py -q
"""

from __future__ import annotations

import email.utils
import logging
import time

import httpx
import pytest

from autoslm.engine.pod.selfterm import terminate_own_pod
from autoslm.errors import NoCapacity, ProviderAuthError, ProviderError, ProviderRateLimited, ProviderUnavailable
from autoslm.providers.base import PodHandle, PodRequest
from autoslm.providers.http import RetryPolicy
from autoslm.providers.runpod.provider import RunPodProvider
from tests.fakes.cloud import wait_for
from tests.fakes.pods import pod_request
from tests.fakes.runpod import CAPACITY_DETAIL, FakeRunPod, fake_runpod  # noqa: F401 - pytest fixture

SLEEP = ["python", "-c", "import time; time.sleep(60)"]
HF_TOKEN = "hf_" + "Z" * 30


class Sleeps(list):
    """An injected ``sleep`` that records what it was asked to wait and returns at once."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


def make(
    fake: FakeRunPod, sleeps: Sleeps, *, key: str | None = None, timeout: float = 2.0, attempts: int = 3, **kw
) -> RunPodProvider:
    return RunPodProvider(
        key or fake.api_key,
        base_url=fake.url,
        timeout=timeout,
        retry=RetryPolicy(attempts=attempts, backoff_s=0.01, factor=2.0),
        sleep=sleeps,
        **kw,
    )


@pytest.fixture
def runpod(fake_runpod, sleeps):  # noqa: F811
    p = make(fake_runpod, sleeps)
    yield p
    p.close()


def spec(name: str = "autoslm-run1-s0-a1", command=SLEEP, env=None, cloud: str | None = None, **kw) -> PodRequest:
    kw.setdefault("gpu_types", ("RTX 4090",))
    options = {"runpod": {"cloud": cloud}} if cloud else None
    return pod_request(name, command, env or {"AUTOSLM_RUN_ID": "run1"}, options=options, **kw)


def test_lifecycle_create_status_list_terminate(runpod, fake_runpod):  # noqa: F811
    handle = runpod.launch(spec(env={"AUTOSLM_RUN_ID": "run1", "HF_TOKEN": HF_TOKEN}))
    assert handle.provider == "runpod" and handle.gpu == "RTX 4090" and handle.price_per_hour == pytest.approx(0.69)
    body = fake_runpod.launch_calls[-1]
    assert body["gpu"] == {"id": "NVIDIA GeForce RTX 4090", "count": 1, "minCudaVersion": "13.0"}
    assert body["args"] == "python -c 'import time; time.sleep(60)'" and body["cloud"] == "SECURE"

    pod = fake_runpod.pod(handle.pod_id)
    assert pod.process is not None and pod.process.alive()
    assert runpod.status(handle).state == "running"
    assert [h.pod_id for h in runpod.list_pods()] == [handle.pod_id]

    runpod.terminate(handle)
    assert not pod.process.alive() and fake_runpod.running_pods() == [] and fake_runpod.existing_pods() == []
    assert runpod.status(handle).state == "terminated"
    runpod.terminate(handle)  # idempotent: a gone pod is success
    runpod.terminate(PodHandle("runpod", "never-existed"))
    assert runpod.list_pods() == []


def test_the_pod_gets_its_env_and_the_vendor_injected_ids(runpod, fake_runpod):  # noqa: F811
    show = [
        "python",
        "-c",
        "import os; print(os.environ['HF_TOKEN'] == 'hf_' + 'Z' * 30, os.environ['RUNPOD_POD_ID'], "
        "os.environ['RUNPOD_API_KEY'].startswith('rpa_pod'), 'VAST_API_KEY' in os.environ, flush=True)",
    ]
    handle = runpod.launch(spec(command=show, env={"HF_TOKEN": HF_TOKEN}))
    out = wait_for(lambda: fake_runpod.log(handle.pod_id).strip())
    assert out == f"True {handle.pod_id} True False"
    # The account key went nowhere near the pod; the pod's key is its own.
    assert fake_runpod.api_key not in repr(fake_runpod.pod(handle.pod_id).env)
    assert fake_runpod.pod(handle.pod_id).pod_key != fake_runpod.api_key


def test_launch_is_idempotent_by_name(runpod, fake_runpod):  # noqa: F811
    first = runpod.launch(spec())
    again = runpod.launch(spec())
    assert again.pod_id == first.pod_id
    assert len(fake_runpod.launch_calls) == 1 and len(fake_runpod.existing_pods()) == 1


def test_429_is_retried_honouring_retry_after(runpod, fake_runpod, sleeps):  # noqa: F811
    fake_runpod.fail_next(2, 429, retry_after=7, method="GET", path="/v2/pods")
    handle = runpod.launch(spec())
    assert sleeps[:2] == [7.0, 7.0]
    assert runpod.status(handle).state == "running"


def test_retry_after_as_an_http_date(runpod, fake_runpod, sleeps):  # noqa: F811
    fake_runpod.fail_next(1, 429, retry_after=email.utils.formatdate(time.time() + 4, usegmt=True), method="GET")
    assert runpod.list_pods() == []
    assert len(sleeps) == 1 and 2.0 <= sleeps[0] <= 4.5


def test_429_forever_is_rate_limited(runpod, fake_runpod, sleeps):  # noqa: F811
    fake_runpod.fail_next(10, 429, retry_after=3)
    with pytest.raises(ProviderRateLimited, match="429"):
        runpod.list_pods()
    assert sleeps == [3.0, 3.0]  # three tries, two waits


def test_retry_after_past_the_total_budget_stops_early(fake_runpod, sleeps):  # noqa: F811
    now = [0.0]
    sleeper = Sleeps()
    p = RunPodProvider(
        fake_runpod.api_key,
        base_url=fake_runpod.url,
        timeout=2.0,
        sleep=sleeper,
        clock=lambda: now[0],
        retry=RetryPolicy(attempts=5, backoff_s=0.01, max_total_s=30),
    )
    fake_runpod.fail_next(10, 429, retry_after=100)
    with pytest.raises(ProviderRateLimited):
        p.list_pods()
    assert sleeper == []  # waiting 100 s would pass the 30 s budget: give up at once


def test_5xx_is_retried_then_unavailable(runpod, fake_runpod, sleeps):  # noqa: F811
    fake_runpod.fail_next(1, 503, path="/v2/pods")
    assert runpod.list_pods() == []
    fake_runpod.fail_next(10, 502)
    with pytest.raises(ProviderUnavailable, match="502"):
        runpod.list_pods()
    assert sleeps == [0.01, 0.01, 0.02]


def test_5xx_on_create_looks_before_creating_again(runpod, fake_runpod, sleeps):  # noqa: F811
    fake_runpod.fail_next(1, 500, method="POST", path="/v2/pods")
    handle = runpod.launch(spec())
    assert len(fake_runpod.launch_calls) == 1  # the 500 came from the gateway, before the vendor saw it
    assert [p.id for p in fake_runpod.existing_pods()] == [handle.pod_id]


def test_create_that_times_out_after_taking_effect_is_not_doubled(fake_runpod, sleeps):  # noqa: F811
    # The create's answer is held past the client's timeout; the lookups after it get the same timeout,
    # which must hold on a loaded machine (at 0.4 s, three of them in a row once timed out).
    p = make(fake_runpod, sleeps, timeout=2.0)
    fake_runpod.hang_next(1, seconds=6.0, method="POST", path="/v2/pods", apply=True)
    handle = p.launch(spec())
    assert len(fake_runpod.launch_calls) == 1
    assert [x.id for x in fake_runpod.existing_pods()] == [handle.pod_id]
    assert p.status(handle).state == "running"


def test_a_hanging_api_times_out(fake_runpod, sleeps):  # noqa: F811
    p = make(fake_runpod, sleeps, timeout=0.3, attempts=2)
    fake_runpod.hang_next(2, seconds=1.5, method="GET")
    with pytest.raises(ProviderUnavailable, match="did not answer in time"):
        p.status(PodHandle("runpod", "whatever"))


def test_no_capacity(runpod, fake_runpod):  # noqa: F811
    fake_runpod.no_capacity(True)
    with pytest.raises(NoCapacity, match="no 1x RTX 4090 in stock"):
        runpod.launch(spec())
    assert fake_runpod.launch_calls == []  # the catalog said NONE: no create was tried


def test_a_refused_create_moves_to_the_next_gpu(runpod, fake_runpod):  # noqa: F811
    fake_runpod.fail_next(
        1,
        400,
        method="POST",
        path="/v2/pods",
        body={"title": "Bad Request", "status": 400, "detail": "There are no longer any instances available"},
    )
    handle = runpod.launch(spec(gpu_types=("RTX 4090", "L40S")))
    assert handle.gpu == "L40S" and len(fake_runpod.existing_pods()) == 1


def test_every_create_refused_is_no_capacity(runpod, fake_runpod):  # noqa: F811
    fake_runpod.no_capacity(True, gpus=["NVIDIA GeForce RTX 4090"])
    fake_runpod.fail_next(
        5, 400, method="POST", path="/v2/pods", body={"title": "Bad Request", "status": 400, "detail": CAPACITY_DETAIL}
    )
    with pytest.raises(NoCapacity, match="could not place"):
        runpod.launch(spec(gpu_types=("RTX 4090", "L40S"), cloud="all"))
    assert fake_runpod.existing_pods() == []


def test_a_400_for_a_broken_rule_is_not_called_no_capacity(runpod, fake_runpod):  # noqa: F811
    fake_runpod.fail_next(
        1,
        400,
        method="POST",
        path="/v2/pods",
        body={"title": "Bad Request", "status": 400, "detail": "container disk must be at most 200 GB"},
    )
    with pytest.raises(ProviderError, match="container disk must be at most 200 GB") as info:
        runpod.launch(spec())
    assert not isinstance(info.value, NoCapacity)
    assert [r for r in fake_runpod.requests if r[:2] == ("POST", "/v2/pods")] == [("POST", "/v2/pods", "")]  # no other GPU tried


def test_gpu_catalog_is_asked_with_min_cuda(runpod, fake_runpod):  # noqa: F811
    runpod.offers(spec().wish)
    queries = [q for m, p, q in fake_runpod.requests if p == "/v2/catalog/gpus"]
    assert queries and all("minCudaVersion=" in q for q in queries)
    # Stock that cannot run the image's CUDA is not offered (plan would show what create then refuses).
    fake_runpod.cuda_version = "11.8"
    assert runpod.offers(spec().wish) == []


def test_price_ceiling_filters_offers(runpod, fake_runpod):  # noqa: F811
    offers = runpod.offers(spec(gpu_types=("RTX 4090", "L40S", "H100 SXM"), cloud="all", max_price_per_hour=0.8).wish)
    assert [(o.gpu, o.location, o.price_per_hour) for o in offers] == [
        ("RTX 4090", "community", 0.34),
        ("RTX 4090", "secure", 0.69),
        ("L40S", "community", 0.79),
    ]
    with pytest.raises(NoCapacity, match=r"under \$0.1/h"):
        runpod.launch(spec(max_price_per_hour=0.1))


def test_bad_key_is_an_auth_error_without_the_key(fake_runpod, sleeps):  # noqa: F811
    bad = "rpa_" + "B" * 40
    p = make(fake_runpod, sleeps, key=bad)
    with pytest.raises(ProviderAuthError) as info:
        p.launch(spec())
    assert "RUNPOD_API_KEY" in str(info.value) and bad not in str(info.value)
    assert sleeps == []  # a refused key is not retried


def test_interruptible_is_refused_clearly(runpod, fake_runpod):  # noqa: F811
    with pytest.raises(NoCapacity, match="no interruptible"):
        runpod.launch(spec(interruptible=True))
    assert fake_runpod.launch_calls == []


def test_the_account_key_never_goes_into_a_pod(runpod, fake_runpod):  # noqa: F811
    with pytest.raises(ProviderError, match="carries an API key") as info:
        runpod.launch(spec(env={"SOMETHING": fake_runpod.api_key}))
    assert fake_runpod.api_key not in str(info.value)
    with pytest.raises(ProviderError, match="RUNPOD_API_KEY"):
        runpod.launch(spec(env={"RUNPOD_API_KEY": "x"}))
    assert fake_runpod.launch_calls == []


def test_preempted_pod_shows_exited_or_terminated(runpod, fake_runpod):  # noqa: F811
    a = runpod.launch(spec("autoslm-r-s0-a1"))
    b = runpod.launch(spec("autoslm-r-s1-a1"))
    fake_runpod.preempt(a.pod_id)
    fake_runpod.preempt(b.pod_id, terminate=True)
    assert runpod.status(a).state == "exited"
    assert runpod.status(b).state == "terminated"
    assert fake_runpod.running_pods() == []
    runpod.terminate(a)
    assert fake_runpod.existing_pods() == []


def test_a_worker_that_exits_shows_exited(runpod, fake_runpod):  # noqa: F811
    handle = runpod.launch(spec(command=["python", "-c", "pass"]))
    wait_for(lambda: runpod.status(handle).state == "exited")


def test_errors_and_logs_never_carry_secrets(runpod, fake_runpod, caplog):  # noqa: F811
    caplog.set_level(logging.DEBUG)
    leak = {"title": "Bad Request", "status": 400, "detail": f"key {fake_runpod.api_key} and {HF_TOKEN} rejected"}
    fake_runpod.fail_next(5, 400, method="POST", path="/v2/pods", body=leak)
    fake_runpod.fail_next(1, 503, method="GET")
    with pytest.raises(ProviderError) as info:  # a 400 that is not about capacity
        runpod.launch(spec(env={"HF_TOKEN": HF_TOKEN}))
    text = str(info.value) + caplog.text + repr(fake_runpod.requests)
    assert fake_runpod.api_key not in text and HF_TOKEN not in text
    assert "***" in str(info.value)


def test_worker_terminates_its_own_pod_with_the_pod_key(runpod, fake_runpod):  # noqa: F811
    other = runpod.launch(spec("autoslm-other-s0-a1"))
    selfterm = [
        "python",
        "-c",
        "from autoslm.engine.pod.selfterm import terminate_own_pod; print(terminate_own_pod(), flush=True)",
    ]
    handle = runpod.launch(spec(command=selfterm))
    wait_for(lambda: fake_runpod.pod(handle.pod_id).deleted)
    assert runpod.status(handle).state == "terminated"
    assert runpod.status(other).state == "running"

    # The pod-scoped key reaches its own pod only.
    pod_key = fake_runpod.pod(handle.pod_id).pod_key
    r = httpx.delete(f"{fake_runpod.url}/v2/pods/{other.pod_id}", headers={"Authorization": f"Bearer {pod_key}"})
    assert r.status_code == 403
    assert httpx.get(f"{fake_runpod.url}/v2/pods", headers={"Authorization": f"Bearer {pod_key}"}).status_code == 403


def test_selfterm_outside_a_pod_does_nothing():
    assert terminate_own_pod({}) is None
    with pytest.raises(ProviderAuthError, match="RUNPOD_API_KEY"):
        terminate_own_pod({"RUNPOD_POD_ID": "abc"})


def test_from_env_needs_a_key_and_follows_the_url(fake_runpod, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.setenv("AUTOSLM_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    with pytest.raises(ProviderAuthError, match="set RUNPOD_API_KEY"):
        RunPodProvider.from_env()
    for k, v in fake_runpod.env().items():
        monkeypatch.setenv(k, v)
    p = RunPodProvider.from_env(timeout=2.0)
    assert p.client.base_url == fake_runpod.url
    assert p.list_pods() == []
