"""Every registered vendor keeps one contract, run through its real provider against its fake server.

offers -> launch with the offers placement judged (create-once: a lost create answer adopts the pod,
never a second one) -> status -> list by label (and every status in one call, where the vendor declares
it) -> terminate (idempotent) -> the pod ending itself from its own environment (through
worker_image/boot_rules.py's POD_VENDORS, where the vendor declares that its pods must end themselves).

A vendor is two folders (its data, autoslm/vendors/<name>/, and its runtime, autoslm/providers/<name>/)
and one line of the vendor table (autoslm/vendors/table.py); here it is one row of
``FAKES``: how to start its fake and build its provider against it, and which create request to lose.

    .venv/bin/python -m pytest -q tests/integration/test_vendor_contract.py
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from autoslm._image.boot_rules import POD_VENDORS
from autoslm.errors import ProviderError
from autoslm.providers import VENDORS
from autoslm.providers.base import POD_LABEL, PodRequest
from autoslm.providers.http import RetryPolicy
from tests.fakes.cloud import wait_for, written_json
from tests.fakes.hfjobs import FakeHFJobs
from tests.fakes.pods import pod_request
from tests.fakes.runpod import FakeRunPod
from tests.fakes.vast import FakeVast

PACKAGE = Path(__file__).resolve().parents[2] / "autoslm"
SLEEP = ["python", "-c", "import time; time.sleep(60)"]
# The pod's own end, from its own environment: which vendor's pod it found itself in, and what ending it did.
# (Written before the end: ending the pod ends this process.)
SELF_END = [
    "python",
    "-c",
    "import json, os; from autoslm._image.boot_rules import pod_vendor; "
    "from autoslm.engine.pod.selfterm import terminate_own_pod; "
    "found = (pod_vendor(os.environ) or {}).get('vendor'); "
    "open(os.environ['CONTRACT_OUT'] + '.tmp', 'w').write(json.dumps({'vendor': found})); "
    "os.replace(os.environ['CONTRACT_OUT'] + '.tmp', os.environ['CONTRACT_OUT']); "
    "print('ended:', terminate_own_pod(), flush=True)",
]


def _fast(cls, fake):
    return cls(fake.api_key, base_url=fake.url, timeout=0.5, retry=RetryPolicy(attempts=3, backoff_s=0.01), sleep=lambda s: None)


def _local(tmp: Path):
    from autoslm.providers.local.provider import LocalProvider

    return contextlib.nullcontext(None), lambda _fake: LocalProvider(home=tmp / "home")


def _runpod(tmp: Path):
    from autoslm.providers.runpod.provider import RunPodProvider

    return FakeRunPod(workdir=tmp / "fake"), lambda fake: _fast(RunPodProvider, fake)


def _vast(tmp: Path):
    from autoslm.providers.vast.provider import VastProvider

    return FakeVast(workdir=tmp / "fake"), lambda fake: _fast(VastProvider, fake)


def _hfjobs(tmp: Path):
    from autoslm.providers.hfjobs.provider import HFJobsProvider

    return FakeHFJobs(api_key="hf_FakeJobsToken0123456789abcdef", workdir=tmp / "fake"), lambda fake: HFJobsProvider(
        fake.api_key, base_url=fake.url, timeout_s=0.5, retry=RetryPolicy(attempts=3, backoff_s=0.01), sleep=lambda s: None
    )


# A fake (tests/fakes/cloud.FakeCloud) runs each pod's command as a local process with the vendor's
# injected environment; where the vendor declares a create window, it also offers ``hang_next(apply=True)``,
# ``launch_calls`` (every create body) and ``existing_pods()`` (objects with ``.id``).
@dataclass(frozen=True)
class Fake:
    start: Callable[[Path], tuple]  # tmp -> (the fake server as a context manager, fake -> provider)
    create: tuple[str, str] | None = None  # (method, path prefix) of the create request, to lose its answer
    gpu: str = "RTX 4090"  # a catalog GPU the fake offers
    # A vendor that joins pods (``Capabilities.joins_pods``): the create of a group of them, to lose its answer.
    group_create: tuple[str, str] | None = None


# One row per registered vendor: test_every_vendor_has_a_fake_here fails until a new vendor adds its own.
FAKES: dict[str, Fake] = {
    "local": Fake(_local),
    "runpod": Fake(_runpod, ("POST", "/v2/pods"), group_create=("POST", "/v2/clusters")),
    "vast": Fake(_vast, ("PUT", "/api/v0/asks/")),
    "hfjobs": Fake(_hfjobs, ("POST", "/api/jobs/"), gpu="L4"),
}


def test_every_vendor_has_a_fake_here_and_every_folder_is_registered():
    assert set(FAKES) == set(VENDORS)
    for floor in ("vendors", "providers"):
        folders = {p.parent.name for p in (PACKAGE / floor).glob("*/__init__.py")}
        assert folders == set(VENDORS), (
            f"a vendor folder under autoslm/{floor}/ that the vendor table does not list, or the reverse"
        )
    for vendor in VENDORS.values():  # the data names its runtime, a floor above
        assert vendor.provider_class.startswith(f"autoslm.providers.{vendor.name}."), vendor.provider_class
        assert vendor.self_end is None or vendor.self_end.startswith(f"autoslm.providers.{vendor.name}."), vendor.self_end


def test_each_pod_table_row_says_what_its_vendor_declares():
    """worker_image/boot_rules.py's POD_VENDORS runs on a pod without autoslm, so it repeats a vendor's
    names, URL and key variables; each row must equal what the vendor's package declares."""
    for row in POD_VENDORS:
        vendor = VENDORS[row["vendor"]]
        assert row["title"] == vendor.title
        assert row["url_env"] == vendor.url_env and row["url"] == vendor.default_url
        assert row["key_env"] in vendor.pod_secret_envs, f"{vendor.name}: the key its pods carry is a pod secret it declares"
        assert vendor.self_end and vendor.capabilities.ends_itself


