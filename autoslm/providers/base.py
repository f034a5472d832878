"""The compute provider interface: start a worker somewhere, watch it, stop it.

Contract for every provider (one per vendor folder, ``autoslm/providers/<vendor>/provider.py``):

- ``launch(spec)`` returns as soon as the pod is requested; it never waits for the pod to run. It is
  called once per attempt by the supervisor, which records the handle before doing anything else.
- ``status(handle)`` says what the pod is doing now; a pod the provider no longer knows is "terminated".
- ``terminate(handle)`` is idempotent: a pod that does not exist is success. It returns as soon as
  the provider accepted the request.
- ``list_pods(label)`` finds every pod autoslm started with that label, for the orphan sweep (gc).
- ``statuses(label) -> {pod_id: PodStatus}``, where the vendor declares ``Capabilities.batch_status``,
  answers for every such pod with one list call; a pod missing from it is asked about with ``status``
  (a list may lag behind a fresh create). ``create_window_s``, where it declares ``create_window``.
- ``launch`` tries the offers ``planned_offers`` hands it as they are: placement judged them once.
- Vendor JSON and vendor errors stay inside the provider module; callers see ``autoslm.errors``
  (NoCapacity, ProviderAuthError, ProviderRateLimited, ProviderUnavailable, ProvisioningFailed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

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
class PodSpec:
    """What to run: the provider decides where (and picks an offer for the GPU wishes)."""

    name: str  # unique per attempt, starts with POD_LABEL: "autoslm-<run_id>-s<seed>-a<attempt>-h<home>"
    command: list[str]
    env: dict[str, str]
    image: str | None = None
    # A bootstrap pod: ``command`` installs autoslm first (autoslm/controller/images.py, worker_image/boot.sh)
    # and the provider runs it on its own public base image (``BOOTSTRAP_IMAGE``) instead of ``image``.
    bootstrap: bool = False
    gpu_types: tuple[str, ...] = ()  # preference order; empty = CPU / any
    gpu_count: int = 1
    interruptible: bool = False
    max_price_per_hour: float | None = None
    disk_gb: int = 40
    cloud: str = "secure"
    min_reliability: float | None = None
    label: str = POD_LABEL
    # The offers to try, in order: the usable ones of the run's plan (controller.placement.launch_offers),
    # so that a launch rents what `autoslm plan` printed. None: the provider picks from its own offers.
    offers: "tuple[Offer, ...] | None" = None
    log_path: str | None = None  # local provider only: where the worker's output goes
    ports: tuple[int, ...] = ()  # TCP ports the pod serves HTTP on, exposed by the vendor (a serve's OpenAI API)


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
class PodStatus:
    state: PodState
    message: str = ""
    price_per_hour: float | None = None
    exit_code: int | None = None
    urls: tuple[str, ...] = ()  # where the pod's exposed ports are reached, where the vendor's status says (Jobs' expose URLs)
    billed: Billed | None = None  # None: the vendor does not say: billed from its create until it is gone


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


def planned_offers(spec: PodSpec, vendor: str) -> list[Offer] | None:
    """The offers a launch tries, in order: those the run's plan judged usable (``spec.offers``, from
    ``controller.placement.launch_offers``, which alone judges them), handed on as they are. None: the
    launch has no plan (the provider picks from its own offers). No usable offer is said here, for
    every vendor: ``vendor`` is its title, for the message."""
    if spec.offers is None:
        return None
    if not spec.offers:
        from autoslm.errors import NoCapacity

        raise NoCapacity(
            f"{vendor} has no usable offer for {spec.name} (`autoslm plan` says why)",
            hint="pick a larger GPU, a smaller model or batch, or raise the limits",
        )
    return list(spec.offers)


@runtime_checkable
class Provider(Protocol):
    name: str

    def launch(self, spec: PodSpec) -> PodHandle: ...

    def status(self, handle: PodHandle) -> PodStatus: ...

    def terminate(self, handle: PodHandle) -> None: ...

    def list_pods(self, label: str = POD_LABEL) -> list[PodHandle]: ...

    def offers(self, spec: PodSpec, *, lookup: bool = False) -> list[Offer]:
        """Offers matching the GPU wishes, cheapest first; [] for providers with no market (local).
        ``lookup``: only a look at prices (`autoslm plan`): one try, no back-off retries."""
        ...
