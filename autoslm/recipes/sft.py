"""The SFT recipe: supervised fine-tuning of a LoRA adapter, loss on the assistant tokens only."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from autoslm.recipes.common import TrainCommon


class SFTTrain(TrainCommon):
    method: Literal["sft"] = "sft"
    batch_size: Annotated[
        int, Field(ge=1, description="sequences per optimizer step, all processes (compute.gpu_count) together")
    ] = 16
    micro_batch_size: Annotated[
        int | None,
        Field(
            ge=1,
            description="sequences per forward pass per process (default: batch_size / compute.gpu_count); the rest is gradient accumulation",
        ),
    ] = None
    packing: Annotated[bool, Field(description="pack several short examples into one sequence")] = False
    padding_free: Annotated[
        bool | Literal["auto"],
        Field(
            description="concatenate the micro-batch without pad tokens (needs a flash-attention kernel); auto = on when the attention kernel allows it"
        ),
    ] = "auto"

    @model_validator(mode="after")
    def _micro_divides(self):
        micro = self.micro_batch_size or self.batch_size
        if self.batch_size % micro:
            raise ValueError(
                f"batch_size {self.batch_size} is not a multiple of micro_batch_size {micro}: "
                f"use a micro_batch_size that divides it, e.g. {_largest_divisor(self.batch_size, micro)}"
            )
        return self


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)