def test_the_pod_table_has_a_row_for_every_vendor_whose_pods_end_themselves():
    ends = {n for n, v in VENDORS.items() if v.capabilities.ends_itself}
    assert {row["vendor"] for row in POD_VENDORS} == ends
    assert all(VENDORS[n].self_end_function() and VENDORS[n].self_end for n in ends)
    for name, vendor in VENDORS.items():
        caps = vendor.capabilities
        assert caps.interruptible or caps.not_interruptible, f"{name}: say why it has no interruptible pods"
        assert (caps.market == "none") == (not vendor.rented)
        assert vendor.provider_type().__name__ and all(f.startswith("compute.") for f in caps.not_applicable)
        assert caps.exposes_ports or caps.no_ports or not vendor.rented, f"{name}: say why `serve --on` cannot use it"
        assert caps.joined_by if caps.joins_pods else caps.no_joining, f"{name}: say how it joins pods, or why it cannot"


@pytest.fixture(params=sorted(FAKES))
def vendor(request, tmp_path: Path):
    server, build = FAKES[request.param].start(tmp_path)
    with server as fake:
        provider = build(fake)
        yield request.param, fake, provider
        getattr(provider, "close", lambda: None)()


def _spec(name: str, command: list[str], env: dict | None = None, gpu: str = "RTX 4090") -> PodRequest:
    return pod_request(name, command, env, gpu_types=(gpu,), options={"vast": {"min_reliability": 0.9}})


def test_offers_launch_once_status_list_terminate_and_the_pod_ends_itself(vendor, tmp_path):
    name, fake, provider = vendor
    caps, gpu = VENDORS[name].capabilities, FAKES[name].gpu
    assert provider.name == name

    # offers: a market's come from the vendor, each its own; none where there is no market.
    offers = provider.offers(_spec("autoslm-contract-s0-a1", SLEEP, gpu=gpu).wish)
    assert (caps.market == "none") == (not offers) and all(o.provider == name for o in offers)

    # launch with the offers placement judged, handed on as they are (None: no market, nothing judged).
    planned = tuple(offers) if offers else None
    pod = _spec("autoslm-contract-s0-a1", SLEEP, gpu=gpu)
    if caps.create_window:
        method, path = FAKES[name].create
        fake.hang_next(1, seconds=1.5, method=method, path=path, apply=True)  # the pod is made, its answer lost
    handle = provider.launch(pod, planned)
    assert handle.provider == name and handle.pod_id
    if caps.create_window:
        assert provider.create_window_s > 0
        assert len(fake.launch_calls) == 1
        assert provider.launch(pod, planned).pod_id == handle.pod_id  # the same attempt again adopts it
        assert len(fake.launch_calls) == 1
        assert [str(p.id) for p in fake.existing_pods() if p.id and str(p.id) == handle.pod_id] == [handle.pod_id]

    # status, then every pod of the label, in one call where the vendor declares it.
    wait_for(lambda: provider.status(handle).state == "running")
    assert handle.pod_id in [h.pod_id for h in provider.list_pods(POD_LABEL)]
    named = [h for h in provider.list_pods(POD_LABEL) if h.pod_id == handle.pod_id]
    assert named[0].name == pod.name
    if caps.batch_status:
        assert provider.statuses(POD_LABEL)[handle.pod_id].state == "running"

    # terminate: gone, and again is no error.
    provider.terminate(handle)
    wait_for(lambda: provider.status(handle).state in ("terminated", "exited"))
    provider.terminate(handle)
    assert handle.pod_id not in [h.pod_id for h in provider.list_pods(POD_LABEL)]

    # The pod ends itself from its own environment: the table finds its vendor, the vendor's key ends it.
    out = tmp_path / "self-end.json"
    ender = provider.launch(_spec("autoslm-contract-s0-a2", SELF_END, env={"CONTRACT_OUT": str(out)}, gpu=gpu), planned)
    said = wait_for(lambda: written_json(out), timeout=30)
    if caps.ends_itself:
        assert said == {"vendor": name}
        wait_for(lambda: provider.status(ender).state == "terminated", timeout=30)
    else:  # its pod is its process: nothing to end but itself, which exits
        assert said == {"vendor": None}
        wait_for(lambda: provider.status(ender).state == "exited", timeout=30)
    assert ender.pod_id not in [h.pod_id for h in provider.list_pods(POD_LABEL)]


