"""VastProvider against the fake Vast server: real httpx client, real local instance processes.

.venv/bin/python -m pytest tests/integration/test_vast.py -q
"""

from __future__ import annotations

import dataclasses
import logging

import httpx
import pytest

from autoslm.errors import (
    NoCapacity,
    ProviderAuthError,
    ProviderError,
    ProviderRateLimited,
    ProviderUnavailable,
    ProvisioningFailed,
)
from autoslm.providers.base import PodHandle, PodRequest
from autoslm.providers.http import RetryPolicy
from autoslm.providers.vast.provider import VastProvider
from tests.fakes.cloud import wait_for
from tests.fakes.pods import pod_request
from tests.fakes.vast import FakeVast, fake_vast  # noqa: F401 - pytest fixture

SLEEP = ["python", "-c", "import time; time.sleep(60)"]
HF_TOKEN = "hf_" + "Q" * 30


class Sleeps(list):
    """An injected ``sleep`` that records what it was asked to wait and returns at once."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


def make(
    fake: FakeVast, sleeps: Sleeps, *, key: str | None = None, timeout: float = 2.0, attempts: int = 3, **kw
) -> VastProvider:
    return VastProvider(
        key or fake.api_key,
        base_url=fake.url,
        timeout=timeout,
        retry=RetryPolicy(attempts=attempts, backoff_s=0.01, factor=2.0),
        sleep=sleeps,
        **kw,
    )


@pytest.fixture
def vast(fake_vast, sleeps):  # noqa: F811
    p = make(fake_vast, sleeps)
    yield p
    p.close()


def spec(name: str = "autoslm-run1-s0-a1", command=SLEEP, env=None, min_reliability: float = 0.95, **kw) -> PodRequest:
    kw.setdefault("gpu_types", ("RTX 4090",))
    options = {"vast": {"min_reliability": min_reliability}}
    return pod_request(name, command, env or {"AUTOSLM_RUN_ID": "run1"}, options=options, **kw)


def test_offers_match_the_wishes_cheapest_first(vast, fake_vast):  # noqa: F811
    offers = vast.offers(spec(gpu_types=("RTX 4090", "A100 80GB PCIe")).wish)
    # 109 is cheaper but unreliable (0.70); 105 is a 40 GB A100 listed under the same name.
    assert [(o.offer_id, o.gpu, o.price_per_hour) for o in offers] == [
        ("101", "RTX 4090", 0.35),
        ("102", "RTX 4090", 0.42),
        ("106", "A100 80GB PCIe", 0.95),
    ]
    q = fake_vast.searches[-1]
    assert q["type"] == "on-demand" and q["gpu_name"] == {"in": ["RTX 4090", "A100 PCIE"]} and q["num_gpus"] == {"eq": 1}
    assert vast.offers(spec(max_price_per_hour=0.4).wish)[0].offer_id == "101"
    assert [o.offer_id for o in vast.offers(spec(max_price_per_hour=0.4).wish)] == ["101"]


def test_lifecycle_create_status_list_terminate(vast, fake_vast):  # noqa: F811
    handle = vast.launch(spec())
    assert handle.provider == "vast" and handle.pod_id == "9001" and handle.price_per_hour == pytest.approx(0.35)
    body = fake_vast.launch_calls[-1]
    assert body["runtype"] == "args" and body["args"] == SLEEP and body["label"] == "autoslm-run1-s0-a1" and "price" not in body

    inst = fake_vast.instance(handle.pod_id)
    assert inst.process is not None and inst.process.alive()
    assert vast.status(handle).state == "running"
    assert [h.pod_id for h in vast.list_pods()] == [handle.pod_id]

    vast.terminate(handle)
    assert not inst.process.alive() and fake_vast.existing_pods() == []
    assert vast.status(handle).state == "terminated"
    vast.terminate(handle)  # idempotent
    vast.terminate(PodHandle("vast", "123456"))
    assert vast.list_pods() == []


def test_the_instance_gets_its_env_and_the_injected_ids(vast, fake_vast):  # noqa: F811
    show = [
        "python",
        "-c",
        "import os; print(os.environ['HF_TOKEN'] == 'hf_' + 'Q' * 30, os.environ['CONTAINER_ID'], "
        "len(os.environ['CONTAINER_API_KEY']), 'VAST_API_KEY' in os.environ, flush=True)",
    ]
    handle = vast.launch(spec(command=show, env={"HF_TOKEN": HF_TOKEN}))
    assert wait_for(lambda: fake_vast.log(handle.pod_id).strip()) == f"True {handle.pod_id} 64 False"
    assert fake_vast.api_key not in repr(fake_vast.instance(handle.pod_id).env)


def test_launch_is_idempotent_by_label(vast, fake_vast):  # noqa: F811
    first = vast.launch(spec())
    assert vast.launch(spec()).pod_id == first.pod_id
    assert len(fake_vast.launch_calls) == 1 and len(fake_vast.existing_pods()) == 1


def test_interruptible_rents_with_a_bid(vast, fake_vast):  # noqa: F811
    handle = vast.launch(spec(interruptible=True))
    body = fake_vast.launch_calls[-1]
    assert body["price"] == pytest.approx(0.198)  # min_bid 0.18 + 10%
    assert handle.price_per_hour == pytest.approx(0.198)
    fake_vast.preempt(handle.pod_id)
    st = vast.status(handle)
    assert st.state == "exited" and "outbid" in st.message
    vast.terminate(handle)
    assert fake_vast.existing_pods() == []


def test_a_refused_bid_leaves_no_stopped_instance(vast, fake_vast):  # noqa: F811
    fake_vast.set_min_bid(101, 0.5, visible=False)  # outbid between our search and our rental
    handle = vast.launch(spec(interruptible=True))
    assert handle.gpu == "RTX 4090"
    assert [c["price"] for c in fake_vast.launch_calls] == [pytest.approx(0.198), pytest.approx(0.22)]
    # The refused rental left a stopped instance behind; it was destroyed before the next offer.
    assert [str(i.id) for i in fake_vast.existing_pods()] == [handle.pod_id]
    assert len(fake_vast.pods()) == 2


def test_every_bid_refused_is_no_capacity_and_leaves_nothing(vast, fake_vast):  # noqa: F811
    fake_vast.set_min_bid(101, 0.5, visible=False)
    fake_vast.set_min_bid(102, 0.5, visible=False)
    with pytest.raises(NoCapacity, match="refused 2 offer"):
        vast.launch(spec(interruptible=True))
    assert fake_vast.existing_pods() == [] and len(fake_vast.pods()) == 2


def test_a_leftover_that_cannot_be_destroyed_names_the_instance(vast, fake_vast):  # noqa: F811
    fake_vast.set_min_bid(101, 0.5, visible=False)
    fake_vast.fail_next(10, 500, method="DELETE")
    with pytest.raises(ProvisioningFailed) as info:
        vast.launch(spec(interruptible=True))
    assert info.value.pod_id == "9001" and "terminate it manually" in str(info.value)
    assert fake_vast.instance("9001").actual_status == "stopped"

    # Launching the same attempt again first destroys the stopped leftover under its name.
    fake_vast.clear_faults()
    handle = vast.launch(spec(interruptible=True))
    assert [str(i.id) for i in fake_vast.existing_pods()] == [handle.pod_id] and handle.pod_id != "9001"


def test_leftover_cleanup_survives_a_transient_error(vast, fake_vast):  # noqa: F811
    fake_vast.set_min_bid(101, 0.5, visible=False)
    fake_vast.fail_next(1, 500, method="DELETE")  # the first cleanup fails once; its retry succeeds
    handle = vast.launch(spec(interruptible=True))
    assert [str(i.id) for i in fake_vast.existing_pods()] == [handle.pod_id]


def test_429_is_retried_honouring_retry_after(vast, fake_vast, sleeps):  # noqa: F811
    fake_vast.fail_next(2, 429, retry_after=5, path="/api/v0/bundles/")
    vast.launch(spec())
    assert sleeps[:2] == [5.0, 5.0]
    fake_vast.fail_next(10, 429, retry_after=1)
    with pytest.raises(ProviderRateLimited):
        vast.list_pods()


def test_5xx_is_retried_then_unavailable(vast, fake_vast, sleeps):  # noqa: F811
    fake_vast.fail_next(1, 502)
    assert vast.list_pods() == []
    fake_vast.fail_next(10, 503)
    with pytest.raises(ProviderUnavailable, match="503"):
        vast.status(PodHandle("vast", "1"))


def test_rental_that_times_out_after_taking_effect_is_not_doubled(fake_vast, sleeps):  # noqa: F811
    # The answer is held past the client's timeout; the lookups after it must answer within that timeout
    # on a loaded machine too.
    p = make(fake_vast, sleeps, timeout=2.0)
    fake_vast.hang_next(1, seconds=6.0, method="PUT", path="/api/v0/asks/", apply=True)
    handle = p.launch(spec())
    assert len(fake_vast.launch_calls) == 1
    assert [str(i.id) for i in fake_vast.existing_pods()] == [handle.pod_id]


def test_a_hanging_api_times_out(fake_vast, sleeps):  # noqa: F811
    p = make(fake_vast, sleeps, timeout=0.3, attempts=2)
    fake_vast.hang_next(2, seconds=1.5)
    with pytest.raises(ProviderUnavailable, match="did not answer in time"):
        p.offers(spec().wish)


def test_no_capacity(vast, fake_vast):  # noqa: F811
    fake_vast.no_capacity(True)
    with pytest.raises(NoCapacity, match="no on-demand offer for 1x RTX 4090"):
        vast.launch(spec())
    assert fake_vast.launch_calls == []


def test_a_taken_offer_moves_to_the_next(vast, fake_vast):  # noqa: F811
    fake_vast.fail_next(
        1,
        400,
        method="PUT",
        path="/api/v0/asks/",
        body={"success": False, "error": "no_such_ask", "msg": "Instance type 101 is no longer available."},
    )
    handle = vast.launch(spec())
    assert handle.price_per_hour == pytest.approx(0.42) and len(fake_vast.existing_pods()) == 1


def test_a_launch_with_a_plan_rents_only_its_offers_in_its_order(vast, fake_vast):  # noqa: F811
    """The supervisor passes the offers `plan` found usable (controller.placement.launch_offers): the
    cheapest offer is not one of them (say its host has too little RAM), so it is never tried."""
    wishes = spec(gpu_types=("RTX 4090", "A100 80GB PCIe"))
    offers = vast.offers(wishes.wish)
    planned = (offers[2], offers[1])
    handle = vast.launch(wishes, planned)
    assert handle.price_per_hour == pytest.approx(planned[0].price_per_hour) and handle.gpu == "A100 80GB PCIe"
    assert len(fake_vast.launch_calls) == 1
    with pytest.raises(NoCapacity, match="no usable offer"):
        vast.launch(dataclasses.replace(wishes, name="autoslm-run2-s0-a1"), ())
    assert len(fake_vast.launch_calls) == 1


def test_bad_key_is_an_auth_error_without_the_key(fake_vast, sleeps):  # noqa: F811
    bad = "V" * 64
    p = make(fake_vast, sleeps, key=bad)
    with pytest.raises(ProviderAuthError) as info:
        p.launch(spec())
    assert "VAST_API_KEY" in str(info.value) and bad not in str(info.value)


def test_the_account_key_never_goes_into_an_instance(vast, fake_vast):  # noqa: F811
    with pytest.raises(ProviderError, match="carries an API key"):
        vast.launch(spec(env={"X": f"prefix-{fake_vast.api_key}"}))
    with pytest.raises(ProviderError, match="VAST_API_KEY"):
        vast.launch(spec(env={"VAST_API_KEY": "x"}))
    assert fake_vast.launch_calls == []


def test_list_follows_pages(fake_vast, sleeps):  # noqa: F811
    with FakeVast(
        workdir=fake_vast.workdir / "paged",
        page_size=2,
        offers=[(i, "RTX 4090", 1, 24564, 0.3, 0.1, 0.99, "X") for i in range(1, 6)],
    ) as fake:
        p = make(fake, sleeps)
        ids = {p.launch(spec(f"autoslm-r-s{i}-a1", command=[])).pod_id for i in range(5)}
        assert {h.pod_id for h in p.list_pods()} == ids
        assert {h.pod_id for h in p.list_pods("autoslm-r-s3")} <= ids
        assert sum(1 for m, path, _ in fake.requests if path == "/api/v1/instances/") >= 3


def test_errors_and_logs_never_carry_secrets(vast, fake_vast, caplog):  # noqa: F811
    caplog.set_level(logging.DEBUG)
    leak = {"success": False, "error": "bad", "msg": f"key {fake_vast.api_key} / {HF_TOKEN} refused"}
    fake_vast.fail_next(5, 400, method="PUT", path="/api/v0/asks/", body=leak)
    with pytest.raises(NoCapacity) as info:
        vast.launch(spec(env={"HF_TOKEN": HF_TOKEN}))
    text = str(info.value) + caplog.text + repr(fake_vast.requests)
    assert fake_vast.api_key not in text and HF_TOKEN not in text


def test_worker_destroys_its_own_instance_with_the_container_key(vast, fake_vast):  # noqa: F811
    other = vast.launch(spec("autoslm-other-s0-a1"))
    selfterm = [
        "python",
        "-c",
        "from autoslm.engine.pod.selfterm import terminate_own_pod; print(terminate_own_pod(), flush=True)",
    ]
    handle = vast.launch(spec(command=selfterm))
    wait_for(lambda: fake_vast.instance(handle.pod_id).destroyed)
    assert vast.status(handle).state == "terminated" and vast.status(other).state == "running"
    key = fake_vast.instance(handle.pod_id).container_key
    r = httpx.delete(f"{fake_vast.url}/api/v0/instances/{other.pod_id}/", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 403


def test_from_env_needs_a_key_and_follows_the_url(fake_vast, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.setenv("AUTOSLM_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("VAST_API_KEY", raising=False)
    with pytest.raises(ProviderAuthError, match="set VAST_API_KEY"):
        VastProvider.from_env()
    for k, v in fake_vast.env().items():
        monkeypatch.setenv(k, v)
    p = VastProvider.from_env(timeout=2.0)
    assert p.client.base_url == fake_vast.url and p.list_pods() == []


# -- fixes checked against Vast's references and the official CLI -------------------------------------
def test_a_bid_refused_with_http_200_is_destroyed_by_the_id_it_returned(vast, fake_vast):  # noqa: F811
    fake_vast.bid_refusal = "200"  # {"success": false, "new_contract": id}, leftover unlabelled, actual_status null
    fake_vast.set_min_bid(101, 0.5, visible=False)
    handle = vast.launch(spec(interruptible=True))
    assert fake_vast.instance(9001).destroyed  # found by its id: no label search could have found it
    assert [str(i.id) for i in fake_vast.existing_pods()] == [handle.pod_id] and handle.pod_id != "9001"


def test_a_refused_bid_with_null_status_is_never_adopted(vast, fake_vast):  # noqa: F811
    leftover = vast.launch(spec("autoslm-run9-s0-a1"))
    inst = fake_vast.instance(leftover.pod_id)
    inst.process.kill()
    inst.actual_status, inst.intended_status = None, "stopped"  # how a refused bid can look: never started
    again = vast.launch(spec("autoslm-run9-s0-a1"))  # the same attempt asked again: must not adopt it
    assert again.pod_id != leftover.pod_id and inst.destroyed


@pytest.mark.parametrize("status", ["unknown", "offline", "exited"])
def test_an_instance_that_will_never_run_is_reported_exited(vast, fake_vast, status):  # noqa: F811
    handle = vast.launch(spec())
    fake_vast.set_status(handle.pod_id, status)
    assert vast.status(handle).state == "exited"  # the controller replaces it instead of waiting for max_hours
    vast.terminate(handle)


def test_offers_are_filtered_like_the_official_cli(vast, fake_vast):  # noqa: F811
    vast.offers(spec().wish)
    assert fake_vast.searches[-1]["external"] == {"eq": False} and fake_vast.searches[-1]["rented"] == {"eq": False}
    names = {"RTX 4090": 0}
    raw = {
        "id": 555,
        "ask_contract_id": 777,
        "gpu_name": "RTX 4090",
        "num_gpus": 1,
        "gpu_ram": 24564,
        "dph_total": 0.3,
        "rentable": True,
    }
    assert vast._offer(raw, spec().wish, names).offer_id == "555"  # the create goes to the offer's id
    assert vast._offer({**raw, "rented": True}, spec().wish, names) is None
    assert vast._offer({**raw, "external": True}, spec().wish, names) is None


def test_destroying_an_instance_that_is_gone_counts_as_done(vast, fake_vast):  # noqa: F811
    handle = vast.launch(spec())
    vast.terminate(handle)
    vast.terminate(handle)  # 404 / no_such_instance: success
    assert fake_vast.existing_pods() == []


def test_list_pods_carries_each_pods_name(vast, fake_vast):  # noqa: F811
    handle = vast.launch(spec("autoslm-runx-s1-a2-h0123abcd"))
    assert [(h.pod_id, h.name) for h in vast.list_pods()] == [(handle.pod_id, "autoslm-runx-s1-a2-h0123abcd")]
