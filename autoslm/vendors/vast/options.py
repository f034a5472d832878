"""Vast's own JobSpec settings, ``[compute.options.vast]``: validated by the JobSpec, read by its provider."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class VastOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    min_reliability: Annotated[float, Field(ge=0, le=1, description="Vast host reliability floor")] = 0.95
