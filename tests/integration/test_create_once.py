"""One attempt is one paid pod: the create-once contract (autoslm/providers/createonce.py), run against
both vendors' fakes through the real provider clients.

    .venv/bin/python -m pytest -q tests/integration/test_create_once.py
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from autoslm.errors import ProviderRefused, ProviderUnavailable
from autoslm.providers.base import PodRequest
from autoslm.providers.createonce import LANDING_S
from autoslm.providers.http import RetryPolicy
from autoslm.providers.runpod.provider import RunPodProvider
from autoslm.providers.vast.provider import VastProvider
from tests.fakes.cloud import wait_for
from tests.fakes.pods import pod_request
from tests.fakes.runpod import FakeRunPod
from tests.fakes.vast import FakeVast

SLEEP = ["python", "-c", "import time; time.sleep(60)"]


@dataclass
class Vendor:
    fake: object
    provider: object
    create: tuple[str, str]  # (method, path prefix) of the create call
    second: object  # makes one more pod with a spec's name, past the create-once rule (vendor calls)

    def live(self, name: str) -> list:
        return [p for p in self.fake.existing_pods() if getattr(p, "name", None) == name or getattr(p, "label", None) == name]


@pytest.fixture(params=["runpod", "vast"])
def vendor(request, tmp_path: Path):
    if request.param == "runpod":
        fake = FakeRunPod(workdir=tmp_path / "fake")
        create = ("POST", "/v2/pods")
        cls = RunPodProvider
    else:
        fake = FakeVast(workdir=tmp_path / "fake")
        create = ("PUT", "/api/v0/asks/")
        cls = VastProvider
    with fake:
        provider = cls(
            # A create starts the pod's process: on a loaded machine that takes a while, so a create's answer
            # is "lost" only by ``hang_next``, never by the load.
            fake.api_key,
            base_url=fake.url,
            timeout=3.0,
            retry=RetryPolicy(attempts=3, backoff_s=0.01),
            sleep=lambda s: None,
        )

        def second(s: PodRequest):
            if request.param == "runpod":
                offer = provider.offers(s.wish)[0]
                provider.api.create_pod(provider._create_body(s, offer))
            else:
                offer = provider.offers(s.wish)[0]  # the first one's offer is rented now: another machine
                provider.api.create_instance(offer.offer_id, provider._create_body(s, offer))

        yield Vendor(fake, provider, create, second)
        provider.close()


def spec(name: str) -> PodRequest:
    return pod_request(
        name, SLEEP, {"AUTOSLM_RUN_ID": "run1"}, gpu_types=("RTX 4090",), options={"vast": {"min_reliability": 0.9}}
    )


def test_a_create_whose_answer_is_lost_is_found_by_name_not_sent_again(vendor):
    method, path = vendor.create
    vendor.fake.hang_next(1, seconds=6.0, method=method, path=path, apply=True)  # past the client's timeout
    handle = vendor.provider.launch(spec("autoslm-once-s0-a1"))
    assert len(vendor.fake.launch_calls) == 1
    assert [str(p.id) for p in vendor.live("autoslm-once-s0-a1")] == [handle.pod_id]
    # Launching the same attempt again adopts it: no second create.
    assert vendor.provider.launch(spec("autoslm-once-s0-a1")).pod_id == handle.pod_id
    assert len(vendor.fake.launch_calls) == 1


def test_a_create_that_fails_every_try_says_it_may_land_and_its_window_covers_the_landing(vendor):
    method, path = vendor.create
    vendor.fake.fail_next(1000, 500, method=method, path=path)
    with pytest.raises(ProviderUnavailable, match="may still land|can still land|no such pod exists yet"):
        vendor.provider.launch(spec("autoslm-fail-s0-a1"))
    assert len(vendor.fake.launch_calls) == 0  # the fake answered before acting: nothing made
    retry = vendor.provider.retry
    assert vendor.provider.create_window_s >= retry.max_total_s + LANDING_S


def test_a_refusal_is_an_answer_unless_an_earlier_try_may_have_landed(vendor):
    method, path = vendor.create
    vendor.fake.fail_next(1, 402, method=method, path=path)
    with pytest.raises(ProviderRefused, match="balance|credit"):  # nothing was sent before: nothing can land
        vendor.provider.launch(spec("autoslm-broke-s0-a1"))
    # A try whose answer was lost (a 500 after the vendor may have acted), then a refusal: no proof
    # that nothing was made, so the create stays unsure (the supervisor keeps its intent).
    vendor.fake.fail_next(1, 500, method=method, path=path)
    vendor.fake.fail_next(1, 402, method=method, path=path)
    with pytest.raises(ProviderUnavailable, match="can still land") as e:
        vendor.provider.launch(spec("autoslm-broke-s0-a2"))
    assert not isinstance(e.value, ProviderRefused)


def test_two_pods_with_one_name_launch_adopts_the_oldest_and_the_other_is_dropped(vendor):
    name = "autoslm-dup-s0-a1"
    first = vendor.provider.launch(spec(name))
    time.sleep(0.05)  # the vendors order by creation time (RunPod) or id (Vast)
    vendor.second(spec(name))  # a create that landed beside it (a relaunch's, while the first was in flight)
    assert len(vendor.live(name)) == 2
    # Rule 1 picks the oldest; rule 3 ends the other.
    assert vendor.provider.launch(spec(name)).pod_id == first.pod_id
    dropped = vendor.provider.once.drop_duplicates(name, keep=first.pod_id)
    assert len(dropped) == 1 and dropped[0] != first.pod_id
    wait_for(lambda: [str(p.id) for p in vendor.live(name)] == [first.pod_id], timeout=10)


def test_a_stopped_pod_listed_with_no_price_is_priced_at_what_it_was_created_at(vendor):
    # Both vendors list a stopped pod at $0/h: its price is then the one the provider wrote into its
    # env at the create (both echo the env back), and the handle says so.
    handle = vendor.provider.launch(spec("autoslm-stop-s0-a1"))
    assert handle.price_per_hour and handle.price_per_hour > 0
    vendor.fake.preempt(handle.pod_id)
    wait_for(lambda: vendor.provider.status(handle).state == "exited", timeout=10)
    (listed,) = [h for h in vendor.provider.list_pods() if h.pod_id == handle.pod_id]
    assert listed.price_per_hour == pytest.approx(handle.price_per_hour, rel=1e-3), listed
    assert listed.price_source == "offer at launch" and listed.created_at, listed
