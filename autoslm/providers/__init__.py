"""Compute providers: where a worker runs. ``get_provider(name)`` builds one from the environment.

Keys come from RUNPOD_API_KEY / VAST_API_KEY (or $AUTOSLM_HOME/credentials.toml, mode 0600); base
URLs from AUTOSLM_RUNPOD_URL / AUTOSLM_VAST_URL, so tests and proxies can redirect them.
"""

from __future__ import annotations

from autoslm.providers.base import Offer, PodHandle, PodSpec, PodStatus, Provider

__all__ = ["Offer", "PodHandle", "PodSpec", "PodStatus", "Provider", "get_provider"]


def get_provider(name: str) -> Provider:
    if name == "local":
        from autoslm.providers.local import LocalProvider

        return LocalProvider()
    if name == "runpod":
        from autoslm.providers.runpod import RunPodProvider

        return RunPodProvider.from_env()
    if name == "vast":
        from autoslm.providers.vast import VastProvider

        return VastProvider.from_env()
    raise ValueError(f"unknown provider {name!r}")
