"""How a vendor bills a pod: by the second, at its hourly price, from its start. The one billing rule, used
by the controller's bills and the in-pod watchdog alike (a module of its own so that both read it without
the catalog's estimates)."""

from __future__ import annotations


def pod_cost_usd(price_per_hour: float | None, start: float | None, end: float) -> float:
    """What a pod costs from ``start`` to ``end`` (seconds) at its hourly price. No price or no start:
    nothing known."""
    if not price_per_hour or start is None:
        return 0.0
    return price_per_hour * max(0.0, end - start) / 3600
