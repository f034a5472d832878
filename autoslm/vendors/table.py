"""The vendor table: every vendor autoslm can run on, ``VENDORS`` (name -> ``Vendor``), from each vendor
data package's ``VENDOR``.

A vendor is two folders on two floors. ``autoslm/vendors/<name>/`` is what it is, as data: its
``__init__`` holds ``VENDOR`` (and ``options.py`` its JobSpec settings' model); importing it imports no
API client. ``autoslm/providers/<name>/`` is its runtime: ``provider.py`` (a class with ``from_env()``,
named by ``VENDOR.provider_class``), its client, its pod's own end (``VENDOR.self_end``). The data never
imports the runtime (tests/unit/test_layers.py). Adding a vendor is those two folders and one line in
``_PACKAGES`` below. The JobSpec's provider field, the secret names, `plan` without keys and `gc` read
this table; nothing else lists vendors.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from autoslm.vendors.vendor import Vendor

# The vendor packages, in the order `plan` and `gc` go through them.
_PACKAGES = (
    "autoslm.vendors.local",
    "autoslm.vendors.runpod",
    "autoslm.vendors.vast",
    "autoslm.vendors.hfjobs",
)


def _load() -> dict[str, Vendor]:
    out: dict[str, Vendor] = {}
    for package in _PACKAGES:
        vendor = importlib.import_module(package).VENDOR
        out[vendor.name] = vendor
    return out


VENDORS: dict[str, Vendor] = _load()


def vendor_names() -> tuple[str, ...]:
    return tuple(VENDORS)


def rented_names() -> tuple[str, ...]:
    """The vendors that rent GPUs for money (every one but this machine)."""
    return tuple(n for n, v in VENDORS.items() if v.rented)


def account_key_envs() -> tuple[str, ...]:
    """Every vendor's account-key variable."""
    return tuple(v.key_env for v in VENDORS.values() if v.key_env)


def never_in_pods() -> tuple[str, ...]:
    """Variables no pod's environment may carry when we create it: every account key that must not
    reach a pod, and the pod-scoped keys the vendors inject themselves."""
    keys = [v.key_env for v in VENDORS.values() if v.key_env and not v.key_reaches_pods]
    return tuple(dict.fromkeys(keys + list(pod_secret_envs())))


def pod_secret_envs() -> tuple[str, ...]:
    """The keys the vendors put into their own pods."""
    return tuple(dict.fromkeys(k for v in VENDORS.values() for k in v.pod_secret_envs))


def unknown_provider(name: object, vendors: Mapping[str, Vendor] | None = None) -> str:
    """One line for a provider name that is not registered (in ``vendors``, default ``VENDORS``)."""
    shown = f'"{name}"' if isinstance(name, str) else repr(name)
    return f"{shown} is not a registered provider: write one of " + ", ".join(f'"{n}"' for n in (vendors or VENDORS))
