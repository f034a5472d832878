"""`autoslm plan` without provider keys: what can be shown before anyone signs up.

Vast's offer search is public, so it is asked without a key. RunPod needs a key for anything, so
its rows come from list prices kept here, marked as such ("catalog price"), never passed off as
live offers: stock, exact price and availability need RUNPOD_API_KEY. Nothing here can rent
anything; ``launch`` still requires the keys.
"""

from __future__ import annotations

import os

from autoslm import catalog
from autoslm.errors import ProviderAuthError
from autoslm.providers.base import Offer, PodSpec

# RunPod on-demand list prices, $ per GPU per hour (secure cloud), as published in 2026-11.
RUNPOD_LIST_PRICES_AS_OF = "2026-11"
RUNPOD_LIST_PRICES = {
    "RTX 3090": 0.46, "RTX 4090": 0.69, "RTX 5090": 0.94, "RTX A5000": 0.27, "RTX A6000": 0.49,
    "RTX 6000 Ada": 0.77, "L4": 0.43, "L40": 0.99, "L40S": 0.86, "A40": 0.40, "A100 80GB PCIe": 1.64,
    "A100 80GB SXM": 1.74, "H100 PCIe": 2.39, "H100 SXM": 2.69, "H100 NVL": 2.79, "H200": 3.59, "B200": 5.98,
}
CATALOG_NOTE = f"catalog price ({RUNPOD_LIST_PRICES_AS_OF} list; set RUNPOD_API_KEY for live offers)"


class RunPodCatalog:
    """Offers from the list prices: one per wished GPU type that RunPod lists."""

    name = "runpod"

    def offers(self, spec: PodSpec, *, lookup: bool = False) -> list[Offer]:
        names = list(spec.gpu_types) or list(RUNPOD_LIST_PRICES)
        out = []
        for rank, wish in enumerate(names):
            info = catalog.gpu_info(wish)
            price = RUNPOD_LIST_PRICES.get(info.name) if info else None
            if info is None or price is None or info.runpod_id is None:
                continue
            total = price * spec.gpu_count
            if spec.max_price_per_hour is not None and total > spec.max_price_per_hour:
                continue
            out.append(Offer(provider="runpod", gpu=info.name, gpu_count=spec.gpu_count, vram_gb=info.vram_gb,
                             price_per_hour=round(total, 4), location="catalog",
                             extra={"price_source": "catalog", "preference": rank}))
        return sorted(out, key=lambda o: (o.price_per_hour, o.extra["preference"]))


def plan_providers(names: list[str]) -> tuple[dict, dict[str, str]]:
    """Providers to ask for offers, keys or not: (name -> provider, name -> note for its rows)."""
    from autoslm.providers import get_provider

    providers, notes = {}, {}
    for name in names:
        try:
            providers[name] = get_provider(name)
        except ProviderAuthError:
            if name == "vast":
                from autoslm.providers.vast import DEFAULT_URL, URL_ENV, VastProvider

                providers[name] = VastProvider("", base_url=os.environ.get(URL_ENV) or DEFAULT_URL)
                notes[name] = "public offer search (no VAST_API_KEY)"
            elif name == "runpod":
                providers[name] = RunPodCatalog()
                notes[name] = CATALOG_NOTE
            else:
                raise
    return providers, notes
