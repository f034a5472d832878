"""What `status` says of a serve (`autoslm serve`: a run whose JobSpec is a ``ServeSpec``): what it serves,
where it answers, and how long it has left. Pure: built from the run's record, its first seed's status
and its metrics, like the rest of ``controller/status.py``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from autoslm.controller.state import RunState


@dataclass(frozen=True)
class ServeStatus:
    """A serve (`autoslm serve`: a run whose JobSpec is a ``ServeSpec``): what it serves, where, until when.
    ``endpoint``: the OpenAI base URL while it answers; ``ttl_left_s``: while it lives, the time to its
    ``--ttl``'s end (the run's deadline, ``ends_at``); ``served_s``: once it ended, how long it served."""

    source_run: str
    step: int | None
    model: str
    endpoint: str | None
    ends_at: float
    ttl_left_s: float | None
    max_usd: float | None
    served_s: float | None = None

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in ServeStatus.__dataclass_fields__}


@functools.lru_cache(maxsize=64)
def spec_serve(spec_json: str) -> tuple[dict, float | None] | None:
    """A serve's adapter (``ServeSpec.adapter``: source_run, step, lora_name) and ``limits.max_usd``, from
    its JobSpec as recorded (JSON), or None for a run that trains; read without building the JobSpec. A
    serve recorded before serves had a kind of their own keeps them in its ``[serve]`` table."""
    import json

    spec = json.loads(spec_json)
    served = spec.get("adapter") if spec.get("kind") == "serve" else spec.get("serve")
    return (served, (spec.get("limits") or {}).get("max_usd")) if isinstance(served, dict) else None


def serve_status(run, seeds: tuple, state: RunState, now: float, metrics: dict | None) -> ServeStatus | None:
    """What a serve run serves and until when (None for a run that trains)."""
    found = spec_serve(run.spec_json)
    if found is None:
        return None
    from autoslm.layout import endpoint_of  # (the layout's records are pydantic: `list` never needs them)

    serve, max_usd = found
    first = seeds[0] if seeds else None
    served = ((metrics or {}).get(f"seed{first.seed}") or {}).get("serve") if first is not None else None
    return ServeStatus(
        source_run=serve.get("source_run"),
        step=serve.get("step"),
        model=serve.get("lora_name"),
        endpoint=endpoint_of(first.message) if first is not None and state.live else None,
        ends_at=run.deadline,
        ttl_left_s=round(max(0.0, run.deadline - now), 1) if state.live else None,
        max_usd=max_usd,
        served_s=served.get("served_s") if isinstance(served, dict) else None,
    )
