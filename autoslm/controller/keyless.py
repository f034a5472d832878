"""`autoslm plan` without provider keys: what can be shown before anyone signs up.

Each vendor declares how (``Capabilities.keyless``): "search" -- its offer search is public, so its
provider is asked without a key; "list prices" -- its rows come from the list prices its package
keeps (``Vendor.list_prices``; "own list": its provider's ``keyless()`` from list prices it keeps in
its own shape), marked as such ("catalog price"), never passed off as live offers:
stock, exact price and availability need the key. Nothing here can rent anything; ``launch`` still
requires the keys.
"""

from __future__ import annotations

from autoslm import catalog
from autoslm.errors import ProviderAuthError
from autoslm.providers.base import GpuWish, Offer
from autoslm.vendors.vendor import Vendor


class ListPriceCatalog:
    """Offers from a vendor's list prices: one per wished GPU type that the vendor lists."""

    def __init__(self, vendor: Vendor):
        self.vendor = vendor
        self.name = vendor.name

    def offers(self, wish: GpuWish, *, lookup: bool = False) -> list[Offer]:
        prices = self.vendor.list_prices
        names = list(wish.gpu_types) or list(prices)
        out = []
        for rank, name in enumerate(names):
            info = catalog.gpu_info(name)
            price = prices.get(info.name) if info else None
            if info is None or price is None or self.vendor.gpu_id(info.name) is None:
                continue
            total = price * wish.gpu_count
            if wish.max_price_per_hour is not None and total > wish.max_price_per_hour:
                continue
            out.append(
                Offer(
                    provider=self.name,
                    gpu=info.name,
                    gpu_count=wish.gpu_count,
                    vram_gb=info.vram_gb,
                    price_per_hour=round(total, 4),
                    location="catalog",
                    extra={"price_source": "catalog", "preference": rank},
                )
            )
        return sorted(out, key=lambda o: (o.price_per_hour, o.extra["preference"]))


def keyless_provider(vendor: Vendor):
    """What `plan` asks for this vendor's offers without its key; None where it has nothing to show."""
    if vendor.capabilities.keyless == "list prices":
        return ListPriceCatalog(vendor)
    if vendor.capabilities.keyless in ("search", "own list"):
        return vendor.provider_type().keyless()
    return None


def plan_providers(names: list[str]) -> tuple[dict, dict[str, str]]:
    """Providers to ask for offers, keys or not: (name -> provider, name -> note for its rows)."""
    from autoslm.providers import VENDORS, get_provider

    providers, notes = {}, {}
    for name in names:
        try:
            providers[name] = get_provider(name)
        except ProviderAuthError:
            vendor = VENDORS[name]
            keyless = keyless_provider(vendor)
            if keyless is None:
                raise
            providers[name] = keyless
            notes[name] = vendor.keyless_note()
    return providers, notes
