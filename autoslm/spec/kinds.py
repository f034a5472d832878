"""A run's JobSpec of either kind: ``kind = "train"`` (``JobSpec``, the default: a spec that names no
kind trains) or ``kind = "serve"`` (``ServeSpec``), told apart by that field, as one pydantic union.

``spec_from_json`` reads a run's recorded spec (the registry's, the pod's ``AUTOSLM_JOBSPEC``): every
training spec as it was always written, and a serve recorded before serves had a kind of their own (a
training spec with a ``[serve]`` table, its TTL as ``limits.max_hours``) as the ``ServeSpec`` it is.
"""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any, Union

from pydantic import Discriminator, Tag, TypeAdapter

from autoslm.spec.models import JobSpec
from autoslm.spec.serve import ServeSpec


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return value.get("kind", "train")
    return getattr(value, "kind", "train")


RunSpec = Annotated[Union[Annotated[JobSpec, Tag("train")], Annotated[ServeSpec, Tag("serve")]], Discriminator(_kind)]
# The union's tags and their models. A spec is validated by its kind's own model: its errors name that
# model, and reading a training spec is a JobSpec validation as it always was (one per record read).
KINDS: dict[str, type[JobSpec] | type[ServeSpec]] = {"train": JobSpec, "serve": ServeSpec}


@functools.cache
def _run_spec() -> TypeAdapter[JobSpec | ServeSpec]:
    return TypeAdapter(RunSpec)  # built when first needed, not when the package is imported


def run_spec(data: Any) -> JobSpec | ServeSpec:
    """A run's spec from its fields, of the kind they name (raises pydantic's ValidationError)."""
    if isinstance(data, dict) and "kind" not in data and isinstance(data.get("serve"), dict):
        data = _recorded_serve(data)
    model = KINDS.get(_kind(data))
    if model is None:  # a kind no model has: the union says so, naming the kinds there are
        return _run_spec().validate_python(data)
    return model.model_validate(data)


def spec_from_json(text: str) -> JobSpec | ServeSpec:
    """A run's spec as recorded (``to_json``), of either kind."""
    try:
        data = json.loads(text)
    except ValueError:
        return _run_spec().validate_json(text)  # pydantic's own words on what is wrong with it
    return run_spec(data)


_ADAPTER_FIELDS = ("source_run", "store", "adapter_path", "step", "lora_name", "lora_rank")


def _recorded_serve(data: dict) -> dict:
    """A serve as it was recorded before it had a kind: the source run's training spec, its ``[serve]``
    table, and its TTL in ``limits.max_hours``, as a ``ServeSpec``'s fields."""
    serve, limits = data["serve"], dict(data.get("limits") or {})
    seed = data.get("seed", 0)
    out = {
        "kind": "serve",
        "seed": seed[0] if isinstance(seed, list) and seed else seed,
        "phase": (data.get("train") or {}).get("method", "sft"),
        "adapter": {k: serve[k] for k in _ADAPTER_FIELDS if k in serve},
        "limits": {**{k: v for k, v in limits.items() if k != "max_hours"}, "ttl_s": float(limits.get("max_hours", 1.0)) * 3600},
    }
    out |= {k: data[k] for k in ("name", "model", "trust_remote_code", "compute", "artifacts") if k in data}
    out |= {k: serve[k] for k in ("port", "max_model_len") if k in serve}
    return out
