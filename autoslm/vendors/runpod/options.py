"""RunPod's own JobSpec settings, ``[compute.options.runpod]``: validated by the JobSpec, read by its provider."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class RunPodOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cloud: Annotated[
        Literal["secure", "community", "all"],
        Field(description='RunPod cloud type: "secure" (its data centers), "community" (vetted hosts), or "all"'),
    ] = "secure"
