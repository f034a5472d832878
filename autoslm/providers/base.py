"""The compute provider interface: start a worker somewhere, watch it, stop it.

Contract for every provider (one per vendor folder, ``autoslm/providers/<vendor>/provider.py``):

- ``offers(wish)`` answers a ``GpuWish`` (what ``compute`` asks for) with the vendor's offers for it.
- ``launch(request, offers)`` creates the ``PodRequest``'s pod and returns as soon as it is requested; it
  never waits for the pod to run. ``offers`` are the usable offers of the run's plan, in its order, tried
  as they are (placement judged them once, and says itself when none is usable: it never calls launch
  then); None where there is no plan (the provider picks from its own offers). It is called once per
  attempt by the supervisor, which records the handle before doing anything else.
- ``status(handle)`` says what the pod is doing now; a pod the provider no longer knows is "terminated".
- ``terminate(handle)`` is idempotent: a pod that does not exist is success. It returns as soon as
  the provider accepted the request.
- ``list_pods(label)`` finds every pod autoslm started with that label, for the orphan sweep (gc).
- ``statuses(label) -> {pod_id: PodStatus}``, where the vendor declares ``Capabilities.batch_status``,
  answers for every such pod with one list call; a pod missing from it is asked about with ``status``
  (a list may lag behind a fresh create). ``create_window_s``, where it declares ``create_window``.
- A vendor's own settings (``Vendor.options``) reach it in the wish: it reads its own with
  ``VENDOR.options_in(wish)``; the request's plain fields (``deadline``, ``serving``) say the rest.
- Vendor JSON and vendor errors stay inside the provider module; callers see ``autoslm.errors``
  (NoCapacity, ProviderAuthError, ProviderRateLimited, ProviderUnavailable, ProvisioningFailed).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

PodState = Literal["pending", "running", "exited", "terminated", "unknown"]
POD_ALIVE = ("pending", "running")  # a pod starting or running (the controller's own states are controller/state.py's)
POD_TERMINATED = "terminated"

# Every pod autoslm starts carries this label/name prefix, so gc can find what it left running.
POD_LABEL = "autoslm"
# Every name and label a vendor stores (a pod's name, a Hugging Face job's labels) keeps to Kubernetes'
# label rule, which some vendors enforce: at most 63 characters of [A-Za-z0-9_.-], alphanumeric at both ends.
NAME_MAX = 63
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?")


def is_label(text: str) -> bool:
    """Whether ``text`` keeps to the label rule (``NAME_MAX``)."""
    return len(text) <= NAME_MAX and _LABEL.fullmatch(text) is not None


def check_pod_name(name: str) -> None:
    """A provider's check of the name it is asked to create: autoslm's prefix, within the label rule
    (controller/podnames.py names every pod so; anything else is a bug, said before any create)."""
    if not name.startswith(POD_LABEL + "-") or not is_label(name):
        raise ValueError(f"pod names start with {POD_LABEL!r}- and keep to {NAME_MAX} characters of [A-Za-z0-9_.-], got {name!r}")


@dataclass(frozen=True)
class GpuWish:
    """What a JobSpec's ``compute`` asks of a vendor, and all that ``offers`` answers: built from
    ``spec.compute`` alone (``controller.placement.gpu_wish``), the same for `plan` and for a launch."""

    gpu_types: tuple[str, ...] = ()  # preference order; empty = CPU / any
    gpu_count: int = 1  # per pod
    interruptible: bool = False
    max_price_per_hour: float | None = None  # one pod
    disk_gb: int = 40
    image: str | None = None  # compute.image as written ("auto", "bootstrap" or a reference); the pod's is PodRequest.image
    # Pods of one replica (``compute.nodes``), each of ``gpu_count`` GPUs, on one private network: a vendor
    # that declares ``Capabilities.joins_pods`` creates them together as one group; the others refuse (``one_pod``).
    nodes: int = 1
    # Each vendor's own settings, validated by the JobSpec against its ``Vendor.options`` model: vendor name
    # -> that model's object. A vendor reads its own (``Vendor.options_in``); one not written is its defaults.
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Serving:
    """A pod that serves HTTP (a serve's OpenAI API): the ports the vendor exposes. Its time to live is
    the request's ``deadline``."""

    ports: tuple[int, ...]


@dataclass(frozen=True)
class PodRequest:
    """The pod to create for one attempt (built once, ``controller.podspec.pod_request``): what runs in it
    and the wish it is placed by. The provider decides where, from the plan's offers or its own."""

    name: str  # unique per attempt, starts with POD_LABEL: "autoslm-<run_id>-s<seed>-a<attempt>-h<home>"
    command: list[str]
    env: dict[str, str]  # the worker's (layout.PodEnv); the provider adds the price it placed the pod at
    wish: GpuWish = field(default_factory=GpuWish)
    image: str | None = None
    # A bootstrap pod: ``command`` installs autoslm first (autoslm/controller/images.py, worker_image/boot.sh)
    # and the provider runs it on its own public base image (``BOOTSTRAP_IMAGE``) instead of ``image``.
    bootstrap: bool = False
    deadline: float | None = None  # epoch seconds: the run's end (limits.max_hours; a serve's TTL); None: none
    serving: Serving | None = None  # None: not a serve
    # This machine's provider only: where the worker's output goes (``autoslm logs`` reads it from the
    # controller's home; node i > 0 of a group writes beside it, ``node_log_path``); a rented pod's output is its vendor's.
    log_path: str | None = None


def node_log_path(log_path, node: int):
    """Where node ``node`` of a group of this machine's processes writes its output: node 0 (training rank
    0, the one that reports) the replica's log, node i ``<log>.node<i>.log`` beside it (a ``Path``)."""
    from pathlib import Path

    path = Path(log_path)
    return path if node == 0 else path.with_name(f"{path.stem}.node{node}{path.suffix}")


def one_pod(request: PodRequest, vendor: str) -> None:
    """The check of a provider that cannot join pods (``Capabilities.joins_pods`` false) that it is asked
    for one: renting one pod of several alone would train nothing (validate refuses such a spec first)."""
    if request.wish.nodes != 1:
        from autoslm.errors import ProviderError

        raise ProviderError(
            f"{vendor} was asked for {request.wish.nodes} pods for {request.name}: it cannot join pods into one replica",
            hint="one pod per replica here: put the GPUs in compute.gpu_count, or use a provider that joins pods",
        )


@dataclass(frozen=True)
class PodHandle:
    provider: str
    pod_id: str
    price_per_hour: float | None = None  # what the provider quoted when it accepted the pod
    gpu: str | None = None
    name: str | None = None  # the pod's name at the provider (list_pods fills it in: gc reads whose it is)
    price_source: str | None = None  # "provider" (its quote) or "offer at launch" (the price the pod was created at)
    created_at: float | None = None  # when the provider says it was created (epoch s), if it says


def launch_price(env) -> float | None:
    """The price a pod was created at, from the environment the provider wrote into it (both vendors
    echo it back): what a stopped pod, whose listing quotes no price, is billed at."""
    try:
        price = float((env or {}).get("AUTOSLM_PRICE_PER_HOUR") or 0)
    except (TypeError, ValueError, AttributeError):
        return None
    return price if price > 0 else None


@dataclass(frozen=True)
class Billed:
    """When the vendor bills a pod, where its status says so (Hugging Face Jobs: while a job runs, from its
    own durations; not while it waits for a machine). Epoch seconds, by the vendor's clock."""

    since: float | None  # None: not billed yet (waiting for a machine), or never (ended before it ran)
    until: float | None = None  # None: still billed


@dataclass(frozen=True)
class NodeStatus:
    """One pod of a replica of several (``GpuWish.nodes``): its node rank (node 0 holds training rank 0),
    the vendor's id for it, and what it is doing."""

    node: int
    pod_id: str
    state: PodState
    message: str = ""
    exit_code: int | None = None


@dataclass(frozen=True)
class PodStatus:
    state: PodState
    message: str = ""
    price_per_hour: float | None = None
    exit_code: int | None = None
    urls: tuple[str, ...] = ()  # where the pod's exposed ports are reached, where the vendor's status says (Jobs' expose URLs)
    billed: Billed | None = None  # None: the vendor does not say: billed from its create until it is gone
    nodes: tuple[NodeStatus, ...] = ()  # a replica of several pods: each one's, by node rank; () for one pod


def group_status(nodes: Sequence[NodeStatus], *, price_per_hour: float | None = None, billed: Billed | None = None) -> PodStatus:
    """The status of a replica of several pods, read by the controller as one pod's: every pod trains a
    share of each step, so the replica lives while all of them do. One pod lost, or exited with a failure,
    ends it: "exited" while any of its pods still exists (the controller then ends the others and
    relaunches all of them, resuming), naming that node; "terminated" once none exists. A pod that exited
    without a code (a vendor that says none) is not a failure while the others live. Done (exited 0) when
    every pod exited 0; "unknown" while the vendor cannot tell about one (look again)."""
    nodes = tuple(sorted(nodes, key=lambda n: n.node))
    if not nodes:
        return PodStatus("terminated", "no pod of the group is left", price_per_hour=price_per_hour, billed=billed)
    k = len(nodes)

    def of(state: PodState, n: NodeStatus | None = None, message: str = "") -> PodStatus:
        code = n.exit_code if n is not None else None
        return PodStatus(state, message, price_per_hour=price_per_hour, exit_code=code, billed=billed, nodes=nodes)

    # A pod that exited with no code said (RunPod says none) may have finished its share: the others end
    # soon after it either way (they finish too, or lose their peer and exit), so it ends nothing alone.
    failed = [n for n in nodes if n.state == "terminated" or (n.state == "exited" and n.exit_code not in (0, None))]
    if all(n.state == "terminated" for n in nodes):
        return of("terminated", None, f"node {nodes[0].node} of {k}: {nodes[0].message or 'terminated'}")
    if failed:
        first = failed[0]
        where = f" ({first.pod_id})" if first.pod_id else ""
        return of("exited", first, f"node {first.node} of {k}{where}: {first.message or first.state}")
    if any(n.state == "unknown" for n in nodes):
        return of("unknown", None, "the vendor could not tell about every pod")
    if all(n.state == "exited" for n in nodes):
        return of("exited", nodes[0], f"all {k} nodes exited" + (" 0" if all(n.exit_code == 0 for n in nodes) else ""))
    if any(n.state == "pending" for n in nodes):
        return of("pending", None, f"{sum(n.state == 'running' for n in nodes)} of {k} nodes running")
    return of("running")


@dataclass(frozen=True)
class Offer:
    """One way to get a GPU: what ``autoslm plan`` prints and ``launch`` picks from."""

    provider: str
    gpu: str
    gpu_count: int
    vram_gb: float
    price_per_hour: float
    interruptible: bool = False
    offer_id: str | None = None
    location: str = ""
    reliability: float | None = None
    extra: dict = field(default_factory=dict)
    ram_gb: float | None = None  # host RAM the pod gets, where the vendor says (Vast does; RunPod does not)


def planned_offers(request: PodRequest, offers: tuple[Offer, ...] | None, vendor: str) -> list[Offer] | None:
    """The offers a launch tries, in order: those the run's plan judged usable, handed on as they are
    (placement alone judges them, and never calls a launch with none). None: no plan (the provider
    picks from its own). An empty plan handed to a provider anyway is refused as placement would:
    ``vendor`` is its title, for the message."""
    if offers is None:
        return None
    if not offers:
        from autoslm.errors import NoCapacity

        raise NoCapacity(
            f"{vendor} has no usable offer for {request.name} (`autoslm plan` says why)",
            hint="pick a larger GPU, a smaller model or batch, or raise the limits",
        )
    return list(offers)


@runtime_checkable
class Provider(Protocol):
    name: str

    def launch(self, request: PodRequest, offers: tuple[Offer, ...] | None = None) -> PodHandle: ...

    def status(self, handle: PodHandle) -> PodStatus: ...

    def terminate(self, handle: PodHandle) -> None: ...

    def list_pods(self, label: str = POD_LABEL) -> list[PodHandle]: ...

    def offers(self, wish: GpuWish, *, lookup: bool = False) -> list[Offer]:
        """Offers matching the GPU wishes, cheapest first; [] for providers with no market (local).
        ``lookup``: only a look at prices (`autoslm plan`): one try, no back-off retries."""
        ...
