"""Compute providers: where a worker runs. One folder per vendor (``autoslm/providers/<vendor>/``),
gathered in ``VENDORS`` (providers/registry.py); ``get_provider(name)`` builds one from the environment.

Each vendor's key comes from its ``Vendor.key_env`` (or $AUTOSLM_HOME/credentials.toml, mode 0600),
its base URL from ``Vendor.url_env``, so tests and proxies can redirect it.
"""

from __future__ import annotations

from autoslm.providers.base import GpuWish, Offer, PodHandle, PodRequest, PodStatus, Provider, Serving
from autoslm.providers.registry import VENDORS
from autoslm.providers.vendor import Capabilities, Vendor

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
        from autoslm.providers.registry import unknown_provider

        raise ValueError(unknown_provider(name))
    return vendor.provider()