@pytest.mark.parametrize("vendor", [n for n in sorted(FAKES) if not VENDORS[n].capabilities.joins_pods], indirect=True)
def test_a_request_for_several_pods_of_one_replica_is_refused_before_any_create(vendor):
    """``GpuWish.nodes``: a vendor that cannot join pods says so; it never rents one pod of several."""
    name, fake, provider = vendor
    pod = _spec("autoslm-nodes-s0-a1", SLEEP, gpu=FAKES[name].gpu)
    two = dataclasses.replace(pod, wish=dataclasses.replace(pod.wish, nodes=2))
    with pytest.raises(ProviderError, match="asked for 2 pods for autoslm-nodes-s0-a1: it cannot join pods"):
        provider.launch(two)
    assert provider.list_pods(POD_LABEL) == []
    if VENDORS[name].capabilities.create_window:
        assert fake.launch_calls == []


# Every vendor that joins pods runs the group contract: every node's process is told its node, and the
# group is one pod to the controller (created once, a lost answer adopted, listed once, ended whole).
GROUPS = sorted(n for n in FAKES if VENDORS[n].capabilities.joins_pods)
NODE_ENV = [
    "python",
    "-c",
    "import json, os, time; out = os.environ['CONTRACT_OUT'] + os.environ['NODE_RANK']; "
    "open(out + '.tmp', 'w').write(json.dumps({k: os.environ.get(k) for k in ('NODE_RANK', 'NUM_NODES')})); "
    "os.replace(out + '.tmp', out); time.sleep(60)",
]


@pytest.mark.parametrize("vendor", GROUPS, indirect=True)
def test_a_replica_of_two_pods_is_one_group_created_found_and_ended_whole(vendor, tmp_path):
    name, fake, provider = vendor
    caps, gpu = VENDORS[name].capabilities, FAKES[name].gpu
    assert caps.joins_pods
    out = tmp_path / "node"
    pod = _spec("autoslm-group-s0-a1", NODE_ENV, env={"CONTRACT_OUT": str(out)}, gpu=gpu)
    two = dataclasses.replace(pod, wish=dataclasses.replace(pod.wish, nodes=2))
    offers = provider.offers(two.wish)
    planned = tuple(offers) if offers else None
    if caps.create_window:
        method, path = FAKES[name].group_create or FAKES[name].create
        fake.hang_next(1, seconds=1.5, method=method, path=path, apply=True)  # a create made, its answer lost
    handle = provider.launch(two, planned)
    assert handle.provider == name and handle.name == two.name
    if offers:
        assert handle.price_per_hour == pytest.approx(2 * offers[0].price_per_hour)  # K pods, billed as one
    if caps.create_window:
        sent = len(fake.launch_calls)
        assert provider.launch(two, planned).pod_id == handle.pod_id and len(fake.launch_calls) == sent  # adopted

    said = [wait_for(lambda n=n: written_json(out.parent / f"node{n}")) for n in (0, 1)]
    assert said == [{"NODE_RANK": "0", "NUM_NODES": "2"}, {"NODE_RANK": "1", "NUM_NODES": "2"}]
    st = wait_for(lambda: (s := provider.status(handle)).state == "running" and s)
    assert [(n.node, n.state) for n in st.nodes] == [(0, "running"), (1, "running")]
    assert [h.name for h in provider.list_pods(POD_LABEL) if h.pod_id == handle.pod_id] == [two.name]  # listed once
    if caps.batch_status:
        assert provider.statuses(POD_LABEL)[handle.pod_id].state == "running"

    provider.terminate(handle)
    wait_for(
        lambda: (
            provider.status(handle).state in ("terminated", "exited")
            and not any(n.state in ("pending", "running") for n in provider.status(handle).nodes)
        )
    )
    provider.terminate(handle)  # again: no error
    assert handle.pod_id not in [h.pod_id for h in provider.list_pods(POD_LABEL)]
    if hasattr(fake, "running_pods"):
        assert fake.running_pods() == []


def test_a_provider_name_that_is_not_registered_is_one_line_naming_the_registered_ones(tmp_path):
    import subprocess

    spec = Path(__file__).resolve().parents[2] / "jobspecs" / "quickstart-critique.toml"
    text = spec.read_text().replace('provider = "local"', 'provider = "nowhere"')
    (tmp_path / "s.toml").write_text(text)
    r = subprocess.run([sys.executable, "-m", "autoslm", "validate", str(tmp_path / "s.toml")], capture_output=True, text=True)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert lines == [
        f'error: {tmp_path / "s.toml"}: compute.provider: "nowhere" is not a registered provider: write one of '
        + ", ".join(f'"{n}"' for n in VENDORS)
    ]
