"""What a vendor is, as data: the ``Vendor`` each vendor data package (``autoslm/vendors/<vendor>/``)
exports as ``VENDOR``, and the ``Capabilities`` it declares.

Pure data and the standard library: the JobSpec's provider field, the secret names, `plan` without
keys and `gc` read it, so importing it must stay as light as the spec. The vendor's API client and
provider (``autoslm/providers/<vendor>/``) are imported only when ``Vendor.provider()`` builds one.

A capability is declared, never probed: the controller reads ``Vendor.capabilities`` instead of
asking a provider object what it has (``getattr``) or comparing names.

A vendor's own JobSpec settings are its ``options``: a pydantic model in its data folder (``options.py``,
imported only when a JobSpec is validated), written as ``[compute.options.<vendor>]``. The JobSpec
validates each table with its vendor's model; the wish carries the objects (``GpuWish.options``), and
the vendor's provider reads its own (``options_in``). No other file names a vendor's option.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

# How `plan` finds prices without the vendor's key: "search" (its offer search is public: the
# provider class's ``keyless()`` builds one without a key), "list prices" (``Vendor.list_prices``, marked as such),
# "own list" (list prices the provider keeps in its own shape, a flavor priced per machine: its class's
# ``keyless()`` answers from them, marked as list prices), "none" (nothing to price: local).
Keyless = Literal["search", "list prices", "own list", "none"]


@dataclass(frozen=True)
class Capabilities:
    """What a vendor does and does not do. Each "does not" carries its reason, for the user."""

    # "offers": a market of live offers (stock and prices move); "list prices": one fixed price per GPU
    # type; "none": no market at all (this machine).
    market: Literal["offers", "list prices", "none"] = "offers"
    # Interruptible (spot) pods; where there are none, ``not_interruptible`` says why.
    interruptible: bool = False
    not_interruptible: str = ""
    # ``statuses(label) -> {pod_id: PodStatus}`` answers for every pod of a label in one call.
    batch_status: bool = False
    # ``create_window_s``: a create whose answer was lost may still land this long after it was sent
    # (the supervisor keeps the launch intent that long).
    create_window: bool = False
    # The pod must end itself when its worker is done (the vendor restarts an exited container or
    # keeps a stopped one billing): the worker uses ``worker_image/boot_rules.py``'s POD_VENDORS row.
    ends_itself: bool = False
    # A port served in its pod is reachable from outside (`autoslm serve --on`); where not, ``no_ports`` says why.
    exposes_ports: bool = False
    no_ports: str = ""
    # Where the public URL of an exposed port is learned: "pod" (the pod's own environment names it:
    # worker_image/boot_rules.py's ``served_at``) or "status" (the provider's status of the pod: ``PodStatus.urls``).
    endpoint_from: Literal["pod", "status"] = "pod"
    # The variable whose token a request to an exposed port carries (``Authorization: Bearer``); None: none needed.
    endpoint_token_env: str | None = None
    # How `plan` prices this vendor without its key.
    keyless: Keyless = "none"
    # The vendor keeps each pod's own output (a Hugging Face job's log): ``pod_logs(name, follow=)`` yields
    # its lines, which `autoslm logs` shows as a local run's log file.
    pod_logs: bool = False
    # Several pods of one replica (``compute.nodes``), which the vendor places on one private network where
    # every pod reaches every other on every port (torch's elastic launcher and gloo/NCCL need that):
    # ``joined_by`` says how ("an Instant Cluster"); where it cannot, ``no_joining`` says why.
    joins_pods: bool = False
    joined_by: str = ""
    no_joining: str = ""
    # The bandwidth between two pods of one replica, Gbit/s: `plan`'s time for the gradients' all-reduce
    # across pods (0: not said; `plan` then counts a 10 Gbit/s network).
    pod_link_gbps: float = 0.0
    # JobSpec fields that do not apply to this vendor (dotted name -> why), said by `plan` and `validate`.
    # Another vendor's options need no entry: an option of a vendor the run does not use is said anyway.
    not_applicable: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Vendor:
    """One vendor: its names, keys, GPUs, images and prices, and how to build its provider."""

    name: str  # what a JobSpec says (``compute.provider``)
    title: str  # for messages: "RunPod"
    provider_class: str  # "module:Class", built with ``Class.from_env()`` (imported only then)
    capabilities: Capabilities = field(default_factory=Capabilities)
    key_env: str | None = None  # the account key's variable; None: no account (local)
    key_section: str | None = None  # its section in $AUTOSLM_HOME/credentials.toml
    key_page: str = ""  # where a user creates a key
    pods_page: str = ""  # where a user sees its pods and ends one by hand (the vendor's console)
    url_env: str | None = None  # redirects the API's base URL (tests, proxies)
    default_url: str | None = None
    # The account key is also what every pod needs (a key that is the store's token too): pods may
    # carry it, so no provider refuses a pod environment that holds it. False: it never reaches a pod.
    key_reaches_pods: bool = False
    # Secrets the vendor puts into its own pods (a pod-scoped key): scrubbed from what we write, and
    # never sent into a pod by us.
    pod_secret_envs: tuple[str, ...] = ()
    gpu_ids: Mapping[str, str] = field(default_factory=dict)  # catalog GPU name -> the vendor's id for it
    other_gpus: tuple[str, ...] = ()  # cards it offers that the catalog has no row for (offered, fit unknown)
    # The public base image a bootstrap pod runs (autoslm/controller/images.py), whether vLLM is in
    # it, and which base it is for the set-up estimate (catalog/setup.py: "pytorch" or "vllm").
    bootstrap_image: str | None = None
    bootstrap_has_vllm: bool = False
    bootstrap_base: str = "pytorch"
    # $ per GPU per hour, published list prices: `plan` shows them without a key ("list prices").
    list_prices: Mapping[str, float] = field(default_factory=dict)
    list_prices_as_of: str = ""
    # How a pod of this vendor ends itself, from inside ("module:function", called with an ApiClient
    # holding the pod-scoped key and the pod's ``boot_rules.pod_vendor`` row), where
    # ``Capabilities.ends_itself``; None where the pod ends with its process.
    self_end: str | None = None
    # Its own JobSpec settings: "module:Class", a pydantic model ([compute.options.<name>]); None: it has none.
    options: str | None = None
    # Options a JobSpec may still write at compute's top level (``compute.cloud``), as before the options
    # table existed: read into this vendor's table.
    top_level_options: tuple[str, ...] = ()

    @property
    def rented(self) -> bool:
        """A vendor that rents GPUs for money (an account key), not this machine."""
        return self.key_env is not None

    def gpu_id(self, gpu: str) -> str | None:
        """The vendor's id for a catalog GPU name, None where it has none (``catalog.gpu_id``)."""
        return self.gpu_ids.get(gpu)

    def provider_type(self) -> type:
        """The provider class (``provider_class``), imported now."""
        module, _, cls = self.provider_class.partition(":")
        return getattr(importlib.import_module(module), cls)

    def provider(self, **kwargs: Any):
        """The vendor's provider, from the environment (its key, its URL): ``Class.from_env(**kwargs)``."""
        return self.provider_type().from_env(**kwargs)

    def options_type(self) -> type:
        """The options model (``options``), imported now."""
        if self.options is None:
            raise TypeError(f"{self.title} has no options")
        module, _, cls = self.options.partition(":")
        return getattr(importlib.import_module(module), cls)

    def options_in(self, wish) -> Any:
        """This vendor's options in a ``GpuWish``, validated by the JobSpec; its defaults where none were written."""
        given = wish.options.get(self.name)
        return given if given is not None else self.options_type()()

    def self_end_function(self):
        """The function ``self_end`` names, imported now."""
        module, _, fn = (self.self_end or "").partition(":")
        return getattr(importlib.import_module(module), fn)

    def keyless_note(self) -> str:
        """What `plan` says beside this vendor's rows when it has no key."""
        if self.capabilities.keyless == "search":
            return f"public offer search (no {self.key_env})"
        if self.capabilities.keyless in ("list prices", "own list"):
            return f"catalog price ({self.list_prices_as_of} list; set {self.key_env} for live offers)"
        return ""
