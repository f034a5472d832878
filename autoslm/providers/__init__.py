"""Compute providers: where a worker runs. One runtime folder per vendor (``autoslm/providers/<vendor>/``:
its provider and API client), whose data (``autoslm/vendors/<vendor>/``) the vendor table gathers in
``VENDORS`` (autoslm/vendors/table.py); ``get_provider(name)`` builds one from the environment.

Each vendor's key comes from its ``Vendor.key_env`` (or $AUTOSLM_HOME/credentials.toml, mode 0600),
its base URL from ``Vendor.url_env``, so tests and proxies can redirect it.
"""

from __future__ import annotations

from autoslm.providers.base import GpuWish, Offer, PodHandle, PodRequest, PodStatus, Provider, Serving
from autoslm.vendors.table import VENDORS
from autoslm.vendors.vendor import Capabilities, Vendor

__all__ = [
    "VENDORS",
    "Capabilities",
    "GpuWish",
    "Offer",
    "PodHandle",
    "PodRequest",
    "PodStatus",
    "Provider",
    "Serving",
    "Vendor",
    "get_provider",
]


def get_provider(name: str) -> Provider:
    vendor = VENDORS.get(name)
    if vendor is None:
        from autoslm.vendors.table import unknown_provider

        raise ValueError(unknown_provider(name))
    return vendor.provider()
